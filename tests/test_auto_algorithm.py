"""`algorithm="auto"`, the all-reduce's default: the algorithm week 2's cost model finds cheapest
with the α, β, γ of the engine the ranks run on — the simulator's network, a real engine's
calibrated file (DSML_NETWORK) or its defaults — the same on every rank, and the right sum."""
from __future__ import annotations

import numpy as np
import pytest

import dsml
from dsml.collectives import ALLREDUCE_ALGORITHMS, allreduce, best_algorithm
from dsml.collectives.auto import auto_algorithm, choose
from dsml.comm.api import SizeOnly
from dsml.comm import costs
from dsml.net import AlphaBeta
from dsml.net.saved import save_network
from dsml.net.topology import ring as ring_network


def chosen_and_sum(comm, n):
    """The algorithm "auto" picks here, and the all-reduce's result."""
    x = np.full(n, comm.rank + 1.0)
    out = yield from allreduce(comm, x)
    return auto_algorithm(comm, "allreduce", x), out


@pytest.mark.parametrize("p,n", [(2, 8), (2, 1 << 17), (5, 64), (8, 1 << 16)])
def test_auto_on_the_simulator_runs_what_the_cost_model_picks_for_its_network(p, n):
    net = AlphaBeta(20e-6, 1e-10, 2e-11)
    result = dsml.run(chosen_and_sum, p, network=net, args=(n,))
    expected = choose("allreduce", p, 8 * n, net.alpha, net.beta, net.gamma)
    assert {name for name, _ in result.values} == {expected}
    for _, out in result.values:
        np.testing.assert_array_equal(out, np.full(n, p * (p + 1) / 2))
    # and the simulated time is that algorithm's: the same program naming it takes as long
    named = dsml.run(lambda comm: (yield from allreduce(comm, np.ones(n), algorithm=expected)),
                     p, network=net)
    assert result.time == named.time


def test_auto_picks_the_latency_saver_for_short_vectors_and_a_bandwidth_optimal_one_for_long():
    """p = 8: recursive doubling's lg p messages win while α dominates; beyond the crossover
    halving–doubling, which moves the ring's 2(p − 1)/p · n bytes in 2 lg p messages instead of
    2(p − 1)."""
    net = AlphaBeta(10e-6, 1e-10, 1e-11)
    short = dsml.run(chosen_and_sum, 8, network=net, args=(16,)).values[0][0]
    long = dsml.run(chosen_and_sum, 8, network=net, args=(1 << 20,)).values[0][0]
    assert (short, long) == ("recursive_doubling", "halving_doubling")


def test_a_topology_is_summarised_by_its_overhead_hops_and_link_bandwidth():
    net = ring_network(4, latency=1e-6, bandwidth=10e9, overhead=2e-6)
    assert costs.network_costs(net) == (4e-6, 1e-10, 0.0)
    values = dsml.run(chosen_and_sum, 4, network=net, args=(4,)).values
    assert values[0][0] == best_algorithm("allreduce", 4, 32, 4e-6, 1e-10, 0.0)


def test_a_topology_is_summarised_by_its_slowest_link():
    """On a two-level cluster the ring's bytes cross the slow links between machines: those set
    β, not the fast links inside a machine."""
    from dsml.net.topology import two_level
    net = two_level(2, 4, 1e-6, 100e9, 20e-6, 1e9)
    alpha, beta, gamma = costs.network_costs(net)
    assert beta == pytest.approx(1e-9) and alpha == pytest.approx(40e-6)


@pytest.mark.parametrize("p", range(2, 13))
def test_auto_is_the_simulators_fastest_also_where_p_is_no_power_of_two(p):
    """Week 2's formulas round lg p up; recursive doubling and halving–doubling really fold to
    the largest power of two first. Priced with the fold, auto's choice takes no longer than
    the fastest algorithm the simulator finds, from 8 B to 16 MiB."""
    net = AlphaBeta(*costs.ENGINE_DEFAULTS["processes"])
    for n in (8, 4096, 65536, 1 << 20, 1 << 24):
        times = {a: dsml.run(lambda comm: (yield from allreduce(comm, SizeOnly(n), algorithm=a)),
                             p, network=net, trace=False).time for a in ALLREDUCE_ALGORITHMS}
        picked = choose("allreduce", p, n, *costs.network_costs(net))
        assert times[picked] <= 1.05 * min(times.values()), (p, n, picked, times)


@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_real_engines_choose_by_their_defaults(engine):
    values = dsml.run(chosen_and_sum, 2, engine=engine, args=(512,)).values
    alpha, beta, gamma = costs.ENGINE_DEFAULTS[engine]
    assert [v[0] for v in values] == [best_algorithm("allreduce", 2, 4096, alpha, beta,
                                                     gamma)] * 2
    for _, out in values:
        np.testing.assert_array_equal(out, np.full(512, 3.0))


def test_a_calibrated_file_named_by_the_environment_decides_instead(tmp_path, monkeypatch):
    """With α tiny and the additions dear, the ring (which adds n/2 per rank at p = 2) beats
    recursive doubling (which adds n) even for short vectors; the defaults pick the other."""
    path = save_network(AlphaBeta(1e-9, 1e-10, 1e-8), tmp_path / "net.json")
    monkeypatch.setenv(costs.ENV, str(path))
    costs._loaded.clear()
    for engine in ("threads", "processes"):
        values = dsml.run(chosen_and_sum, 2, engine=engine, args=(512,)).values
        assert [v[0] for v in values] == ["ring", "ring"]
    monkeypatch.setenv(costs.ENV, str(tmp_path / "missing.json"))
    with pytest.raises(dsml.comm.RankError, match="DSML_NETWORK=.*missing.json"):
        dsml.run(chosen_and_sum, 2, engine="threads", args=(4,))


def test_the_choice_is_cached_and_the_cache_stays_bounded(monkeypatch):
    from dsml.collectives import auto

    class Comm:
        size, costs = 4, (1e-6, 1e-9, 0.0)

    monkeypatch.setattr(auto, "_CACHE_SIZE", 3)
    auto._chosen.clear()
    for n in range(1, 8):
        auto_algorithm(Comm(), "allreduce", np.zeros(n))
        assert len(auto._chosen) <= 3


def test_a_rank_naming_the_algorithm_auto_picks_runs_with_ranks_that_ask_for_auto():
    """The call's signature holds the algorithm auto runs, not the word "auto"."""
    net = AlphaBeta(10e-6, 1e-10, 1e-11)
    picked = choose("allreduce", 2, 64, net.alpha, net.beta, net.gamma)

    def program(comm):
        x = np.full(8, comm.rank + 1.0)
        if comm.rank == 0:
            return (yield from allreduce(comm, x))
        return (yield from allreduce(comm, x, algorithm=picked))

    for _, out in [(None, v) for v in dsml.run(program, 2, network=net).values]:
        np.testing.assert_array_equal(out, np.full(8, 3.0))


def test_ranks_whose_auto_picks_differ_are_told_which_algorithm_each_ran():
    """A rank whose α, β, γ differ (another DSML_NETWORK file, say) picks another algorithm: the
    report names both instead of blaming the data."""
    def program(comm):
        if comm.rank == 0:
            comm.costs = (1e-9, 1e-10, 1e-8)            # the ring's territory
        else:
            comm.costs = (1e-3, 1e-10, 0.0)             # recursive doubling's
        return (yield from allreduce(comm, np.ones(512)))

    with pytest.raises(dsml.DeadlockError) as error:
        dsml.run(program, 2, engine="threads")
    assert "ring" in str(error.value) and "recursive_doubling" in str(error.value)
