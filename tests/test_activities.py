"""Plumbing (hand-written): tests for a rank's second activity — `comm.spawn` / `comm.join`
(week 3, `dsml.comm.activities`) — on every engine.

The simulator runs each activity as a process of its own; the real engines run a rank's
activities by turns inside the rank's thread or process (`driver._drive_activities`). Both
must give the same values and the same errors. Real runs that must succeed get generous
timeouts; only the runs that are meant to time out get short ones. No assertion on speed.
"""
from __future__ import annotations

import numpy as np
import pytest

import dsml
from dsml import RankError
from dsml.collectives import allreduce
from dsml.comm import Activity, Comm
from dsml.comm import driver, processes
from dsml.net import AlphaBeta
from dsml.sim import DeadlockError
from leaks import nothing_left_behind  # noqa: F401

ENGINES = ["sim", "threads", "processes"]
REAL_ENGINES = ["threads", "processes"]
TIMEOUT = 60.0          # a bound for real runs that should succeed; never a speed claim
SHORT = {"threads": 1.5, "processes": 3.0}    # s: for the runs that are meant to time out
NET = AlphaBeta(1e-5, 1e-9)


def run(program, p, engine, **kwargs):
    if engine == "sim":
        kwargs.pop("timeout", None)
        return dsml.run(program, p, network=NET, **kwargs)
    kwargs.setdefault("timeout", TIMEOUT)
    return dsml.run(program, p, engine=engine, **kwargs)


def vector(rank, n=10):
    """Rank r's input: small integers, so every sum is exact whatever the order."""
    return np.arange(n, dtype=np.float64) * (rank + 1)


def total(p, n=10):
    return sum(vector(r, n) for r in range(p))


# --- values ----------------------------------------------------------------------------------

def spawned_allreduce(comm, n):
    handle = yield comm.spawn(allreduce(comm, vector(comm.rank, n)))
    yield comm.compute(1e-3)
    return (yield comm.join(handle))


def plain_allreduce(comm, n):
    return (yield from allreduce(comm, vector(comm.rank, n)))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_a_spawned_allreduce_gives_the_values_of_a_plain_one(engine, p):
    n = 10
    plain = run(plain_allreduce, p, engine, args=(n,)).values
    spawned = run(spawned_allreduce, p, engine, args=(n,)).values
    for rank in range(p):
        assert np.array_equal(spawned[rank], plain[rank])
        assert np.array_equal(spawned[rank], total(p, n))


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_a_spawned_allreduce_of_arrays_in_shared_memory(engine):
    """64 KiB blocks: on processes they travel through shared memory."""
    n = 3 * 8192 * 4
    values = run(spawned_allreduce, 3, engine, args=(n,)).values
    for value in values:
        assert np.array_equal(value, total(3, n))


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_the_trace_of_a_spawned_allreduce_has_the_simulator_s_rows_and_a_join(engine):
    sim = run(spawned_allreduce, 3, "sim", args=(10,))
    real = run(spawned_allreduce, 3, engine, args=(10,))

    def rows(result):
        return sorted((r.rank, r.op, r.src, r.dst, r.nbytes, r.tag) for r in result.trace)
    assert rows(real) == rows(sim)
    joins = [r for r in real.trace if r.op == "join"]
    assert sorted(r.rank for r in joins) == [0, 1, 2]
    assert all(0 <= r.start <= r.end <= real.time for r in real.trace)


def chained(comm, previous, x):
    """The second activity: waits for the first (a collective on the same tags must not run
    beside it), then runs its own."""
    first = yield comm.join(previous)
    second = yield from allreduce(comm, x, algorithm="recursive_doubling")
    return first, second


def two_collectives_beside_messages(comm, rounds):
    p, rank = comm.size, comm.rank
    right, left = (rank + 1) % p, (rank - 1) % p
    first = yield comm.spawn(allreduce(comm, vector(rank)))
    second = yield comm.spawn(chained(comm, first, 10 * vector(rank)))
    heard = []
    for i in range(rounds):                 # the main activity's own messages, on tag 7
        got = yield comm.sendrecv(right, np.array([100 * rank + i]), left, tag=7)
        heard.append(int(got[0]))
        yield comm.send(left, (rank, i), tag=8)
        heard.append((yield comm.recv(right, tag=8)))
    both = yield comm.join(second)
    return heard, both


@pytest.mark.parametrize("engine", ENGINES)
def test_two_chained_collectives_beside_the_main_activity_s_messages(engine):
    p, rounds = 3, 4
    values = run(two_collectives_beside_messages, p, engine, args=(rounds,)).values
    for rank, (heard, (first, second)) in enumerate(values):
        left, right = (rank - 1) % p, (rank + 1) % p
        expected = []
        for i in range(rounds):
            expected += [100 * left + i, (right, i)]
        assert heard == expected
        assert np.array_equal(first, total(p))
        assert np.array_equal(second, 10 * total(p))


def outer(comm):
    inner = yield comm.spawn(allreduce(comm, vector(comm.rank)))
    mine = yield comm.sendrecv((comm.rank + 1) % comm.size, np.array([comm.rank]),
                               (comm.rank - 1) % comm.size, tag=3)
    return int(mine[0]), (yield comm.join(inner))


def nested(comm):
    handle = yield comm.spawn(outer(comm))
    return (yield comm.join(handle))


@pytest.mark.parametrize("engine", ENGINES)
def test_nested_activities(engine):
    p = 3
    for rank, (left, reduced) in enumerate(run(nested, p, engine).values):
        assert left == (rank - 1) % p
        assert np.array_equal(reduced, total(p))


def returns(comm, value):
    yield comm.compute(0.0)
    return value


def joins_and_adds(comm, handle):
    value = yield comm.join(handle)
    return value + 1


def joins_a_finished_activity_twice(comm):
    quick = yield comm.spawn(returns(comm, 10 * comm.rank))
    after = yield comm.spawn(joins_and_adds(comm, quick))
    late = yield comm.join(after)           # `quick` has finished by the time this resumes
    finished = quick.done
    return late, finished, (yield comm.join(quick)), (yield comm.join(quick))


@pytest.mark.parametrize("engine", ENGINES)
def test_joining_a_finished_activity_answers_its_value_every_time(engine):
    result = run(joins_a_finished_activity_twice, 2, engine)
    assert result.values == [(1, True, 0, 0), (11, True, 10, 10)]
    for rank in range(2):
        assert [r.op for r in result.trace.of_rank(rank) if r.op == "join"] == ["join"] * 4


def shares_the_mailbox(comm):
    if comm.rank == 0:
        for value in (1, 2):
            yield comm.send(1, np.array([value]), tag=3)
        return None
    second = yield comm.spawn(receives(comm))
    first = yield comm.recv(0, tag=3)       # posted first: the first message is the main's
    return int(first[0]), int((yield comm.join(second))[0])


def receives(comm):
    return (yield comm.recv(0, tag=3))


@pytest.mark.parametrize("engine", ENGINES)
def test_activities_share_the_rank_s_mailbox_in_arrival_order(engine):
    assert run(shares_the_mailbox, 2, engine).values[1] == (1, 2)


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_a_program_that_never_spawns_stays_on_the_single_activity_loop(engine, monkeypatch):
    def no_scheduler(*args):
        raise AssertionError("the multi-activity scheduler ran")
    monkeypatch.setattr(driver, "_drive_activities", no_scheduler)
    if engine == "processes" and processes.start_method() != "fork":
        pytest.skip("the patch reaches the children only when they fork")
    values = run(plain_allreduce, 3, engine, args=(10,)).values
    assert all(np.array_equal(v, total(3)) for v in values)
    with pytest.raises(RankError, match="the multi-activity scheduler ran"):
        run(spawned_allreduce, 2, engine, args=(10,))


# --- errors ----------------------------------------------------------------------------------

def test_spawn_and_join_check_their_argument_naming_the_rank():
    comm = Comm(2, 4)
    with pytest.raises(TypeError, match=r"rank 2: spawn takes a generator of requests .*got "
                                        r"function"):
        comm.spawn(plain_allreduce)
    with pytest.raises(TypeError, match=r"rank 2: join takes the Activity .*got int"):
        comm.join(42)
    with pytest.raises(ValueError, match=r"rank 2: cannot join <activity 1 of rank 1, running>"):
        comm.join(Activity(1, 1))


def spawns_a_function(comm):
    if comm.rank == 1:
        yield comm.spawn(plain_allreduce)   # the function, not a call of it
    yield comm.compute(0.0)


def joins_a_number(comm):
    if comm.rank == 1:
        yield comm.join(42)
    yield comm.compute(0.0)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("program, words", [
    (spawns_a_function, r"TypeError: rank 1: spawn takes a generator of requests"),
    (joins_a_number, r"TypeError: rank 1: join takes the Activity"),
])
def test_bad_spawn_or_join_fails_the_rank(engine, program, words):
    with pytest.raises(RankError, match=r"rank 1 failed( at t=0 s)?: " + words) as info:
        run(program, 2, engine)
    assert info.value.rank == 1


def returns_without_joining(comm, waits):
    if comm.rank == 0:
        yield comm.send(1, np.zeros(1), tag=4)
        return None
    yield comm.spawn(receives_tag_4(comm) if waits else returns(comm, 1))
    return "returned early"


def receives_tag_4(comm):
    return (yield comm.recv(0, tag=4))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("waits", [False, True], ids=["quick activity", "receiving activity"])
def test_returning_without_joining_a_running_activity_fails_the_rank(engine, waits):
    with pytest.raises(RankError, match=r"rank 1 .*RuntimeError: its program returned while "
                                        r"activity 1 still ran; join every activity before "
                                        r"returning") as info:
        run(returns_without_joining, 2, engine, args=(waits,))
    assert info.value.rank == 1


def raises(comm):
    yield comm.compute(0.0)
    raise ValueError(f"broken activity on rank {comm.rank}")


def spawns_one_that_raises(comm):
    if comm.rank == 2:
        handle = yield comm.spawn(raises(comm))
        yield comm.join(handle)
    yield comm.compute(0.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_activity_that_raises_fails_its_rank(engine):
    with pytest.raises(RankError, match=r"rank 2 .*ValueError: broken activity on rank 2") \
            as info:
        run(spawns_one_that_raises, 3, engine)
    assert info.value.rank == 2


def waits_for_the_other(comm, previous):
    yield comm.join(previous)
    yield comm.send(1 - comm.rank, np.zeros(1), tag=1)


def activities_in_a_cycle(comm):
    """Each rank's activity 1 waits for what only the other rank's activity 2 sends, after
    its own activity 1 has finished."""
    first = yield comm.spawn(receives_tag_1(comm))
    second = yield comm.spawn(waits_for_the_other(comm, first))
    yield comm.join(second)
    yield comm.join(first)


def receives_tag_1(comm):
    return (yield comm.recv(1 - comm.rank, tag=1))


def test_a_deadlock_between_activities_on_sim_lists_every_activity():
    with pytest.raises(DeadlockError) as info:
        run(activities_in_a_cycle, 2, "sim")
    message = str(info.value)
    for rank in range(2):
        assert f"rank {rank} activity 1 waits for a message from rank {1 - rank} (tag 1)" \
            in message
        assert f"rank {rank} activity 2 waits in join for its activity 1 to finish" in message
        assert f"rank {rank} waits in join for its activity 2 to finish" in message


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_a_deadlock_between_activities_is_found_naming_what_each_rank_waits_for(engine):
    with pytest.raises(DeadlockError) as info:
        run(activities_in_a_cycle, 2, engine, timeout=60)
    message = str(info.value)
    assert message.startswith("deadlock at t=")
    for rank in range(2):
        assert (f"rank {rank} activity 1 waits for a message from rank {1 - rank} (tag 1) "
                f"(and 2 other activities of rank {rank} wait)") in message


def joins_itself(comm):
    handles = []

    def selfish():
        yield comm.join(handles[0])         # waits for itself: only a timeout ends this
    handles.append((yield comm.spawn(selfish())))
    yield comm.join(handles[0])


def test_an_activity_that_joins_itself_deadlocks_on_sim():
    with pytest.raises(DeadlockError, match=r"rank 0 activity 1 waits in join for its "
                                            r"activity 1 to finish"):
        run(joins_itself, 1, "sim")


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_activities_that_only_join_time_out_on_real_engines(engine):
    """Nothing to wait for but the run's end: no message source, yet no hang."""
    with pytest.raises(RankError) as info:
        run(joins_itself, 2, engine, timeout=SHORT[engine])
    for rank in range(2):
        assert (f"rank {rank} waits in join for its activity 1 to finish (and 1 other "
                f"activity of rank {rank} waits)") in str(info.value)


def activity_outlives_its_rank(comm):
    if comm.rank == 1:
        yield comm.spawn(receives_tag_1(comm))     # rank 0 never sends it
    yield comm.compute(0.0)


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_a_deadlock_says_when_the_program_returned_without_joining(engine):
    with pytest.raises(DeadlockError) as info:
        run(activity_outlives_its_rank, 2, engine, timeout=60)
    assert ("1 process(es) still wait:\n  rank 1 activity 1 waits for a message from rank 0 "
            "(tag 1); its program has returned without joining it") in str(info.value)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_non_request_lists_spawn_and_join_among_the_requests(engine):
    def junk(comm):
        yield 42

    with pytest.raises(RankError, match=r"which is not a request; yield one of "
                                        r"comm\.send\(\.\.\.\), .*comm\.now\(\), "
                                        r"comm\.join\(\.\.\.\), .*comm\.spawn\(\.\.\.\)$"):
        run(junk, 2, engine)


def junk_in_an_activity(comm):
    def junk():
        yield "send please"
    if comm.rank == 1:
        handle = yield comm.spawn(junk())
        yield comm.join(handle)
    yield comm.compute(0.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_non_request_in_an_activity_names_the_rank(engine):
    with pytest.raises(RankError, match=r"rank 1 .*yielded 'send please', which is not a "
                                        r"request") as info:
        run(junk_in_an_activity, 2, engine)
    assert info.value.rank == 1


# --- the point of it: overlap (simulator) ---------------------------------------------------

def compute_beside_a_send(comm, overlap, nbytes):
    if comm.rank == 1:
        yield comm.recv(0)
        return None
    if overlap:
        sending = yield comm.spawn(sends(comm, nbytes))
        yield comm.compute(1e-3)
        yield comm.join(sending)
    else:
        yield comm.compute(1e-3)
        yield from sends(comm, nbytes)


def sends(comm, nbytes):
    yield comm.send(1, dsml.SizeOnly(nbytes))


def test_compute_beside_a_send_takes_the_longer_of_the_two_on_sim():
    link, nbytes = AlphaBeta(alpha=10e-6, beta=1e-9), 1_000_000        # 1 MB at 1 GB/s
    transfer = link.alpha + nbytes * link.beta
    serial = dsml.run(compute_beside_a_send, 2, network=link, args=(False, nbytes))
    overlapped = dsml.run(compute_beside_a_send, 2, network=link, args=(True, nbytes))
    assert serial.time == 1e-3 + transfer
    assert overlapped.time == max(1e-3, transfer)
    joins = [r for r in overlapped.trace.of_rank(0) if r.op == "join"]
    assert [(r.start, r.end) for r in joins] == [(1e-3, transfer)]
    assert [(r.op, r.start, r.end) for r in overlapped.trace.of_rank(0)
            if r.op != "join"] == [("compute", 0.0, 1e-3), ("send", 0.0, transfer)]
