"""The flow-level network model, Topology(sharing="fair"): max-min fair rates against closed
forms worked by hand, fair against FIFO, and multipath on the fat tree."""
import math

import networkx as nx
import numpy as np
import pytest

import dsml
from dsml.collectives import allreduce
from dsml.comm.api import SizeOnly
from dsml.net import Topology, fat_tree, ring, star, torus2d, tree, two_level, fully_connected
from dsml.net import CUT_THROUGH_HOP, HOST_OVERHEAD

LAT, BW = 1e-6, 10e9


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def incast(comm, nbytes):
    if comm.rank == 0:
        for src in range(1, comm.size):
            yield comm.recv(src)
    else:
        yield comm.send(0, SizeOnly(nbytes))


def send_ends(result):
    """(src, dst) -> end time of each send in the trace."""
    return {(r.src, r.dst): r.end for r in result.trace if r.op == "send"}


@pytest.mark.parametrize("p", [2, 3, 5, 9, 17])
def test_incast_on_a_star_is_latency_plus_all_bytes_through_the_receivers_link(p):
    n = 1_000_000
    net = star(p, LAT, BW, sharing="fair")
    result = dsml.run(incast, p, network=net, args=(n,))
    formula = 2 * LAT + (p - 1) * n / BW
    assert close(result.time, formula)
    for rank in range(1, p):          # all share the receiver's link equally: all end together
        assert close(result.finish_times[rank], formula)
    assert net.link_bytes[("switch", 0)] == (p - 1) * n
    assert close(net.link_busy[("switch", 0)], (p - 1) * n / BW)
    assert close(net.link_busy[(1, "switch")], (p - 1) * n / BW)   # its uplink: at rate B/(p−1)
    # The flows starting together are solved once, not once each (and none after the end).
    assert net.flows.recomputations <= 2


def test_fair_and_fifo_differ_where_messages_share_a_link():
    """FIFO serializes the incast on the last link (each message pays α again and waits);
    fair sharing overlaps them: p(α + nβ) against 2α + (p − 1)nβ."""
    p, n = 6, 200_000
    fifo = dsml.run(incast, p, network=star(p, LAT, BW), args=(n,)).time
    fair = dsml.run(incast, p, network=star(p, LAT, BW, sharing="fair"), args=(n,)).time
    assert close(fifo, p * (LAT + n / BW))
    assert close(fair, 2 * LAT + (p - 1) * n / BW)
    assert fifo - fair > (p - 2) * LAT * 0.99


def dumbbell(k, middle_bandwidth):
    """k hosts on the left, k on the right, two switches joined by one link."""
    graph = nx.Graph()
    for i in range(k):
        graph.add_edge(("left", i), "L")
        graph.add_edge(("right", i), "R")
    graph.add_edge("L", "R", bandwidth=middle_bandwidth)
    hosts = [("left", i) for i in range(k)] + [("right", i) for i in range(k)]
    return Topology(graph, hosts, LAT, BW, sharing="fair", name=f"dumbbell({k})")


@pytest.mark.parametrize("k", [1, 2, 3, 8])
@pytest.mark.parametrize("middle", [BW, 2.5 * BW])
def test_a_dumbbell_bottleneck_shared_by_k_flows(k, middle):
    n = 500_000

    def across(comm):
        if comm.rank < k:
            yield comm.send(comm.rank + k, SizeOnly(n))
        else:
            yield comm.recv(comm.rank - k)

    result = dsml.run(across, 2 * k, network=dumbbell(k, middle))
    rate = min(BW, middle / k)        # the middle link's share, or the host links if less
    for rank in range(2 * k):
        assert close(result.finish_times[rank], 3 * LAT + n / rate)


def test_a_flow_joining_and_leaving_mid_transfer():
    """Rank 1 sends 3 MB to rank 0; rank 2 sends 4 MB to rank 0 starting 1 ms later.
    B = 1 GB/s, hop latency 1 µs (2 µs a route). By hand: flow 1 runs alone from 2 µs to
    1.002 ms (1 MB sent), then both at 0.5 GB/s; flow 1's last 2 MB take 4 ms: it ends at
    5.002 ms, when flow 2 has sent 2 MB; flow 2 then runs alone, its last 2 MB taking 2 ms:
    it ends at 7.002 ms."""
    bw = 1e9

    def program(comm):
        if comm.rank == 0:
            yield comm.recv(1)
            yield comm.recv(2)
        elif comm.rank == 1:
            yield comm.send(0, SizeOnly(3_000_000))
        else:
            yield comm.compute(1e-3)
            yield comm.send(0, SizeOnly(4_000_000))

    result = dsml.run(program, 3, network=star(3, LAT, bw, sharing="fair"))
    ends = send_ends(result)
    assert close(ends[(1, 0)], 5.002e-3)
    assert close(ends[(2, 0)], 7.002e-3)
    # FIFO: flow 2 finds the switch→0 link free again only at 2(α + 3 ms).
    fifo = send_ends(dsml.run(program, 3, network=star(3, LAT, bw)))
    assert close(fifo[(1, 0)], LAT + 3e-3)


def test_progressive_filling_gives_a_flow_what_its_bottlenecked_neighbours_leave():
    """Path 0–1–2–3, links of B, B and 2B, no latency. Flows 0→2 and 1→3 share link 1→2:
    B/2 each. Flow 2→3 shares link 2→3 (2B) with 1→3 and gets what 1→3 leaves: 1.5B, not
    the B an equal split of 2→3 would give."""
    n, bw = 3_000_000, 1e9
    graph = nx.path_graph(4)
    graph.edges[2, 3]["bandwidth"] = 2 * bw
    net = Topology(graph, latency=0.0, bandwidth=bw, sharing="fair")

    def program(comm):
        if comm.rank in (0, 1):
            yield comm.send(comm.rank + 2, SizeOnly(n))
        elif comm.rank == 2:
            yield comm.send(3, SizeOnly(n))
            yield comm.recv(0)
        else:
            yield comm.recv(1)
            yield comm.recv(2)

    ends = send_ends(dsml.run(program, 4, network=net))
    assert close(ends[(2, 3)], n / (1.5 * bw))
    assert close(ends[(0, 2)], 2 * n / bw)
    assert close(ends[(1, 3)], 2 * n / bw)     # 2→3 leaving does not free link 1→2


def test_two_messages_from_one_rank_share_its_uplink():
    """Rank 0 sends to ranks 1 and 2 from two activities at once: both cross its uplink at
    B/2 and end together at 2α + 2n/B; one message alone takes 2α + n/B."""
    n = 1_000_000

    def two_sends(comm):
        if comm.rank == 0:
            first = yield comm.spawn(one_send(comm, 1))
            second = yield comm.spawn(one_send(comm, 2))
            yield comm.join(first)
            yield comm.join(second)
        else:
            yield comm.recv(0)

    def one_send(comm, dst):
        yield comm.send(dst, SizeOnly(n))

    result = dsml.run(two_sends, 3, network=star(3, LAT, BW, sharing="fair"))
    ends = send_ends(result)
    assert close(ends[(0, 1)], 2 * LAT + 2 * n / BW)
    assert close(ends[(0, 2)], 2 * LAT + 2 * n / BW)


def ring_allreduce(comm, x):
    result = yield from allreduce(comm, x, algorithm="ring")
    return result


@pytest.mark.parametrize("p", [2, 5, 8])
def test_ring_allreduce_on_a_physical_ring_is_the_same_under_fair_and_fifo(p):
    """Each message crosses one link nobody else uses at that moment: nothing is shared,
    so both models give α + nβ per message."""
    n = 1 << 20

    def program(comm):
        out = yield from ring_allreduce(comm, np.full(n // 8, comm.rank, np.float64))
        return float(out[0])

    fifo = dsml.run(program, p, network=ring(p, LAT, BW))
    fair = dsml.run(program, p, network=ring(p, LAT, BW, sharing="fair"))
    assert math.isclose(fair.time, fifo.time, rel_tol=1e-12)
    assert fair.values == fifo.values == [float(sum(range(p)))] * p


def test_overhead_is_paid_once_per_message_in_both_models():
    n, hops = 100_000, 2
    one = lambda comm: (yield comm.send(1, SizeOnly(n))) if comm.rank == 0 else (yield comm.recv(0))
    fifo = dsml.run(one, 2, network=star(2, CUT_THROUGH_HOP, BW, overhead=HOST_OVERHEAD)).time
    fair = dsml.run(one, 2, network=star(2, CUT_THROUGH_HOP, BW, overhead=HOST_OVERHEAD,
                                         sharing="fair")).time
    assert close(fifo, HOST_OVERHEAD + hops * (CUT_THROUGH_HOP + n / BW))   # store-and-forward
    assert close(fair, HOST_OVERHEAD + hops * CUT_THROUGH_HOP + n / BW)     # cut-through


def test_an_empty_message_takes_the_latency_only():
    one = lambda comm: (yield comm.send(1, SizeOnly(0))) if comm.rank == 0 else (yield comm.recv(0))
    assert close(dsml.run(one, 2, network=star(2, LAT, BW, sharing="fair")).time, 2 * LAT)


def cross_half(comm, n, pairs):
    for src, dst in pairs:
        if comm.rank == src:
            yield comm.send(dst, SizeOnly(n))
        elif comm.rank == dst:
            yield comm.recv(src)


@pytest.mark.parametrize("sharing", ["fifo", "fair"])
def test_a_permutation_across_the_fat_tree_gets_the_full_bisection(sharing):
    """4 simultaneous 10 MB flows from leaf 0 to leaf 1 of fat_tree(2, 4, 4) take the time
    of one: destination-based routing sends them up four different spines. Through a single
    shortest path (the graph alone) they share one uplink: 4× as long when the flows share
    it fairly, 7/4× under FIFO store-and-forward (the four messages follow each other up
    the shared links, overlapping on the others)."""
    n = 10_000_000
    kw = dict(latency=CUT_THROUGH_HOP, bandwidth=BW, overhead=HOST_OVERHEAD, sharing=sharing)
    pairs = [(i, 4 + i) for i in range(4)]
    single = dsml.run(cross_half, 8, network=fat_tree(2, 4, 4, **kw), args=(n, pairs[:1])).time
    net = fat_tree(2, 4, 4, **kw)
    four = dsml.run(cross_half, 8, network=net, args=(n, pairs)).time
    assert close(four, single)
    assert sorted(net.route(i, 4 + i)[1][1] for i in range(4)) == [f"spine{s}" for s in range(4)]
    one_path = Topology(net.graph, net.hosts, name="no multipath",
                        **{k: v for k, v in kw.items() if k != "bandwidth"})
    shared = dsml.run(cross_half, 8, network=one_path, args=(n, pairs)).time
    assert shared > (3.9 if sharing == "fair" else 1.7) * single


def test_destination_routing_collides_when_destinations_are_equal_mod_spines():
    """fat_tree(3, 2, 2): from leaf 0, flows to hosts 2 and 4 both climb spine 0 and share
    that uplink (B/2 each), while spine 1 idles; flows to hosts 2 and 5 do not collide."""
    n = 2_000_000
    collide = dsml.run(cross_half, 6, network=fat_tree(3, 2, 2, LAT, BW, sharing="fair"),
                       args=(n, [(0, 2), (1, 4)])).time
    apart = dsml.run(cross_half, 6, network=fat_tree(3, 2, 2, LAT, BW, sharing="fair"),
                     args=(n, [(0, 2), (1, 5)])).time
    assert close(apart, 4 * LAT + n / BW)
    assert close(collide, 4 * LAT + 2 * n / BW)


def test_the_same_fair_run_twice_gives_the_same_trace():
    def all_to_zero(comm):
        if comm.rank == 0:
            for src in range(1, comm.size):
                yield comm.recv(src)
        else:
            yield comm.compute(1e-6 * (comm.rank % 3))
            yield comm.send(0, SizeOnly(1000 * comm.rank))

    a = dsml.run(all_to_zero, 6, network=fat_tree(2, 3, 2, LAT, BW, sharing="fair"))
    b = dsml.run(all_to_zero, 6, network=fat_tree(2, 3, 2, LAT, BW, sharing="fair"))
    assert a.trace.records == b.trace.records and a.time == b.time


@pytest.mark.parametrize("build", [
    lambda **kw: ring(4, **kw), lambda **kw: star(4, **kw), lambda **kw: tree(4, **kw),
    lambda **kw: fully_connected(4, **kw), lambda **kw: torus2d(2, 2, **kw),
    lambda **kw: two_level(2, 2, **kw), lambda **kw: fat_tree(2, 2, 2, **kw)])
def test_every_builder_takes_sharing_and_overhead(build):
    net = build(sharing="fair", overhead=2e-6)
    assert net.sharing == "fair" and net.overhead == 2e-6
    result = dsml.run(ring_allreduce, 4, network=net, args=(np.arange(8.0),))
    assert all(np.array_equal(v, 4 * np.arange(8.0)) for v in result.values)


def test_bad_sharing_overhead_and_chunks_are_refused():
    with pytest.raises(ValueError, match=r"sharing must be 'fifo' or 'fair', got 'max-min'"):
        star(4, sharing="max-min")
    with pytest.raises(ValueError, match=r"overhead must be a finite number ≥ 0"):
        ring(4, overhead=-1e-6)
    with pytest.raises(ValueError, match=r"chunks must be 1 with sharing='fair', got 4"):
        ring(4, sharing="fair").with_chunks(4)
    with pytest.raises(ValueError, match=r"router gave \[0, 2\] from 0 to 2: not a path"):
        Topology(nx.path_graph(3), router=lambda a, b: [a, b]).route(0, 2)


def reference_max_min(flows, capacity):
    """An independent fluid simulation: at every start or end, solve the max-min rates of all
    active flows from scratch (water-filling), then advance to the next event.
    flows: list of (start s, links, bytes). Returns each flow's end time."""
    remaining = [float(n) for _, _, n in flows]
    end = [None] * len(flows)
    t = 0.0
    while any(e is None for e in end):
        active = [i for i, (s, _, _) in enumerate(flows) if s <= t and end[i] is None]
        rates = {}
        free = dict(capacity)
        while len(rates) < len(active):
            users = {}
            for i in active:
                if i not in rates:
                    for link in flows[i][1]:
                        users.setdefault(link, []).append(i)
            link = min(users, key=lambda l: (free[l] / len(users[l]), str(l)))
            share = free[link] / len(users[link])
            for i in users[link]:
                rates[i] = share
                for other in flows[i][1]:
                    free[other] -= share
        starts = [s for i, (s, _, _) in enumerate(flows) if s > t]
        finishes = [t + remaining[i] / rates[i] for i in active]
        step = min(starts + finishes) - t
        for i in active:
            remaining[i] -= rates[i] * step
            if remaining[i] <= 1e-6 * flows[i][2]:
                end[i] = t + step
        t += step
    return end


@pytest.mark.parametrize("seed", range(6))
def test_incremental_rates_match_a_from_scratch_solution_on_random_traffic(seed):
    """Random one-message-per-rank traffic with random start times on a fat tree with one
    spine too few: the per-component, once-per-instant solver gives the same end times as
    re-solving every flow at every event."""
    rng = np.random.default_rng(seed)
    p = 9
    net = fat_tree(3, 3, 2, LAT, BW, sharing="fair")
    dst = [int(d) for d in rng.permutation(p)]
    delay = [float(x) for x in rng.choice([0.0, 1e-5, 3e-5], size=p)]
    size = [int(n) for n in rng.integers(1, 5, size=p) * 100_000]

    def program(comm):
        r = comm.rank
        if dst[r] != r:
            yield comm.compute(delay[r])
            yield comm.send(dst[r], SizeOnly(size[r]))
        for src in range(p):
            if dst[src] == r and src != r:
                yield comm.recv(src)

    ends = send_ends(dsml.run(program, p, network=net))
    senders = [r for r in range(p) if dst[r] != r]
    flows = [(delay[r] + sum(net.links[l][0] for l in net.route(r, dst[r])),
              net.route(r, dst[r]), size[r]) for r in senders]
    expected = reference_max_min(flows, {l: 1 / per_byte for l, (_, per_byte) in net.links.items()})
    for r, want in zip(senders, expected):
        assert math.isclose(ends[(r, dst[r])], want, rel_tol=1e-6), (r, ends[(r, dst[r])], want)


def test_a_message_started_ahead_of_time_yields_to_one_that_starts_first():
    """Rank 0 → 3 (3 hops) is sent first onto idle links, so it is started ahead of time;
    rank 2 → 3 (1 hop, sent 0.5 µs later) reaches the shared link 2→3 before it. Both then
    follow max-min fairness from the moment each really starts (closed form below)."""
    hop, bandwidth, n = 1e-6, 1e9, 10_000
    net = ring(8, latency=hop, bandwidth=bandwidth, sharing="fair")

    def program(comm):
        if comm.rank == 2:
            yield comm.compute(0.5e-6)
        if comm.rank in (0, 2):
            yield comm.send(3, SizeOnly(n))
        elif comm.rank == 3:
            yield comm.recv(0)
            yield comm.recv(2)

    result = dsml.run(program, 8, network=net)
    sent = {r.rank: r.end for r in result.trace if r.op == "send"}    # ends when delivered
    start_a, start_b = 3 * hop, 0.5e-6 + hop                          # B starts first
    assert start_b < start_a
    alone_b = bandwidth * (start_a - start_b)                         # B's bytes before A
    end_b = start_a + (n - alone_b) / (bandwidth / 2)                 # then half the link each
    end_a = end_b + (n - (end_b - start_a) * bandwidth / 2) / bandwidth
    assert sent[2] == pytest.approx(end_b, rel=1e-12)
    assert sent[0] == pytest.approx(end_a, rel=1e-12)
    assert net.flows.recomputations >= 2
    assert net.link_bytes[(2, 3)] == 2 * n and net.link_bytes[(0, 1)] == n
