"""The capstone (dsml.capstone): elastic data parallelism with a compressed ring all-reduce,
scheduled failures, stragglers and checkpoints, and its time ledger."""
import math
from types import SimpleNamespace

import numpy as np
import pytest

from dsml.capstone import (CATEGORIES, capstone_report, capstone_train, checkpoint_steps,
                           make_compressor, time_to_target)
from dsml.comm.run import run
from dsml.compression import Dense
from dsml.elastic import TrainingLost, elastic_outcome, elastic_train, replay
from dsml.fault import FailureSchedule, Stragglers, young_interval
from dsml.net import AlphaBeta, two_level
from dsml.train import MLP, digits
from dsml.train.optim import Adam

X_TRAIN, Y_TRAIN, X_TEST, Y_TEST = digits()
SIZES = (64, 16, 10)
NETWORK = AlphaBeta(alpha=5e-6, beta=1e-9)


def capstone(world, steps=12, batch=50, network=NETWORK, **kwargs):
    settings = dict(seconds_per_sample=1e-4, detect_seconds=1e-3, seed=3)
    settings.update(kwargs)
    return run(capstone_train, world, engine="sim", network=network, failures="notify",
               args=(MLP(SIZES, seed=3), Adam(0.01), X_TRAIN, Y_TRAIN, X_TEST, Y_TEST, steps,
                     batch, 0.01), kwargs=settings)


def full_run(world=6, steps=16, **kwargs):
    """Failures, a spare, stragglers, top-k with error feedback and costly checkpoints."""
    schedule = FailureSchedule([(0.004, 2), (0.011, 0), (0.5, 4)], world, 1.0)
    factors = Stragglers(0.2, 0.1, 2.0).step_times(1.0, steps, world, np.random.default_rng(1))
    settings = dict(joins={world - 1: 5}, failures=schedule, compute_factors=factors,
                    compressor="topk", compressor_setting=0.2, checkpoint_every=3,
                    checkpoint_seconds=2e-3)
    settings.update(kwargs)
    return capstone(world, steps=steps, network=two_level(3, 2), **settings)


def test_ledger_adds_up_to_each_ranks_wall_time_and_goodputs_in_range():
    result = full_run()
    report = capstone_report(result)
    assert sorted(result.failed) == [0, 2]              # rank 4's failure comes after the end
    for rank, seconds in report["breakdown"].items():
        assert set(seconds) == set(CATEGORIES)
        assert all(value >= 0 for value in seconds.values())
        assert math.isclose(sum(seconds.values()) + report["spare"][rank], report["ends"][rank],
                            rel_tol=1e-9)
    # a failed rank's wall time ends where it failed, a finished rank's at the run's end
    assert report["ends"][2] == pytest.approx(result.failed[2].end)
    assert max(report["ends"].values()) == pytest.approx(result.time)
    assert 0 < report["mfu"] < report["effective_training_time"] < 1
    totals = {c: sum(s[c] for s in report["breakdown"].values()) for c in CATEGORIES}
    assert totals["lost"] > 0 and totals["recovery"] > 0 and totals["checkpoint"] > 0
    # MFU: the kept samples at nominal speed (1e-4 s each) over the rank-seconds in the job
    assert report["mfu"] == pytest.approx(16 * 50 * 1e-4 / report["job_seconds"])
    # ETT: kept steps' compute and communication; the finish agreement is neither
    kept = totals["compute"] + totals["communication"]
    assert report["effective_training_time"] < kept / report["job_seconds"]


def test_samples_are_accounted_as_elastic_accounts_them():
    steps, batch = 16, 50
    result = full_run(steps=steps, compressor="none")
    report = capstone_report(result)
    history = report["history"]
    assert [r["step"] for r in history] == list(range(steps))
    cursors = [r["cursor"] for r in history]
    assert cursors == [batch * k for k in range(steps)]   # no gap, no repeat in the stream
    assert report["samples"] == steps * batch
    for record in history:
        assert sum(record["shard_sizes"]) == batch
        assert len(record["shard_sizes"]) == len(record["members"])
    computed = report["computed_samples"]
    assert sorted(computed) == list(range(6))             # the failed ranks' too
    assert computed[2] > 0 and computed[5] < computed[1]  # rank 5 joined late
    assert sum(computed.values()) > steps * batch         # rolled-back work was computed too
    # without compression the committed history replays to the same model
    model = MLP(SIZES, seed=3)
    replay(model, Adam(0.01), X_TRAIN, Y_TRAIN, history, seed=3)
    for name, value in model.params.items():
        np.testing.assert_allclose(report["params"][name], value, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("world,batch,steps", [(1, 20, 5), (3, 50, 9), (4, 64, 8), (5, 37, 7)])
def test_without_failures_stragglers_or_compression_equals_elastic(world, batch, steps):
    ours = capstone(world, steps=steps, batch=batch, compressor="none", checkpoint_every=2)
    theirs = run(elastic_train, world, engine="sim", network=NETWORK, failures="notify",
                 args=(MLP(SIZES, seed=3), Adam(0.01), X_TRAIN, Y_TRAIN, steps, batch, 0.01),
                 kwargs=dict(seed=3, checkpoint_every=2))
    mine, reference = capstone_report(ours), elastic_outcome(theirs)
    for name, value in reference["params"].items():
        np.testing.assert_allclose(mine["params"][name], value, rtol=1e-10, atol=1e-13)
    drop = ("loss",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in mine["history"]] == \
        [{k: v for k, v in r.items() if k not in drop} for r in reference["history"]]
    np.testing.assert_allclose([r["loss"] for r in mine["history"]],
                               [r["loss"] for r in reference["history"]], rtol=1e-12)
    assert all(s["lost"] == 0 and s["recovery"] == 0 for s in mine["breakdown"].values())


@pytest.mark.parametrize("compressor,setting", [("topk", 0.1), ("powersgd", 2)])
def test_compressed_replicas_stay_identical_and_learn(compressor, setting):
    result = capstone(4, steps=40, batch=64, compressor=compressor, compressor_setting=setting)
    report = capstone_report(result)        # elastic_outcome: every replica bit-identical
    assert len(result.values) == 4
    assert report["curve"][-1][2] > 0.4     # four times chance (0.1) after 40 compressed steps
    assert time_to_target(report["curve"], 0.4) < result.time


def test_measured_compute_follows_the_straggler_factors_not_the_nominal_time():
    world, steps, batch, per_sample = 3, 6, 50, 1e-4
    factors = np.linspace(1.0, 3.0, steps * world).reshape(steps, world)
    result = capstone(world, steps=steps, batch=batch, compressor="none", compute_factors=factors,
                      seconds_per_sample=per_sample)
    report = capstone_report(result)
    for rank in range(world):
        shard = [r["shard_sizes"][rank] for r in report["history"]]
        expected = sum(per_sample * s * factors[k, rank] for k, s in enumerate(shard))
        nominal = per_sample * sum(shard)
        assert report["breakdown"][rank]["compute"] == pytest.approx(expected, rel=1e-9)
        assert report["breakdown"][rank]["compute"] > 1.5 * nominal
    # the slowest rank sets the pace: the others wait for it, in communication
    assert report["breakdown"][0]["communication"] > report["breakdown"][2]["communication"]


def test_same_seed_gives_the_same_run():
    first, second = full_run(), full_run()
    assert len(first.trace.records) > 100
    assert list(first.trace.records) == list(second.trace.records)
    a, b = capstone_report(first), capstone_report(second)
    assert a["breakdown"] == b["breakdown"] and a["curve"] == b["curve"]
    assert a["effective_training_time"] == b["effective_training_time"]
    assert a["mfu"] == b["mfu"]


def test_effective_training_time_ignores_stragglers_mfu_does_not():
    """A slow step is still a kept step: ETT stays near 1 without failures, whatever the
    stragglers, while MFU falls; failures lower ETT."""
    world, steps = 4, 12
    slow = np.ones((steps, world))
    slow[:, 1] = 3.0                                   # rank 1 three times slower every step
    even = capstone_report(capstone(world, steps=steps, compressor="dense",
                                    checkpoint_every=steps + 1))
    lagging = capstone_report(capstone(world, steps=steps, compressor="dense",
                                       checkpoint_every=steps + 1, compute_factors=slow))
    assert even["effective_training_time"] > 0.97
    assert lagging["effective_training_time"] == pytest.approx(even["effective_training_time"],
                                                               abs=0.02)
    assert lagging["mfu"] < 0.6 * even["mfu"]
    failing = capstone_report(capstone(world, steps=steps, compressor="dense", checkpoint_every=4,
                                       failures=FailureSchedule([(0.006, 2)], world, 1.0)))
    assert failing["effective_training_time"] < even["effective_training_time"] - 0.05


def test_dense_sends_fp32_over_the_ring():
    """The "dense" baseline rounds the gradient to fp32 for the wire: its result agrees with
    the exact float64 run ("none") to fp32 precision, and is not identical to it."""
    exact = capstone(3, steps=4, compressor="none")
    single = capstone(3, steps=4, compressor="dense")
    assert isinstance(make_compressor("dense", 0, [(3,)]), Dense)
    a, b = capstone_report(exact), capstone_report(single)
    for name, value in a["params"].items():
        np.testing.assert_allclose(b["params"][name], value, rtol=1e-4, atol=1e-6)
        assert not np.array_equal(b["params"][name], value)


def test_every_rank_failing_is_reported():
    world = 4
    schedule = FailureSchedule([(0.0, r) for r in range(world)], world, 1.0)
    result = capstone(world, failures=schedule)
    assert sorted(result.failed) == list(range(world))
    with pytest.raises(TrainingLost, match="no rank finished"):
        capstone_report(result)


def test_checkpoint_steps_is_young_in_steps():
    assert checkpoint_steps(5e-3, 0.125, 3.3e-3) == round(young_interval(5e-3, 0.125) / 3.3e-3)
    assert checkpoint_steps(1e-6, 1e-3, 1.0) == 1              # never below one step
    with pytest.raises(ValueError, match="step_seconds"):
        checkpoint_steps(5e-3, 0.125, 0.0)
    with pytest.raises(ValueError, match="checkpoint_cost"):
        checkpoint_steps(-1.0, 0.125, 1e-3)


def test_time_to_target():
    curve = [(0.1, 1, 0.5, 2.0), (0.2, 2, 0.8, 1.0), (0.3, 3, 0.7, 0.9)]
    assert time_to_target(curve, 0.8) == 0.2
    assert time_to_target(curve, 0.9) == math.inf
    with pytest.raises(ValueError, match="target"):
        time_to_target(curve, 1.5)


@pytest.mark.parametrize("kwargs,message", [
    (dict(seconds_per_sample=-1e-3), "seconds_per_sample must be a finite number ≥ 0"),
    (dict(checkpoint_seconds=float("nan")), "checkpoint_seconds"),
    (dict(detect_seconds=-1.0), "detect_seconds"),
    (dict(compressor="gzip"), "compressor must be one of"),
    (dict(compressor="powersgd", compressor_setting=1.5), "integer rank"),
    (dict(compressor="topk", compressor_setting=1.5), "fraction"),
    (dict(compute_factors=np.ones((2, 3))), "compute_factors must have shape"),
    (dict(compute_factors=np.zeros((12, 3))), "compute_factors must all be > 0"),
    (dict(compute_factors=np.ones((12, 4))), "compute_factors must have shape"),
    (dict(failures=FailureSchedule([], 5, 1.0)), "covers 5 ranks"),
    (dict(restore="tape"), "restore must be one of"),
    (dict(checkpoint_every=0), "checkpoint_every"),
    (dict(members=[0, 1], joins={1: 2}), "disjoint"),
])
def test_bad_input_is_refused_clearly(kwargs, message):
    """The rank program checks its input before its first request."""
    comm = SimpleNamespace(rank=0, size=3)
    settings = dict(compute_factors=np.ones((12, 3)))
    settings.update(kwargs)
    program = capstone_train(comm, MLP(SIZES, seed=3), Adam(0.01), X_TRAIN, Y_TRAIN, X_TEST,
                             Y_TEST, 12, 50, 0.01, **settings)
    with pytest.raises(ValueError, match=message):
        next(program)


def test_make_compressor():
    assert make_compressor("none", 0, [(3,)]) is None
    assert make_compressor("topk", 0.5, [(3,)]).name.endswith("+ EF")
    with pytest.raises(ValueError, match="compressor must be one of"):
        make_compressor("zip", 0.5, [(3,)])


def test_run_capstone_passes_the_simulators_limits_and_refuses_bad_ones():
    from dsml.capstone import run_capstone
    from dsml.sim import LimitExceeded
    from dsml.sim_support import DEFAULT_MAX_EVENTS
    problem = (3, NETWORK, MLP(SIZES, seed=3), Adam(0.01), X_TRAIN, Y_TRAIN, X_TEST, Y_TEST, 4,
               50, 0.01)
    settings = dict(seconds_per_sample=1e-4, detect_seconds=1e-3, seed=3, compressor="none")
    roomy = run_capstone(*problem, max_events=2 * DEFAULT_MAX_EVENTS, timeout=600, **settings)
    same = capstone(3, steps=4, compressor="none")          # through dsml.run, default limits
    assert roomy.time == same.time
    assert capstone_report(roomy)["curve"] == capstone_report(same)["curve"]
    with pytest.raises(LimitExceeded, match="max_events=50 "):
        run_capstone(*problem, max_events=50, **settings)
    for bad in (1.5, "10", -1, 0, True, float("nan")):
        with pytest.raises(ValueError, match="max_events must be an integer ≥ 1"):
            run_capstone(*problem, max_events=bad, **settings)
    for bad in (0, -1.0, "5", float("nan")):
        with pytest.raises(ValueError, match="timeout must be > 0"):
            run_capstone(*problem, timeout=bad, **settings)
