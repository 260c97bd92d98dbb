"""Plumbing (hand-written): tests for dsml.elastic — data-parallel SGD that survives ranks
leaving (crashing) and joining (week 6).

The independent reference is one process taking whole global batches (`serial_reference`
below: loss_and_grads and optimizer.step, nothing else) over the schedule the test derives
itself from the membership of each committed step: the global batch and learning rate from the
stated rule, the data cursor as the running sum of the global batches. Against it:
- without failures, any number of ranks (1–5, spares idle) gives the serial model;
- after crashes at any point (start of a step, after a gradient is sent, a leader half-way
  through its broadcast, inside a rendezvous, a state source dying), with both restore modes
  and both rules, and after spares join: the run finishes, every finished rank holds the same
  bits, the samples counted from the actual shards equal what the memberships imply, the data
  stream is consumed in order with nothing skipped or repeated, and the model equals the serial
  run over the same schedule (relative 1e-12: the leader adds shard sums in another order);
- seeded random crash schedules (hypothesis) keep all of this;
- what is lost is what the restore mode says: the steps since the last checkpoint, or none;
- all ranks failing, the last survivor failing, a spare left alone: a clear TrainingLost;
- with a detector (a timeout, inside training), a stalled but live worker is suspected, fenced
  out by the new epoch, its late gradient refused and counted, and the replay still holds; a
  detector that never fires changes nothing, bit for bit;
- with a store, a fenced rank whose leader died before refusing it reads its fate from the
  store and stops (a deterministic case, a 40-seed probe of stalls and leader crashes that
  deadlocked 8 times before the store read); a leader dying before it commits leaves the
  suspect a member; a spare is never stopped by the store's members; a spare's failure the
  watching leader hears of does not make it skip the join rendezvous its workers go to;
- on real threads and processes, the detector inside training (1 s timeout, 4 s stall): the
  stalled rank (and any healthy rank a loaded machine made look silent) stops fenced, the
  survivors agree and the run ends — outcomes only, no timing;
- bad input fails with an error that names the argument.
"""
from __future__ import annotations

import copy
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsml.comm.run import run
from dsml.data_parallel import shard_bounds
from dsml.elastic import (TrainingLost, check_crashes, elastic_outcome, elastic_train, replay,
                          scaled, stream_batch)
from dsml.net import AlphaBeta
from dsml.train import MLP, gaussian_mixture, loss_and_grads
from dsml.train.optim import SGD, Adam

NET = AlphaBeta(1e-5, 1e-9)
TOLERANCE = 1e-12
X, Y = gaussian_mixture(90, classes=3, dim=4, seed=3)     # 90: passes wrap inside batches
MODEL = MLP((4, 8, 3), seed=1)
SEED = 7


def elastic(world, engine="sim", optimizer=None, **kwargs):
    kwargs.setdefault("steps", 10)
    kwargs.setdefault("batch", 12)
    kwargs.setdefault("lr", 0.05)
    kwargs.setdefault("seed", SEED)
    optimizer = optimizer or Adam(0.05)
    network = NET if engine == "sim" else None
    return run(elastic_train, world, engine=engine, network=network, failures="notify",
               args=(MODEL, optimizer, X, Y), kwargs=kwargs, timeout=60.0)


def serial_reference(memberships, rule, batch, lr, optimizer=None, initial=None):
    """One process: for each committed step's membership size, the whole global batch the rule
    gives, read from the stream at the running cursor. Returns (params, samples)."""
    model, optimizer = copy.deepcopy(MODEL), copy.deepcopy(optimizer or Adam(0.05))
    initial = initial or memberships[0]
    cursor = 0
    for members in memberships:
        if rule == "global":
            size, step_lr = batch, lr
        else:
            size, step_lr = batch * members, lr * members / initial
        chosen = stream_batch(len(X), cursor, size, SEED)
        _, grads = loss_and_grads(model, X[chosen], Y[chosen])
        optimizer.lr = step_lr
        optimizer.step(model.params, grads)
        cursor += size
    return model.params, cursor


def assert_close(a, b):
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=TOLERANCE, atol=1e-14, err_msg=name)


def check_run(result, rule="global", batch=12, lr=0.05, steps=10, optimizer=None,
              initial=None):
    """Everything a finished run must satisfy; returns the outcome."""
    outcome = elastic_outcome(result)       # raises unless finished ranks agree bit for bit
    history = outcome["history"]
    assert [h["step"] for h in history] == list(range(steps))
    cursor = 0
    for h in history:
        size = batch if rule == "global" else batch * len(h["members"])
        # samples counted from the shards the ranks actually computed on
        assert sum(h["shard_sizes"]) == size, h
        assert h["shard_sizes"] == [
            b - a for a, b in (shard_bounds(size, len(h["members"]), k)
                               for k in range(len(h["members"])))]
        assert h["cursor"] == cursor            # the stream is read on, nothing skipped
        cursor += size
    memberships = [len(h["members"]) for h in history]
    params, samples = serial_reference(memberships, rule, batch, lr, optimizer, initial)
    assert samples == cursor
    assert_close(outcome["params"], params)
    for rank in outcome["ranks"]:              # every finished rank: the same final cursor
        assert result.values[rank]["cursor"] == samples
    return outcome


# --- pieces ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n,start,size", [(7, 0, 30), (10, 3, 17), (1, 0, 5), (5, 4, 0)])
def test_stream_is_passes_of_permutations_and_concatenates(n, start, size):
    whole = stream_batch(n, 0, start + size, seed=2)
    assert np.array_equal(np.concatenate([stream_batch(n, 0, start, 2),
                                          stream_batch(n, start, size, 2)]), whole)
    for p in range(len(whole) // n):
        assert sorted(whole[p * n:(p + 1) * n]) == list(range(n))


def test_scaling_rules():
    assert scaled("global", 32, 0.1, 3, 4) == (32, 0.1)
    assert scaled("linear", 8, 0.1, 3, 4) == (24, pytest.approx(0.075))
    assert scaled("linear", 8, 0.1, 6, 4) == (48, pytest.approx(0.15))


@pytest.mark.parametrize("call,message", [
    (lambda: scaled("sqrt", 8, 0.1, 2, 2), "rule must be one of"),
    (lambda: scaled("global", 0, 0.1, 2, 2), "batch=0"),
    (lambda: check_crashes({5: ("step", 1)}, 4), "rank 5 is not in 0..3"),
    (lambda: check_crashes({1: ("sometime", 1)}, 4), "crashes\\[1\\] must be"),
    (lambda: check_crashes({1: ("step", -1)}, 4), "crashes\\[1\\] must be"),
    (lambda: stream_batch(0, 0, 3, 1), "n_examples"),
])
def test_bad_input_names_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("kwargs,message", [
    ({"members": [0, 1], "joins": {1: 3}}, "must be disjoint"),
    ({"restore": "disk"}, "restore must be one of"),
    ({"rule": "sqrt"}, "rule must be one of"),
    ({"checkpoint_every": 0}, "checkpoint_every=0"),
])
def test_bad_arguments_fail_on_every_rank(kwargs, message):
    result = elastic(3, **kwargs)
    assert sorted(result.failed) == [0, 1, 2]
    assert all(message in str(error) for error in result.failed.values()) or \
        pytest.fail(str(result.failed))


# --- no failures ----------------------------------------------------------------------------

@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("rule", ["global", "linear"])
def test_without_failures_equals_serial_run(world, rule):
    result = elastic(world, rule=rule, batch=7)
    outcome = check_run(result, rule=rule, batch=7)
    assert outcome["ranks"] == list(range(world)) and not result.failed
    assert [r["reason"] for r in outcome["rendezvous"]] == ["finish"]


def test_sgd_momentum_state_survives_a_restore():
    optimizer = SGD(0.05, momentum=0.9)
    result = elastic(4, optimizer=optimizer, crashes={2: ("step", 6)})
    check_run(result, optimizer=optimizer)


# --- ranks leave ----------------------------------------------------------------------------

def test_worker_crash_rolls_back_to_checkpoint_and_loses_only_that():
    result = elastic(4, crashes={2: ("step", 7)}, checkpoint_every=4)
    outcome = check_run(result)
    assert sorted(result.failed) == [2] and outcome["ranks"] == [0, 1, 3]
    failure = outcome["rendezvous"][0]
    # crashed at the start of step 7; checkpoints at steps 0, 4, 8: steps 4, 5, 6 are lost
    assert (failure["reason"], failure["resume_step"], failure["lost_steps"]) == \
        ("failure", 4, 3)
    assert [len(h["members"]) for h in outcome["history"]] == [4] * 4 + [3] * 6


def test_measured_work_departs_from_the_schedule_by_the_lost_steps():
    """The memberships imply each survivor's committed samples; the survivors measured more
    work: steps 4–6 were rolled back and the first attempt at step 7 (in flight when rank 2
    was found dead) was thrown away — four shards of 12 / 4 = 3 samples each."""
    result = elastic(4, crashes={2: ("step", 7)}, checkpoint_every=4)
    outcome = check_run(result)
    committed = {r: sum(h["shard_sizes"][h["members"].index(r)] for h in outcome["history"])
                 for r in outcome["ranks"]}
    measured = outcome["computed_samples"]
    assert all(measured[r] == committed[r] + 4 * 3 for r in outcome["ranks"]), (measured,
                                                                                 committed)


def test_replica_restore_loses_nothing():
    result = elastic(4, crashes={2: ("step", 7)}, restore="replica")
    outcome = check_run(result)
    failure = outcome["rendezvous"][0]
    assert (failure["resume_step"], failure["lost_steps"], failure["restored_from"]) == \
        (7, 0, "live")
    assert [len(h["members"]) for h in outcome["history"]] == [4] * 7 + [3] * 3


@pytest.mark.parametrize("restore", ["checkpoint", "replica"])
def test_leader_crash_half_way_through_its_reply(restore):
    """Rank 0 sends step 5's result to ranks 3 and 2 and dies: 1 (the new leader) is a step
    behind them."""
    result = elastic(4, crashes={0: ("reply", 5)}, restore=restore, checkpoint_every=4)
    outcome = check_run(result)
    failure = outcome["rendezvous"][0]
    assert failure["leader"] == 1 and failure["members"] == [1, 2, 3]
    assert failure["resume_step"] == (6 if restore == "replica" else 4)


def test_latest_checkpoint_is_the_newest_any_survivor_holds():
    """With checkpoints every 3 steps, ranks 3 and 2 took step 5's result and checkpointed at
    step 6; rank 1 (the new leader, still at step 5) holds only step 3's: 6 is restored."""
    result = elastic(4, crashes={0: ("reply", 5)}, checkpoint_every=3)
    failure = check_run(result)["rendezvous"][0]
    assert (failure["resume_step"], failure["restored_from"]) == (6, "checkpoint")


def test_worker_crash_after_sending_its_gradient_counts_its_step():
    result = elastic(3, crashes={2: ("reply", 4)}, restore="replica")
    outcome = check_run(result)
    assert outcome["history"][4]["members"] == [0, 1, 2]       # its step committed
    assert outcome["history"][5]["members"] == [0, 1]


def test_detection_delay_is_paid_per_detected_failure():
    fast = elastic(4, crashes={2: ("step", 5)}, seconds_per_sample=1e-4)
    slow = elastic(4, crashes={2: ("step", 5)}, seconds_per_sample=1e-4, detect_seconds=0.5)
    assert_close(elastic_outcome(fast)["params"], elastic_outcome(slow)["params"])
    # one detection (the leader's receive from rank 2); the workers learn it from the leader
    assert slow.time - fast.time == pytest.approx(0.5, abs=1e-9)


# --- failures during the rendezvous ---------------------------------------------------------

def test_worker_dies_after_reporting_and_is_dropped_next_round():
    # rank 3 reports in the rendezvous that makes epoch 1 and dies: it is in epoch 1's
    # membership, and the next step finds it gone
    result = elastic(4, crashes={1: ("step", 3), 3: ("rendezvous", 1)})
    outcome = check_run(result)
    epochs = {r["epoch"]: r["members"] for r in outcome["rendezvous"]}
    assert epochs[1] == [0, 2, 3] and epochs[2] == [0, 2]


def test_leader_dies_half_way_through_the_membership_broadcast():
    result = elastic(5, crashes={1: ("step", 3), 0: ("rendezvous", 1)})
    outcome = check_run(result)
    assert sorted(result.failed) == [0, 1]
    first, second = outcome["rendezvous"][:2]
    # rank 2 got epoch 1 from rank 0 before rank 0 died; epoch 2 is rank 2's
    assert (first["leader"], first["members"]) == (0, [0, 2, 3, 4])
    assert (second["leader"], second["members"]) == (2, [2, 3, 4])


def test_state_source_dies_when_asked():
    """Replica restore: leader 0 gives step 5's result to 4 and 3, then dies; rank 1 leads,
    lacks step 6 and asks rank 3 (the most senior holder), which reported and died: rank 4's
    copy is used instead."""
    result = elastic(5, crashes={0: ("reply", 5), 3: ("rendezvous", 1)}, restore="replica")
    outcome = check_run(result)
    assert sorted(result.failed) == [0, 3]
    first = outcome["rendezvous"][0]
    assert first["resume_step"] == 6 and first["members"] == [1, 2, 4]


# --- ranks join -----------------------------------------------------------------------------

@pytest.mark.parametrize("rule", ["global", "linear"])
def test_spare_joins_and_gets_the_state(rule):
    result = elastic(4, rule=rule, joins={3: 4}, batch=6)
    outcome = check_run(result, rule=rule, batch=6)
    assert outcome["ranks"] == [0, 1, 2, 3]
    assert [len(h["members"]) for h in outcome["history"]] == [3] * 4 + [4] * 6
    join = outcome["rendezvous"][0]
    assert (join["reason"], join["joined"], join["lost_steps"]) == ("join", [3], 0)


def test_spare_whose_first_contact_died_joins_without_a_rollback():
    """The spare's join request went to rank 0, which crashed; it asks rank 1 instead. Its
    lost contact is no failure of the members: the join keeps the live state."""
    result = elastic(4, joins={3: 6}, crashes={0: ("step", 2)}, checkpoint_every=4)
    outcome = check_run(result)
    join = next(r for r in outcome["rendezvous"] if r["joined"])
    assert (join["reason"], join["restored_from"], join["lost_steps"]) == ("join", "live", 0)
    assert join["resume_step"] == 6 and join["leader"] == 1


def test_spare_replaces_a_crashed_rank_and_late_spare_is_turned_away():
    result = elastic(5, joins={3: 6, 4: 50}, crashes={1: ("step", 2)})
    outcome = check_run(result)
    assert outcome["ranks"] == [0, 2, 3]
    assert result.values[4]["status"] == "stopped"
    assert "finished before this rank joined" in result.values[4]["outcome"]


def test_idle_rank_outside_members_and_spares():
    result = elastic(3, members=[0, 1])
    assert result.values[2] == {"status": "idle", "rank": 2}
    check_run(result)


# --- random kills ---------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), restore=st.sampled_from(["checkpoint", "replica"]),
       rule=st.sampled_from(["global", "linear"]))
def test_random_crashes_lose_nothing_beyond_the_checkpoint(seed, restore, rule):
    """Up to three of ranks 1–5 crash at random points (rank 0 never does, so someone finishes);
    a spare (rank 6) may join."""
    rng = np.random.default_rng(seed)
    victims = rng.choice(np.arange(1, 6), size=rng.integers(1, 4), replace=False)
    crashes = {}
    for rank in victims:
        point = ["step", "reply", "rendezvous"][rng.integers(3)]
        crashes[int(rank)] = (point, int(rng.integers(1, 4) if point == "rendezvous"
                                         else rng.integers(0, 10)))
    joins = {6: int(rng.integers(0, 12))}
    result = elastic(7, joins=joins, crashes=crashes, restore=restore, rule=rule, batch=5,
                     checkpoint_every=3)
    outcome = check_run(result, rule=rule, batch=5, initial=6)
    assert set(result.failed) <= set(crashes)
    assert 0 in outcome["ranks"]
    for record in outcome["rendezvous"]:
        if restore == "replica":
            assert record["lost_steps"] <= 1
        else:
            assert record["lost_steps"] <= 3        # checkpoint_every


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_any_rank_may_crash_and_the_run_never_hangs(seed):
    """Any rank, leaders and spares included, may crash anywhere: the run either finishes with
    every check above holding or ends with TrainingLost — never a deadlock (which the simulator
    would raise) and never a disagreement between finished ranks."""
    rng = np.random.default_rng(seed)
    world, spares = int(rng.integers(2, 6)), int(rng.integers(0, 3))
    victims = rng.choice(world + spares, size=int(rng.integers(1, world + spares + 1)),
                         replace=False)
    crashes = {}
    for rank in victims:
        point = ["step", "reply", "rendezvous"][rng.integers(3)]
        crashes[int(rank)] = (point, int(rng.integers(1, 5) if point == "rendezvous"
                                         else rng.integers(0, 10)))
    joins = {world + k: int(rng.integers(0, 12)) for k in range(spares)}
    restore, rule = ["checkpoint", "replica"][seed % 2], ["global", "linear"][seed // 2 % 2]
    result = elastic(world + spares, joins=joins, crashes=crashes, restore=restore, rule=rule,
                     batch=5, checkpoint_every=3)
    assert set(result.failed) <= set(crashes)
    try:
        check_run(result, rule=rule, batch=5, initial=world)
    except TrainingLost as lost:
        assert "no rank finished" in str(lost)


# --- everyone fails -------------------------------------------------------------------------

def test_all_ranks_failing_at_once_is_reported():
    result = elastic(4, crashes={r: ("step", 3) for r in range(4)})
    with pytest.raises(TrainingLost, match=r"no rank finished.*rank 0.*rank 3"):
        elastic_outcome(result)


def test_last_survivor_failing_is_reported():
    result = elastic(3, crashes={0: ("step", 2), 1: ("step", 4), 2: ("step", 6)})
    with pytest.raises(TrainingLost, match="rank 2 crashed at step 6"):
        elastic_outcome(result)


def test_spare_left_alone_stops_with_a_reason():
    result = elastic(3, joins={2: 8}, crashes={0: ("step", 3), 1: ("step", 3)})
    assert result.values[2]["status"] == "stopped"
    with pytest.raises(TrainingLost, match="no surviving replica or checkpoint"):
        elastic_outcome(result)


# --- a real engine --------------------------------------------------------------------------

def test_threads_engine_crash_and_join():
    result = elastic(4, engine="threads", joins={3: 5}, crashes={1: ("step", 3)})
    outcome = check_run(result)
    assert outcome["ranks"] == [0, 2, 3] and sorted(result.failed) == [1]
    sim = elastic(4, joins={3: 5}, crashes={1: ("step", 3)})
    assert elastic_outcome(sim)["history"] == outcome["history"]


def test_replay_is_the_serial_reference():
    result = elastic(4, crashes={2: ("step", 5)}, joins={}, rule="linear")
    outcome = check_run(result, rule="linear")
    model = copy.deepcopy(MODEL)
    replay(model, Adam(0.05), X, Y, outcome["history"], seed=SEED)
    assert_close(outcome["params"], model.params)


# --- failure detectors that can be wrong ----------------------------------------------------------

from dsml.heartbeat import heartbeat_clock, heartbeat_monitor, heartbeat_worker  # noqa: E402
from dsml.membership_store import membership_store  # noqa: E402


def detector_program(comm, timeout, stalls, crashes, period, check_every, how="raise",
                     store=None):
    """Rank 0 monitors, the last rank (or the one before the store) is its clock, ranks 1..
    are workers."""
    clock = comm.size - 1 if store is None else comm.size - 2
    if comm.rank == store:
        return (yield from membership_store(comm, [0], list(range(1, clock))))
    if comm.rank == 0:
        return (yield from heartbeat_monitor(comm, list(range(1, clock)), clock, timeout,
                                             store))
    if comm.rank == clock:
        return (yield from heartbeat_clock(comm, 0, check_every))
    return (yield from heartbeat_worker(comm, 0, period, stalls[comm.rank - 1],
                                        crashes.get(comm.rank), how))


def detector_run(suspect_after, stalls, crashes=None, period=0.01, check_every=0.001,
                 how="raise", **options):
    if options.get("engine", "sim") == "sim":
        options.setdefault("network", AlphaBeta(5e-6, 1e-9))
    return run(detector_program, len(stalls) + 2, failures="notify",
               args=(suspect_after, stalls, crashes or {}, period, check_every, how), **options)


def test_without_stalls_or_failures_nobody_is_suspected():
    result = detector_run(0.015, np.zeros((4, 20)))
    monitor = result.values[0]
    assert monitor["suspected"] == {} and monitor["fenced"] == [] and monitor["epoch"] == 0
    assert monitor["finished"] == {1, 2, 3, 4}


@pytest.mark.parametrize("timeout", [0.015, 0.04, 0.1])
def test_a_failure_is_detected_by_the_timeout_not_by_the_engine(timeout):
    """The engine tells the listener at once (PeerFailed); the suspicion still waits for the
    timeout: detection takes between T and T + one check + the last heartbeat's flight."""
    result = detector_run(timeout, np.zeros((3, 30)), crashes={2: 10})
    monitor = result.values[0]
    delay = monitor["suspected"][2] - result.failed[2].time
    assert timeout < delay <= timeout + 0.001 + 1e-4
    assert set(monitor["suspected"]) == {2} and monitor["epoch"] == 1


def test_a_stalled_worker_is_falsely_suspected_and_then_fenced():
    stalls = np.zeros((3, 20))
    stalls[0, 5] = 0.05                      # worker 1 stalls 50 ms before heartbeat 5
    result = detector_run(0.03, stalls)
    monitor = result.values[0]
    assert set(monitor["suspected"]) == {1} and not result.failed
    # everything worker 1 sent after its suspicion — 15 beats and its bye — was refused
    assert [rank for _, rank in monitor["fenced"]] == [1] * 16
    assert all(time > monitor["suspected"][1] for time, _ in monitor["fenced"])
    assert monitor["finished"] == {2, 3}     # a fenced bye does not count as a member's
    # a timeout longer than the stall suspects nobody
    assert detector_run(0.07, stalls).values[0]["suspected"] == {}


# --- the same detector on real threads and processes: wall-clock periods ------------------------
# Outcomes only (who is suspected, who fenced): never timing, the machine may be loaded. A
# stall or a failure lasts far longer than the timeout, so a busy machine cannot hide it.

WALL_PERIOD, WALL_TIMEOUT, WALL_CHECK = 0.02, 0.1, 0.005


@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_wall_clock_detector_suspects_a_stall_and_fences_it(engine):
    stalls = np.zeros((3, 12))
    stalls[0, 4] = 1.0                       # worker 1 sleeps 1 s (10 timeouts) before beat 4
    result = detector_run(WALL_TIMEOUT, stalls, period=WALL_PERIOD, check_every=WALL_CHECK,
                          engine=engine, timeout=60)
    monitor = result.values[0]
    assert 1 in monitor["suspected"] and not result.failed
    assert 1 not in monitor["finished"]      # its bye came after the suspicion: refused
    fenced = [rank for _, rank in monitor["fenced"] if rank == 1]
    assert len(fenced) >= 2                  # at least its beat after the stall and its bye
    assert result.values[-1] == "stopped"    # the clock was told to stop


@pytest.mark.parametrize("engine, how", [("threads", "raise"), ("processes", "raise"),
                                         ("processes", "kill")])
def test_wall_clock_detector_detects_a_failed_rank(engine, how):
    result = detector_run(WALL_TIMEOUT, np.zeros((3, 15)), crashes={2: 5}, period=WALL_PERIOD,
                          check_every=WALL_CHECK, engine=engine, timeout=60, how=how)
    monitor = result.values[0]
    assert sorted(result.failed) == [2] and 2 in monitor["suspected"]
    # not before the timeout: suspected only after a timeout's silence since its last beat
    assert monitor["suspected"][2] - monitor["last"][2] > WALL_TIMEOUT


def test_kill_is_refused_outside_the_processes_engine():
    result = detector_run(WALL_TIMEOUT, np.zeros((1, 3)), crashes={1: 1}, how="kill")
    assert "how='kill' needs engine='processes'" in str(result.failed[1])
    result = detector_run(WALL_TIMEOUT, np.zeros((1, 3)), crashes={1: 1}, how="later")
    assert "how must be 'raise' or 'kill', got 'later'" in str(result.failed[1])


# --- the membership store --------------------------------------------------------------------
# With store=rank, the store's compare-and-set decides every membership and its generation.
# The trajectory must be the one the leader-only protocol commits; only generations may differ
# (a refused proposal moves them on).

def without_epochs(history):
    return [{k: v for k, v in h.items() if k != "epoch"} for h in history]


def meetings(outcome):
    return [(r["members"], r["leader"], r["resume_step"]) for r in outcome["rendezvous"]]


@pytest.mark.parametrize("world, kwargs", [
    (4, dict(crashes={1: ("step", 3), 3: ("rendezvous", 1)})),
    (5, dict(crashes={1: ("step", 3), 0: ("rendezvous", 1)})),
    (5, dict(crashes={0: ("reply", 5), 3: ("rendezvous", 1)}, restore="replica")),
    (4, dict(joins={3: 6}, crashes={0: ("step", 2)})),
])
def test_the_store_decides_generations_and_the_trajectory_is_unchanged(world, kwargs):
    plain = elastic_outcome(elastic(world, **kwargs))
    stored_run = elastic(world + 1, store=world, **kwargs)
    stored = check_run(stored_run)
    store = stored_run.values[world]
    assert stored["history"] == plain["history"] and meetings(stored) == meetings(plain)
    for name in plain["params"]:
        assert np.array_equal(stored["params"][name], plain["params"][name])
    # every membership the ranks acted on was taken by the store under its generation
    taken = {(generation, tuple(members)) for generation, members, _ in store["log"]}
    assert all((r["epoch"], tuple(r["members"])) in taken for r in stored["rendezvous"])
    final = stored["rendezvous"][-1]
    assert (store["generation"], store["members"]) == (final["epoch"], final["members"])
    assert store["refused"] == []


def test_a_proposal_on_a_stale_generation_is_refused():
    """Rank 0 leads the final rendezvous: the store takes generation 1 from it, and it dies
    before telling anyone. Rank 1, which saw only generation 0, proposes on top of 0 and is
    refused; it proposes again on top of 1. The leader-only protocol would reuse number 1."""
    kwargs = dict(crashes={0: ("rendezvous", 1)})
    stored_run = elastic(4, store=3, **kwargs)
    stored = check_run(stored_run)
    store = stored_run.values[3]
    assert store["refused"] == [(1, 0, 1)]
    assert [(g, m, by) for g, m, by in store["log"]][:3] == [
        (0, [0, 1, 2], None), (1, [0, 1, 2], 0), (2, [1, 2], 1)]
    plain = elastic_outcome(elastic(3, **kwargs))
    assert [r["epoch"] for r in plain["rendezvous"]][:1] == [1]
    assert stored["rendezvous"][0]["epoch"] == 2
    assert without_epochs(stored["history"]) == without_epochs(plain["history"])
    assert meetings(stored) == meetings(plain)


@pytest.mark.parametrize("kwargs,message", [
    (dict(store=1, members=[0, 1, 2]), "store must be a rank in 0..3 that is neither a member"),
    (dict(store=3, joins={3: 2}), "store must be a rank in 0..3"),
    (dict(store=7), "store must be a rank in 0..3"),
    (dict(store=3, crashes={3: ("step", 1)}), "the store \\(rank 3\\) cannot crash"),
])
def test_bad_store_arguments(kwargs, message):
    result = elastic(4, **kwargs)
    assert sorted(result.failed) == [0, 1, 2, 3]
    for error in result.failed.values():
        assert re.search(message, str(error)), error


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_with_a_store_any_crash_gives_the_same_trajectory(seed):
    rng = np.random.default_rng(seed)
    world, spares = int(rng.integers(2, 6)), int(rng.integers(0, 3))
    victims = rng.choice(world + spares, size=int(rng.integers(1, world + spares + 1)),
                         replace=False)
    crashes = {int(rank): (["step", "reply", "rendezvous"][rng.integers(3)],
                           int(rng.integers(1, 5))) for rank in victims}
    joins = {world + k: int(rng.integers(0, 12)) for k in range(spares)}
    options = dict(joins=joins, crashes=crashes, restore=["checkpoint", "replica"][seed % 2],
                   checkpoint_every=3)
    plain, stored = elastic(world + spares, **options), elastic(world + spares + 1,
                                                                store=world + spares, **options)
    try:
        expected = elastic_outcome(plain)
    except TrainingLost:
        with pytest.raises(TrainingLost):
            elastic_outcome(stored)
        return
    outcome = elastic_outcome(stored)
    generations = [r["epoch"] for r in outcome["rendezvous"]]
    assert generations == sorted(set(generations))       # rising, never reused
    if generations != [r["epoch"] for r in expected["rendezvous"]]:
        # A leader died after the store took its proposal: that generation is skipped, so the
        # epochs differ from the run without a store, and a crash injected at "rendezvous n"
        # (the announcement of epoch n) falls on another leader's announcement. The runs are no
        # longer the same experiment: check this one on its own (samples accounted,
        # parameters equal to a serial replay of its committed history).
        check_run(stored)
        return
    assert without_epochs(outcome["history"]) == without_epochs(expected["history"])
    assert outcome["ranks"] == expected["ranks"] and meetings(outcome) == meetings(expected)


def test_the_detectors_suspicions_go_to_the_store():
    """Worker 1 stalls and worker 3 fails: each suspicion is a proposal the store takes under
    the next generation; the monitor's epoch is the store's."""
    stalls = np.zeros((3, 20))
    stalls[0, 5] = 0.05
    result = run(detector_program, 3 + 3, network=AlphaBeta(5e-6, 1e-9), failures="notify",
                 args=(0.03, stalls, {3: 12}, 0.01, 0.001, "raise", 5))
    monitor, store = result.values[0], result.values[5]
    assert set(monitor["suspected"]) == {1, 3} and sorted(result.failed) == [3]
    assert [(g, m) for g, m, _ in store["log"]] == [(0, [1, 2, 3]), (1, [2, 3]), (2, [2])]
    assert monitor["epoch"] == store["generation"] == 2 and store["refused"] == []


# --- a detector that can be wrong, inside training ------------------------------------------
# detector={"clock": rank, "timeout": T}: the leader suspects a worker silent for more than T
# in a step. A stalled worker is alive: it is suspected anyway, fenced out by the new epoch,
# and its late gradient (stamped with the old epoch) is refused.

WATCH = dict(seconds_per_sample=1e-3)          # 3 samples per rank: a step takes ~3 ms


def watched(world, clock, timeout=0.01, **kwargs):
    return elastic(world, detector={"clock": clock, "timeout": timeout}, **WATCH, **kwargs)


@pytest.mark.parametrize("restore", ["checkpoint", "replica"])
@pytest.mark.parametrize("stall, refused_at", [(0.02, 1), (0.5, 2)])   # wakes mid-run / after
def test_a_stalled_live_worker_is_suspected_fenced_and_refused(restore, stall, refused_at):
    result = watched(5, clock=4, stalls={2: (5, stall)}, restore=restore)
    assert not result.failed                                   # nobody died …
    outcome = check_run(result)                                # … the replay holds
    leader, slow = result.values[0], result.values[2]
    assert list(leader["suspected"]) == [2] and leader["refused"] == 1
    assert 0.01 < leader["suspected"][2] <= 0.01 + 0.0025 + 1e-3   # T < wait ≤ T + every
    assert slow["status"] == "stopped" and "fenced out" in slow["outcome"]
    assert f"epoch {refused_at}" in slow["outcome"] and slow["epoch"] == 0
    assert outcome["ranks"] == [0, 1, 3]
    suspicion = outcome["rendezvous"][0]
    assert (suspicion["reason"], suspicion["members"]) == ("failure", [0, 1, 3])
    resumed = suspicion["resume_step"]
    assert [h["members"] for h in outcome["history"]] == \
        [[0, 1, 2, 3]] * resumed + [[0, 1, 3]] * (10 - resumed)
    assert resumed == (4 if restore == "checkpoint" else 5)


def test_the_store_refuses_the_fenced_members_stale_view():
    """With a store, the fenced rank tries to write back the membership it knew (generation
    0): compare-and-set refuses it, since the suspicion moved the generation on."""
    result = watched(6, clock=4, store=5, stalls={2: (5, 0.02)})
    check_run(result)
    store, slow = result.values[5], result.values[2]
    assert slow["fence_verdict"] == "refused"
    assert store["refused"] == [(2, 0, 1)] and store["generation"] == 2     # refused mid-run
    assert [(g, m) for g, m, _ in store["log"]][:2] == [(0, [0, 1, 2, 3]), (1, [0, 1, 3])]
    assert store["members"] == [0, 1, 3]


# --- the fenced rank learns its fate from the store ---------------------------------------------
# A leader may die after suspecting a live rank and before refusing its late gradient. The
# suspect then finds the leader dead and enters a rendezvous; with a store it reads the store
# first, and stops if the membership went on without it.

@pytest.mark.parametrize("crash", [("rendezvous", 1), ("step", 6), ("reply", 6)])
@pytest.mark.parametrize("stall", [0.05, 0.5])
def test_a_fenced_rank_whose_leader_died_stops_on_what_the_store_holds(stall, crash):
    """Rank 2 stalls at step 5 and is suspected; leader 0 has the store take generation 1
    without it, then dies: half-way through announcing it (("rendezvous", 1)), or at the
    start of step 6 or after half of step 6's reply, before rank 2 wakes. Without the store
    read, rank 2 reported to rank 1, which leads a membership without it and never answers:
    the simulator found a deadlock. Now rank 2 reads generation 1, finds itself left out,
    tries its stale compare-and-set (refused) and stops; ranks 1 and 3 finish alike."""
    result = watched(6, clock=4, store=5, stalls={2: (5, stall)}, crashes={0: crash})
    outcome = check_run(result)
    store, slow = result.values[5], result.values[2]
    assert sorted(result.failed) == [0] and outcome["ranks"] == [1, 3]
    assert slow["status"] == "stopped" and "fenced out" in slow["outcome"]
    assert slow["epoch"] == 0 and slow["fence_verdict"] == "refused"
    assert store["log"][1] == (1, [0, 1, 3], 0)          # taken by the leader before it died
    assert store["refused"][-1][:2] == (2, 0) and store["members"] == [1, 3]
    assert all(2 not in h["members"] for h in outcome["history"][6:])


@pytest.mark.parametrize("store", [5, None])
def test_a_leader_dying_before_it_commits_leaves_the_suspect_a_member(store):
    """Leader 0 suspects rank 2 and dies just before committing (CrashingRank's "commit"):
    the suspicion never took effect. It was not passed on either (a suspect is named only in
    the decision that commits it), so the next leader, rank 1, waits for rank 2's report and
    keeps it: nobody is fenced, with or without a store."""
    world = 6 if store else 5
    result = watched(world, clock=4, store=store, stalls={2: (5, 0.05)},
                     crashes={0: ("commit", 1)})
    outcome = check_run(result)
    assert sorted(result.failed) == [0] and outcome["ranks"] == [1, 2, 3]
    assert outcome["rendezvous"][0]["members"] == [1, 2, 3]
    if store:
        assert [m for _, m, _ in result.values[store]["log"]][:2] == [[0, 1, 2, 3], [1, 2, 3]]


def test_a_spare_is_not_fenced_by_a_membership_it_has_not_joined():
    """The store's members leave out a spare until it joins: its reads must not stop it."""
    result = watched(7, clock=5, store=6, stalls={2: (5, 0.05)}, joins={4: 7},
                     crashes={0: ("rendezvous", 1)})
    outcome = check_run(result)
    assert outcome["ranks"] == [1, 3, 4] and "fenced out" in result.values[2]["outcome"]
    assert outcome["history"][-1]["members"] == [1, 3, 4]


def test_random_stalls_and_leader_crashes_never_hang():
    """40 seeded runs: one or two workers stall (4 ms, 20 ms or 0.3 s) at a random step, and
    the leader crashes at a random point. Before the store read, 8 of these 40 deadlocked.
    Every run must end; a rank stops fenced only if it stalled, and only when the store's
    members leave it out; the survivors agree and the replay holds."""
    for seed in range(40):
        rng = np.random.default_rng(seed)
        stalled = rng.choice([1, 2, 3], size=int(rng.integers(1, 3)), replace=False)
        stalls = {int(r): (int(rng.integers(0, 9)), float(rng.choice([0.004, 0.02, 0.3])))
                  for r in stalled}
        crash = (["step", "reply", "rendezvous", "commit"][rng.integers(4)],
                 int(rng.integers(1, 9)))
        result = watched(6, clock=4, store=5, stalls=stalls, crashes={0: crash})
        outcome = check_run(result)
        fenced = {r for r in (1, 2, 3) if "fenced out" in result.values[r]["outcome"]}
        assert set(result.failed) <= {0}, (seed, result.failed)    # its point may not come
        assert fenced <= set(stalls) and not fenced & set(result.values[5]["members"]), seed
        assert set(outcome["ranks"]) == {0, 1, 2, 3} - fenced - set(result.failed), seed


@pytest.mark.parametrize("kwargs", [
    dict(crashes={2: ("step", 7)}),
    dict(crashes={0: ("reply", 5)}, restore="replica"),
    dict(joins={3: 4}, crashes={1: ("step", 2)}),
])
def test_a_detector_that_never_fires_changes_nothing(kwargs):
    """A timeout no step reaches: the same committed history and bit-identical parameters as
    without the detector (the engine's notice still reports real crashes)."""
    plain = elastic_outcome(elastic(4, **WATCH, **kwargs))
    run_ = watched(5, clock=4, timeout=10.0, **kwargs)
    outcome = elastic_outcome(run_)
    assert outcome["history"] == plain["history"] and outcome["ranks"] == plain["ranks"]
    for name in plain["params"]:
        assert np.array_equal(outcome["params"][name], plain["params"][name])
    assert all(not v.get("suspected") and not v.get("refused") for v in run_.values
               if isinstance(v, dict))


def test_a_stall_without_a_detector_is_only_waited_for():
    plain = elastic_outcome(elastic(4, **WATCH))
    slow = elastic(4, stalls={2: (5, 0.05)}, **WATCH)
    outcome = check_run(slow)
    assert outcome["history"] == plain["history"] and outcome["ranks"] == [0, 1, 2, 3]


@pytest.mark.parametrize("seed", range(4))
def test_random_stalls_never_hang_and_the_replay_holds(seed):
    rng = np.random.default_rng(seed)
    stalls = {int(r): (int(rng.integers(0, 9)), float(rng.choice([0.004, 0.02, 0.3])))
              for r in rng.choice([1, 2, 3, 4], size=int(rng.integers(1, 4)), replace=False)}
    result = watched(6, clock=5, stalls=stalls, restore=["checkpoint", "replica"][seed % 2])
    outcome = check_run(result)
    suspected = set(result.values[0]["suspected"])
    assert suspected <= set(stalls) and not result.failed
    assert set(outcome["ranks"]) == {0, 1, 2, 3, 4} - suspected
    assert result.values[0]["refused"] == len(suspected)
    for rank in suspected:
        assert "fenced out" in result.values[rank]["outcome"]


@pytest.mark.parametrize("store", [None, 5])
def test_a_spare_failing_while_the_leader_watches_leaves_the_views_alike(store):
    """Spare 3, due at step 3, fails right after sending its join report. The watching leader
    hears of it through its receive from any rank; had it counted the spare dead there, it
    would skip the join rendezvous its workers go to, suspect them all and wait for gradients
    they never send (a deadlock before). It leaves the spare to the rendezvous, as gather."""
    result = watched(6 if store else 5, clock=4, store=store, joins={3: 3},
                     crashes={3: ("rendezvous", 1)})
    outcome = check_run(result)
    assert sorted(result.failed) == [3] and outcome["ranks"] == [0, 1, 2]
    assert set(result.values[0]["suspected"]) <= {3}          # the dead spare, at most


# --- the detector inside training on real engines -----------------------------------------------
# Wall-clock time: a step takes milliseconds, the timeout is 1 s and rank 2 sleeps 4 s. Outcomes
# only, never timing: on a loaded machine a healthy rank may be suspected too, and then it must
# be fenced like the stalled one, with the survivors still agreeing.

@pytest.mark.parametrize("engine, store, crashes", [
    ("processes", 5, {}), ("threads", None, {}),
    ("processes", 5, {0: ("rendezvous", 1)}),      # the leader dies after committing: the store
])
def test_the_detector_inside_training_on_a_real_engine(engine, store, crashes):
    world = 6 if store else 5
    result = elastic(world, engine=engine, store=store, stalls={2: (3, 4.0)}, crashes=crashes,
                     detector={"clock": 4, "timeout": 1.0})
    assert set(result.failed) <= set(crashes)                  # the run ended; no one else died
    outcome = check_run(result)                                # survivors agree; replay holds
    stopped = {r for r in (1, 2, 3) if result.values[r]["status"] == "stopped"}
    assert 2 in stopped and all("fenced out" in result.values[r]["outcome"] for r in stopped)
    assert outcome["ranks"] == sorted({0, 1, 2, 3} - stopped - set(result.failed))
    if not result.failed:
        leader = result.values[0]
        assert set(leader["suspected"]) == stopped and leader["refused"] == len(stopped)
    assert result.values[4]["status"] == "clock"               # the clock was let go
    if store:
        assert all(result.values[r]["fence_verdict"] == "refused" for r in stopped)
        assert result.values[store]["members"] == outcome["ranks"]

@pytest.mark.parametrize("kwargs,message", [
    (dict(detector={"clock": 1, "timeout": 0.1}, members=[0, 1, 2]),
     "detector\\['clock'\\] must be a rank in 0..3"),
    (dict(detector={"clock": 9, "timeout": 0.1}), "detector\\['clock'\\] must be a rank"),
    (dict(detector={"clock": 3, "timeout": 0}), "detector needs timeout > 0"),
    (dict(stalls={0: (2, 0.1)}), "stalls: rank 0 must be a member other than the leader"),
    (dict(stalls={1: (2, -1.0)}), "stalls\\[1\\] must be \\(step ≥ 0, seconds > 0\\)"),
    (dict(detector={"clock": 3, "timeout": 0.1}, crashes={3: ("step", 1)}),
     "the detector's clock \\(rank 3\\) cannot crash"),
])
def test_bad_detector_arguments(kwargs, message):
    result = elastic(4, **kwargs)
    assert result.failed
    for error in result.failed.values():
        assert re.search(message, str(error)), error
