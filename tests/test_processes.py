"""Plumbing (hand-written): tests for the `processes` engine — real values, failures, clean-up.

Real processes on a small CI machine: generous timeouts, and no assertion on speed. Tests of
behaviour every real engine shares run on `threads` too (`REAL_ENGINES`).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import dsml
from dsml import RankError, SizeOnly
from dsml.sim import DeadlockError

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 60.0          # a bound for runs that should succeed; never a speed claim
REAL_ENGINES = ["processes", "threads"]


def assert_no_children_left(pids):
    assert multiprocessing.active_children() == []
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def write_pid(directory, rank):
    Path(directory, f"pid{rank}").write_text(str(os.getpid()))


def read_pids(directory, world_size):
    return [int(Path(directory, f"pid{r}").read_text()) for r in range(world_size)]


# --- rank programs (module level; the engine forks, so local ones work too) -----------------

def ping_pong(comm, n):
    if comm.rank == 0:
        yield comm.send(1, np.arange(n, dtype=np.float64))
        reply = yield comm.recv(1)
        return float(reply.sum())
    x = yield comm.recv(0)
    yield comm.send(0, 2 * x)
    return os.getpid()


def ring_shift(comm, data, rounds):
    x = data[comm.rank]
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    for _ in range(rounds):
        x = yield comm.sendrecv(right, x, left)
    return x


def report_pid(comm):
    yield comm.compute(0.0)
    return os.getpid()


# --- correct results -------------------------------------------------------------------------

def test_ping_pong_values():
    n = 1000
    result = dsml.run(ping_pong, 2, engine="processes", args=(n,), timeout=TIMEOUT)
    assert result.values[0] == 2 * sum(range(n))
    assert result.engine == "processes" and result.world_size == 2
    child_pid = result.values[1]
    assert child_pid != os.getpid()
    assert_no_children_left([child_pid])


@pytest.mark.parametrize("engine", REAL_ENGINES)
@pytest.mark.parametrize("p", [2, 3, 4])
def test_ring_sendrecv_equals_numpy_roll(p, engine):
    rng = np.random.default_rng(p)
    data = rng.standard_normal((p, 7))
    rounds = p + 1
    result = dsml.run(ring_shift, p, engine=engine, args=(list(data), rounds),
                      timeout=TIMEOUT)
    np.testing.assert_array_equal(np.stack(result.values), np.roll(data, rounds, axis=0))


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_time_and_trace_records_for_each_rank(engine):
    data = [np.full(3, float(r)) for r in range(3)]
    result = dsml.run(ring_shift, 3, engine=engine, args=(data, 2), timeout=TIMEOUT)
    assert result.time > 0
    assert len(result.finish_times) == 3
    assert all(0 <= t <= result.time for t in result.finish_times)
    assert max(result.finish_times) == result.time
    assert result.trace.ranks() == [0, 1, 2]
    for rank in range(3):
        records = result.trace.of_rank(rank)
        assert [r.op for r in records] == ["sendrecv", "sendrecv"]
        for r in records:
            assert 0 <= r.start <= r.end <= result.time
            assert r.src == (rank - 1) % 3 and r.dst == (rank + 1) % 3 and r.nbytes == 24
    document = result.trace.to_chrome()
    assert sum(e["name"] == "thread_name" for e in document["traceEvents"]) == 3


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_trace_off(engine):
    result = dsml.run(report_pid, 2, engine=engine, trace=False, timeout=TIMEOUT)
    assert result.trace is None and result.time >= 0
    assert result.engine == engine


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_tags_structured_payloads_and_size_only_travel_intact(engine):
    def mixed(comm):
        if comm.rank == 0:
            yield comm.send(1, {"version": 3, "grad": np.ones(4)}, tag=2)
            yield comm.send(1, SizeOnly(10_000), tag=1)
            yield comm.send(1, (np.arange(3), 1.5, None), tag=2)
            return None
        size_only = yield comm.recv(0, tag=1)        # arrived second, asked for first
        first = yield comm.recv(0, tag=2)
        second = yield comm.recv(0, tag=2)
        return size_only, first, second

    result = dsml.run(mixed, 2, engine=engine, timeout=TIMEOUT)
    size_only, first, second = result.values[1]
    assert size_only == SizeOnly(10_000)
    assert first["version"] == 3 and np.array_equal(first["grad"], np.ones(4))
    assert np.array_equal(second[0], np.arange(3)) and second[1:] == (1.5, None)


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_send_snapshot_on_real_processes(engine):
    def mutate(comm):
        if comm.rank == 0:
            x = np.zeros(5)
            yield comm.send(1, x)
            x += 1
            yield comm.send(1, x)
            return None
        a = yield comm.recv(0)
        b = yield comm.recv(0)
        return float(a.sum()), float(b.sum())

    assert dsml.run(mutate, 2, engine=engine, timeout=TIMEOUT).values[1] == (0.0, 5.0)


def test_a_rank_program_defined_in_main_works():
    """Like a notebook cell: the program lives in `__main__` of the calling interpreter."""
    code = textwrap.dedent("""
        import numpy as np
        import dsml

        def ring_in_main(comm, n):
            x = np.full(n, float(comm.rank))
            got = yield comm.sendrecv((comm.rank + 1) % comm.size, x, (comm.rank - 1) % comm.size)
            return float(got.sum())

        result = dsml.run(ring_in_main, 3, engine="processes", args=(4,), timeout=60)
        print("MODULE", ring_in_main.__module__)
        print("VALUES", result.values)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("DSML_START_METHOD", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "MODULE __main__" in done.stdout
    assert "VALUES [8.0, 0.0, 4.0]" in done.stdout


# --- failures: named, bounded in time, nothing left behind ---------------------------------------

def raises_on_rank_1(comm, directory):
    write_pid(directory, comm.rank)
    if comm.rank == 1:
        yield comm.recv(0)              # every other rank has written its pid by now
        yield comm.recv(2)
        raise ValueError("gradient has NaN in layer 3")
    yield comm.send(1, np.zeros(1))
    yield comm.recv(1)                  # blocks: this rank must be killed by the engine


def test_a_rank_that_raises_is_named_with_its_traceback(tmp_path):
    with pytest.raises(RankError) as info:
        dsml.run(raises_on_rank_1, 3, engine="processes", args=(str(tmp_path),),
                 timeout=TIMEOUT)
    message = str(info.value)
    assert info.value.rank == 1
    assert message.startswith("rank 1 failed: ValueError: gradient has NaN in layer 3")
    assert "--- traceback of rank 1 ---" in message
    assert "Traceback (most recent call last)" in message
    assert "raises_on_rank_1" in message and 'raise ValueError("gradient has NaN' in message
    assert_no_children_left(read_pids(tmp_path, 3))


def hangs_on_rank_1(comm, directory):
    write_pid(directory, comm.rank)
    if comm.rank == 1:
        yield comm.recv(0, tag=7)       # rank 0 never sends it
    yield comm.compute(0.0)


def test_a_wait_for_a_finished_rank_is_a_deadlock_found_at_once(tmp_path):
    start = time.monotonic()
    with pytest.raises(DeadlockError) as info:
        dsml.run(hangs_on_rank_1, 2, engine="processes", args=(str(tmp_path),),
                 timeout=TIMEOUT)
    assert time.monotonic() - start < TIMEOUT / 2      # found, not timed out
    message = str(info.value)
    assert isinstance(info.value, RankError) and info.value.rank == 1
    assert message.startswith("deadlock at t=")
    assert "1 process(es) still wait:\n  rank 1 waits for a message from rank 0 (tag 7)" \
        in message
    assert_no_children_left(read_pids(tmp_path, 2))


def everyone_waits(comm, directory):
    write_pid(directory, comm.rank)
    yield comm.recv((comm.rank + 1) % comm.size)


def test_a_deadlock_on_real_processes_is_found_at_once_naming_each_rank(tmp_path):
    start = time.monotonic()
    with pytest.raises(DeadlockError) as info:
        dsml.run(everyone_waits, 3, engine="processes", args=(str(tmp_path),),
                 timeout=TIMEOUT)
    assert time.monotonic() - start < TIMEOUT / 2
    message = str(info.value)
    for rank in range(3):
        assert f"rank {rank} waits for a message from rank {(rank + 1) % 3}" in message
    assert_no_children_left(read_pids(tmp_path, 3))


def stops_on_rank_2(comm, directory):
    write_pid(directory, comm.rank)
    if comm.rank == 2:
        os.kill(os.getpid(), signal.SIGSTOP)     # as if someone stopped it mid-run
    if comm.rank == 0:
        yield comm.recv(2)
    yield comm.compute(0.0)


def test_a_stopped_rank_is_the_one_a_timeout_names(tmp_path):
    with pytest.raises(RankError) as info:
        dsml.run(stops_on_rank_2, 3, engine="processes", args=(str(tmp_path),), timeout=3)
    message = str(info.value)
    assert info.value.rank == 2
    assert "did not finish within the timeout of 3 s" in message
    if sys.platform.startswith("linux"):
        assert "rank 2 is running its program (not waiting on a message) — its process is " \
               "stopped" in message
    assert_no_children_left(read_pids(tmp_path, 3))


def dies_on_rank_1(comm, directory):
    write_pid(directory, comm.rank)
    if comm.rank == 1:
        yield comm.recv(0)              # rank 0 has written its pid by now
        os._exit(3)
    yield comm.send(1, np.zeros(1))
    yield comm.recv(1)


def test_a_rank_that_dies_is_reported_with_its_exit_code(tmp_path):
    for attempt in range(10):
        directory = tmp_path / str(attempt)
        directory.mkdir()
        start = time.monotonic()
        with pytest.raises(RankError, match=r"rank 1 died \(exit code 3\)") as info:
            dsml.run(dies_on_rank_1, 2, engine="processes", args=(str(directory),),
                     timeout=TIMEOUT)
        assert info.value.rank == 1
        assert time.monotonic() - start < TIMEOUT / 2      # noticed at once, not at the timeout
        assert_no_children_left(read_pids(directory, 2))


def test_a_rank_that_dies_fails_the_run_promptly_and_leaves_nothing_behind(tmp_path):
    """The run fails fast and cleans up."""
    start = time.monotonic()
    with pytest.raises(Exception):
        dsml.run(dies_on_rank_1, 2, engine="processes", args=(str(tmp_path),), timeout=TIMEOUT)
    assert time.monotonic() - start < TIMEOUT / 2
    assert_no_children_left(read_pids(tmp_path, 2))


def test_a_successful_run_leaves_no_process_behind():
    result = dsml.run(report_pid, 3, engine="processes", timeout=TIMEOUT)
    pids = result.values
    assert len(set(pids)) == 3 and os.getpid() not in pids
    assert_no_children_left(pids)


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_a_non_request_is_reported_with_the_rank(engine):
    def yields_junk(comm):
        if comm.rank == 1:
            yield "send please"
        yield comm.compute(0.0)

    with pytest.raises(RankError, match=r"rank 1 failed: TypeError: yielded 'send please', "
                       r"which is not a request"):
        dsml.run(yields_junk, 2, engine=engine, timeout=TIMEOUT)
    assert multiprocessing.active_children() == []
    assert not [t for t in threading.enumerate() if t.name.startswith("dsml-rank")]


# --- bad input ---------------------------------------------------------------------------------

def test_network_with_processes_raises():
    with pytest.raises(ValueError, match=r"engine='processes' measures a real network; "
                       r"network= is only for engine='sim'"):
        dsml.run(report_pid, 2, engine="processes", network=dsml.net.AlphaBeta(1e-6, 1e-9))


def test_a_plain_function_is_rejected_before_any_process_starts():
    def plain(comm):
        return 1

    with pytest.raises(TypeError, match=r"program plain must be a generator function"):
        dsml.run(plain, 2, engine="processes")
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("timeout", [0, -1.0])
def test_bad_timeout(timeout):
    with pytest.raises(ValueError, match=r"timeout must be > 0 seconds"):
        dsml.run(report_pid, 2, engine="processes", timeout=timeout)


def test_bad_start_method_env(monkeypatch):
    monkeypatch.setenv("DSML_START_METHOD", "teleport")
    with pytest.raises(ValueError, match=r"DSML_START_METHOD must be one of .*got 'teleport'"):
        dsml.run(report_pid, 2, engine="processes")


# --- engines agree on what is an error ---------------------------------------------------------

def forgetful(comm):
    if comm.rank == 0:
        yield comm.send(1, np.zeros(3))
        yield comm.send(1, np.zeros(3))
    else:
        yield comm.recv(0)


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_a_message_never_received_is_an_error_on_processes_too(engine):
    with pytest.raises(RankError, match=r"rank 1 finished without receiving"):
        dsml.run(forgetful, 2, engine=engine, timeout=TIMEOUT)


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_recv_trace_records_carry_the_message_size_like_on_sim(engine):
    def one_way(comm):
        if comm.rank == 0:
            yield comm.send(1, np.zeros(100, np.uint8))
        else:
            yield comm.recv(0)

    sim = dsml.run(one_way, 2, network=dsml.net.AlphaBeta(1e-6, 1e-9))
    real = dsml.run(one_way, 2, engine=engine, timeout=TIMEOUT)
    assert [(r.rank, r.op, r.nbytes) for r in sorted(sim.trace, key=lambda r: r.rank)] == \
           [(r.rank, r.op, r.nbytes) for r in sorted(real.trace, key=lambda r: r.rank)]


def test_ranks_start_once_the_resource_tracker_has_settled(monkeypatch):
    """The tracker, a new interpreter, imports for tens of milliseconds when a process first
    starts it: ranks pinned to its CPU lost that much of their first timed loop. Every run
    waits for it (it is no longer using a CPU) before starting ranks."""
    import subprocess
    import sys
    import textwrap

    import dsml.comm.processes as processes

    calls = []
    real = processes.await_tracker
    monkeypatch.setattr(processes, "await_tracker", lambda *a: calls.append(1) or real(*a))
    assert dsml.run(lambda comm: (yield comm.now()), 2, engine="processes").values
    assert calls == [1]
    check = textwrap.dedent("""
        import time
        from multiprocessing import resource_tracker
        from dsml.comm.processes import _cpu_ticks, await_tracker
        resource_tracker.ensure_running()
        pid = resource_tracker._resource_tracker._pid
        waited = await_tracker()
        first = _cpu_ticks(pid)
        time.sleep(0.05)
        print(waited > 0, first[0], first == _cpu_ticks(pid), await_tracker() == 0.0)
    """)
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["True", "S", "True", "True"], out
