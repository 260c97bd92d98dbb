"""Plumbing (hand-written): tests for the `threads` engine — same semantics as the others.

Behaviour every real engine shares is also tested on threads in tests/test_processes.py
(`REAL_ENGINES`); this file covers the rest: failures and cancellation (threads cannot be
killed, so every rank must end by itself), time, trace, and agreement with the simulator.
Generous timeouts, no assertion on speed.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import dsml
from dsml import RankError, SizeOnly
from dsml.sim import DeadlockError
from dsml.comm import threads as threads_engine
from leaks import nothing_left_behind, rank_threads  # noqa: F401

TIMEOUT = 60.0
NET = dsml.net.AlphaBeta(1e-6, 1e-9)


def run(program, p, **kwargs):
    kwargs.setdefault("timeout", TIMEOUT)
    return dsml.run(program, p, engine="threads", **kwargs)


# --- values ------------------------------------------------------------------------------------

def ping_pong(comm, n):
    if comm.rank == 0:
        yield comm.send(1, np.arange(n, dtype=np.float64))
        reply = yield comm.recv(1)
        return float(reply.sum())
    x = yield comm.recv(0)
    yield comm.send(0, 2 * x)
    return threading.current_thread().name


def test_ping_pong_runs_each_rank_on_its_own_thread():
    result = run(ping_pong, 2, args=(100,))
    assert result.values == [2 * sum(range(100)), "dsml-rank-1"]
    assert result.engine == "threads" and result.world_size == 2


def test_every_engine_gives_the_same_values():
    def reduce_to_zero(comm, seed):
        x = np.random.default_rng(seed + comm.rank).integers(0, 100, 5)
        if comm.rank == 0:
            for src in range(1, comm.size):
                x = x + (yield comm.recv(src))
            return x.tolist()
        yield comm.send(0, x)
        return None

    values = [dsml.run(reduce_to_zero, 4, engine=e, args=(7,), network=NET if e == "sim" else None,
                       timeout=TIMEOUT).values for e in ("sim", "threads", "processes")]
    assert values[0] == values[1] == values[2]


def test_matching_by_source_and_tag_in_arrival_order_with_a_stash():
    def out_of_order(comm):
        if comm.rank == 0:
            for i in range(3):
                yield comm.send(2, np.full(2, i), tag=5)
            yield comm.send(2, np.full(2, 9), tag=1)
            return None
        if comm.rank == 1:
            yield comm.send(2, SizeOnly(123), tag=5)
            return None
        got = [(yield comm.recv(0, tag=1))]           # arrived last from rank 0
        got.append((yield comm.recv(1, tag=5)))       # another source, same tag
        for _ in range(3):
            got.append((yield comm.recv(0, tag=5)))   # in the order sent
        return got

    got = run(out_of_order, 3).values[2]
    assert got[0].tolist() == [9, 9] and got[1] == SizeOnly(123)
    assert [g[0] for g in got[2:]] == [0, 1, 2]


def test_eager_sends_never_wait_for_the_receiver():
    def both_send_first(comm):
        other = 1 - comm.rank
        for i in range(20):
            yield comm.send(other, np.full(1 << 17, float(i)))   # 1 MiB each
        got = []
        for _ in range(20):
            got.append(float((yield comm.recv(other))[0]))
        return got

    assert run(both_send_first, 2).values == [list(map(float, range(20)))] * 2


def test_compute_combine_and_now_are_answered_without_messages():
    def local(comm):
        yield comm.compute(5.0)                       # a no-op: this must not take 5 s
        yield comm.combine(64)
        if hasattr(comm, "now"):
            t = yield comm.now()
            assert t >= 0
        return comm.rank

    start = time.monotonic()
    result = run(local, 2)
    assert time.monotonic() - start < 5
    assert result.values == [0, 1]
    for rank in range(2):
        assert [(r.op, r.nbytes) for r in result.trace.of_rank(rank)] == \
               [("compute", 0), ("combine", 64)]


def test_trace_and_time_are_measured_from_a_common_start():
    def ring(comm):
        x = np.full(4, float(comm.rank))
        for _ in range(3):
            x = yield comm.sendrecv((comm.rank + 1) % comm.size, x, (comm.rank - 1) % comm.size)
        return x

    result = run(ring, 3)
    assert result.time > 0 and max(result.finish_times) == result.time
    for rank in range(3):
        records = result.trace.of_rank(rank)
        assert [r.op for r in records] == ["sendrecv"] * 3
        assert all(0 <= r.start <= r.end <= result.time and r.nbytes == 32 for r in records)
    sim = dsml.run(ring, 3, network=NET)
    assert sorted((r.rank, r.op, r.src, r.dst, r.nbytes) for r in sim.trace) == \
           sorted((r.rank, r.op, r.src, r.dst, r.nbytes) for r in result.trace)


def test_one_rank():
    def alone(comm):
        yield comm.compute(0.0)
        return comm.size

    assert run(alone, 1).values == [1]


# --- failures: named, bounded in time, every thread ended ---------------------------------------

def raises_on_rank_2(comm):
    if comm.rank == 2:
        yield comm.recv(0)
        raise ValueError("loss is NaN")
    if comm.rank == 0:
        yield comm.send(2, np.zeros(1))
    yield comm.recv(2)                    # blocks: must be cancelled


def test_a_rank_that_raises_is_named_with_its_traceback_and_the_others_end():
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        run(raises_on_rank_2, 4)
    assert time.monotonic() - start < TIMEOUT / 2
    message = str(info.value)
    assert info.value.rank == 2
    assert message.startswith("rank 2 failed: ValueError: loss is NaN")
    assert "--- traceback of rank 2 ---" in message and "raises_on_rank_2" in message
    assert rank_threads() == []          # joined before the error was raised


def test_a_non_request_names_the_rank():
    def junk(comm):
        if comm.rank == 1:
            yield 42
        yield comm.compute(0.0)

    with pytest.raises(RankError, match=r"rank 1 failed: TypeError: yielded 42, which is not "
                                        r"a request"):
        run(junk, 2)


def test_a_hopeless_wait_is_a_deadlock_found_at_once_listing_what_each_rank_waits_for():
    def waits(comm):
        if comm.rank == 1:
            yield comm.recv(0, tag=7)     # never sent
        if comm.rank == 2:
            yield comm.recv(1)
        yield comm.compute(0.0)

    start = time.monotonic()
    with pytest.raises(DeadlockError) as info:
        run(waits, 3, timeout=60)
    assert time.monotonic() - start < 30          # found, not timed out
    message = str(info.value)
    assert isinstance(info.value, RankError) and info.value.rank == 1
    assert message.startswith("deadlock at t=")
    assert "rank 1 waits for a message from rank 0 (tag 7)" in message
    assert "rank 2 waits for a message from rank 1 (tag 0)" in message
    assert "rank 0" not in message.replace("from rank 0", "")      # it finished


def test_a_deadlock_is_found_at_once_naming_each_rank():
    def everyone_waits(comm):
        yield comm.recv((comm.rank + 1) % comm.size)

    start = time.monotonic()
    with pytest.raises(DeadlockError) as info:
        run(everyone_waits, 3, timeout=60)
    assert time.monotonic() - start < 30
    for rank in range(3):
        assert f"rank {rank} waits for a message from rank {(rank + 1) % 3}" in str(info.value)


def test_a_timeout_names_the_rank_that_keeps_running_and_stops_it():
    """A rank looping on compute() never waits: only the timeout ends the run, and the
    thread is stopped at its next request (no thread is left spinning)."""
    def spins(comm):
        if comm.rank == 1:
            while True:
                yield comm.compute(1e-3)
        yield comm.recv(1)

    with pytest.raises(RankError) as info:
        run(spins, 2, timeout=1)
    assert info.value.rank == 1
    message = str(info.value)
    assert "did not finish within the timeout of 1 s" in message
    assert "rank 0 waits for a message from rank 1 (tag 0)" in message
    assert "rank 1 is running its program" in message
    assert "could not be stopped" not in message


def test_a_message_never_received_is_an_error():
    def forgetful(comm):
        if comm.rank == 0:
            yield comm.send(1, np.zeros(3), tag=1)
            yield comm.send(1, np.zeros(3), tag=2)
        else:
            yield comm.recv(0, tag=1)

    with pytest.raises(RankError, match=r"rank 1 finished without receiving messages sent to "
                                        r"it \(mismatched peers or tags\?\):\n  "
                                        r"rank 0 -> rank 1 \(tag 2\): 1 message\(s\)"):
        run(forgetful, 2)


def test_a_rank_that_keeps_sending_after_a_failure_is_stopped_at_its_next_send():
    def floods(comm):
        if comm.rank == 0:
            raise RuntimeError("boom")
        while True:                       # never receives: only its sends can stop it
            yield comm.send(0, np.zeros(1))
            time.sleep(0.001)
        yield                             # pragma: no cover

    with pytest.raises(RankError, match=r"rank 0 failed: RuntimeError: boom"):
        run(floods, 2)


def test_a_rank_stuck_in_its_own_code_is_named_in_the_error(monkeypatch):
    monkeypatch.setattr(threads_engine, "JOIN_TIMEOUT", 0.2)
    release = threading.Event()

    def stuck(comm):
        if comm.rank == 0:
            raise RuntimeError("boom")
        release.wait(30)                  # not a request: cancellation cannot reach it
        yield comm.compute(0.0)

    try:
        with pytest.raises(RankError) as info:
            run(stuck, 2)
        assert "rank 0 failed: RuntimeError: boom" in str(info.value)
        assert "could not be stopped: dsml-rank-1" in str(info.value)
    finally:
        release.set()
        for thread in rank_threads():
            thread.join(10)


# --- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("timeout", [0, -1.0])
def test_bad_timeout(timeout):
    def noop(comm):
        yield comm.compute(0.0)

    with pytest.raises(ValueError, match=r"timeout must be > 0 seconds"):
        run(noop, 2, timeout=timeout)


def test_network_with_threads_raises():
    def noop(comm):
        yield comm.compute(0.0)

    with pytest.raises(ValueError, match=r"engine='threads' measures a real network"):
        run(noop, 2, network=NET)
