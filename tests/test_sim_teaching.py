"""Plumbing (hand-written): week 1's teaching engine (`dsml.comm.sim_core`, generated from the
notebook) and the package's engine (`dsml.comm.sim_engine`, its hand-written subclass with later
weeks' hooks and speed paths) run every program the teaching one can run identically: the same
values, times and trace rows, and the same errors."""
from __future__ import annotations

import numpy as np
import pytest

from dsml.collectives import allreduce as traced_allreduce
from dsml.comm import sim_core, sim_engine
from dsml.comm.api import RankError, SizeOnly
from dsml.net import AlphaBeta, fat_tree, ring
from dsml.sim import DeadlockError

# The teaching engine answers week 1's requests only; the package's collectives also yield a
# `Span` (one enclosing trace slice per call, answered by the subclass), so compare the
# collective itself, unwrapped.
allreduce = traced_allreduce.__wrapped__

NETWORKS = {
    "alpha-beta": lambda p: AlphaBeta(5e-6, 1e-9, 1e-10),
    "ring fifo": lambda p: ring(p, latency=5e-6, bandwidth=1e9),
    "fat tree fair": lambda p: fat_tree(2, p // 2, 2, latency=5e-6, bandwidth=1e9,
                                        sharing="fair"),
}


def summed(comm, algorithm, n, size_only):
    x = SizeOnly(8 * n) if size_only else np.arange(n, dtype=float) + comm.rank
    y = yield from allreduce(comm, x, algorithm=algorithm)
    return y.nbytes if size_only else float(y.sum())


def mixed(comm):
    """send, recv (message there before or after the receive), sendrecv, compute, combine, now."""
    p, rank = comm.size, comm.rank
    right, left = (rank + 1) % p, (rank - 1) % p
    yield comm.compute(1e-6 * rank)
    yield comm.send(right, np.full(100, rank), tag=3)
    yield comm.compute(2e-6 * (p - rank))
    got = yield comm.recv(left, tag=3)
    y = yield comm.sendrecv(left, got * 2, right, tag=4)
    yield comm.combine(y.nbytes)
    t = yield comm.now()
    yield comm.send(right, (t, {"x": y[:3]}))
    back = yield comm.recv(left)
    for k in range(3):                      # three messages queued on one (source, tag)
        yield comm.send(right, np.array([k]), tag=5)
    yield comm.compute(1e-5)
    order = []
    for _ in range(3):
        order.append(int((yield comm.recv(left, tag=5))[0]))
    return float(back[1]["x"].sum()) + back[0], order


def both(program, p, network, **kwargs):
    runs = []
    for module in (sim_core, sim_engine):
        try:
            runs.append(module.simulate(program, p, network(p), **kwargs))
        except (DeadlockError, RankError) as error:
            runs.append(error)
    return runs


def assert_same(teaching, full):
    assert teaching.values == full.values
    assert teaching.time == full.time and teaching.finish_times == full.finish_times
    assert (teaching.trace is None) == (full.trace is None)
    if teaching.trace is not None:
        assert teaching.trace.rows == full.trace.rows


@pytest.mark.parametrize("network", list(NETWORKS))
@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "halving_doubling", "tree"])
def test_collectives_give_the_same_trace_on_both_engines(network, algorithm):
    teaching, full = both(summed, 8, NETWORKS[network], args=(algorithm, 1000, False))
    assert_same(teaching, full)
    assert len(teaching.trace) > 8


@pytest.mark.parametrize("trace", [True, False])
def test_size_only_payloads_and_no_trace_give_the_same_run(trace):
    teaching, full = both(summed, 16, NETWORKS["alpha-beta"], args=("ring", 10_000, True),
                          trace=trace)
    assert_same(teaching, full)


@pytest.mark.parametrize("network", list(NETWORKS))
def test_every_request_of_week_1_gives_the_same_trace(network):
    teaching, full = both(mixed, 4, NETWORKS[network])
    assert_same(teaching, full)
    assert {r.op for r in teaching.trace} == {"send", "recv", "sendrecv", "compute", "combine"}


def test_errors_say_the_same_on_both_engines():
    def receive_first(comm):
        x = yield comm.recv((comm.rank - 1) % comm.size)
        yield comm.send((comm.rank + 1) % comm.size, x)

    def unread(comm):
        if comm.rank == 0:
            yield comm.send(1, np.zeros(3), tag=1)
        yield comm.compute(1e-3)

    def raises(comm):
        yield comm.compute(1e-3)
        if comm.rank == 1:
            raise KeyError("boom")
        yield comm.recv(1)

    for program in (receive_first, unread, raises):
        teaching, full = both(program, 3, NETWORKS["alpha-beta"])
        # The package's engine raises every engine's DeadlockError, a subclass of the
        # teaching simulator's (also a RankError); same words.
        assert isinstance(full, type(teaching)) and str(teaching) == str(full)


def test_only_the_package_engine_adds_unreceived_messages_to_a_deadlock_report():
    def mismatch(comm):
        if comm.rank == 0:
            yield comm.send(1, np.zeros(3), tag=1)
        yield comm.recv(1 - comm.rank, tag=2)

    teaching, full = both(mismatch, 2, NETWORKS["alpha-beta"])
    assert isinstance(teaching, DeadlockError) and isinstance(full, DeadlockError)
    assert str(full).startswith(str(teaching))
    assert "rank 0 -> rank 1 (tag 1): 1 message(s)" in str(full)
    assert "never received" not in str(teaching)
