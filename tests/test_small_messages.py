"""Plumbing (hand-written): the small-message path of the `processes` engine (issue 20) gives
what the general path gives — same arrays, same traces, same errors — and keeps every
guarantee: deadlocks found at once, failure notices, messages in order, the shared-memory
path for large arrays. No assertion on speed (benchmarks/small_messages.py measures it).
"""
from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dsml
from dsml.collectives import allreduce
from dsml.comm import frames, segments
from dsml.comm.api import Comm
from dsml.comm.failures import PeerFailed
from dsml.sim import DeadlockError
from leaks import nothing_left_behind  # noqa: F401
from test_shm import same_bits, small_payloads

TIMEOUT = 60.0
ROOT = Path(__file__).resolve().parent.parent


# --- frames ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [n for n in small_payloads()
                                  if "pickled" not in n and "strided" not in n])
def test_a_frame_read_whole_decodes_as_the_general_path_does(name):
    x = small_payloads()[name]
    for _ in range(2):                    # first the head is parsed, then it comes from the cache
        frame = frames.encode_frame(9, x)
        tag, whole = frames.decode_whole(frame)
        general_tag, general = frames.decode_frame(bytearray(frame), 0, len(frame) - 8)
        assert tag == general_tag == 9
        assert same_bits(whole, x) and same_bits(general, x)
        assert whole.flags.writeable and whole.flags.c_contiguous
        assert whole.flags.aligned              # the head is padded: the data starts aligned
        whole[...] = general[...]               # the program may write into what it received


def test_heads_are_cached_per_tag_dtype_and_shape_and_only_below_the_threshold():
    small = np.arange(10, dtype=np.float32)
    big = np.zeros(segments.SHM_THRESHOLD // 8, dtype=np.float64)
    frames.encode_frame(3, small)
    frames.encode_frame(3, big)
    assert (3, small.dtype, small.shape) in frames._HEADS
    assert (3, big.dtype, big.shape) not in frames._HEADS   # goes through shared memory
    one, other = frames.encode_frame(3, small), frames.encode_frame(4, small)
    assert one != other                                       # the tag is part of the head
    assert frames.decode_whole(other)[0] == 4
    assert frames.decode_whole(frames.encode_frame(3, small.reshape(2, 5)))[1].shape \
        == (2, 5)


# --- the same results and traces as the general path -----------------------------------------------

def mixed_messages(comm):
    """Small raw arrays of several dtypes and shapes, a pickled message and a large array,
    sent back to back and received in another order (some go through the stash), then a few
    exchanges and an all-reduce; returns everything received."""
    peer = 1 - comm.rank
    got = []
    payloads = [np.arange(6, dtype=np.float32) + comm.rank,
                (np.arange(4.0) * comm.rank).reshape(2, 2),
                np.array([True, False, comm.rank == 1]),
                {"step": comm.rank, "w": np.ones(3)},
                np.full(segments.SHM_THRESHOLD // 4, comm.rank, dtype=np.float32)]
    for tag, payload in enumerate(payloads):
        yield comm.send(peer, payload, tag=tag)
    for tag in (4, 1, 3, 0, 2):
        got.append((yield comm.recv(peer, tag=tag)))
    x = np.arange(1024, dtype=np.float32) * (comm.rank + 1)
    for _ in range(5):
        x = yield comm.sendrecv(peer, x, peer, tag=7)
        x[0] += 1                                    # received arrays are the program's own
    got.append(x)
    for algorithm in ("ring", "recursive_doubling"):
        got.append((yield from allreduce(comm, np.arange(1024.0) + comm.rank,
                                         algorithm=algorithm)))
    return got


def flatten(values):
    out = []
    for value in values:
        if isinstance(value, dict):
            out += [value["step"], value["w"]]
        else:
            out.append(value)
    return out


def test_the_fast_path_gives_the_results_and_trace_rows_of_the_threads_engine():
    fast = dsml.run(mixed_messages, 2, engine="processes", timeout=TIMEOUT)
    untraced = dsml.run(mixed_messages, 2, engine="processes", trace=False, timeout=TIMEOUT)
    reference = dsml.run(mixed_messages, 2, engine="threads", timeout=TIMEOUT)
    for rank in range(2):
        for a, b, c in zip(flatten(fast.values[rank]), flatten(untraced.values[rank]),
                           flatten(reference.values[rank])):
            assert np.array_equal(a, c) and np.array_equal(b, c)
            if isinstance(c, np.ndarray):
                assert a.dtype == b.dtype == c.dtype and a.shape == b.shape == c.shape

    def rows(result):
        return sorted((r.rank, r.op, r.src, r.dst, r.nbytes, r.tag) for r in result.trace)
    assert rows(fast) == rows(reference)
    assert untraced.trace is None


# --- guarantees kept on the fast path -------------------------------------------------------------

def exchanges_then_a_wrong_tag(comm):
    peer = 1 - comm.rank
    x = np.ones(1024, dtype=np.float32)
    for _ in range(20):
        x = yield comm.sendrecv(peer, x, peer)
    if comm.rank == 0:
        yield comm.send(peer, x, tag=5)
    return (yield comm.recv(peer, tag=6))      # rank 1's message (tag 5) never matches


def test_a_deadlock_after_fast_exchanges_is_found_at_once_and_names_the_held_message():
    with pytest.raises(DeadlockError) as caught:
        dsml.run(exchanges_then_a_wrong_tag, 2, engine="processes", trace=False,
                 timeout=TIMEOUT)
    text = str(caught.value)
    assert "rank 0 waits for a message from rank 1 (tag 6)" in text
    assert "rank 1 waits for a message from rank 0 (tag 6)" in text
    assert "rank 1 holds 1 message(s) no receive has taken" in text


def fails_after_exchanges(comm, how):
    peer = 1 - comm.rank
    x = np.ones(256, dtype=np.float32)
    for _ in range(10):
        x = yield comm.sendrecv(peer, x, peer)
    if comm.rank == 1:
        if how == "raise":
            raise ValueError("rank 1 gives up")
        import os
        os._exit(3)
    try:
        yield comm.recv(peer)
    except PeerFailed as failure:
        return f"peer {failure.rank} failed"
    return "no failure seen"


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_a_peer_that_fails_during_fast_exchanges_is_reported_to_the_waiting_rank(how):
    result = dsml.run(fails_after_exchanges, 2, engine="processes", args=(how,),
                      failures="notify", trace=False, timeout=TIMEOUT)
    assert result.values[0] == "peer 1 failed"
    assert 1 in result.failed


# --- collectives without a trace: the collective's own generator, its own signature --------------

def test_a_traced_collective_keeps_its_signature_and_names():
    from dsml.collectives.allreduce import allreduce as plain
    assert inspect.signature(allreduce) == inspect.signature(plain)
    assert allreduce.__name__ == "allreduce" and allreduce.__wrapped__ is plain
    comm = Comm(0, 2)
    comm.tracing = False
    untraced = allreduce(comm, np.ones(3), algorithm="recursive_doubling")
    assert untraced.gi_code is plain.__code__           # no generator in between
    comm.tracing = True
    traced = allreduce(comm, np.ones(3), "sum", "ring")
    assert traced.gi_code is not plain.__code__ and traced.__qualname__ == plain.__qualname__
    untraced.close()
    traced.close()


def yields_allreduce_itself(comm):
    yield allreduce


def test_yielding_the_collective_itself_still_says_use_yield_from():
    with pytest.raises(dsml.RankError, match=r"yielded the generator function allreduce "
                                             r"itself.*`yield from`"):
        dsml.run(yields_allreduce_itself, 2, engine="threads", timeout=TIMEOUT)


def _scaled(comm, x, scale=2):
    yield comm.compute(1e-6)
    return x * scale


def _scaled_keyword_only(comm, x, *, scale=2):
    yield comm.compute(1e-6)
    return x * scale


def _scaled_by_clock(comm, x, clock=3):             # a name the generated wrapper uses
    yield comm.compute(1e-6)
    return x * clock


@pytest.mark.parametrize("trace", [True, False])
def test_traced_wrappers_pass_every_argument_and_record_one_slice_per_call(trace):
    from dsml.comm.spans import traced
    scaled, keyword_only, by_clock = (traced(f) for f in (_scaled, _scaled_keyword_only,
                                                          _scaled_by_clock))

    def program(comm):
        x = np.ones(2)
        out = [(yield from scaled(comm, x)), (yield from scaled(comm, x, 5)),
               (yield from scaled(comm, x=x, scale=5)),
               (yield from keyword_only(comm, x)), (yield from keyword_only(comm, x, scale=5)),
               (yield from by_clock(comm, x)), (yield from by_clock(comm, x, clock=5))]
        return [float(o.sum()) for o in out]

    result = dsml.run(program, 2, engine="threads", trace=trace, timeout=TIMEOUT)
    assert result.values == [[4.0, 10.0, 10.0, 4.0, 10.0, 6.0, 10.0]] * 2
    if trace:
        spans = [r for r in result.trace if r.op.startswith("_scaled")]
        assert sorted(r.op for r in spans if r.rank == 0) == sorted(
            ["_scaled"] * 3 + ["_scaled_keyword_only"] * 2 + ["_scaled_by_clock"] * 2)
        assert {r.nbytes for r in spans} == {16}


def test_the_per_call_benchmark_runs_checks_its_sums_and_times_a_second_checkout(tmp_path):
    raw = tmp_path / "raw.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "small_messages.py"),
                          "--calls", "20", "--warm-up", "5", "--repeats", "1",
                          "--columns", "pingpong,ring,recursive_doubling,pipe",
                          "--before", str(ROOT), "--raw", str(raw)],
                         capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr[-3000:]
    names = ["pingpong", "pingpong (before)", "ring", "ring (before)", "recursive_doubling",
             "recursive_doubling (before)", "pipe"]
    rows = {line[:30].strip() for line in run.stdout.splitlines() if not line.startswith("#")}
    assert set(names) <= rows
    summaries = json.loads(raw.read_text())
    assert sorted(summaries) == sorted(names)
    assert all(s[0]["p10"] <= s[0]["median"] <= s[0]["p90"] for s in summaries.values())
