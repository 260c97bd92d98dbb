"""Plumbing (hand-written): tests for dsml.sim — event order, tie-break, deadlock, failures, traces."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import dsml
from dsml.sim import PENDING, DeadlockError, ProcessFailed, Simulator, Trace, TraceRecord


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
    result.trace.to_chrome(path)
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
    assert [(e["name"], e["tid"], e["args"]["name"]) for e in names] == [
        ("thread_name", 0, "rank 0"), ("thread_name", 1, "rank 1")]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == len(result.trace)
    assert {e["tid"] for e in spans} == {0, 1}
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
        assert e["pid"] == 0 and e["dur"] >= 0 and e["ts"] >= 0


def test_to_chrome_output_file_is_sorted_and_compact(tmp_path):
    trace = Trace([TraceRecord(1, "recv", 2e-6, 3e-6, src=0, dst=1, nbytes=8),
                   TraceRecord(0, "send", 0.0, 1e-6, src=0, dst=1, nbytes=8)])
    path = tmp_path / "t.json"
    trace.to_chrome(path)
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n") and ": " not in text and ", " not in text
    events = json.loads(text)["traceEvents"]
    assert [(e["ph"], e["tid"]) for e in events] == [("M", 0), ("M", 1), ("X", 0), ("X", 1)]
    assert events[2]["ts"] == 0.0 and math.isclose(events[2]["dur"], 1.0)
    assert math.isclose(events[3]["ts"], 2.0) and math.isclose(events[3]["dur"], 1.0)


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
