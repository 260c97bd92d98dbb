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
