"""What a simulated message holds and passes through does not grow with the rank count.

A 1,024-rank ring all-reduce visits every rank once per step, so whatever each rank keeps (and
touches per message) is multiplied by p: past the processor's cache, events per second fall as
p grows (benchmarks/sim_at_scale.py times it). These tests count the things that grew with p or
sat in every message's path for nothing; they never time anything.
"""
from __future__ import annotations

import numpy as np
import pytest

from dsml.collectives import allreduce
from dsml.collectives.buffers import block_sizes
from dsml.comm.api import Now, SendRecv, SizeOnly
from dsml.comm.sim_engine import SimEngine
from dsml.comm.spans import Span
from dsml.net import AlphaBeta


@pytest.mark.parametrize("p", [1, 3, 64, 1024])
def test_block_sizes_hold_two_ints_whatever_p(p):
    # Each rank of a ring keeps this list: p distinct ints per rank were p² (32 MB) at 1,024.
    for n in (1 << 30, 10, 0, p - 1, 7 * p + 3):
        sizes = block_sizes(n, p)
        assert sizes == [len(b) for b in np.array_split(np.empty(n), p)]
        assert len({id(s) for s in sizes}) <= 2, (n, p)


def ring_of(nbytes):
    def program(comm):
        result = yield from allreduce(comm, SizeOnly(nbytes), algorithm="ring")
        return result.nbytes
    return program


def counted(engine):
    """Count the Now and Span requests the engine answers (a collective's enclosing slice)."""
    counts = {Now: 0, Span: 0}
    for kind in counts:
        handler = engine.handlers[kind]

        def counting(process, req, handler=handler, kind=kind):
            counts[kind] += 1
            return handler(process, req)
        engine.handlers[kind] = counting
    return counts


@pytest.mark.parametrize("trace", [False, True])
def test_no_enclosing_slice_without_a_trace(trace):
    engine = SimEngine(8, AlphaBeta(1e-5, 1e-9), trace=trace)
    counts = counted(engine)
    result = engine.run(ring_of(1 << 20))
    assert result.values == [1 << 20] * 8
    # With a trace, one slice per rank (now() before, span after); without, none at all.
    assert counts == ({Now: 8, Span: 8} if trace else {Now: 0, Span: 0})


@pytest.mark.parametrize("trace", [False, True])
def test_generators_between_program_and_engine(trace):
    # Every message of the ring passes through each generator of the chain (a frame that a
    # 1,024-rank run touches once per rank per step): the enclosing slice's wrapper is one
    # of them, and only when there is a slice to record.
    engine = SimEngine(4, AlphaBeta(1e-5, 1e-9), trace=trace)
    depths = []
    on_sendrecv = engine.handlers[SendRecv]

    def measuring(process, req):
        depth, gen = 0, process.gen
        while gen is not None:
            depth, gen = depth + 1, gen.gi_yieldfrom
        depths.append(depth)
        return on_sendrecv(process, req)
    engine.handlers[SendRecv] = measuring
    engine.run(ring_of(1 << 20))
    # program -> allreduce -> reduce-scatter / all-gather (+ the slice's wrapper with a trace)
    assert len(depths) == 2 * (4 - 1) * 4
    assert set(depths) == ({4} if trace else {3})
