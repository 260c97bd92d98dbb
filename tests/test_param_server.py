"""Week 4's parameter server (dsml.param_server) and receive-from-any-source (comm.recv_any):
the server's arithmetic against plain SGD, the SSP guarantee on random straggler patterns,
staleness read from the order of events, and clear errors for bad input, on every engine."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest

import dsml
from dsml import RankError
from dsml.comm.api import SizeOnly
from dsml.data_parallel import flatten, train_single
from dsml.collectives import allreduce
from dsml.hogwild import sparse_least_squares
from dsml.param_server import (PUSH, REPLY, check_bound, key_ranges, parameter_server,
                               clocks_seen, params_at, ps_exchange, push_order,
                               sparse_parameter_server, ssp_with_cache, worker_speeds)
from dsml.sim import DeadlockError
from dsml.train import MLP, gaussian_mixture, make_optimizer
from leaks import nothing_left_behind  # noqa: F401

NET = dsml.net.AlphaBeta(20e-6, 1e-9)
X, Y = gaussian_mixture(200, classes=3, dim=5, seed=1)
SIZES = [5, 8, 3]
BATCH = 16


def model():
    return MLP(SIZES, seed=2)


def batches_of(worker, steps, seed):
    rng = np.random.default_rng([seed, worker])
    out = []
    for _ in range(steps):
        out.append(rng.choice(len(X), size=BATCH, replace=False))
        rng.random()
    return out


def run_ps(world, servers, engine="sim", **kwargs):
    kwargs = {"steps": 6, "lr": 0.1, "batch": BATCH, "seed": 3, **kwargs}
    if engine == "sim":
        return dsml.run(parameter_server, world, network=NET, args=(servers, model(), X, Y),
                        kwargs=kwargs)
    return dsml.run(parameter_server, world, engine=engine, args=(servers, model(), X, Y),
                    kwargs=kwargs, timeout=60)


# --- the arithmetic ---------------------------------------------------------------------------

@pytest.mark.parametrize("servers", [1, 2, 3])
def test_one_worker_asynchronous_is_plain_sgd_bit_for_bit(servers):
    result = run_ps(servers + 1, servers, steps=10)
    reference = model()
    train_single(reference, make_optimizer("sgd", 0.1), X, Y, batches_of(0, 10, 3))
    assert np.array_equal(params_at(result.values[:servers], math.inf),
                          flatten(reference.params)[0])


@pytest.mark.parametrize("workers, servers", [(2, 1), (3, 2), (4, 3)])
def test_synchronous_is_sgd_on_the_union_of_the_batches(workers, servers):
    result = run_ps(servers + workers, servers, mode="bsp", steps=5)
    picks = [batches_of(w, 5, 3) for w in range(workers)]
    reference = model()
    train_single(reference, make_optimizer("sgd", 0.1), X, Y,
                 [np.concatenate([picks[w][t] for w in range(workers)]) for t in range(5)])
    assert np.allclose(params_at(result.values[:servers], math.inf),
                       flatten(reference.params)[0], rtol=1e-12, atol=1e-14)
    for log in result.values[:servers]:
        assert all(u.staleness == 0 for u in log["updates"])


@pytest.mark.parametrize("servers", [1, 2])
def test_backup_workers_go_on_without_a_slow_worker_and_drop_its_gradients(servers):
    # Worker 3 is ten times slower: with one backup every step is the mean of workers 0-2's,
    # SGD on the union of their batches, and every gradient of worker 3 arrives too late.
    steps, workers = 5, 4
    result = run_ps(servers + workers, servers, mode="bsp", steps=steps, backups=1,
                    seconds_per_step=1e-3, speeds=[1, 1.2, 1.1, 10])
    picks = [batches_of(w, steps, 3) for w in range(3)]
    reference = model()
    train_single(reference, make_optimizer("sgd", 0.1), X, Y,
                 [np.concatenate([picks[w][t] for w in range(3)]) for t in range(steps)])
    assert np.allclose(params_at(result.values[:servers], math.inf),
                       flatten(reference.params)[0], rtol=1e-12, atol=1e-14)
    for log in result.values[:servers]:
        assert {u.worker for u in log["updates"]} == {servers, servers + 1, servers + 2}
        assert [w for w, _, _ in log["dropped"]] == [servers + 3] * steps


def check_backup_log(log, workers, backups, steps):
    by_step = {}
    for u in log["updates"]:
        by_step.setdefault(u.step, []).append(u.worker)
    assert sorted(by_step) == list(range(1, steps + 1))
    assert all(len(set(w)) == len(w) == workers - backups for w in by_step.values())
    assert len(log["updates"]) + len(log["dropped"]) == workers * steps   # every push, once


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_backup_workers_apply_exactly_w_minus_b_gradients_a_step(seed):
    speeds = worker_speeds(6, spread=0.5, seed=seed)
    result = run_ps(7, 1, mode="bsp", steps=8, backups=2, seed=seed, seconds_per_step=1e-3,
                    speeds=speeds, straggle_prob=0.2, straggle_factor=10)
    check_backup_log(result.values[0], 6, 2, 8)


def test_backup_workers_on_threads(nothing_left_behind):
    result = run_ps(5, 1, engine="threads", mode="bsp", steps=6, backups=1,
                    seconds_per_step=2e-3, speeds=[1, 1, 1, 4])
    check_backup_log(result.values[0], 4, 1, 6)


@pytest.mark.parametrize("backups", [-1, 4, 1.5])
def test_backups_must_leave_at_least_one_worker(backups):
    with pytest.raises(RankError, match=r"backups must be an integer in 0..3 \(fewer than the 4 "
                                        r"workers\), got"):
        run_ps(5, 1, mode="bsp", backups=backups)


def run_cached(world, engine="sim", **kwargs):
    kwargs = {"steps": 6, "lr": 0.1, "batch": BATCH, "seed": 3, "bound": 1, **kwargs}
    options = dict(network=NET) if engine == "sim" else dict(engine=engine, timeout=60)
    return dsml.run(ssp_with_cache, world, args=(model(), X, Y), kwargs=kwargs, **options)


@pytest.mark.parametrize("bound", [0, 2, math.inf])
def test_one_worker_with_a_cache_is_plain_sgd_bit_for_bit(bound):
    result = run_cached(2, steps=10, bound=bound)
    reference = model()
    train_single(reference, make_optimizer("sgd", 0.1), X, Y, batches_of(0, 10, 3))
    assert np.array_equal(params_at(result.values[:1], math.inf), flatten(reference.params)[0])
    pulls = [pulled for _, _, pulled in result.values[1]]
    # alone, its clock is the slowest: it pulls every bound + 1 steps after the first (∞: never)
    assert pulls == [bound != math.inf and c > 0 and c % (bound + 1) == 0 for c in range(10)]


def check_cached_guarantee(result, bound):
    workers = range(1, len(result.values))
    for rank in workers:
        for c, version, _ in result.values[rank]:
            seen = clocks_seen(result.values[0]["updates"], version, workers)
            assert all(seen[u] >= c - bound for u in workers if u != rank), (rank, c, seen)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("bound", [0, 1, 3])
def test_a_cached_worker_never_computes_on_values_older_than_the_bound(seed, bound):
    speeds = worker_speeds(4, spread=0.6, seed=seed)
    result = run_cached(5, steps=12, bound=bound, seed=seed, seconds_per_step=1e-3,
                        speeds=speeds, straggle_prob=0.2, straggle_factor=8)
    check_cached_guarantee(result, bound)
    assert len(result.values[0]["updates"]) == 4 * 12


def test_the_guarantee_check_catches_a_cache_one_clock_too_old():
    speeds = [1, 1, 1, 8]                     # one slow worker: the bound binds
    result = run_cached(5, steps=10, bound=1, seconds_per_step=1e-3, speeds=speeds)
    check_cached_guarantee(result, 1)
    with pytest.raises(AssertionError):
        check_cached_guarantee(result, 0)     # the same run does not meet a tighter bound


def test_ssp_with_a_cache_on_threads(nothing_left_behind):
    result = run_cached(4, engine="threads", steps=8, bound=1, seconds_per_step=1e-3,
                        speeds=[1, 1, 3])
    check_cached_guarantee(result, 1)
    assert len(result.values[0]["updates"]) == 3 * 8


def test_ssp_with_a_cache_needs_a_worker():
    with pytest.raises(RankError, match=r"need a server and at least one worker, got world size 1"):
        run_cached(1)


def test_every_gradient_is_applied_once_and_staleness_is_counted_from_events():
    workers, steps = 5, 8
    result = run_ps(workers + 2, 2, steps=steps, seconds_per_step=1e-3,
                    speeds=worker_speeds(workers, 0.5, seed=4))
    for log in result.values[:2]:
        updates = log["updates"]
        assert len(updates) == workers * steps
        assert sorted((u.worker, u.step) for u in updates) == \
            [(w, t) for w in range(2, 2 + workers) for t in range(1, steps + 1)]
        assert [u.applied_to for u in updates] == list(range(workers * steps))
        assert all(u.staleness >= 0 for u in updates)
        assert max(u.staleness for u in updates) > 0           # the workers overlapped


def test_key_ranges_cut_as_array_split():
    assert key_ranges(10, 3) == [(0, 4), (4, 7), (7, 10)]
    with pytest.raises(ValueError, match="at least one server"):
        key_ranges(10, 0)


# --- SSP: the bound holds on random straggler patterns ----------------------------------------

@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("bound", [0, 1, 3, math.inf])
def test_no_worker_reads_a_state_older_than_the_bound_allows(seed, bound):
    rng = np.random.default_rng(seed)
    workers, steps = int(rng.integers(2, 7)), 10
    result = run_ps(workers + 1, 1, steps=steps, bound=bound, seconds_per_step=1e-3,
                    speeds=worker_speeds(workers, float(rng.uniform(0.1, 1.0)), seed=seed),
                    straggle_prob=0.2, straggle_factor=float(rng.uniform(2, 20)))
    log = result.values[0]
    started = [r for r in log["reads"] if r.step <= steps]
    assert len(started) == workers * steps
    for read in started:
        assert read.step - 1 - read.slowest_clock <= bound, read
    # And the updates the reader had seen: every worker's first (step − 1 − bound) gradients.
    if bound != math.inf:
        for read in started:
            seen = {u for u in log["updates"] if u.applied_to < read.version}
            for w in range(1, workers + 1):
                assert sum(1 for u in seen if u.worker == w) >= read.step - 1 - bound


def test_a_bound_of_zero_waits_for_stragglers_and_infinity_never_does():
    timing = dict(seconds_per_step=1e-3, speeds=[1.0, 1.0, 5.0])
    lock_step = run_ps(4, 1, bound=0, **timing).time
    free = run_ps(4, 1, bound=math.inf, **timing).time
    assert free < lock_step


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("bound", [-1, 1.5, "2", True])
def test_a_bound_that_is_not_a_non_negative_integer_or_inf_is_refused(bound):
    with pytest.raises(ValueError, match="staleness bound s must be an integer ≥ 0"):
        check_bound(bound)
    with pytest.raises(RankError, match="rank 0 failed .* staleness bound s must be"):
        run_ps(3, 1, bound=bound)


def test_unknown_mode_and_too_many_servers_are_named():
    with pytest.raises(RankError, match="unknown mode 'eventual'"):
        run_ps(3, 1, mode="eventual")
    with pytest.raises(RankError, match="need 1 ≤ servers < world size 3"):
        run_ps(3, 3)


def rogue(comm):
    """Rank 1 pushes server 0 keys it does not own."""
    if comm.rank == 0:
        yield from parameter_server(comm, 1, model(), X, Y, steps=1, lr=0.1)
        return
    yield comm.send(0, (None, 0, (0, 3), None), tag=PUSH)
    yield comm.recv(0, tag=REPLY)
    yield comm.send(0, (0, 1, (3, 9), np.zeros(6)), tag=PUSH)


def test_a_push_for_keys_the_server_does_not_own_is_an_error_naming_both():
    n = flatten(model().params)[0].size
    with pytest.raises(RankError, match=rf"server 0 owns keys \[0, {n}\); rank 1 pushed 6 "
                                        rf"values for keys \[3, 9\)"):
        dsml.run(rogue, 2, network=NET)


# --- receive from any source ------------------------------------------------------------------

def gather_any(comm, delays):
    if comm.rank == 0:
        got = []
        for _ in range(comm.size - 1):
            got.append((yield comm.recv_any(tag=5)))
        return [(src, float(x[0])) for src, x in got]
    yield comm.compute(delays[comm.rank])
    yield comm.send(0, np.array([10.0 * comm.rank]), tag=5)


def test_recv_any_takes_messages_in_arrival_order_on_the_simulator():
    result = dsml.run(gather_any, 4, network=NET, args=({1: 3e-3, 2: 1e-3, 3: 2e-3},))
    assert result.values[0] == [(2, 20.0), (3, 30.0), (1, 10.0)]


def test_recv_any_takes_what_arrived_before_it_was_asked_in_arrival_order():
    def late(comm):
        if comm.rank == 0:
            yield comm.compute(1.0)                 # everything has arrived by now
            order = []
            for _ in range(comm.size - 1):
                src, _ = yield comm.recv_any(tag=1)
                order.append(src)
            return order
        yield comm.compute(1e-3 * (comm.size - comm.rank))
        yield comm.send(0, np.zeros(1), tag=1)
    assert dsml.run(late, 4, network=NET).values[0] == [1, 2, 3]    # before any ask: lowest first


def test_a_receive_for_the_source_is_served_before_one_from_any_source():
    def both(comm):
        if comm.rank == 0:
            anyone = yield comm.spawn(one_from_anyone(comm))
            mine = yield comm.recv(1, tag=2)
            return float(mine[0]), (yield comm.join(anyone))
        yield comm.compute(1e-3 * comm.rank)
        yield comm.send(0, np.array([float(comm.rank)]), tag=2)

    def one_from_anyone(comm):
        src, x = yield comm.recv_any(tag=2)
        return src, float(x[0])
    assert dsml.run(both, 3, network=NET).values[0] == (1.0, (2, 2.0))


@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_recv_any_on_real_engines_gets_every_message_once(engine, nothing_left_behind):
    result = dsml.run(gather_any, 4, engine=engine, args=({1: 0, 2: 0, 3: 0},), timeout=60)
    assert sorted(result.values[0]) == [(1, 10.0), (2, 20.0), (3, 30.0)]


def test_a_receive_from_any_source_that_never_comes_is_named_in_the_deadlock():
    def waits(comm):
        if comm.rank == 0:
            yield comm.recv_any(tag=7)
    with pytest.raises(DeadlockError, match=r"rank 0 waits for a message from any rank \(tag 7\)"):
        dsml.run(waits, 2, network=NET)


@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_a_receive_from_any_source_that_never_comes_times_out_named(engine, nothing_left_behind):
    def waits(comm):
        if comm.rank == 0:
            yield comm.recv_any(tag=7)
    with pytest.raises(RankError, match=r"rank 0 waits for a message from any rank \(tag 7\)"):
        dsml.run(waits, 2, engine=engine, timeout=3)


# --- the parameter server on real processes ----------------------------------------------------

@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_the_parameter_server_trains_on_real_engines(engine, nothing_left_behind):
    result = run_ps(4, 1, engine=engine, steps=8)
    log = result.values[0]
    assert len(log["updates"]) == 3 * 8 and all(u.staleness >= 0 for u in log["updates"])
    assert sorted(u.applied_to for u in log["updates"]) == list(range(24))


def test_ps_exchange_moves_w_times_the_shard_into_each_server():
    result = dsml.run(ps_exchange, 3 + 4, network=NET, args=(3, 1001))
    inbound = [sum(r.nbytes for r in result.trace.of_rank(s) if r.op == "recv") for s in range(3)]
    assert inbound == [4 * 334, 4 * 334, 4 * 333]


BIG = dsml.net.AlphaBeta(1e-6, 1e-9)        # bandwidth-bound: 1 MB takes 1 ms, α is small


def port_bytes(result, ranks, op):
    return [sum(r.nbytes for r in result.trace.of_rank(q) if r.op == op) for q in ranks]


def test_push_order_naive_starts_everyone_at_server_0_staggered_at_their_own():
    assert [push_order(w, 4, False) for w in range(3)] == [[0, 1, 2, 3]] * 3
    assert [push_order(w, 3, True) for w in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1],
                                                           [0, 1, 2]]


@pytest.mark.parametrize("workers", [3, 5, 8])
def test_a_dedicated_worker_sends_n_and_a_co_located_one_2_w_minus_1_over_w_n(workers):
    n = 12_000
    dedicated = dsml.run(ps_exchange, 2 * workers, network=BIG, args=(workers, n),
                         kwargs=dict(staggered=True))
    colocated = dsml.run(ps_exchange, workers, network=BIG, args=(workers, n),
                         kwargs=dict(staggered=True, colocated=True))
    assert port_bytes(dedicated, range(workers, 2 * workers), "send") == [n] * workers
    assert port_bytes(dedicated, range(workers, 2 * workers), "recv") == [n] * workers
    shards = [b - a for a, b in key_ranges(n, workers)]
    assert port_bytes(colocated, range(workers), "send") == [2 * (n - s) for s in shards]


@pytest.mark.parametrize("workers", [4, 7, 16])
def test_staggered_dedicated_servers_reach_n_beta_and_co_located_ones_the_ring(workers):
    n = 1_000_000
    n_beta = n * BIG.beta

    def ring(comm):
        yield from allreduce(comm, SizeOnly(n), algorithm="ring")
    ring_time = dsml.run(ring, workers, network=BIG, trace=False).time
    time = {(colocated, staggered): dsml.run(
        ps_exchange, workers if colocated else 2 * workers, network=BIG, trace=False,
        args=(workers, n), kwargs=dict(staggered=staggered, colocated=colocated)).time
        for colocated in (False, True) for staggered in (False, True)}
    assert n_beta <= time[False, True] <= 1.02 * n_beta * (1 + 1 / workers)
    assert time[False, True] < ring_time     # (W + 1)/W · nβ against 2(W − 1)/W · nβ
    assert abs(time[True, True] / ring_time - 1) < 0.02
    assert time[False, False] > 1.5 * time[False, True]       # everyone at server 0 first
    assert time[True, False] > 1.5 * time[True, True]


@pytest.mark.parametrize("engine", ["threads"])
@pytest.mark.parametrize("colocated", [False, True])
def test_every_layout_completes_on_a_real_engine(engine, colocated, nothing_left_behind):
    world = 4 if colocated else 8
    result = dsml.run(ps_exchange, world, engine=engine, args=(4, 1000),
                      kwargs=dict(staggered=True, colocated=colocated), timeout=60)
    assert len(result.values) == world


def test_co_located_needs_a_server_on_every_rank():
    with pytest.raises(RankError, match=r"servers must equal the world size 4, got servers=2"):
        dsml.run(ps_exchange, 4, network=NET, args=(2, 100), kwargs=dict(colocated=True))
    with pytest.raises(RankError, match=r"need 1 ≤ servers < world size 4, got servers=4"):
        dsml.run(ps_exchange, 4, network=NET, args=(4, 100))


SPARSE = sparse_least_squares(300, 2000, 5, noise=0.1, seed=4)


@pytest.mark.parametrize("engine", ["sim", "threads"])
def test_sparse_push_and_pull_take_the_same_sgd_steps_as_dense_with_one_worker(engine):
    def run(sparse):
        options = dict(network=NET) if engine == "sim" else dict(engine=engine, timeout=60)
        return dsml.run(sparse_parameter_server, 2, args=(SPARSE, 30, 1.0, 4),
                        kwargs=dict(sparse=sparse, seed=1), **options).values[0]
    dense, sparse = run(False), run(True)
    assert np.array_equal(dense, sparse) and np.any(dense != 0)


def test_sparse_push_and_pull_send_four_numbers_per_touched_key():
    result = dsml.run(sparse_parameter_server, 3, network=NET, args=(SPARSE, 10, 1.0, 4),
                      kwargs=dict(sparse=True, seed=2))
    rng = [np.random.default_rng([2, w]) for w in (1, 2)]
    touched = sum(len(np.unique(SPARSE.idx[r.choice(SPARSE.n, size=4, replace=False)]))
                  for r in rng for _ in range(10))
    values = sum(r.nbytes for r in result.trace.records if r.op == "send")
    headers = 40 * 4 * 8                         # four messages a step, a few scalars each at most
    assert 4 * 8 * touched <= values <= 4 * 8 * touched + headers


def test_sparse_parameter_server_names_a_bad_batch_or_step_count():
    with pytest.raises(RankError, match=r"batch must be in 1..300 \(the examples\), got 0"):
        dsml.run(sparse_parameter_server, 2, network=NET, args=(SPARSE, 3, 1.0, 0))
    with pytest.raises(RankError, match=r"steps must be an integer ≥ 1, got 0"):
        dsml.run(sparse_parameter_server, 2, network=NET, args=(SPARSE, 0, 1.0, 4))


# --- a worker that dies (failures="notify") -----------------------------------------------------

ENGINES = ["sim", "threads", "processes"]


def run_notify(program, world, engine, args=(), kwargs=None):
    if engine == "sim":
        return dsml.run(program, world, network=NET, args=args, kwargs=kwargs,
                        failures="notify")
    return dsml.run(program, world, engine=engine, args=args, kwargs=kwargs, timeout=60,
                    failures="notify")


@pytest.mark.parametrize("engine", ENGINES)
def test_an_asynchronous_server_outlives_a_worker_that_dies_and_reports_it(engine,
                                                                           nothing_left_behind):
    result = run_notify(parameter_server, 5, engine, (1, model(), X, Y),
                        dict(steps=6, lr=0.1, batch=BATCH, seed=3, seconds_per_step=1e-3,
                             fail_at={3: 2}))
    log = result.values[0]
    assert list(result.failed) == [3] and "crashed at step 2" in str(result.failed[3])
    assert result.values[3] is result.failed[3]
    assert [rank for rank, _ in log["failures"]] == [3]
    assert len(log["updates"]) == 3 * 6 + 2       # the dead worker's two pushes were applied
    assert sorted({u.worker for u in log["updates"]}) == [1, 2, 3, 4]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("bound", [0, 1])
def test_a_bounded_server_does_not_wait_for_a_dead_slowest_worker(bound, engine,
                                                                  nothing_left_behind):
    result = run_notify(parameter_server, 4, engine, (1, model(), X, Y),
                        dict(steps=8, lr=0.1, batch=BATCH, seed=3, bound=bound,
                             seconds_per_step=1e-3, speeds=[1.0, 1.0, 4.0], fail_at={3: 1}))
    assert len(result.values[0]["updates"]) == 2 * 8 + 1
    assert list(result.failed) == [3]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_synchronous_server_stops_with_a_clear_error_instead_of_waiting_forever(
        engine, nothing_left_behind):
    result = run_notify(parameter_server, 4, engine, (1, model(), X, Y),
                        dict(steps=6, lr=0.1, batch=BATCH, seed=3, mode="bsp", fail_at={2: 3}))
    assert "server 0: worker 2 failed; a synchronous step needs every worker's gradient" in \
        str(result.failed[0])
    assert set(result.failed) >= {0, 2}       # the others then learn that their server failed


def test_without_notify_a_dying_worker_fails_the_run_naming_it():
    with pytest.raises(RankError, match=r"rank 2 failed .* crashed at step 3"):
        run_ps(4, 1, fail_at={2: 3})


def after_its_messages(comm):
    from dsml.comm.failures import PeerFailed

    if comm.rank == 1:
        yield comm.send(0, np.ones(2))
        yield comm.send(0, np.ones(10_000))       # large: shared memory on processes
        raise ValueError("gone")
    first = yield comm.recv(1)                    # sent before the failure: still delivered
    second = yield comm.recv(1)
    try:
        yield comm.recv(1)
    except PeerFailed as failure:
        caught = (failure.rank, str(failure))
    try:                                          # every later receive from it raises too
        yield comm.sendrecv(1, np.zeros(3), 1)
    except PeerFailed:
        return float(first.sum() + second.sum()), caught
    return None


@pytest.mark.parametrize("engine", ENGINES)
def test_a_receive_from_a_failed_rank_raises_peer_failed_after_its_messages(
        engine, nothing_left_behind):
    result = run_notify(after_its_messages, 2, engine)
    assert result.values[0] == (10_002.0, (1, "rank 1 failed: ValueError: gone"))
    assert isinstance(result.failed[1], ValueError) and result.values[1] is result.failed[1]


def any_source_after_a_failure(comm):
    """Rank 1 sends once and fails; rank 2 sends twice and returns. Rank 0 takes messages from
    anyone until every other rank is accounted for: the failure arrives exactly once."""
    from dsml.comm.failures import PeerFailed

    if comm.rank == 1:
        yield comm.send(0, 10)
        raise RuntimeError("down")
    if comm.rank == 2:
        yield comm.send(0, 20)
        yield comm.send(0, 30)
        return None
    got, failures = [], []
    while len(got) + len(failures) < 4:
        try:
            got.append((yield comm.recv_any()))
        except PeerFailed as failure:
            failures.append(failure.rank)
    return sorted(got), failures


@pytest.mark.parametrize("engine", ENGINES)
def test_a_receive_from_any_source_learns_of_a_failure_once(engine, nothing_left_behind):
    result = run_notify(any_source_after_a_failure, 3, engine)
    assert result.values[0] == ([(1, 10), (2, 20), (2, 30)], [1])
    assert list(result.failed) == [1]


def test_notify_is_refused_on_mpi_and_bad_modes_are_named():
    with pytest.raises(ValueError, match="failures='notify' does not run on engine='mpi'"):
        dsml.run(gather_any, 2, engine="mpi", args=({1: 0},), failures="notify")
    with pytest.raises(ValueError, match="failures must be 'stop' or 'notify'"):
        dsml.run(gather_any, 2, network=NET, args=({1: 0},), failures="ignore")


def sends_then_dies(comm, nbytes):
    """Rank 1 sends rank 0 a large message and fails as soon as it has left; rank 0 receives
    twice from rank 1: the message, then the notice."""
    from dsml.comm.failures import PeerFailed

    if comm.rank == 1:
        yield comm.send(0, np.ones(nbytes // 8))
        raise RuntimeError("gone right after sending")
    first = yield comm.recv(1)
    try:
        yield comm.recv(1)
    except PeerFailed as failure:
        return float(first.sum()), failure.rank, (yield comm.now())
    return None


def test_on_a_multi_hop_network_the_notice_arrives_behind_the_rank_s_last_message():
    # Two machines over a slow core link: the message leaves rank 1 long before it reaches
    # rank 0, and rank 1 fails in between. The notice follows the message along its route.
    net = dsml.net.two_level(2, 1, inter_latency=1e-3, inter_bandwidth=1e8)
    result = dsml.run(sends_then_dies, 2, network=net, args=(8 * 1024,), failures="notify")
    total, rank, noticed_at = result.values[0]
    assert (total, rank) == (1024.0, 1)
    failed_at = result.finish_times[1]
    delivered = max(r.end for r in result.trace.of_rank(0) if r.op == "recv" and r.src == 1)
    assert failed_at < delivered <= noticed_at      # the message was still on its way


def test_on_one_hop_the_notice_is_there_at_once():
    result = dsml.run(sends_then_dies, 2, network=NET, args=(8 * 1024,), failures="notify")
    assert result.values[0][:2] == (1024.0, 1)
    assert result.values[0][2] == result.finish_times[1]
