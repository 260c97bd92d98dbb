"""Plumbing (hand-written): tests that real engines leave nothing behind and find hopeless
runs early — a killed parent, SIGTERM, a rank that dies under failures="notify", deadlocks
found at once, and a learner's missing `yield from`.

Processes on a small, loaded CI machine: generous bounds, no assertion on speed (the bounds
only separate "found at once" from "waited for the timeout").
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import dsml
from dsml import RankError
from dsml.comm import rank_process, segments
from dsml.comm.failures import PeerFailed
from dsml.sim import DeadlockError
from leaks import nothing_left_behind  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 60.0
REAL_ENGINES = ["threads", "processes"]
HAVE_DEV_SHM = os.path.isdir("/dev/shm")


def gone(pid: int) -> bool:
    """True if no process `pid` is left (a zombie nobody has reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def segments_of(pid: int) -> list[str]:
    if not HAVE_DEV_SHM:
        return []
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"dsml_{pid}_")]


# A parent that runs a long all-reduce-like ring of 250,000 floats (through shared memory) on
# 4 processes; each rank writes its pid to the directory given, then works for minutes.
PARENT = textwrap.dedent("""
    import os, sys
    import numpy as np
    import dsml

    def long_ring(comm, directory):
        open(os.path.join(directory, f"pid{comm.rank}"), "w").write(str(os.getpid()))
        x = np.ones(250_000)
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        for _ in range(10_000_000):
            x = (yield comm.sendrecv(right, x, left)) * 1.0
        return 0

    dsml.run(long_ring, 4, engine="processes", args=(sys.argv[1],), timeout=3600)
""")


def start_parent(tmp_path, source=PARENT, segments=True):
    """Start `source` as a parent process; return it and its 4 children's pids once they are
    running (and, with `segments`, once its runs have segments in use)."""
    script = tmp_path / "parent.py"
    script.write_text(source)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env)
    deadline = time.monotonic() + TIMEOUT
    pids = []
    while time.monotonic() < deadline:
        files = [tmp_path / f"pid{r}" for r in range(4)]
        if all(f.exists() and f.read_text() for f in files):
            pids = [int(f.read_text()) for f in files]
            if not segments or not HAVE_DEV_SHM or segments_of(parent.pid):
                break
        assert parent.poll() is None, "the parent ended before its children were running"
        time.sleep(0.05)
    assert pids, "the children did not start"
    time.sleep(0.5)                     # mid-run: messages in flight, segments in use
    return parent, pids


def wait_until_nothing_left(parent_pid, pids, within):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(gone(pid) for pid in pids) and not segments_of(parent_pid):
            return
        time.sleep(0.1)
    assert [pid for pid in pids if not gone(pid)] == [], "rank processes outlived the parent"
    assert segments_of(parent_pid) == [], "segments outlived the parent"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: PR_SET_PDEATHSIG")
def test_a_parent_killed_with_sigkill_leaves_no_rank_and_no_segment(tmp_path):
    parent, pids = start_parent(tmp_path)
    parent.kill()
    parent.wait()
    wait_until_nothing_left(parent.pid, pids, within=5.0)


def test_sigterm_to_the_parent_cleans_up_like_ctrl_c_and_still_ends_it(tmp_path):
    parent, pids = start_parent(tmp_path)
    parent.terminate()
    assert parent.wait(timeout=TIMEOUT) == -signal.SIGTERM      # it still ends by SIGTERM
    wait_until_nothing_left(parent.pid, pids, within=5.0)


def test_the_next_run_sweeps_segments_whose_parent_is_dead():
    if not HAVE_DEV_SHM:
        pytest.skip("no /dev/shm listing")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    assert gone(pid)
    name = f"dsml_{pid}_0_1_0"
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
    try:
        dsml.run(lambda comm: (yield comm.compute(0.0)), 2, engine="processes",
                 timeout=TIMEOUT)
        assert not os.path.exists(f"/dev/shm/{name}")
    finally:
        if os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")


def test_a_live_parents_segments_are_not_swept():
    assert segments.sweep_segments() == [] or True     # nothing of ours is swept:
    mine = f"dsml_{os.getpid()}_sweeptest_0"
    if not HAVE_DEV_SHM:
        pytest.skip("no /dev/shm listing")
    fd = os.open(f"/dev/shm/{mine}", os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
    try:
        assert mine not in segments.sweep_segments()
        assert os.path.exists(f"/dev/shm/{mine}")
    finally:
        os.unlink(f"/dev/shm/{mine}")


# --- hopeless waits, found at once -----------------------------------------------------------

def both_receive_first(comm):
    yield comm.recv(1 - comm.rank)


def receives_from_a_finished_rank(comm):
    if comm.rank == 1:
        yield comm.recv(0)
    yield comm.compute(0.0)


def mismatched_tags(comm):
    if comm.rank == 0:
        yield comm.send(1, np.zeros(3), tag=1)
    else:
        yield comm.recv(0, tag=2)


def ping_pong(comm, n):
    """A 2-rank ping-pong that a learner runs with world_size=3: rank 2 waits for rank 0."""
    peer = 1 - comm.rank if comm.rank < 2 else 0
    for _ in range(n):
        if comm.rank == 0:
            yield comm.send(peer, np.zeros(1))
            yield comm.recv(peer)
        else:
            yield comm.recv(peer)
            if comm.rank == 1:
                yield comm.send(peer, np.zeros(1))


@pytest.mark.parametrize("engine", REAL_ENGINES)
@pytest.mark.parametrize("program, world_size, args, waits", [
    (both_receive_first, 2, (), ["rank 0 waits for a message from rank 1 (tag 0)",
                                 "rank 1 waits for a message from rank 0 (tag 0)"]),
    (receives_from_a_finished_rank, 2, (), ["rank 1 waits for a message from rank 0 (tag 0)"]),
    (mismatched_tags, 2, (), ["rank 1 waits for a message from rank 0 (tag 2)",
                              "messages that arrived but were never received"]),
    (ping_pong, 3, (3,), ["rank 2 waits for a message from rank 0 (tag 0)"]),
])
def test_a_hopeless_wait_is_a_deadlock_in_the_simulators_words(engine, program, world_size,
                                                                args, waits):
    start = time.monotonic()
    with pytest.raises(DeadlockError) as info:
        dsml.run(program, world_size, engine=engine, args=args, timeout=TIMEOUT)
    assert time.monotonic() - start < TIMEOUT / 2          # found, not timed out
    message = str(info.value)
    assert message.startswith("deadlock at t=")
    for wait in waits:
        assert wait in message
    with pytest.raises(DeadlockError) as on_sim:            # the simulator says the same
        dsml.run(program, world_size, network=dsml.net.AlphaBeta(1e-6, 1e-9), args=args)
    for wait in waits:
        if wait.startswith("rank"):
            assert wait in str(on_sim.value)


def test_a_run_that_ends_well_is_never_taken_for_a_deadlock():
    """Many short waits, a stash, and ranks that finish early: no false alarm."""
    def busy(comm):
        for step in range(300):
            if comm.rank == 0:
                yield comm.send(1, np.full(1, step), tag=step % 3)
            elif comm.rank == 1:
                got = yield comm.recv(0, tag=step % 3)
                assert got[0] == step
        return comm.rank

    for engine in REAL_ENGINES:
        assert dsml.run(busy, 3, engine=engine, timeout=TIMEOUT).values == [0, 1, 2]


# --- failures="notify" covers a rank that dies -----------------------------------------------

def one_rank_dies(comm, how):
    if comm.rank == 2:
        yield comm.send(0, np.ones(2))
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(4)
    if comm.rank == 0:
        first = yield comm.recv(2)              # sent before it died: still delivered
        try:
            yield comm.recv(2)
        except PeerFailed as failure:
            return ("told", failure.rank, float(first.sum()))
        return "not told"
    return "bystander"


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_a_rank_that_dies_is_a_failed_rank_under_notify(how):
    result = dsml.run(one_rank_dies, 3, engine="processes", args=(how,), failures="notify",
                      timeout=TIMEOUT)
    assert result.values[0] == ("told", 2, 2.0)
    assert result.values[1] == "bystander"
    assert list(result.failed) == [2]
    assert "died (exit code" in str(result.failed[2])


def test_a_rank_that_dies_still_fails_the_run_by_default():
    with pytest.raises(RankError, match=r"rank 2 died \(exit code -9\)"):
        dsml.run(one_rank_dies, 3, engine="processes", args=("kill",), timeout=TIMEOUT)


# --- a collective called without `yield from` --------------------------------------------------

def _allreduce_like(comm, x):
    peer = 1 - comm.rank
    other = yield comm.sendrecv(peer, x, peer)
    return x + other


def forgets_yield_from_and_returns(comm):
    x = _allreduce_like(comm, np.ones(2))          # a generator; nothing was sent
    yield comm.compute(0.0)
    return x


def yields_the_collective(comm):
    x = yield _allreduce_like(comm, np.ones(2))
    return x


@pytest.mark.parametrize("engine", REAL_ENGINES + ["sim"])
def test_a_collective_called_without_yield_from_says_use_yield_from(engine):
    network = dsml.net.AlphaBeta(1e-6, 1e-9) if engine == "sim" else None
    kwargs = {} if engine == "sim" else {"timeout": TIMEOUT}
    with pytest.raises(RankError, match=r"rank [01] .*returned a generator \(_allreduce_like\(\.\.\.\)\) "
                                        r"that never ran.*`yield from`"):
        dsml.run(forgets_yield_from_and_returns, 2, engine=engine, network=network, **kwargs)
    if engine != "sim":              # the simulator's own words come with the week-1 notebook
        with pytest.raises(RankError, match=r"rank [01] .*yielded a generator \(_allreduce_like\(\.\.\.\)\)"
                                            r", not a request; call a collective with `yield from`"):
            dsml.run(yields_the_collective, 2, engine=engine, **kwargs)


# --- shared-memory workers (week 4's Hogwild!) --------------------------------------------------

WORKERS_PARENT = textwrap.dedent("""
    import os, sys
    from dsml.comm.shared import SharedArrays, run_workers

    def work(worker, w, directory):
        open(os.path.join(directory, f"pid{worker}"), "w").write(str(os.getpid()))
        while True:
            w[worker] += 1.0

    with SharedArrays() as shared:
        w = shared.zeros((4,))
        run_workers(work, 4, args=(w, sys.argv[1]), timeout=3600)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: PR_SET_PDEATHSIG")
def test_shared_memory_workers_die_with_a_killed_parent(tmp_path):
    parent, pids = start_parent(tmp_path, WORKERS_PARENT, segments=False)
    parent.kill()
    parent.wait()
    wait_until_nothing_left(parent.pid, pids, within=5.0)


# --- deadlines that hold while starting and while reading results ------------------------------

def test_threads_check_the_deadline_while_they_are_being_started(monkeypatch):
    from dsml.comm import threads as threads_engine

    started = []
    real_start = threads_engine.threading.Thread.start

    def slow_start(thread):
        started.append(thread.name)
        time.sleep(0.05)                 # as starting thousands of threads does
        real_start(thread)
    monkeypatch.setattr(threads_engine.threading.Thread, "start", slow_start)

    def waits_for_everyone(comm):
        yield comm.recv((comm.rank + 1) % comm.size)

    with pytest.raises(RankError, match=r"did not finish within the timeout of 0.5 s"):
        dsml.run(waits_for_everyone, 200, engine="threads", timeout=0.5)
    assert len([name for name in started if name.startswith("dsml-rank")]) < 200


def big_result(comm):
    yield comm.compute(0.0)
    return np.ones(4_000_000)               # 32 MB: many pipe-fulls


def test_a_rank_stopped_while_writing_its_result_is_named_at_the_deadline(monkeypatch):
    """The parent reads results without blocking: a child stopped half-way through writing
    its result does not hold the parent past its timeout."""
    real_write_all = rank_process._write_all

    def write_half_then_stop(fd, data):
        if len(data) > 1_000_000:
            real_write_all(fd, data[:len(data) // 2])
            os.kill(os.getpid(), signal.SIGSTOP)
        real_write_all(fd, data)
    monkeypatch.setattr(rank_process, "_write_all", write_half_then_stop)   # forked ranks see it
    start = time.monotonic()
    with pytest.raises(RankError, match=r"did not finish within the timeout of 3 s") as info:
        dsml.run(big_result, 2, engine="processes", timeout=3)
    assert time.monotonic() - start < TIMEOUT
    if sys.platform.startswith("linux"):
        assert "its process is stopped" in str(info.value)
