"""Tests of dsml.fault: failure models, failure schedules, stragglers, Young/Daly intervals,
the checkpointed job (rank program and NumPy version), async checkpoints, published data."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsml.comm.run import run
from dsml.fault import (LLAMA3_INTERRUPTIONS, LLAMA3_UNEXPECTED_BY_COMPONENT, OPT175B_RESTARTS,
                        ExponentialFailures, FailureSchedule, Stragglers, WeibullFailures,
                        checkpointed_job, daly_interval, expected_wall_time, failure_schedule,
                        first_failure_times, interruption_statistics, job_mtbf,
                        renewal_failure_times, simulate_checkpointed_jobs, synchronous_steps,
                        waste_fraction, young_interval)
from dsml.net import AlphaBeta

FREE = AlphaBeta(0.0, 0.0)
BAD_POSITIVE = [0, -1.0, float("nan"), float("inf"), -float("inf"), True, "3", None]


def run_job(work, interval, cost, restart, crash_times, horizon, write_time=0.0):
    schedule = FailureSchedule([(t, 0) for t in crash_times if np.isfinite(t)], 1, horizon)
    result = run(checkpointed_job, 1, engine="sim", network=FREE, trace=False,
                 args=(work, interval, cost, restart, schedule, write_time))
    return result.values[0]


# -- Young and Daly -------------------------------------------------------------------------

@pytest.mark.parametrize("cost, mtbf", [(1.0, 1.0), (300.0, 14400.0), (60.0, 3600.0 * 24),
                                        (0.5, 7.0), (9.0, 4.9)])
def test_young_and_daly_match_their_formulas(cost, mtbf):
    assert young_interval(cost, mtbf) == pytest.approx((2 * cost * mtbf) ** 0.5, rel=1e-15)
    r = cost / (2 * mtbf)
    daly = (2 * cost * mtbf) ** 0.5 * (1 + r ** 0.5 / 3 + r / 9) - cost
    assert daly_interval(cost, mtbf) == pytest.approx(daly, rel=1e-14)


def test_daly_branch_for_costly_checkpoints():
    assert daly_interval(2.0, 1.0) == 1.0        # δ = 2M: the branch starts here
    assert daly_interval(50.0, 3.0) == 3.0
    below = daly_interval(2.0 - 1e-9, 1.0)
    # Daly's expansion at δ → 2M gives 2·[1 + 1/3 + 1/9] − 2 = 8/9, not M: the branch jumps.
    assert below == pytest.approx(8 / 9, rel=1e-6)


@pytest.mark.parametrize("ratio", [1e-4, 1e-3, 1e-2, 0.05, 0.2])
def test_daly_is_nearer_the_exact_optimum_than_young(ratio):
    mtbf, restart = 3600.0, 120.0
    cost = ratio * mtbf
    work = 1000 * mtbf
    young, daly = young_interval(cost, mtbf), daly_interval(cost, mtbf)
    grid = np.geomspace(young / 4, young * 4, 20001)
    walls = expected_wall_time(work, grid, cost, restart, mtbf)
    best = grid[np.argmin(walls)]
    assert abs(daly - best) < abs(young - best)
    # Waste at either interval is within a small amount of the optimum's (the flat bottom).
    best_waste = waste_fraction(work, walls.min())
    for tau in (young, daly):
        waste = waste_fraction(work, expected_wall_time(work, tau, cost, restart, mtbf))
        assert waste - best_waste < 0.02 * max(best_waste, 1e-3) + 1e-4


@pytest.mark.parametrize("function", [young_interval, daly_interval])
@pytest.mark.parametrize("bad", BAD_POSITIVE)
def test_intervals_refuse_bad_inputs(function, bad):
    with pytest.raises(ValueError, match="checkpoint_cost"):
        function(bad, 100.0)
    with pytest.raises(ValueError, match="mtbf"):
        function(10.0, bad)


# -- the closed form --------------------------------------------------------------------------

def reference_wall_time(work, interval, cost, restart, mtbf):
    """An independent loop over segments of Daly's per-segment expectation."""
    total, left = 0.0, work
    while left > 1e-9 * work:
        piece = min(interval, left)
        left -= piece
        seconds = piece + (cost if left > 1e-9 * work else 0.0)
        total += mtbf * math.exp(restart / mtbf) * (math.exp(seconds / mtbf) - 1)
    return total


@pytest.mark.parametrize("work, interval", [(100.0, 7.0), (100.0, 30.0), (100.0, 250.0),
                                            (1.0, 0.3), (3600.0, 600.0 * 1.7)])
def test_expected_wall_time_against_a_segment_loop(work, interval):
    for cost, restart, mtbf in [(5.0, 0.0, 50.0), (0.0, 3.0, 400.0), (2.0, 10.0, 30.0)]:
        assert expected_wall_time(work, interval, cost, restart, mtbf) == pytest.approx(
            reference_wall_time(work, interval, cost, restart, mtbf), rel=1e-12)


def test_expected_wall_time_vectorized_and_bad_inputs():
    taus = np.array([5.0, 10.0, 40.0])
    walls = expected_wall_time(100.0, taus, 2.0, 1.0, 60.0)
    assert walls.shape == (3,)
    for tau, wall in zip(taus, walls):
        assert wall == expected_wall_time(100.0, float(tau), 2.0, 1.0, 60.0)
    for kwargs, name in [(dict(work=0), "work"), (dict(mtbf=-1), "mtbf"),
                         (dict(checkpoint_cost=-1), "checkpoint_cost"),
                         (dict(restart_cost=float("nan")), "restart_cost"),
                         (dict(interval=0.0), "interval"),
                         (dict(interval=np.array([1.0, -2.0])), "interval")]:
        args = dict(work=100.0, interval=10.0, checkpoint_cost=1.0, restart_cost=1.0, mtbf=50.0)
        args.update(kwargs)
        with pytest.raises(ValueError, match=name):
            expected_wall_time(**args)


# -- failure models -------------------------------------------------------------------------

@pytest.mark.parametrize("nodes", [1, 3, 10, 257])
def test_job_mtbf_measured_against_the_formula(nodes):
    rng = np.random.default_rng(nodes)
    samples = first_failure_times(ExponentialFailures(1000.0), nodes, 4000, rng)
    standard_error = samples.std() / math.sqrt(samples.size)
    assert abs(samples.mean() - job_mtbf(1000.0, nodes)) < 4 * standard_error


@pytest.mark.parametrize("nodes", [8, 100])
def test_weibull_first_failure_departs_from_m_over_n(nodes):
    """The case where the measurement must differ from M/N: Weibull k = 0.7."""
    rng = np.random.default_rng(1)
    model = WeibullFailures(1000.0, 0.7)
    samples = first_failure_times(model, nodes, 4000, rng)
    standard_error = samples.std() / math.sqrt(samples.size)
    assert samples.mean() < job_mtbf(1000.0, nodes) - 10 * standard_error
    assert abs(samples.mean() - model.first_failure_mean(nodes)) < 4 * standard_error
    # Shape 1 is the exponential: the same mean of the min.
    assert WeibullFailures(1000.0, 1.0).first_failure_mean(nodes) == pytest.approx(1000 / nodes)


def test_failure_models_have_the_stated_mean():
    rng = np.random.default_rng(2)
    for model in (ExponentialFailures(50.0), WeibullFailures(50.0, 0.7),
                  WeibullFailures(50.0, 3.0)):
        draws = model.lifetimes(rng, 200000)
        assert abs(draws.mean() - 50.0) < 5 * draws.std() / math.sqrt(draws.size)


@pytest.mark.parametrize("bad", BAD_POSITIVE)
def test_failure_models_refuse_bad_parameters(bad):
    with pytest.raises(ValueError, match="mtbf"):
        ExponentialFailures(bad)
    with pytest.raises(ValueError, match="shape"):
        WeibullFailures(10.0, bad)
    with pytest.raises(ValueError, match="mtbf_node"):
        job_mtbf(bad, 4)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_counts_refuse_bad_values(bad):
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="nodes"):
        job_mtbf(10.0, bad)
    with pytest.raises(ValueError, match="nodes"):
        first_failure_times(ExponentialFailures(10.0), bad, 10, rng)
    with pytest.raises(ValueError, match="samples"):
        first_failure_times(ExponentialFailures(10.0), 4, bad, rng)


# -- renewal failure times and schedules ------------------------------------------------------

@pytest.mark.parametrize("streams, horizon", [(0, 10.0), (1, 0.5), (5, 100.0), (40, 1000.0)])
def test_renewal_failure_times_cover_the_horizon(streams, horizon):
    rng = np.random.default_rng(3)
    times = renewal_failure_times(ExponentialFailures(7.0), streams, horizon, rng)
    assert times.shape[0] == streams
    if streams:
        assert np.all(np.isinf(times[:, -1]))        # a final "never again" column
        finite = np.isfinite(times)
        assert np.all(times[finite] < horizon) and np.all(times[finite] > 0)
        assert np.all(np.diff(np.where(finite, times, 2 * horizon), axis=1) >= 0)


def test_renewal_rate_is_n_over_m_for_any_shape():
    rng = np.random.default_rng(4)
    for model in (ExponentialFailures(10.0), WeibullFailures(10.0, 0.7)):
        times = renewal_failure_times(model, 50, 20000.0, rng)
        rate = np.isfinite(times).sum() / 20000.0
        assert rate == pytest.approx(50 / 10.0, rel=0.03)


def test_failure_schedule_is_seeded_sorted_and_answers_next_failure():
    a = failure_schedule(6, 100.0, 1000.0, np.random.default_rng(9))
    b = failure_schedule(6, 100.0, 1000.0, np.random.default_rng(9))
    assert list(a) == list(b) and len(a) > 0
    times = [t for t, _ in a]
    assert times == sorted(times)
    for rank in range(6):
        mine = a.times_of(rank)
        assert mine == sorted(t for t, r in a if r == rank)
        assert a.next_failure(rank) == (mine[0] if mine else math.inf)
        for i, t in enumerate(mine):
            following = mine[i + 1] if i + 1 < len(mine) else math.inf
            assert a.next_failure(rank, after=t) == following
            assert a.next_failure(rank, after=t - 1e-9) == t
    assert a.first_failure() == a[0]
    weibull = failure_schedule(6, 100.0, 1000.0, np.random.default_rng(9), weibull_shape=0.7)
    assert list(weibull) != list(a)


def test_failure_schedule_edge_cases():
    empty = failure_schedule(0, 10.0, 5.0, np.random.default_rng(0))
    assert len(empty) == 0 and empty.first_failure() == (math.inf, -1)
    none = FailureSchedule([], 2, 5.0)
    assert none.next_failure(1, after=0.0) == math.inf
    hand = FailureSchedule([(3.0, 1), (1.0, 0), (2.0, 1)], 2, 5.0)
    assert list(hand) == [(1.0, 0), (2.0, 1), (3.0, 1)]
    assert hand.next_failure(1, after=2.0) == 3.0 and hand.times_of(1) == [2.0, 3.0]


def test_failure_schedule_refuses_bad_input():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="ranks"):
        failure_schedule(-1, 10.0, 5.0, rng)
    with pytest.raises(ValueError, match="mtbf"):
        failure_schedule(2, 0.0, 5.0, rng)
    with pytest.raises(ValueError, match="horizon"):
        failure_schedule(2, 10.0, -5.0, rng)
    with pytest.raises(ValueError, match="weibull_shape"):
        failure_schedule(2, 10.0, 5.0, rng, weibull_shape=0)
    with pytest.raises(ValueError, match="rank 2"):
        FailureSchedule([(1.0, 2)], 2, 5.0)
    with pytest.raises(ValueError, match="outside"):
        FailureSchedule([(6.0, 0)], 2, 5.0)
    schedule = FailureSchedule([(1.0, 0)], 2, 5.0)
    for bad in (-1, 2, 1.0, True):
        with pytest.raises(ValueError, match="rank must be"):
            schedule.next_failure(bad)


# -- stragglers -----------------------------------------------------------------------------

@pytest.mark.parametrize("ranks, steps", [(1, 3), (3, 5), (5, 1), (8, 4)])
def test_synchronous_steps_take_the_slowest_rank(ranks, steps):
    rng = np.random.default_rng(ranks)
    times = Stragglers(0.1, 0.2, 0.3).step_times(0.05, steps, ranks, rng)
    assert times.shape == (steps, ranks) and np.all(times > 0)
    result = run(synchronous_steps, ranks, engine="sim", network=FREE, args=(times,), trace=False)
    assert result.values[0] == pytest.approx(np.cumsum(times.max(axis=1)), rel=1e-12)
    if ranks > 1 and steps > 1:
        # The case where the mean would be wrong: unequal ranks make the job slower.
        assert result.time > np.sum(times.mean(axis=1)) * (1 + 1e-6)


def test_no_stragglers_means_equal_steps_and_bad_parameters():
    rng = np.random.default_rng(0)
    times = Stragglers(0.0, 0.0, 1.0).step_times(0.2, 4, 3, rng)
    assert np.array_equal(times, np.full((4, 3), 0.2))
    assert Stragglers().step_times(0.2, 0, 3, rng).shape == (0, 3)
    with pytest.raises(ValueError, match="long_delay_probability"):
        Stragglers(0.1, 1.5, 1.0)
    with pytest.raises(ValueError, match="slowdown_sigma"):
        Stragglers(-0.1, 0.1, 1.0)
    with pytest.raises(ValueError, match="long_delay_mean"):
        Stragglers(0.1, 0.1, float("nan"))
    with pytest.raises(ValueError, match="steps"):
        Stragglers().step_times(0.2, -1, 3, rng)
    with pytest.raises(ValueError, match="step_time"):
        Stragglers().step_times(0.0, 1, 3, rng)


# -- the checkpointed job -------------------------------------------------------------------

@pytest.mark.parametrize("work, interval", [(1000.0, 100.0), (1000.0, 70.0), (1000.0, 1500.0),
                                            (1000.0, 1000.0), (37.0, 5.5)])
@pytest.mark.parametrize("cost", [0.0, 3.0])
def test_without_crashes_the_job_pays_only_checkpoints(work, interval, cost):
    pieces = math.ceil(work / interval)
    job = run_job(work, interval, cost, 9.0, [], 10 * work)
    assert job["checkpoints"] == pieces - 1 and job["failures"] == 0
    assert job["wall"] == pytest.approx(work + cost * (pieces - 1), rel=1e-12)
    fast = simulate_checkpointed_jobs(work, interval, cost, 9.0, np.full((1, 1), np.inf),
                                      10 * work)
    assert fast["wall"][0] == pytest.approx(job["wall"], rel=1e-12)


def test_a_crash_by_hand_sync_and_async():
    """W = 1000 s, τ = 100 s, R = 10 s, one crash at 120 s. Synchronous (δ = 1 s): the checkpoint
    at 101 s holds, 900 s of work remain → 130 + 900 + 8·1 = 1038 s. Asynchronous (snapshot 1 s,
    write 50 s): the write would finish at 151 s, so the crash rolls back to 0 → 130 + 1000 + 9
    = 1139 s, and 100 s of finished work are redone."""
    sync = run_job(1000.0, 100.0, 1.0, 10.0, [120.0], 5000.0)
    assert sync["wall"] == pytest.approx(1038.0) and sync["rolled_back"] == 0.0
    assert sync["lost"] == pytest.approx(19.0) and sync["failures"] == 1
    asyn = run_job(1000.0, 100.0, 1.0, 10.0, [120.0], 5000.0, write_time=50.0)
    assert asyn["wall"] == pytest.approx(1139.0) and asyn["rolled_back"] == pytest.approx(100.0)
    # A crash after the write finished keeps the checkpoint: crash at 160 s → 170 + 900 + 8.
    later = run_job(1000.0, 100.0, 1.0, 10.0, [160.0], 5000.0, write_time=50.0)
    assert later["wall"] == pytest.approx(1078.0)
    for crash, write, expected in [(120.0, 0.0, 1038.0), (120.0, 50.0, 1139.0),
                                   (160.0, 50.0, 1078.0)]:
        fast = simulate_checkpointed_jobs(1000.0, 100.0, 1.0, 10.0,
                                          np.array([[crash, np.inf]]), 5000.0, write_time=write)
        assert fast["wall"][0] == pytest.approx(expected)


def test_a_crash_during_the_restart_restarts_it():
    # Crashes at 120 s and 125 s, R = 10 s: the restart ends at 135 s; 900 s of work remain.
    job = run_job(1000.0, 100.0, 1.0, 10.0, [120.0, 125.0], 5000.0)
    assert job["wall"] == pytest.approx(135 + 900 + 8) and job["failures"] == 2
    assert job["restart"] == pytest.approx(15.0)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10**6), interval=st.floats(20.0, 3000.0),
       cost=st.sampled_from([0.0, 1.0, 40.0]), restart=st.sampled_from([0.0, 30.0]),
       write=st.sampled_from([0.0, 25.0, 400.0]))
def test_rank_program_and_numpy_version_agree(seed, interval, cost, restart, write):
    rng = np.random.default_rng(seed)
    work, mtbf = 2000.0, 500.0
    horizon = 200 * work
    crashes = renewal_failure_times(ExponentialFailures(mtbf), 3, horizon, rng)
    fast = simulate_checkpointed_jobs(work, interval, cost, restart, crashes, horizon,
                                      write_time=write)
    for r in range(3):
        job = run_job(work, interval, cost, restart, crashes[r], horizon, write_time=write)
        assert job["wall"] == pytest.approx(fast["wall"][r], rel=1e-11)
        assert job["failures"] == fast["failures"][r]
        assert job["checkpoints"] == fast["checkpoints"][r]
        assert job["checkpoint"] == pytest.approx(fast["checkpoint"][r], rel=1e-9, abs=1e-6)
        assert job["restart"] == pytest.approx(fast["restart"][r], rel=1e-9, abs=1e-6)


@pytest.mark.parametrize("interval", [300.0, 1234.5, 5000.0, 20000.0])
def test_monte_carlo_matches_dalys_closed_form(interval):
    rng = np.random.default_rng(int(interval))
    work, cost, restart, mtbf, runs = 20000.0, 60.0, 120.0, 3000.0, 3000
    expected = expected_wall_time(work, interval, cost, restart, mtbf)
    horizon = 10 * expected
    crashes = renewal_failure_times(ExponentialFailures(mtbf), runs, horizon, rng)
    wall = simulate_checkpointed_jobs(work, interval, cost, restart, crashes, horizon)["wall"]
    assert abs(wall.mean() - expected) < 4 * wall.std() / math.sqrt(runs)


def test_monte_carlo_departs_from_the_closed_form_for_weibull_failures():
    rng = np.random.default_rng(5)
    work, cost, restart, mtbf, runs = 100000.0, 60.0, 120.0, 3000.0, 3000
    interval = young_interval(cost, mtbf)
    expected = expected_wall_time(work, interval, cost, restart, mtbf)
    horizon = 10 * expected
    crashes = renewal_failure_times(WeibullFailures(mtbf, 0.6), runs, horizon, rng)
    wall = simulate_checkpointed_jobs(work, interval, cost, restart, crashes, horizon)["wall"]
    assert abs(wall.mean() - expected) > 6 * wall.std() / math.sqrt(runs)


def test_measured_waste_at_young_is_near_the_measured_minimum():
    rng = np.random.default_rng(8)
    work, cost, restart, mtbf, runs = 50000.0, 30.0, 60.0, 2000.0, 600
    young = young_interval(cost, mtbf)
    taus = young * np.geomspace(0.25, 4, 9)
    horizon = 4 * expected_wall_time(work, taus, cost, restart, mtbf).max()
    crashes = renewal_failure_times(ExponentialFailures(mtbf), runs, horizon, rng)
    waste = [waste_fraction(work, simulate_checkpointed_jobs(
        work, tau, cost, restart, crashes, horizon)["wall"]).mean() for tau in taus]
    at_young = waste_fraction(work, simulate_checkpointed_jobs(
        work, young, cost, restart, crashes, horizon)["wall"]).mean()
    assert at_young - min(waste) < 5e-3
    assert max(waste) - min(waste) > 0.05          # the grid's ends are clearly worse


def test_async_effective_cost_per_checkpoint():
    for interval, write in [(100.0, 50.0), (100.0, 100.0), (40.0, 100.0), (30.0, 250.0)]:
        job = run_job(1000.0, interval, 2.0, 5.0, [], 1e5, write_time=write)
        n = job["checkpoints"]
        expected = 2.0 * n + (n - 1) * max(0.0, write - interval)
        assert job["wall"] - 1000.0 == pytest.approx(expected, rel=1e-9)
        assert job["checkpoint"] == pytest.approx(expected, rel=1e-9)


def test_job_refuses_bad_input():
    schedule = FailureSchedule([], 1, 100.0)
    for args, name in [((0.0, 10.0, 1.0, 1.0), "work"), ((100.0, -1.0, 1.0, 1.0), "interval"),
                       ((100.0, 10.0, -1.0, 1.0), "checkpoint_cost"),
                       ((100.0, 10.0, 1.0, float("inf")), "restart_cost")]:
        with pytest.raises(ValueError, match=name):
            next(checkpointed_job(None, *args, schedule))
        with pytest.raises(ValueError, match=name):
            simulate_checkpointed_jobs(*args, np.full((2, 1), np.inf), 100.0)
    with pytest.raises(ValueError, match="write_time"):
        next(checkpointed_job(None, 100.0, 10.0, 1.0, 1.0, schedule, -5.0))
    with pytest.raises(ValueError, match="failure_times"):
        simulate_checkpointed_jobs(100.0, 10.0, 1.0, 1.0, np.zeros(3), 100.0)
    with pytest.raises(ValueError, match="horizon"):
        simulate_checkpointed_jobs(100.0, 10.0, 1.0, 1.0, np.full((1, 1), np.inf), 50.0)
    with pytest.raises(ValueError, match="interval"):
        simulate_checkpointed_jobs(100.0, np.array([10.0, 0.0]), 1.0, 1.0,
                                   np.full((2, 1), np.inf), 500.0)


# -- published data -------------------------------------------------------------------------

def test_llama3_and_opt_data_and_statistics():
    llama = LLAMA3_INTERRUPTIONS
    assert llama["planned"] + llama["unexpected"] == llama["total"] == 466
    assert sum(c for _, _, c in LLAMA3_UNEXPECTED_BY_COMPONENT) == llama["unexpected"] == 419
    stats = interruption_statistics(419, 54, 16384)
    assert stats["per_day"] == pytest.approx(419 / 54)
    assert stats["mtbf_job"] == pytest.approx(54 * 86400 / 419)
    assert stats["mtbf_gpu"] == pytest.approx(54 * 86400 / 419 * 16384)
    assert job_mtbf(stats["mtbf_gpu"], 16384) == pytest.approx(stats["mtbf_job"])
    assert OPT175B_RESTARTS["gpus"] == 992


@pytest.mark.parametrize("args, name", [((0, 54, 10), "interruptions"), ((-3, 54, 10), "interruptions"),
                                        ((5, 0, 10), "days"), ((5, -1.0, 10), "days"),
                                        ((5, 54, 0), "gpus"), ((5, 54, 2.5), "gpus")])
def test_interruption_statistics_refuses_bad_input(args, name):
    with pytest.raises(ValueError, match=name):
        interruption_statistics(*args)


def test_the_batch_speed_path_does_not_import_dsml_fault_back():
    # dsml.fault (week 6) imports dsml.fault_batch; an import back would make a circle.
    import ast
    from pathlib import Path
    import dsml.fault_batch
    tree = ast.parse(Path(dsml.fault_batch.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names}
    assert "dsml.fault" not in imported and "dsml" not in imported, imported
