"""Generated from notebooks/week1_foundations_and_communication.ipynb — do not edit; edit the notebook and run `make export`."""

# imports repeated from earlier cells of the same notebook (added by the exporter)
from dsml.validate_args import positive_number

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.net.alphabeta import check_time_parameter


# -- cell 78
import itertools
import math

import networkx as nx

from dsml.net.flows import FairSharing
from dsml.utils import add_to_class
from dsml.validate_args import integer


class Topology:
    """A network built from a NetworkX graph: hosts (the ranks) and switches joined by links.

    Each edge is two directed links (full duplex) with a `latency` (s per hop: the wire and
    the switch it enters) and `bandwidth` (bytes/s), from its attributes or these defaults.
    `overhead` (s) is a host's cost α per message, paid once; `gamma` (s/B) is combining on a
    host. Routes are fixed: fewest hops, or `router(src host, dst host)` → list of nodes.
    `sharing` picks how messages share a link:
    - "fifo" (default): n bytes hold a link for latency + n/bandwidth, first come, first
      served, cut into `chunks` pieces (1: store-and-forward; k > 1: pipelined hop by hop).
    - "fair": a message pays overhead + its route's latencies once, then its bytes cross all
      its links at the max-min fair share of each among the messages crossing it at that
      moment (a flow model, `dsml.net.flows`; no store-and-forward: `chunks` must be 1).
    """

    def __init__(self, graph: nx.Graph, hosts=None, latency: float = 1e-6,
                 bandwidth: float = 10e9, chunks: int = 1, name: str = "topology",
                 gamma: float = 0.0, overhead: float = 0.0, sharing: str = "fifo", router=None):
        if graph.number_of_nodes() == 0:
            raise ValueError("graph has no nodes")
        if graph.is_directed():
            raise ValueError("graph must be undirected (each edge is a full-duplex link)")
        if not nx.is_connected(graph):
            parts = [sorted(map(str, c)) for c in nx.connected_components(graph)]
            raise ValueError(f"graph is disconnected: {len(parts)} components, e.g. {parts[:2]}")
        self.graph, self.name, self.router = graph, name, router
        self.hosts = list(graph.nodes) if hosts is None else list(hosts)
        for host in self.hosts:
            if host not in graph:
                raise ValueError(f"host {host!r} is not a node of the graph")
        if len(set(self.hosts)) != len(self.hosts):
            raise ValueError("hosts must be distinct nodes")
        self.chunks = _check_count("chunks", chunks)
        if sharing not in ("fifo", "fair"):
            raise ValueError(f"sharing must be 'fifo' or 'fair', got {sharing!r}")
        if sharing == "fair" and self.chunks != 1:
            raise ValueError(f"chunks must be 1 with sharing='fair', got {chunks}")
        self.sharing, self.latency, self.bandwidth = sharing, latency, bandwidth
        self.gamma = check_time_parameter("gamma", gamma)   # s/B to combine data on a host
        self.overhead = check_time_parameter("overhead", overhead)   # s per message
        self.links = {}   # (u, v) -> (latency s, seconds per byte)
        for u, v, data in graph.edges(data=True):
            lat = check_time_parameter(f"latency of link {u}-{v}", data.get("latency", latency))
            bw = positive_number(f"bandwidth of link {u}-{v}", data.get("bandwidth", bandwidth),
                                 unit="bytes/s")
            self.links[(u, v)] = self.links[(v, u)] = (lat, 1.0 / bw)
        self._routes, self._route_latency = {}, {}


# -- cell 80
@add_to_class(Topology)
def __repr__(self):
    return (f"Topology({self.name!r}, {len(self.hosts)} hosts, {self.graph.number_of_edges()} "
            f"links, chunks={self.chunks}, sharing={self.sharing!r})")


@add_to_class(Topology)
def with_chunks(self, chunks: int) -> "Topology":
    """The same network, cutting messages into `chunks` pieces."""
    return Topology(self.graph, self.hosts, self.latency, self.bandwidth, chunks, self.name,
                    self.gamma, self.overhead, self.sharing, self.router)


@add_to_class(Topology)
def route(self, src: int, dst: int) -> list:
    """The directed links a message from rank src to rank dst crosses, in order."""
    key = (src, dst)
    if key not in self._routes:
        a, b = self.hosts[src], self.hosts[dst]
        path = nx.shortest_path(self.graph, a, b) if self.router is None else self.router(a, b)
        links = list(zip(path[:-1], path[1:]))
        if path[0] != a or path[-1] != b or any(link not in self.links for link in links):
            raise ValueError(f"router gave {path!r} from {a!r} to {b!r}: not a path of the graph")
        self._routes[key] = links
        self._route_latency[key] = self.overhead + sum(self.links[link][0] for link in links)
    return self._routes[key]


@add_to_class(Topology)
def attach(self, sim, world_size: int) -> None:
    if world_size > len(self.hosts):
        raise ValueError(f"world_size {world_size} exceeds the {len(self.hosts)} hosts "
                         f"of {self.name}: rank {len(self.hosts)} has no host")
    self.sim = sim
    self.flows = None
    if self.sharing == "fair":
        links = list(self.links)
        self.flows = FairSharing(sim, links, [1.0 / self.links[link][1] for link in links],
                                 lambda src, dst: (self.route(src, dst),
                                                   self._route_latency[(src, dst)]))
        self.link_busy, self.link_bytes = self.flows.link_busy, self.flows.link_bytes
        return
    self.link_free = {link: 0.0 for link in self.links}
    self.link_busy = {link: 0.0 for link in self.links}   # total seconds occupied
    self.link_bytes = {link: 0 for link in self.links}    # total bytes carried


# -- cell 82
@add_to_class(Topology)
def transmit(self, src: int, dst: int, nbytes: int, on_sent, on_delivered, message) -> None:
    if self.flows is not None:            # sharing="fair": one flow over the whole route
        self.flows.transmit(src, dst, nbytes, on_sent, on_delivered, message)
        return
    route = self.route(src, dst)
    k = self.chunks if nbytes >= self.chunks else max(1, nbytes)
    sizes = [nbytes // k + (1 if i < nbytes % k else 0) for i in range(k)]
    state = {"left_src": 0, "arrived": 0}

    def hop(piece):
        index, hop_index = piece
        link = route[hop_index]
        latency, per_byte = self.links[link]
        start = max(self.sim.now, self.link_free[link])
        end = start + latency + sizes[index] * per_byte
        self.link_free[link] = end
        self.link_busy[link] += end - start
        self.link_bytes[link] += sizes[index]
        if hop_index == 0:
            state["left_src"] += 1
            if state["left_src"] == k:          # the last chunk has left the sender
                self.sim.at(end, on_sent)
        if hop_index + 1 < len(route):
            self.sim.at(end, hop, (index, hop_index + 1))
        else:
            state["arrived"] += 1
            if state["arrived"] == k:           # the last chunk has reached the receiver
                self.sim.at(end, on_delivered, message)

    for index in range(k):
        if self.overhead:                       # the host's α, before the first hop
            self.sim.after(self.overhead, hop, (index, 0))
        else:
            hop((index, 0))


# -- cell 84
# Realistic values for `latency` (per hop) and `overhead` (per message), used by sections
# 10-11 and week 2; the builders' own defaults stay 1 µs a hop and no overhead.
CUT_THROUGH_HOP = 300e-9   # s: cut-through Ethernet switches forward in 250 ns (Cisco Nexus
#                            3548) to about 380 ns (Arista 7150), 2012 launch figures
HOST_OVERHEAD = 1e-6       # s: one-byte RDMA over InfiniBand HDR takes 1.2 µs end to end
#                            (Azure HBv3 documentation), of which about 1 µs is the hosts


def _check_count(name: str, value: int, minimum: int = 1) -> int:
    return integer(name, value, minimum)


def ring(p: int, latency: float = 1e-6, bandwidth: float = 10e9, *,
         overhead: float = 0.0, sharing: str = "fifo") -> Topology:
    """p hosts in a cycle, each linked to its two neighbours. (Keywords: see Topology.)"""
    p = _check_count("p", p, 2)
    graph = nx.cycle_graph(p) if p > 2 else nx.path_graph(p)
    return Topology(graph, list(range(p)), latency, bandwidth, name=f"ring({p})",
                    overhead=overhead, sharing=sharing)


def star(p: int, latency: float = 1e-6, bandwidth: float = 10e9, *,
         overhead: float = 0.0, sharing: str = "fifo") -> Topology:
    """p hosts, each linked to one central switch."""
    p = _check_count("p", p, 2)
    graph = nx.star_graph(p)            # node 0 is the centre, hosts are 1..p
    graph = nx.relabel_nodes(graph, {0: "switch", **{i: i - 1 for i in range(1, p + 1)}})
    return Topology(graph, list(range(p)), latency, bandwidth, name=f"star({p})",
                    overhead=overhead, sharing=sharing)


def fully_connected(p: int, latency: float = 1e-6, bandwidth: float = 10e9, *,
                    overhead: float = 0.0, sharing: str = "fifo") -> Topology:
    """A direct link between every pair of hosts."""
    p = _check_count("p", p, 2)
    return Topology(nx.complete_graph(p), list(range(p)), latency, bandwidth,
                    name=f"fully_connected({p})", overhead=overhead, sharing=sharing)


def tree(p: int, arity: int = 2, latency: float = 1e-6, bandwidth: float = 10e9, *,
         overhead: float = 0.0, sharing: str = "fifo") -> Topology:
    """Hosts as the nodes of a complete `arity`-ary tree: host i's parent is (i-1)//arity."""
    p = _check_count("p", p, 2)
    arity = _check_count("arity", arity, 1)
    graph = nx.Graph()
    graph.add_nodes_from(range(p))
    graph.add_edges_from((i, (i - 1) // arity) for i in range(1, p))
    return Topology(graph, list(range(p)), latency, bandwidth, name=f"tree({p}, arity={arity})",
                    overhead=overhead, sharing=sharing)


# -- cell 85
def torus2d(rows: int, cols: int, latency: float = 1e-6, bandwidth: float = 10e9, *,
            overhead: float = 0.0, sharing: str = "fifo") -> Topology:
    """A rows × cols grid with wrap-around links; host r·cols + c sits at (r, c)."""
    rows = _check_count("rows", rows, 1)
    cols = _check_count("cols", cols, 1)
    if rows * cols < 2:
        raise ValueError(f"a torus needs at least 2 hosts, got {rows}×{cols}")
    graph = nx.grid_2d_graph(rows, cols, periodic=True)
    hosts = [(r, c) for r in range(rows) for c in range(cols)]
    return Topology(graph, hosts, latency, bandwidth, name=f"torus2d({rows}×{cols})",
                    overhead=overhead, sharing=sharing)


def two_level(nodes: int, per_node: int, intra_latency: float = 1e-6,
              intra_bandwidth: float = 100e9, inter_latency: float = 5e-6,
              inter_bandwidth: float = 10e9, *, overhead: float = 0.0,
              sharing: str = "fifo") -> Topology:
    """`nodes` machines of `per_node` ranks: fast links from each rank to its machine's
    switch, slow links from each machine's switch to one core switch. Rank i lives on
    machine i // per_node."""
    nodes = _check_count("nodes", nodes, 1)
    per_node = _check_count("per_node", per_node, 1)
    graph = nx.Graph()
    hosts = list(range(nodes * per_node))
    for rank in hosts:
        graph.add_edge(rank, f"node{rank // per_node}",
                       latency=intra_latency, bandwidth=intra_bandwidth)
    for n in range(nodes):
        graph.add_edge(f"node{n}", "core", latency=inter_latency, bandwidth=inter_bandwidth)
    return Topology(graph, hosts, name=f"two_level({nodes}×{per_node})", overhead=overhead,
                    sharing=sharing)


def fat_tree(leaves: int, per_leaf: int, spines: int, latency: float = 1e-6,
             bandwidth: float = 10e9, *, overhead: float = 0.0,
             sharing: str = "fifo") -> Topology:
    """A two-level fat tree (leaf–spine): every leaf switch links to every spine switch.
    Traffic between leaves is spread over the spines by destination: a message to host d
    climbs to spine d mod spines ("D-mod-k" routing, as InfiniBand subnet managers set up fat
    trees). Deterministic, one path per pair (so messages keep their order), and with
    spines = per_leaf any shift permutation across leaves uses each spine link once: full
    bisection. Two flows from one leaf to destinations equal mod spines still collide."""
    leaves = _check_count("leaves", leaves, 1)
    per_leaf = _check_count("per_leaf", per_leaf, 1)
    spines = _check_count("spines", spines, 1)
    graph = nx.Graph()
    hosts = list(range(leaves * per_leaf))
    for rank in hosts:
        graph.add_edge(rank, f"leaf{rank // per_leaf}")
    for leaf in range(leaves):
        for spine in range(spines):
            graph.add_edge(f"leaf{leaf}", f"spine{spine}")

    def up_and_down(src, dst):         # hosts are the ranks
        up, down = f"leaf{src // per_leaf}", f"leaf{dst // per_leaf}"
        return [src, up, dst] if up == down else [src, up, f"spine{dst % spines}", down, dst]
    return Topology(graph, hosts, latency, bandwidth, overhead=overhead, sharing=sharing,
                    router=up_and_down,
                    name=f"fat_tree({leaves} leaves × {per_leaf}, {spines} spines)")


# -- cell 87
def diameter(topology: Topology) -> int:
    """The most hops on a shortest path between two hosts."""
    lengths = dict(nx.all_pairs_shortest_path_length(topology.graph))
    return max(lengths[a][b] for a in topology.hosts for b in topology.hosts)


def bisection_bandwidth(topology: Topology, max_hosts: int = 16) -> float:
    """The least total bandwidth (bytes/s, one direction) crossing any cut that splits the
    hosts into two halves (sizes ⌊p/2⌋ and ⌈p/2⌉), found by trying every split.

    With switches in the graph, each split is a minimum s–t cut (switches may fall on
    either side). Exhaustive, so limited to `max_hosts` hosts.
    """
    hosts = topology.hosts
    p = len(hosts)
    if p > max_hosts:
        raise ValueError(f"bisection_bandwidth tries every split; {p} hosts exceed "
                         f"max_hosts={max_hosts}")
    capacity = {frozenset(link): 1.0 / per_byte
                for link, (_, per_byte) in topology.links.items()}
    has_switches = len(topology.graph) > p
    best = math.inf
    # Host 0 stays on side A, which halves the splits to try.
    for others in itertools.combinations(hosts[1:], (p + 1) // 2 - 1):
        side_a = {hosts[0], *others}
        if has_switches:
            flow = nx.DiGraph()
            for (u, v), (_, per_byte) in topology.links.items():
                flow.add_edge(u, v, capacity=1.0 / per_byte)
            for host in hosts:                 # edges without capacity are infinite
                if host in side_a:
                    flow.add_edge("_source", host)
                else:
                    flow.add_edge(host, "_sink")
            cut = nx.minimum_cut_value(flow, "_source", "_sink")
        else:
            cut = sum(c for edge, c in capacity.items() if len(edge & side_a) == 1)
        best = min(best, cut)
    return best
