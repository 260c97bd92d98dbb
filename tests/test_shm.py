"""Plumbing (hand-written): tests for the `processes` engine's data path — shared memory for large
arrays, pipes for the rest: values intact, sends that never block, and nothing left behind (no
segment in /dev/shm, no child, no resource-tracker warning) after success and every failure.

Real processes on a small CI machine: generous timeouts, deterministic data, no speed claims.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import dsml
from dsml import RankError
from dsml.comm import blas, frames, rank_process, segments
from leaks import HAVE_DEV_SHM, nothing_left_behind  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 60.0
MiB = 1 << 20


def child_env() -> dict:
    """The environment of a child Python that imports this module: the repository and tests/
    (for its helper `leaks`) on the path, the default start method."""
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    env.pop("DSML_START_METHOD", None)
    return env


def parents_segments():
    """Called inside a rank: the segments of the run it belongs to (fork: parent = the run)."""
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"dsml_{os.getppid()}_")]


def run(program, p, **kwargs):
    kwargs.setdefault("timeout", TIMEOUT)
    return dsml.run(program, p, engine="processes", **kwargs)


# --- values --------------------------------------------------------------------------------------

def payloads():
    """Arrays around and above the threshold, of every kind of dtype, with awkward bits."""
    rng = np.random.default_rng(0)
    t = segments.SHM_THRESHOLD
    weird = rng.standard_normal(t // 8 + 3)
    weird[::7] = np.nan
    weird[1] = -0.0
    weird[2] = np.inf
    structured = np.zeros(5000, dtype=[("a", "<i4"), ("b", "<f8", (2,))])
    structured["a"] = np.arange(5000)
    return {
        "below threshold": rng.integers(0, 255, t - 1, dtype=np.uint8),
        "at threshold": rng.integers(0, 255, t, dtype=np.uint8),
        "float64 with nan, -0 and inf": weird,
        "float32 3-d": rng.standard_normal((16, 32, 33)).astype(np.float32),
        "int64": rng.integers(-2**62, 2**62, 100_000),
        "complex128": rng.standard_normal(5000) + 1j * rng.standard_normal(5000),
        "bool": rng.random(70_000) < 0.5,
        "big-endian": np.arange(20_000, dtype=">i4"),
        "structured": structured,
        "fortran order": np.asfortranarray(rng.standard_normal((300, 200))),
        "4 MiB": rng.standard_normal(MiB // 2),
        "empty": np.zeros((0, 5)),
    }


def bounce(comm, payload):
    """Rank 0 sends to 1, 1 returns it to 0: two trips through the engine."""
    if comm.rank == 0:
        yield comm.send(1, payload)
        return (yield comm.recv(1))
    got = yield comm.recv(0)
    yield comm.send(0, got)
    return None


def same_bits(a, b):
    return (type(a) is type(b) is np.ndarray and a.dtype == b.dtype and a.shape == b.shape
            and a.tobytes() == b.tobytes())


@pytest.mark.parametrize("name", list(payloads()))
def test_arrays_arrive_bit_identical(name):
    x = payloads()[name]
    back = run(bounce, 2, args=(x,)).values[0]
    assert same_bits(back, x)


def test_large_arrays_inside_structured_messages():
    big, small = np.arange(MiB // 8, dtype=np.float64), np.arange(3)
    message = {"step": 7, "grads": [big, small, (big[::2].copy(), 1.5)], "name": "w"}
    back = run(bounce, 2, args=(message,)).values[0]
    assert back["step"] == 7 and back["name"] == "w"
    assert same_bits(back["grads"][0], big) and same_bits(back["grads"][1], small)
    assert same_bits(back["grads"][2][0], big[::2].copy()) and back["grads"][2][1] == 1.5


def test_large_arrays_really_go_through_shared_memory():
    def look(comm):
        if comm.rank == 0:
            yield comm.send(1, np.ones(MiB))
            return None
        x = yield comm.recv(0)
        return parents_segments(), float(x.sum())      # kept for reuse until the run ends

    if not HAVE_DEV_SHM:
        pytest.skip("no /dev/shm to look at")
    before, total = run(look, 2).values[1]
    assert total == MiB
    assert len(before) == 1 and before[0].startswith(f"dsml_{os.getpid()}_")


def ring(comm, n, rounds, seed):
    rng = np.random.default_rng(seed + comm.rank)
    x = rng.standard_normal(n)
    mine = x.copy()
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    for _ in range(rounds):
        x = yield comm.sendrecv(right, x, left)
    return mine, x


@pytest.mark.parametrize("p, n", [(2, MiB // 8), (3, 50_000), (4, 10_000)])
def test_many_large_messages_reuse_segments_and_stay_intact(p, n):
    rounds = 2 * p + 1
    values = run(ring, p, args=(n, rounds, 3)).values
    for rank, (_, final) in enumerate(values):
        assert same_bits(final, values[(rank - rounds) % p][0])


def test_sizes_that_change_from_message_to_message():
    def growing(comm):
        other, got = 1 - comm.rank, []
        for i in range(12):
            x = np.full(1000 * 2 ** (i % 7) + i, float(i))     # 1 KB ... 512 KB, not powers of 2
            y = yield comm.sendrecv(other, x, other)
            got.append(bool(np.array_equal(x, y)))
        return all(got)

    assert run(growing, 2).values == [True, True]



# --- large arrays arrive as views of the sender's segment --------------------------------------

def test_a_large_array_arrives_as_a_writable_view_of_shared_memory():
    def look(comm):
        if comm.rank == 0:
            yield comm.send(1, np.arange(MiB // 8, dtype=np.float64))
            return None
        x = yield comm.recv(0)
        x += 1                                       # the receiver may change what it got
        return bool(x.flags.owndata), bool(x.flags.writeable), float(x[-1])

    assert run(look, 2).values[1] == (False, True, float(MiB // 8))


def test_arrays_a_receiver_keeps_are_never_overwritten():
    """Rank 1 keeps every other array, and of the rest only a small slice: a segment may be
    reused only when no array made from it is left, so all of them must stay intact."""
    def keeps(comm, count):
        if comm.rank == 0:
            for i in range(count):
                yield comm.send(1, np.full(MiB // 8, float(i)))
            return None
        kept, slices = {}, {}
        for i in range(count):
            x = yield comm.recv(0)
            if i % 2:
                kept[i] = x
            else:
                slices[i] = x[100:110]            # keeps the whole segment busy
            del x
        return all(np.all(a == i) for i, a in {**kept, **slices}.items())

    assert run(keeps, 2, args=(16,)).values[1] is True


def test_segments_come_back_once_the_arrays_are_gone():
    """A ring that drops each array after use: each sender's pool stays at a few segments,
    not one per message."""
    def ring_count(comm, rounds):
        x = np.ones(MiB // 8)
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        for _ in range(rounds):
            x = yield comm.sendrecv(right, x, left)
        return len(parents_segments()) if HAVE_DEV_SHM else 0

    counts = run(ring_count, 2, args=(40,)).values
    assert max(counts) <= 8, f"{counts[0]} segments for 80 messages: acknowledgements lost?"


def test_a_ring_allreduce_settles_on_two_segments_per_rank():
    """p = 2, 1 MiB: a rank's reduce-scatter block and all-gather block each find their
    segment acknowledged by the time they are sent (the receiver lets go of each view before
    its next send, and the engine itself keeps no reference), so each rank makes exactly two
    segments however many all-reduces it runs. (When the engine held the last received array
    until the next request had been answered, a third one appeared and the three rotated.)"""
    from dsml.collectives import allreduce

    def many(comm, times):
        x = np.full(MiB // 4, comm.rank + 1.0, dtype=np.float32)
        for _ in range(times):
            out = yield from allreduce(comm, x, algorithm="ring")
        assert np.all(out == 3.0)
        return sorted(parents_segments())

    if not HAVE_DEV_SHM:
        pytest.skip("no /dev/shm to look at")
    names = run(many, 2, args=(30,)).values[0]
    per_rank = {rank: [n for n in names if n.split("_")[-2] == str(rank)] for rank in (0, 1)}
    assert [len(per_rank[0]), len(per_rank[1])] == [2, 2], names


def test_a_rank_that_fails_holding_received_arrays_leaves_nothing_and_prints_nothing():
    code = textwrap.dedent("""
        import numpy as np
        import dsml

        def holds_then_fails(comm):
            if comm.rank == 0:
                for i in range(3):
                    yield comm.send(1, np.full(1 << 17, float(i)), tag=i % 2)
                return None
            # Receiving tag 1 reads past the two arrays of tag 0: they wait, as views of
            # rank 0's segments, in the engine's stash when the rank fails.
            held = [(yield comm.recv(0, tag=1))]
            raise ValueError(f"rank 1 gives up holding {held[0][0]}")

        try:
            dsml.run(holds_then_fails, 2, engine="processes", timeout=60)
        except dsml.RankError as error:
            print("failed as expected:", error.rank, str(error).splitlines()[0])
    """)
    env = child_env()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "failed as expected: 1 rank 1 failed: ValueError: rank 1 gives up holding 1.0" \
        in done.stdout, done.stdout
    assert "Traceback" not in done.stderr and "Warning" not in done.stderr, done.stderr
    assert "resource_tracker" not in done.stderr, done.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_ranks_keep_freed_memory_for_reuse():
    def ask(comm):
        yield comm.compute(0.0)
        return rank_process.keep_freed_memory()

    assert run(ask, 2).values == [True, True]


# --- frames: a bare array goes raw (header + bytes), anything else is pickled -------------------

def small_payloads():
    """Arrays below the shared-memory threshold, of every kind of dtype and shape."""
    rng = np.random.default_rng(1)
    weird = rng.standard_normal(37)
    weird[::5] = np.nan
    weird[1], weird[2] = -0.0, -np.inf
    structured = np.zeros(4, dtype=[("a", "<i4"), ("b", "<f8", (2,))])
    structured["a"] = np.arange(4)
    return {
        "float64 with nan, -0 and -inf": weird,
        "float32 0-d": np.array(3.25, dtype=np.float32),
        "float16": rng.standard_normal(9).astype(np.float16),
        "int8": np.arange(-128, 128, dtype=np.int8),
        "uint64 extremes": np.array([0, 2**64 - 1, 2**63], dtype=np.uint64),
        "int16 big-endian": np.arange(-7, 7, dtype=">i2"),
        "float64 big-endian 2-d": rng.standard_normal((3, 4)).astype(">f8"),
        "complex64": (rng.standard_normal(5) + 1j).astype(np.complex64),
        "bool 3-d": rng.random((2, 3, 4)) < 0.5,
        "unicode": np.array(["", "héllo", "∑"], dtype="<U5"),
        "bytes": np.array([b"ab", b"\x00\x01\x02"], dtype="S3"),
        "datetime64[ms]": np.array([0, 1, -5], dtype="datetime64[ms]"),
        "timedelta64[ns]": np.array([7, -7], dtype="timedelta64[ns]"),
        "void": np.frombuffer(b"abcdefgh", dtype="V4").copy(),
        "zero length": np.zeros(0, dtype=np.float32),
        "zero length 3-d": np.zeros((3, 0, 2), dtype=np.int64),
        "strided view": np.arange(100.0)[::3],
        "fortran order (pickled)": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "structured (pickled)": structured,
        "object (pickled)": np.array([1, "a", None, 2.5], dtype=object),
    }


def goes_raw(payload) -> bool:
    return frames.encode_frame(0, payload)[8] == frames._RAW


def test_plain_arrays_go_raw_and_everything_else_is_pickled():
    payloads = small_payloads()
    for name, x in payloads.items():
        assert goes_raw(x) == ("pickled" not in name and "strided" not in name), name
    assert goes_raw(payloads["strided view"].copy())         # what a send snapshots
    for other in [(np.arange(3), 1), {"w": np.arange(3)}, [1.5], "text", 7, None,
                  dsml.SizeOnly(8), np.float64(2.0)]:
        assert not goes_raw(other), other


@pytest.mark.parametrize("name", list(small_payloads()))
def test_frames_decode_to_the_same_bits(name):
    x = small_payloads()[name]
    frame = frames.encode_frame(9, x)
    # as the receiver sees it: after other bytes, in a buffer it keeps reusing
    buffer = bytearray(b"junk" + frame + b"more")
    tag, back = frames.decode_frame(buffer, 4, len(frame) - 8)
    assert tag == 9
    if x.dtype.hasobject:
        assert back.dtype == x.dtype and list(back) == list(x)
    else:
        assert same_bits(back, x)
    assert back.flags.writeable
    buffer[:] = b"\xff" * len(buffer)                      # the array owns its bytes
    if not x.dtype.hasobject:
        assert same_bits(back, x)


def test_references_to_segments_and_acknowledgements_have_frames_of_their_own():
    ref = segments.ShmRef("dsml_1_2_3_4", (5, 0, 7), np.dtype(">f4"))
    frame = frames.encode_frame(11, ref)
    assert frame[8] == frames._REF
    tag, back = frames.decode_frame(bytearray(frame), 0, len(frame) - 8)
    assert (tag, back.name, back.shape, back.dtype) == (11, ref.name, ref.shape, ref.dtype)
    names = ["dsml_1_2_0_0", "dsml_1_2_0_17"]
    frame = frames.encode_frame(frames._ACK, names)
    assert frame[8] == frames._NAMES
    assert frames.decode_frame(bytearray(frame), 0, len(frame) - 8) == (frames._ACK, names)


def test_small_arrays_and_structured_messages_arrive_intact_between_processes():
    payloads = small_payloads()
    message = {"step": 3, "name": "w", "grads": [payloads["float16"], (np.ones(3), 1.5)],
               "size": dsml.SizeOnly(12)}

    def many(comm):
        if comm.rank == 0:
            for x in payloads.values():
                yield comm.send(1, x, tag=1)
            yield comm.send(1, message, tag=2)
            return None
        got = []
        for _ in payloads:
            got.append((yield comm.recv(0, tag=1)))
        return got, (yield comm.recv(0, tag=2))

    got, back = run(many, 2).values[1]
    for (name, x), y in zip(payloads.items(), got):
        if x.dtype.hasobject:
            assert list(y) == list(x), name
        else:
            assert same_bits(y, x), name
    assert back["step"] == 3 and back["name"] == "w" and back["size"] == dsml.SizeOnly(12)
    assert same_bits(back["grads"][0], payloads["float16"]) and back["grads"][1][1] == 1.5


# --- sends never block -------------------------------------------------------------------------

def test_both_ranks_send_twenty_large_messages_before_receiving():
    def both_send_first(comm):
        other = 1 - comm.rank
        for i in range(20):
            yield comm.send(other, np.full(MiB // 8, float(100 * comm.rank + i)))   # 1 MiB
        got = []
        for _ in range(20):
            x = yield comm.recv(other)
            got.append(float(x[0]) if np.all(x == x[0]) else None)
        return got

    values = run(both_send_first, 2).values
    assert values[0] == [100.0 + i for i in range(20)]
    assert values[1] == [float(i) for i in range(20)]


def test_both_ranks_send_more_small_messages_than_a_pipe_holds_before_receiving():
    def flood(comm, count):
        other = 1 - comm.rank
        for i in range(count):
            yield comm.send(other, np.full(128, i, dtype=np.int64))    # ~1.2 KB framed
        total = 0
        for i in range(count):
            x = yield comm.recv(other)
            total += int(x[0] == i)
        return total

    assert run(flood, 2, args=(1000,)).values == [1000, 1000]        # ~1.2 MB each way


def test_what_a_finished_rank_still_has_queued_is_delivered():
    def leaves_early(comm):
        if comm.rank == 0:
            for i in range(500):
                yield comm.send(1, np.full(256, i, dtype=np.int32))     # more than a pipe holds
            return "done"
        for _ in range(3):
            yield comm.compute(0.0)
        import time
        time.sleep(0.3)                    # rank 0 has returned by now
        got = []
        for _ in range(500):
            got.append(int((yield comm.recv(0))[0]))
        return got == list(range(500))

    assert run(leaves_early, 2).values == ["done", True]


# --- failures leave nothing behind ---------------------------------------------------------------

def sends_big_then(comm, what):
    """Rank 0 sends 1 MiB that rank 1 never takes; rank 1 then fails in the way asked."""
    if comm.rank == 0:
        yield comm.send(1, np.ones(MiB // 8), tag=3)
        yield comm.send(1, np.ones(10), tag=4)
        if what == "never received":
            return None
        yield comm.recv(1, tag=9)          # blocks until the engine stops this rank
    yield comm.recv(0, tag=4)              # rank 0's big message is sent by now
    if HAVE_DEV_SHM:
        assert parents_segments(), "the big message should be waiting in shared memory"
    if what == "raise":
        raise ValueError("rank 1 gives up")
    if what == "exit":
        os._exit(5)
    if what == "deadlock":
        yield comm.recv(0, tag=7)          # never sent
    if what == "timeout":
        os.kill(os.getpid(), signal.SIGSTOP)   # stopped: only the timeout ends the run
    return None


@pytest.mark.parametrize("what, pattern", [
    ("raise", r"rank 1 failed: ValueError: rank 1 gives up"),
    ("exit", r"rank 1 died \(exit code 5\)"),
    ("deadlock", r"deadlock at t=.*\n  rank 0 waits for a message from rank 1 \(tag 9\)\n"
                 r"  rank 1 waits for a message from rank 0 \(tag 7\)"),
    ("timeout", r"rank 1 is stopped \(SIGSTOP or a debugger\?\), so the run did not finish "
                r"within the timeout of 3 s \(2 rank\(s\) unfinished\)"),
    ("never received", r"rank 1 finished without receiving messages sent to it"),
])
def test_no_segment_is_left_after_a_failure(what, pattern):
    with pytest.raises(RankError, match=pattern):
        run(sends_big_then, 2, args=(what,), timeout=3 if what == "timeout" else TIMEOUT)
    # the fixture checks /dev/shm and the children


def test_without_a_listing_the_counted_names_are_unlinked(monkeypatch):
    monkeypatch.setattr(segments, "SHM_DIR", "/nonexistent-shm-listing")
    with pytest.raises(RankError, match=r"rank 1 failed: ValueError"):
        run(sends_big_then, 2, args=("raise",))


def test_no_resource_tracker_warning_after_success_and_every_failure():
    code = textwrap.dedent("""
        import numpy as np
        import dsml
        from tests.test_shm import ring, sends_big_then

        result = dsml.run(ring, 3, engine="processes", args=(200_000, 7, 1), timeout=60)
        print("ring ok", len(result.values))
        for what, timeout in [("raise", 60), ("exit", 60), ("timeout", 3),
                              ("never received", 60)]:
            try:
                dsml.run(sends_big_then, 2, engine="processes", args=(what,), timeout=timeout)
            except dsml.RankError as error:
                print("failed as expected:", what)
    """)
    env = child_env()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("failed as expected") == 4, done.stdout
    assert "resource_tracker" not in done.stderr and "leaked" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "Warning" not in done.stderr, done.stderr


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawned_children_share_the_tracker_and_clean_up(monkeypatch, method):
    """Also: a forkserver child's parent is the server, which its check for an orphaned rank
    must not take for a dead parent."""
    monkeypatch.setenv("DSML_START_METHOD", method)
    values = run(ring, 2, args=(100_000, 3, 5)).values
    assert same_bits(values[0][1], values[1][0])


# --- one BLAS thread per child -------------------------------------------------------------------

def test_children_run_blas_with_one_thread():
    def report(comm):
        yield comm.compute(0.0)
        return blas.blas_threads(), os.environ.get("OPENBLAS_NUM_THREADS")

    before = blas.blas_threads()
    values = run(report, 2).values
    for counts, variable in values:
        assert variable == "1"
        assert all(n == 1 for n in counts)
    assert blas.blas_threads() == before        # the parent's BLAS is left alone
    if not values[0][0]:
        pytest.skip("this NumPy's BLAS does not say how many threads it uses")
