"""Plumbing (hand-written): tests for dsml.net.topology — hop costs, pipelining, contention, builders."""
from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest

import dsml
from dsml import SizeOnly
from dsml.net import (Topology, bisection_bandwidth, diameter, fat_tree, fully_connected, ring,
                      star, torus2d, tree, two_level)

LAT, BW = 2e-6, 5e9          # per link: 2 µs, 5 GB/s


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-12)


def hop_time(nbytes, lat=LAT, bw=BW):
    return lat + nbytes / bw


def one_message(comm, dst, nbytes):
    if comm.rank == 0:
        yield comm.send(dst, SizeOnly(nbytes))
    elif comm.rank == dst:
        yield comm.recv(0)


# --- store-and-forward and pipelining on an uncontended path -----------------------------

@pytest.mark.parametrize("hops", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("nbytes", [0, 1000, 1_000_000])
def test_store_and_forward_over_h_hops(hops, nbytes):
    net = ring(12, latency=LAT, bandwidth=BW)
    assert len(net.route(0, hops)) == hops
    result = dsml.run(one_message, 12, network=net, args=(hops, nbytes))
    assert close(result.finish_times[hops], hops * hop_time(nbytes))
    # The sender is done once the message has left it (its first hop).
    assert close(result.finish_times[0], hop_time(nbytes))
    assert close(result.time, hops * hop_time(nbytes))


@pytest.mark.parametrize("hops", [1, 3, 5])
@pytest.mark.parametrize("chunks", [1, 2, 3, 4, 5, 8, 16, 100])
def test_pipelined_transfer_with_k_chunks(hops, chunks):
    nbytes = 1_200_000                   # divisible by every k used: equal chunks
    net = ring(12, latency=LAT, bandwidth=BW).with_chunks(chunks)
    assert net.chunks == chunks
    result = dsml.run(one_message, 12, network=net, args=(hops, nbytes))
    formula = (hops + chunks - 1) * (LAT + nbytes / BW / chunks)
    assert close(result.time, formula)
    # Sender: done when its last chunk has left, after k chunk times on the first link.
    assert close(result.finish_times[0], chunks * (LAT + nbytes / BW / chunks))


def test_pipelining_a_message_smaller_than_the_chunk_count_uses_one_byte_chunks():
    net = ring(8, latency=LAT, bandwidth=BW).with_chunks(16)
    result = dsml.run(one_message, 8, network=net, args=(3, 5))   # 5 bytes -> 5 chunks
    assert close(result.time, (3 + 5 - 1) * hop_time(1))
    empty = dsml.run(one_message, 8, network=net, args=(3, 0))    # 0 bytes: one empty chunk
    assert close(empty.time, 3 * LAT)


def test_ring_sendrecv_on_a_ring_topology_costs_one_hop_per_round():
    def shift(comm, rounds):
        x = np.full(100, float(comm.rank))
        for _ in range(rounds):
            x = yield comm.sendrecv((comm.rank + 1) % comm.size, x, (comm.rank - 1) % comm.size)
        return x[0]

    for p in (2, 3, 6):
        result = dsml.run(shift, p, network=ring(p, LAT, BW), args=(4,))
        assert close(result.time, 4 * hop_time(800))
        assert result.values == [float((r - 4) % p) for r in range(p)]


# --- measurements are never the formula: contention -----------------------------------------

def test_two_flows_sharing_a_link_the_contended_one_is_slower_than_the_formula():
    """Ranks 0→2 and 1→3 both cross node0→core→node1 of a two-level network at once."""
    net = two_level(2, 2, intra_latency=1e-6, intra_bandwidth=100e9,
                    inter_latency=5e-6, inter_bandwidth=10e9)
    nbytes = 1_000_000
    intra, inter = 1e-6 + nbytes / 100e9, 5e-6 + nbytes / 10e9
    formula = 2 * intra + 2 * inter           # closed form for one uncontended 4-hop message

    def two_flows(comm):
        if comm.rank in (0, 1):
            yield comm.send(comm.rank + 2, SizeOnly(nbytes))
        else:
            yield comm.recv(comm.rank - 2)

    result = dsml.run(two_flows, 4, network=net)
    first, second = result.finish_times[2], result.finish_times[3]
    assert close(first, formula)              # issued first: it gets the shared links first
    assert second > formula * 1.1             # the measurement departs from the formula ...
    assert close(second, formula + inter)     # ... by one wait on the shared inter link
    assert close(net.link_busy[("node0", "core")], 2 * inter)


def test_a_small_message_queued_behind_a_large_one_on_a_ring():
    """0→3 (3 hops, small) meets 1→3 (2 hops, large) on link 1→2."""
    net = ring(8, LAT, BW)
    small, large = 1_000, 1_000_000

    def flows(comm):
        if comm.rank == 0:
            yield comm.send(3, SizeOnly(small))
        elif comm.rank == 1:
            yield comm.send(3, SizeOnly(large))
        elif comm.rank == 3:
            a = yield comm.recv(0)
            b = yield comm.recv(1)
            return a.nbytes, b.nbytes

    result = dsml.run(flows, 8, network=net)
    recv_small = next(r for r in result.trace if r.rank == 3 and r.src == 0)
    formula = 3 * hop_time(small)
    measured = recv_small.end
    assert measured > 10 * formula
    # FIFO per link: it waits for the large one on link 1→2, and again on link 2→3, which
    # the large one reserved first (at t = hop_time(large), when it finished crossing 1→2).
    assert close(measured, 2 * hop_time(large) + hop_time(small))
    assert result.values[3] == (small, large)


def test_pipelined_flows_contend_on_a_shared_uplink():
    """A leaf–spine network with one spine: two cross-leaf pipelined flows share the uplink."""
    nbytes, chunks = 800_000, 8
    net = fat_tree(2, 2, 1, latency=LAT, bandwidth=BW).with_chunks(chunks)

    def cross(comm):
        if comm.rank in (0, 1):
            yield comm.send(comm.rank + 2, SizeOnly(nbytes))
        else:
            yield comm.recv(comm.rank - 2)

    result = dsml.run(cross, 4, network=net)
    chunk = LAT + nbytes / BW / chunks
    formula = (4 + chunks - 1) * chunk          # one uncontended 4-hop pipelined message
    # Both flows' chunks reach leaf0 together and alternate on the leaf0→spine0 link, which
    # is busy from one chunk time to 2k + 1 chunk times; two more hops follow. Both are late.
    assert close(result.finish_times[2], (2 * chunks + 2) * chunk)
    assert close(result.finish_times[3], (2 * chunks + 3) * chunk)
    assert min(result.finish_times[2:]) > 1.5 * formula


@pytest.mark.parametrize("senders", [1, 2, 3, 4, 7, 10])
def test_incast_through_a_star_serializes_on_the_switch_to_receiver_link(senders):
    nbytes = 100_000
    net = star(senders + 1, LAT, BW)

    def incast(comm):
        if comm.rank == 0:
            for src in range(1, comm.size):
                yield comm.recv(src)
        else:
            yield comm.send(0, SizeOnly(nbytes))

    result = dsml.run(incast, senders + 1, network=net)
    T = hop_time(nbytes)
    # Uplinks run in parallel (one hop), then the switch→0 link carries one message at a time.
    assert close(result.time, T + senders * T)
    assert close(net.link_busy[("switch", 0)], senders * T)
    for rank in range(1, senders + 1):
        assert close(result.finish_times[rank], T)   # every sender's first hop is uncontended


def test_incast_time_is_linear_in_senders():
    nbytes = 50_000
    times = []
    for senders in range(1, 9):
        def incast(comm):
            if comm.rank == 0:
                for src in range(1, comm.size):
                    yield comm.recv(src)
            else:
                yield comm.send(0, SizeOnly(nbytes))
        times.append(dsml.run(incast, senders + 1, network=star(senders + 1, LAT, BW)).time)
    slopes = np.diff(times)
    assert np.allclose(slopes, hop_time(nbytes), rtol=1e-9)


def test_per_link_attributes_override_the_defaults():
    graph = nx.path_graph(3)
    graph.edges[1, 2]["latency"] = 10e-6
    graph.edges[1, 2]["bandwidth"] = 1e9
    net = Topology(graph, latency=LAT, bandwidth=BW)
    result = dsml.run(one_message, 3, network=net, args=(2, 1000))
    assert close(result.time, hop_time(1000) + hop_time(1000, 10e-6, 1e9))


def test_the_same_topology_run_twice_gives_the_same_trace():
    net = fat_tree(2, 3, 2, LAT, BW).with_chunks(4)

    def all_to_zero(comm):
        if comm.rank == 0:
            for src in range(1, comm.size):
                yield comm.recv(src)
        else:
            yield comm.send(0, SizeOnly(1000 * comm.rank))

    a = dsml.run(all_to_zero, 6, network=net)
    b = dsml.run(all_to_zero, 6, network=net)
    assert a.trace.records == b.trace.records and a.time == b.time


# --- diameter and bisection bandwidth of each builder --------------------------------------

B = 10e9       # the builders' default bandwidth


@pytest.mark.parametrize("p", range(3, 11))
def test_ring_diameter_and_bisection(p):
    net = ring(p)
    assert diameter(net) == p // 2
    assert bisection_bandwidth(net) == pytest.approx(2 * B)


def test_ring_of_two_is_a_single_link():
    net = ring(2)
    assert net.graph.number_of_edges() == 1
    assert diameter(net) == 1 and bisection_bandwidth(net) == pytest.approx(B)


@pytest.mark.parametrize("p", range(2, 9))
def test_fully_connected_diameter_and_bisection(p):
    net = fully_connected(p)
    assert diameter(net) == 1
    # (p/2)² links cross a balanced cut when p is even; ⌊p/2⌋·⌈p/2⌉ in general.
    assert bisection_bandwidth(net) == pytest.approx((p // 2) * ((p + 1) // 2) * B)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
def test_star_diameter_and_bisection(p):
    net = star(p)
    assert diameter(net) == 2
    assert bisection_bandwidth(net) == pytest.approx((p // 2) * B)


def test_torus_diameter_and_bisection():
    net = torus2d(4, 4)
    assert net.graph.number_of_edges() == 32
    assert diameter(net) == 4
    assert bisection_bandwidth(net) == pytest.approx(8 * B)
    line = torus2d(1, 4)                  # one row: a ring of 4
    assert diameter(line) == 2 and bisection_bandwidth(line) == pytest.approx(2 * B)


@pytest.mark.parametrize("p, arity, diam, links", [(7, 2, 4, 1), (8, 2, 5, 1), (10, 3, 4, 2),
                                                   (5, 1, 4, 1)])
def test_tree_diameter_and_bisection(p, arity, diam, links):
    net = tree(p, arity)
    assert diameter(net) == diam
    assert bisection_bandwidth(net) == pytest.approx(links * B)


def test_two_level_diameter_and_bisection():
    net = two_level(2, 2, inter_bandwidth=10e9, intra_bandwidth=100e9)
    assert diameter(net) == 4                         # rank → node → core → node → rank
    assert bisection_bandwidth(net) == pytest.approx(10e9)      # one inter-node link
    assert bisection_bandwidth(two_level(4, 2)) == pytest.approx(2 * 10e9)
    single = two_level(1, 4)
    assert diameter(single) == 2
    assert bisection_bandwidth(single) == pytest.approx(2 * 100e9)   # two intra links


@pytest.mark.parametrize("leaves, per_leaf, spines, links", [(4, 2, 2, 4), (4, 2, 1, 2),
                                                             (2, 2, 2, 2), (2, 4, 4, 4)])
def test_fat_tree_diameter_and_bisection(leaves, per_leaf, spines, links):
    net = fat_tree(leaves, per_leaf, spines)
    assert diameter(net) == 4
    assert bisection_bandwidth(net) == pytest.approx(links * B)


def test_bisection_refuses_too_many_hosts():
    with pytest.raises(ValueError, match=r"20 hosts exceed max_hosts=16"):
        bisection_bandwidth(ring(20))


# --- invalid inputs ---------------------------------------------------------------------------

@pytest.mark.parametrize("bandwidth", [0, -1e9, float("nan"), float("inf")])
def test_bad_bandwidth(bandwidth):
    with pytest.raises(ValueError, match=r"bandwidth of link 0-1 must be a finite number > 0 "
                       r"\(bytes/s\), got"):
        ring(4, bandwidth=bandwidth)
    graph = nx.path_graph(3)
    graph.edges[1, 2]["bandwidth"] = bandwidth
    with pytest.raises(ValueError, match=r"bandwidth of link 1-2 must be a finite number > 0"):
        Topology(graph)


@pytest.mark.parametrize("latency", [-1e-6, float("nan")])
def test_bad_latency(latency):
    with pytest.raises(ValueError, match=r"latency of link 0-1 must be a finite number ≥ 0"):
        ring(4, latency=latency)


def test_disconnected_graph():
    with pytest.raises(ValueError, match=r"graph is disconnected: 2 components"):
        Topology(nx.Graph([(0, 1), (2, 3)]))


def test_empty_or_directed_graph():
    with pytest.raises(ValueError, match=r"graph has no nodes"):
        Topology(nx.Graph())
    with pytest.raises(ValueError, match=r"graph must be undirected"):
        Topology(nx.DiGraph([(0, 1), (1, 0)]))


def test_a_host_not_in_the_graph():
    with pytest.raises(ValueError, match=r"host 5 is not a node of the graph"):
        Topology(nx.path_graph(3), hosts=[0, 5])
    with pytest.raises(ValueError, match=r"hosts must be distinct nodes"):
        Topology(nx.path_graph(3), hosts=[0, 1, 0])


def test_world_size_larger_than_the_hosts():
    def noop(comm):
        yield comm.compute(0.0)

    with pytest.raises(ValueError, match=r"world_size 5 exceeds the 4 hosts of ring\(4\): "
                       r"rank 4 has no host"):
        dsml.run(noop, 5, network=ring(4))


@pytest.mark.parametrize("chunks", [0, -2, 1.5])
def test_bad_chunk_count(chunks):
    with pytest.raises(ValueError, match=r"chunks must be an integer ≥ 1, got " + str(chunks)):
        Topology(nx.path_graph(3), chunks=chunks)
    with pytest.raises(ValueError, match=r"chunks must be an integer ≥ 1"):
        ring(4).with_chunks(chunks)


@pytest.mark.parametrize("builder, args, what", [
    (ring, (1,), r"p must be an integer ≥ 2, got 1"),
    (star, (0,), r"p must be an integer ≥ 2, got 0"),
    (fully_connected, (2.0,), r"p must be an integer ≥ 2, got 2\.0"),
    (tree, (4, 0), r"arity must be an integer ≥ 1, got 0"),
    (torus2d, (1, 1), r"a torus needs at least 2 hosts"),
    (two_level, (0, 2), r"nodes must be an integer ≥ 1, got 0"),
    (fat_tree, (2, 2, 0), r"spines must be an integer ≥ 1, got 0"),
])
def test_builders_reject_bad_counts(builder, args, what):
    with pytest.raises(ValueError, match=what):
        builder(*args)


@pytest.mark.parametrize("hops", [2, 3, 5])
@pytest.mark.parametrize("nbytes, chunks", [(100_001, 4), (1_000_003, 7), (10, 3)])
def test_uneven_chunks_follow_the_documented_departure(hops, nbytes, chunks):
    """When k does not divide n the first n mod k chunks carry one byte more; the transfer then
    takes (h + k − 1)α + nβ + (h − 1)⌈n/k⌉β (docs/measurements.md), not (h + k − 1)(α + nβ/k)."""
    alpha, bandwidth = 5e-6, 1e9
    beta = 1 / bandwidth

    def far(comm, n, dst):
        if comm.rank == 0:
            yield comm.send(dst, np.zeros(n, np.uint8))
        elif comm.rank == dst:
            yield comm.recv(0)

    network = dsml.net.ring(12, latency=alpha, bandwidth=bandwidth).with_chunks(chunks)
    time = dsml.run(far, 12, network=network, args=(nbytes, hops)).time
    expected = (hops + chunks - 1) * alpha + nbytes * beta + (hops - 1) * math.ceil(nbytes / chunks) * beta
    assert math.isclose(time, expected, rel_tol=1e-12)
    assert time > (hops + chunks - 1) * (alpha + nbytes * beta / chunks)
