"""Plumbing (hand-written): tests for dsml.sim — event order, tie-break, deadlock, failures, traces."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import dsml
from dsml.collectives import allreduce
from dsml.sim import PENDING, DeadlockError, ProcessFailed, Simulator, Trace, TraceRecord
from dsml.sim_support import partial_overlaps


# --- a minimal request vocabulary, so these tests need nothing but dsml.sim ------------

class Sleep:
    def __init__(self, seconds):
        self.seconds = seconds

    def describe(self):
        return f"sleeps for {self.seconds} s"


class Wait:
    """Wait for a named signal that nobody may ever send."""

    def __init__(self, what):
        self.what = what

    def describe(self):
        return f"waits for signal {self.what!r}"


def handler(process, request):
    if isinstance(request, Sleep):
        process.sim.after(request.seconds, process.resume, None)
    # Wait: nothing is scheduled, the process stays blocked forever.
    return PENDING


# --- event ordering ---------------------------------------------------------------------

def test_events_run_in_time_order():
    sim = Simulator()
    seen = []
    for t in [3.0, 1.0, 2.5, 0.0, 2.0]:
        sim.at(t, lambda arg: seen.append((sim.now, arg)), t)
    end = sim.run()
    assert seen == [(t, t) for t in sorted([3.0, 1.0, 2.5, 0.0, 2.0])]
    assert end == 3.0
    assert sim.events_processed == 5


def test_same_time_events_run_in_scheduling_order():
    sim = Simulator()
    seen = []
    for label in "abcdefghij":
        sim.at(1.0, seen.append, label)
    sim.at(0.5, seen.append, "early")
    sim.run()
    assert seen == ["early"] + list("abcdefghij")


def test_events_scheduled_during_run_at_the_current_time_run_after_those_already_queued():
    sim = Simulator()
    seen = []

    def first(_):
        seen.append("first")
        sim.at(sim.now, seen.append, "scheduled by first")

    sim.at(1.0, first)
    sim.at(1.0, seen.append, "second")
    sim.run()
    assert seen == ["first", "second", "scheduled by first"]


def test_after_is_relative_to_now():
    sim = Simulator()
    seen = []
    sim.at(2.0, lambda _: sim.after(0.25, lambda _: seen.append(sim.now)))
    sim.run()
    assert seen == [2.25]


def test_scheduling_in_the_past_raises():
    sim = Simulator()
    errors = []

    def late(_):
        try:
            sim.at(0.5, seen_nothing)
        except ValueError as error:
            errors.append(str(error))

    def seen_nothing(_):
        raise AssertionError("must not run")

    sim.at(1.0, late)
    sim.run()
    assert len(errors) == 1 and "cannot schedule in the past" in errors[0]
    with pytest.raises(ValueError, match="in the past"):
        sim.after(-1e-9, seen_nothing)


def test_scheduling_at_nan_raises():
    sim = Simulator()
    with pytest.raises(ValueError, match="NaN"):
        sim.at(float("nan"), print)


def test_processes_interleave_by_simulated_time_and_spawn_order():
    sim = Simulator()
    log = []

    def sleeper(name, delays):
        for d in delays:
            yield Sleep(d)
            log.append((sim.now, name))
        return name.upper()

    a = sim.spawn(sleeper("a", [1.0, 1.0, 1.0]), handler, name="a")
    b = sim.spawn(sleeper("b", [0.5, 1.5, 1.0]), handler, name="b")
    assert sim.run() == 3.0
    # At t=2 both wake: b scheduled its wake-up (at t=0.5) before a did (at t=1), so b runs
    # first, and then schedules its t=3 wake-up before a does: ties follow scheduling order.
    assert log == [(0.5, "b"), (1.0, "a"), (2.0, "b"), (2.0, "a"), (3.0, "b"), (3.0, "a")]
    assert (a.value, b.value) == ("A", "B")
    assert (a.finish_time, b.finish_time) == (3.0, 3.0)
    assert a.done and b.done and a.waiting_for is None


def test_default_process_names_are_numbered():
    sim = Simulator()

    def nothing():
        return 1
        yield  # pragma: no cover

    p = sim.spawn(nothing(), handler)
    sim.run()
    assert p.name == "process 0" and p.value == 1 and p.finish_time == 0.0


# --- deadlock and failures ----------------------------------------------------------------

def test_deadlock_lists_every_waiting_process_and_what_it_waits_for():
    sim = Simulator()

    def waiter(what, first=0.0):
        yield Sleep(first)
        yield Wait(what)

    def finisher():
        yield Sleep(5.0)

    sim.spawn(waiter("go", 1.0), handler, name="alice")
    sim.spawn(finisher(), handler, name="carol")
    sim.spawn(waiter("stop", 2.0), handler, name="bob")
    with pytest.raises(DeadlockError) as info:
        sim.run()
    message = str(info.value)
    assert "deadlock at t=5 s" in message
    assert "2 process(es) still wait" in message
    assert "alice waits for signal 'go'" in message
    assert "bob waits for signal 'stop'" in message
    assert "carol" not in message
    assert [p.name for p in info.value.waiting] == ["alice", "bob"]


def test_deadlock_describes_a_request_without_describe_by_its_repr():
    sim = Simulator()

    def stuck():
        yield ("opaque", 42)

    sim.spawn(stuck(), lambda process, request: PENDING, name="p")
    with pytest.raises(DeadlockError, match=r"p waits on \('opaque', 42\)"):
        sim.run()


def test_a_raising_process_gives_process_failed_with_the_cause_chained():
    sim = Simulator()

    def broken():
        yield Sleep(1.5)
        raise KeyError("missing")

    sim.spawn(broken(), handler, name="worker 7")
    with pytest.raises(ProcessFailed, match=r"worker 7 raised KeyError: 'missing'") as info:
        sim.run()
    assert isinstance(info.value.__cause__, KeyError)
    assert info.value.error is info.value.__cause__
    assert info.value.process.name == "worker 7"
    assert sim.now == 1.5


def test_a_process_that_raises_before_its_first_yield_fails_too():
    sim = Simulator()

    def broken():
        raise ZeroDivisionError("at once")
        yield  # pragma: no cover

    sim.spawn(broken(), handler, name="early")
    with pytest.raises(ProcessFailed, match="early raised ZeroDivisionError"):
        sim.run()


# --- traces -------------------------------------------------------------------------------

ALPHA, BETA = 5e-6, 1e-9


def ping_pong_program(comm, nbytes, rounds=2):
    x = np.arange(nbytes, dtype=np.uint8)
    for _ in range(rounds):
        if comm.rank == 0:
            yield comm.send(1, x)
            x = yield comm.recv(1)
        else:
            x = yield comm.recv(0)
            yield comm.compute(1e-6)
            yield comm.send(0, x)
    return int(x.sum())


def ring_program(comm, n, rounds):
    x = np.full(n, comm.rank, dtype=np.float64)
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    for _ in range(rounds):
        x = yield comm.sendrecv(right, x, left)
        yield comm.compute(1e-7 * (comm.rank + 1))
    return x


def chrome_bytes(result, tmp_path, name):
    path = tmp_path / name
    assert partial_overlaps(result.trace.to_chrome(path)) == []
    return path.read_bytes()


def test_same_simulation_twice_gives_byte_identical_chrome_json(tmp_path):
    net = dsml.net.AlphaBeta(alpha=ALPHA, beta=BETA)
    a = dsml.run(ring_program, 5, network=net, args=(100, 4))
    b = dsml.run(ring_program, 5, network=dsml.net.AlphaBeta(alpha=ALPHA, beta=BETA),
                 args=(100, 4))
    first, second = chrome_bytes(a, tmp_path, "a.json"), chrome_bytes(b, tmp_path, "b.json")
    assert first == second
    assert a.trace.records == b.trace.records
    # A different input changes the trace (the comparison above is not vacuous).
    c = dsml.run(ring_program, 5, network=net, args=(101, 4))
    assert chrome_bytes(c, tmp_path, "c.json") != first


def test_to_chrome_is_valid_json_with_one_track_per_rank_and_times_in_microseconds(tmp_path):
    nbytes = 1000
    result = dsml.run(ping_pong_program, 2, network=dsml.net.AlphaBeta(ALPHA, BETA),
                      args=(nbytes, 1))
    path = tmp_path / "trace.json"
    returned = result.trace.to_chrome(path)
    document = json.loads(path.read_text(encoding="utf-8"))
    assert document == returned
    events = document["traceEvents"]
    names = [e for e in events if e["ph"] == "M"]
    assert [(e["name"], e["pid"], e["tid"], e["args"]["name"]) for e in names] == [
        ("process_name", 0, 0, "rank 0"), ("process_name", 1, 1, "rank 1"),
        ("thread_name", 0, 0, "rank 0"), ("thread_name", 1, 1, "rank 1")]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == len(result.trace)
    assert {(e["pid"], e["tid"]) for e in spans} == {(0, 0), (1, 1)}
    message = ALPHA + nbytes * BETA
    send0 = next(e for e in spans if e["tid"] == 0 and e["name"] == "send")
    assert send0["ts"] == 0.0
    assert math.isclose(send0["dur"], message * 1e6, rel_tol=1e-12)
    assert send0["args"] == {"nbytes": nbytes, "tag": 0, "src": 0, "dst": 1}
    recv0 = next(e for e in spans if e["tid"] == 0 and e["name"] == "recv")
    # rank 0 posts its receive right after its send, then waits for 1 µs of compute + reply.
    assert math.isclose(recv0["ts"], message * 1e6, rel_tol=1e-12)
    assert math.isclose(recv0["dur"], (1e-6 + message) * 1e6, rel_tol=1e-12)
    compute1 = next(e for e in spans if e["name"] == "compute")
    assert compute1["tid"] == 1 and math.isclose(compute1["dur"], 1.0, rel_tol=1e-12)
    for e in spans:
        assert e["pid"] == e["tid"] and e["dur"] >= 0 and e["ts"] >= 0
    assert partial_overlaps(document) == []


def test_to_chrome_output_file_is_sorted_and_compact(tmp_path):
    trace = Trace([TraceRecord(1, "recv", 2e-6, 3e-6, src=0, dst=1, nbytes=8),
                   TraceRecord(0, "send", 0.0, 1e-6, src=0, dst=1, nbytes=8)])
    path = tmp_path / "t.json"
    trace.to_chrome(path)
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n") and ": " not in text and ", " not in text
    events = json.loads(text)["traceEvents"]
    assert [(e["ph"], e["tid"]) for e in events] == [("M", 0), ("M", 1), ("M", 0), ("M", 1),
                                                     ("X", 0), ("X", 1), ("s", 0), ("f", 1)]
    assert events[4]["ts"] == 0.0 and math.isclose(events[4]["dur"], 1.0)
    assert math.isclose(events[5]["ts"], 2.0) and math.isclose(events[5]["dur"], 1.0)
    # The arrow of the one message: from inside the send's slice to inside the receive's.
    assert events[6]["id"] == events[7]["id"] and events[7]["bp"] == "e"
    assert 0.0 < events[6]["ts"] < 1.0 and 2.0 < events[7]["ts"] < 3.0


def test_trace_helpers():
    trace = Trace()
    trace.add(2, "compute", 0.0, 1.0)
    trace.add(0, "send", 0.0, 0.5, 0, 2, 16, 3)
    assert len(trace) == 2 and trace[1].tag == 3
    assert trace.ranks() == [0, 2]
    assert trace.of_rank(2) == [TraceRecord(2, "compute", 0.0, 1.0)]
    assert [r.op for r in trace] == ["compute", "send"]
    assert trace.to_chrome() == trace.to_chrome()   # no path: just the document


def test_a_handler_may_answer_at_once():
    """A handler that returns a value (not PENDING) resumes the generator immediately, in a
    loop rather than by recursion, so a long run of instant requests costs no events and no
    stack."""
    sim = Simulator()

    def counter():
        total = 0
        for _ in range(100_000):
            total += yield "instant"
        return total

    process = sim.spawn(counter(), lambda p, request: 1, name="counter")
    sim.run()
    assert process.value == 100_000
    assert sim.events_processed == 1          # only the start


def test_requests_answered_at_once_count_toward_max_events():
    """They cost no event, but an endless loop of them must still stop (dsml.sim_support)."""
    from dsml.sim import LimitExceeded
    sim = Simulator()

    def endless():
        while True:
            yield "instant"

    sim.spawn(endless(), lambda p, request: 1, name="spinner")
    with pytest.raises(LimitExceeded, match=r"max_events=1,000 steps.*\n  spinner waits on "
                       r"'instant'"):
        sim.run(max_events=1000)


# --- traces that Perfetto accepts: one track per activity, arrows for messages -----------

def reduce_after(comm, previous, x):
    """One bucket's all-reduce, after the previous bucket's (as week 3's DDP chains them)."""
    done = [] if previous is None else (yield comm.join(previous))
    total = yield from allreduce(comm, x)
    return done + [float(total[0])]


def overlapped_backward(comm, buckets=3, n=20_000):
    """Backward in three parts; each bucket's all-reduce runs beside the next part."""
    pending = None
    for b in range(buckets):
        yield comm.compute(100e-6)
        pending = yield comm.spawn(reduce_after(comm, pending, np.full(n, comm.rank + b, float)))
    return (yield comm.join(pending))


def test_a_trace_with_spawned_activities_nests_on_every_track(tmp_path):
    result = dsml.run(overlapped_backward, 4, network=dsml.net.AlphaBeta(ALPHA, BETA))
    assert result.values == [[6.0, 10.0, 14.0]] * 4
    path = tmp_path / "overlap.json"
    document = result.trace.to_chrome(path)
    assert json.loads(path.read_text(encoding="utf-8")) == document
    assert partial_overlaps(document) == []
    # Not vacuous: drawn on one track per rank, as before, the same records overlap in part.
    assert len(partial_overlaps(_one_track_per_rank(result.trace))) > 0
    # Each rank: its program and one track per activity running at once, named in metadata.
    events = document["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads[(2, 2)] == "rank 2" and threads[(2, 2 + 4)] == "rank 2 · activity track 1"
    assert sorted(threads) == sorted((r, r + k * 4) for r in range(4) for k in range(4))
    assert {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"} == {
        r: f"rank {r}" for r in range(4)}
    # A join waiting inside an activity is drawn on that activity's track, not the program's.
    joins = [r for r in result.trace if r.op == "join"]
    assert {r.track for r in joins} == {0, 2, 3}        # bucket 0 had nothing to join


def test_every_message_has_one_arrow_from_its_send_to_its_receive():
    result = dsml.run(overlapped_backward, 4, network=dsml.net.AlphaBeta(ALPHA, BETA))
    document = result.trace.to_chrome()
    events = document["traceEvents"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    messages = sum(r.op == "sendrecv" for r in result.trace)   # the ring's only requests
    assert len(starts) == len(ends) == messages
    spans = [e for e in events if e["ph"] == "X"]
    for number, s in starts.items():
        f = ends[number]
        assert f["bp"] == "e" and s["pid"] != f["pid"]
        # Each end lies inside a sendrecv slice of its own track, and the head not before the tail.
        for end in (s, f):
            assert any(x["name"] == "sendrecv" and x["pid"] == end["pid"]
                       and x["tid"] == end["tid"] and x["ts"] <= end["ts"] <= x["ts"] + x["dur"]
                       for x in spans)
        assert f["ts"] >= s["ts"]


def test_partial_overlaps_finds_slices_that_cross():
    def slice_(ts, dur, tid=0):
        return {"ph": "X", "name": "x", "pid": 0, "tid": tid, "ts": ts, "dur": dur}
    nested = {"traceEvents": [slice_(0, 10), slice_(2, 3), slice_(5, 5), slice_(10, 1)]}
    assert partial_overlaps(nested) == []
    crossing = {"traceEvents": [slice_(0, 10), slice_(5, 10), slice_(5, 10, tid=1)]}
    assert len(partial_overlaps(crossing)) == 1


def test_an_activity_reuses_the_track_of_one_that_has_finished():
    def one_at_a_time(comm):
        for _ in range(3):
            handle = yield comm.spawn(compute_for(comm, 1e-6))
            yield comm.join(handle)
    result = dsml.run(one_at_a_time, 2, network=dsml.net.AlphaBeta(ALPHA, BETA))
    computes = [r for r in result.trace if r.op == "compute"]
    assert len(computes) == 6 and {r.track for r in computes} == {1}
    assert {r.track for r in result.trace if r.op == "join"} == {0}


def compute_for(comm, seconds):
    yield comm.compute(seconds)


def test_a_real_engine_s_trace_of_activities_nests_too():
    """The threads engine records no track: to_chrome lays overlapping slices out on more."""
    result = dsml.run(overlapped_backward, 4, engine="threads", timeout=60)
    assert result.values == [[6.0, 10.0, 14.0]] * 4
    assert {r.track for r in result.trace} == {0}
    assert len(partial_overlaps(result.trace.to_chrome())) == 0
    assert len(partial_overlaps(_one_track_per_rank(result.trace))) > 0     # not vacuous


def _one_track_per_rank(trace):
    """The export as it was: every record of a rank on one track."""
    events = [{"ph": "X", "name": r.op, "pid": r.rank, "tid": r.rank, "ts": r.start * 1e6,
               "dur": (r.end - r.start) * 1e6} for r in trace]
    return {"traceEvents": events}


def test_lay_out_keeps_a_valid_simulator_trace_as_it_is():
    from dsml.sim_support import lay_out
    result = dsml.run(overlapped_backward, 4, network=dsml.net.AlphaBeta(ALPHA, BETA))
    assert sorted(lay_out(result.trace.records)) == sorted(result.trace.records)
