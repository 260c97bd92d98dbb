"""Errors that name their cause, alike on every engine: one DeadlockError type (also a
RankError naming the lowest waiting rank), timeout reports that lead with the cause, and
tracebacks that start with the rank's own code."""
import numpy as np
import pytest

import dsml
from dsml.comm.deadlock import DeadlockError

TIMEOUT = 60
ENGINES = ["sim", "threads", "processes"]


def run(program, p, engine, **kwargs):
    if engine == "sim":
        return dsml.run(program, p, network=dsml.net.AlphaBeta(1e-6, 1e-9), **kwargs)
    kwargs.setdefault("timeout", TIMEOUT)
    return dsml.run(program, p, engine=engine, **kwargs)


def receive_first(comm):
    if comm.rank > 0:
        yield comm.recv(comm.rank - 1, tag=4)
    yield comm.send((comm.rank + 1) % comm.size, np.zeros(2), tag=9)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_deadlock_is_one_type_on_every_engine(engine):
    with pytest.raises(dsml.RankError) as info:
        run(receive_first, 3, engine)
    error = info.value
    assert type(error) is DeadlockError and error.rank == 1
    assert dsml.DeadlockError is DeadlockError
    assert isinstance(error, dsml.sim.DeadlockError)      # what week 1's code catches
    assert "rank 1 waits for a message from rank 0 (tag 4)" in str(error)


def stops_in_a_collective(comm):
    import os
    import signal

    from dsml.collectives import allreduce
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)        # only the timeout ends the run
    return (yield from allreduce(comm, np.ones(4)))


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"),
                    reason="reads /proc/<pid>/stat")
def test_a_timeout_report_leads_with_a_stopped_rank_and_asks_nothing_about_ops():
    with pytest.raises(dsml.RankError) as info:
        run(stops_in_a_collective, 3, "processes", timeout=3)
    message = str(info.value)
    assert info.value.rank == 1
    assert message.startswith("rank 1 is stopped (SIGSTOP or a debugger?), so the run did not "
                              "finish within the timeout of 3 s (3 rank(s) unfinished):"), message
    assert "same op" not in message, message


@pytest.mark.parametrize("engine", ENGINES)
def test_a_deadlock_in_one_collective_with_one_op_asks_nothing_about_ops(engine):
    def program(comm):
        from dsml.collectives import allreduce
        if comm.rank == 1:
            yield comm.recv(0, tag=3)                 # never sent: the others wait for rank 1
        return (yield from allreduce(comm, np.ones(4), algorithm="ring"))

    with pytest.raises(DeadlockError) as info:
        run(program, 3, engine)
    assert "same op" not in str(info.value), str(info.value)


def _helper_that_raises(x):
    raise ValueError(f"bad value {x}")


def raises_in_rank_1(comm):
    yield comm.compute(0.0)
    if comm.rank == 1:
        try:
            _helper_that_raises(3)
        except ValueError as error:
            raise KeyError("while handling it") from error
    return comm.rank


@pytest.mark.parametrize("engine", ENGINES)
def test_a_raising_rank_s_traceback_starts_with_its_own_code_and_keeps_the_chain(engine):
    import traceback
    with pytest.raises(dsml.RankError) as info:
        run(raises_in_rank_1, 2, engine)
    error = info.value
    assert error.rank == 1
    if engine == "sim":        # the original is chained: its traceback is what a user reads
        text = "".join(traceback.format_exception(error.__cause__))
    else:                      # the text of the rank's traceback is in the message
        text = str(error).split("--- traceback of rank 1 ---\n", 1)[1]
    blocks = text.split("\n\n")
    # Both exceptions of the chain, each from the rank's own frame down.
    assert "ValueError: bad value 3" in text and "KeyError: 'while handling it'" in text
    for block in blocks:
        if block.startswith("Traceback (most recent call last):"):
            first = block.splitlines()[1]
            assert __file__ in first, block        # not dsml's engine frames


def different_calls(comm, case):
    from dsml.collectives import allreduce, broadcast
    x = np.ones(4)
    if case == "collective":
        if comm.rank == 1:
            return (yield from broadcast(comm, x, root=0))
        return (yield from allreduce(comm, x, algorithm="ring"))
    if case == "algorithm":
        algorithm = "ring" if comm.rank == 0 else "recursive_doubling"
        return (yield from allreduce(comm, x, algorithm=algorithm))
    return (yield from broadcast(comm, x, root=comm.rank % 2))      # case == "root"


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case, words", [
    ("collective", "rank 0 called allreduce(op='sum', algorithm='ring'), rank 1 called "
                   "broadcast(root=0, algorithm='binomial', chunks=4)"),
    ("algorithm", "algorithm 'ring' vs 'recursive_doubling'"),
    ("root", "root 0 vs 1"),
])
def test_ranks_in_different_collective_calls_are_told_what_differs(engine, case, words):
    # Two roots each send and return (case "root"): the run ends with messages unreceived.
    with pytest.raises(DeadlockError if case != "root" else dsml.RankError) as info:
        run(different_calls, 2, engine, kwargs={"case": case})
    message = str(info.value)
    assert "ranks are in different collective calls" in message and words in message, message
    assert "does not match another rank's" not in message


def sends_one_of_each_tag(comm):
    if comm.rank == 0:
        yield comm.send(1, np.ones(2), tag=5)
        yield comm.send(1, np.ones(2), tag=5)
        yield comm.send(1, np.ones(2), tag=6)
    else:
        yield comm.recv(0, tag=5)
    return comm.rank


@pytest.mark.parametrize("engine", ENGINES)
def test_a_message_nobody_received_is_named_by_source_destination_and_tag(engine):
    with pytest.raises(dsml.RankError) as info:
        run(sends_one_of_each_tag, 2, engine)
    message = str(info.value)
    assert info.value.rank == 1
    assert "rank 0 -> rank 1 (tag 5): 1 message(s)" in message, message
    assert "rank 0 -> rank 1 (tag 6): 1 message(s)" in message, message
