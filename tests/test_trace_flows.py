"""Every message's arrow in a Chrome trace starts in its send's slice and ends in its receive's,
never before it starts — on every engine (the real engines post receives long before the
matching send, which once put 10–17 of 24–32 heads before their tails)."""
import time

import numpy as np
import pytest

import dsml
from dsml.collectives import allreduce
from dsml.sim import Trace

TIMEOUT = 60


def arrows_are_causal(document):
    """Problems with the arrows of a Chrome trace document (empty if none), and their count."""
    events = document["traceEvents"]
    tails = {e["id"]: e for e in events if e["ph"] == "s"}
    heads = {e["id"]: e for e in events if e["ph"] == "f"}
    slices = [e for e in events if e["ph"] == "X"]

    def inside(point, names):
        return any(x["name"] in names and x["pid"] == point["pid"] and x["tid"] == point["tid"]
                   and x["ts"] <= point["ts"] <= x["ts"] + x["dur"] for x in slices)

    problems = []
    assert tails.keys() == heads.keys()
    for number, tail in tails.items():
        head = heads[number]
        if head["ts"] < tail["ts"]:
            problems.append(f"arrow {number} ends at {head['ts']} µs before it starts "
                            f"({tail['ts']} µs)")
        if not inside(tail, ("send", "sendrecv")):
            problems.append(f"arrow {number} starts outside a send")
        if not inside(head, ("recv", "sendrecv")):
            problems.append(f"arrow {number} ends outside a receive")
    return problems, len(tails)


def test_a_receive_posted_long_before_its_send_gets_an_arrow_from_the_send():
    trace = Trace([(1, "recv", 0.0, 10e-6, 0, -1, 8, 0, 0),
                   (0, "compute", 0.0, 8e-6, -1, -1, 0, 0, 0),
                   (0, "send", 8e-6, 9e-6, -1, 1, 8, 0, 0)])
    problems, count = arrows_are_causal(trace.to_chrome())
    assert count == 1 and problems == []


def late_sender(comm):
    """Rank 0 sends only after a while: every receive is posted long before its send."""
    if comm.rank == 0:
        yield comm.compute(0.02)      # the simulator's time; the real engines' is this:
        time.sleep(0.02)
        for dst in range(1, comm.size):
            yield comm.send(dst, np.ones(4))
    else:
        yield comm.recv(0)
    x = yield from allreduce(comm, np.full(1024, float(comm.rank)), algorithm="ring")
    return float(x[0])


@pytest.mark.parametrize("engine", ["sim", "threads", "processes"])
def test_arrows_run_from_send_to_receive_on_every_engine(engine):
    kwargs = {"network": dsml.net.AlphaBeta(1e-6, 1e-9)} if engine == "sim" else \
        {"timeout": TIMEOUT}
    result = dsml.run(late_sender, 4, engine=engine, **kwargs)
    assert result.values == [6.0] * 4
    problems, count = arrows_are_causal(result.trace.to_chrome())
    assert count == 3 + 4 * 2 * 3       # the late sends, and the ring's 2(p − 1) steps a rank
    assert problems == []
