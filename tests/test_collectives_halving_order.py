"""Plumbing (hand-written): halving–doubling's partner order (`order="far_first"`, the default,
or `"near_first"`, MPICH's order) — same results to round-off, same bytes per rank, and on a
physical ring the near-first order puts fewer bytes on the busiest link."""
from __future__ import annotations

import numpy as np
import pytest

import dsml
from dsml.collectives.allreduce import allreduce_halving_doubling
from dsml.collectives.reduce_scatter import halving_masks, reduce_scatter_halving_blocks
from dsml.comm.api import SizeOnly
from dsml.net.topology import CUT_THROUGH_HOP, HOST_OVERHEAD
from dsml.net.topology import ring as ring_fabric

NET = dsml.net.AlphaBeta(alpha=2e-6, beta=1e-10, gamma=2.5e-11)


def halving_doubling(comm, xs, order):
    return (yield from allreduce_halving_doubling(comm, xs[comm.rank], np.add, order))


def halving_reduce_scatter(comm, xs, order):
    sizes = [len(b) for b in np.array_split(xs[comm.rank], comm.size)]
    blocks = np.split(xs[comm.rank], np.cumsum(sizes)[:-1])
    return (yield from reduce_scatter_halving_blocks(comm, blocks, np.add, order))


def test_masks_in_both_orders_and_a_bad_order_is_named():
    assert halving_masks(16, "far_first") == [8, 4, 2, 1]
    assert halving_masks(16, "near_first") == [1, 2, 4, 8]
    assert halving_masks(1, "near_first") == []
    with pytest.raises(ValueError, match="order must be one of .*'nearest'"):
        halving_masks(8, "nearest")


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8, 16])
def test_both_orders_reduce_to_the_same_sum_on_sim(p):
    rng = np.random.default_rng(p)
    xs = [rng.standard_normal(37 * p + 5) for _ in range(p)]
    expected = np.sum(xs, axis=0)
    out = {order: dsml.run(halving_doubling, p, network=NET, args=(xs, order)).values
           for order in ("far_first", "near_first")}
    for order, values in out.items():
        for got in values:
            np.testing.assert_allclose(got, expected, rtol=0, atol=p * 1e-14 * np.abs(xs).sum(0).max())
            assert np.array_equal(got, values[0])         # bit-identical on every rank
    # different summation trees: equal to round-off, not necessarily bit for bit
    np.testing.assert_allclose(out["near_first"][0], out["far_first"][0], rtol=1e-12, atol=1e-12)
    # the reduce-scatter hands rank r block r in either order
    blocks = np.array_split(expected, p)
    rs = dsml.run(halving_reduce_scatter, p, network=NET, args=(xs, "near_first")).values
    for r in range(p):
        np.testing.assert_allclose(rs[r], blocks[r], rtol=1e-12, atol=1e-12)


def test_default_order_is_far_first_and_unchanged():
    p = 8
    xs = [np.arange(40.0) * (r + 1) for r in range(p)]
    library = dsml.run(lambda comm: dsml.collectives.allreduce(comm, xs[comm.rank],
                                                               algorithm="halving_doubling"),
                       p, network=NET)
    far = dsml.run(halving_doubling, p, network=NET, args=(xs, "far_first"))
    assert all(np.array_equal(a, b) for a, b in zip(library.values, far.values))
    assert library.time == far.time


def test_near_first_loads_the_physical_ring_less_and_sends_the_same_bytes():
    p, nbytes = 16, 1 << 20
    load, sent = {}, {}
    for order in ("far_first", "near_first"):
        net = ring_fabric(p, CUT_THROUGH_HOP, overhead=HOST_OVERHEAD, sharing="fair")
        result = dsml.run(halving_doubling, p, network=net, args=([SizeOnly(nbytes)] * p, order))
        load[order] = max(net.link_bytes.values())
        sent[order] = sorted(rec.nbytes for rec in result.trace.records
                             if rec.op in ("send", "sendrecv") and rec.dst >= 0)
    assert sent["near_first"] == sent["far_first"]
    assert load["near_first"] < load["far_first"]
