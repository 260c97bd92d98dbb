"""Generated from notebooks/week1_foundations_and_communication.ipynb — do not edit; edit the notebook and run `make export`."""

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.net.alphabeta import check_time_parameter


# -- cell 78
import itertools
import math
import numbers

import networkx as nx

from dsml.utils import add_to_class


class Topology:
    """A network built from a NetworkX graph: hosts (the ranks) and switches joined by links.

    Each undirected edge is two directed links (full duplex) with its own `latency` (s) and
    `bandwidth` (bytes/s), taken from the edge attributes or the defaults given here. A
    transmission of n bytes occupies a link for latency + n/bandwidth (per-hop α + nβ, as
    Hockney); a link serves transmissions first come, first served (FIFO contention).
    Messages follow a fixed shortest path (fewest hops, NetworkX's deterministic choice) and
    are cut into `chunks` pieces: 1 is store-and-forward (a node forwards a message only once
    it has all of it), k > 1 pipelines the pieces hop by hop. `gamma` (s/B) is the cost of
    combining data on a host, charged by `comm.combine`.
    """

    def __init__(self, graph: nx.Graph, hosts=None, latency: float = 1e-6,
                 bandwidth: float = 10e9, chunks: int = 1, name: str = "topology",
                 gamma: float = 0.0):
        if graph.number_of_nodes() == 0:
            raise ValueError("graph has no nodes")
        if graph.is_directed():
            raise ValueError("graph must be undirected (each edge is a full-duplex link)")
        if not nx.is_connected(graph):
            parts = [sorted(map(str, c)) for c in nx.connected_components(graph)]
            raise ValueError(f"graph is disconnected: {len(parts)} components, e.g. {parts[:2]}")
        self.graph = graph
        self.hosts = list(graph.nodes) if hosts is None else list(hosts)
        for host in self.hosts:
            if host not in graph:
                raise ValueError(f"host {host!r} is not a node of the graph")
        if len(set(self.hosts)) != len(self.hosts):
            raise ValueError("hosts must be distinct nodes")
        if isinstance(chunks, bool) or not isinstance(chunks, numbers.Integral) or chunks < 1:
            raise ValueError(f"chunks must be an integer ≥ 1, got {chunks!r}")
        self.chunks = int(chunks)
        self.name = name
        self.latency, self.bandwidth = latency, bandwidth
        self.gamma = check_time_parameter("gamma", gamma)   # s/B to combine data on a host
        self.links = {}   # (u, v) -> (latency s, seconds per byte)
        for u, v, data in graph.edges(data=True):
            lat = check_time_parameter(f"latency of link {u}-{v}", data.get("latency", latency))
            bw = float(data.get("bandwidth", bandwidth))
            if not (bw > 0 and math.isfinite(bw)):
                raise ValueError(f"bandwidth of link {u}-{v} must be a finite number > 0 "
                                 f"(bytes/s), got {bw}")
            self.links[(u, v)] = self.links[(v, u)] = (lat, 1.0 / bw)
        self._routes = {}

    def __repr__(self):
        return (f"Topology({self.name!r}, {len(self.hosts)} hosts, "
                f"{self.graph.number_of_edges()} links, chunks={self.chunks})")

    def with_chunks(self, chunks: int) -> "Topology":
        """The same network, cutting messages into `chunks` pieces."""
        return Topology(self.graph, self.hosts, self.latency, self.bandwidth, chunks, self.name,
                        self.gamma)


# -- cell 80
@add_to_class(Topology)
def route(self, src: int, dst: int) -> list:
    """The directed links a message from rank src to rank dst crosses, in order."""
    key = (src, dst)
    if key not in self._routes:
        path = nx.shortest_path(self.graph, self.hosts[src], self.hosts[dst])
        self._routes[key] = list(zip(path[:-1], path[1:]))
    return self._routes[key]


@add_to_class(Topology)
def attach(self, sim, world_size: int) -> None:
    if world_size > len(self.hosts):
        raise ValueError(f"world_size {world_size} exceeds the {len(self.hosts)} hosts "
                         f"of {self.name}: rank {len(self.hosts)} has no host")
    self.sim = sim
    self.link_free = {link: 0.0 for link in self.links}
    self.link_busy = {link: 0.0 for link in self.links}   # total seconds occupied


# -- cell 82
@add_to_class(Topology)
def transmit(self, src: int, dst: int, nbytes: int, on_sent, on_delivered, message) -> None:
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
        hop((index, 0))


# -- cell 84
def _check_count(name: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer ≥ {minimum}, got {value!r}")
    return int(value)


def ring(p: int, latency: float = 1e-6, bandwidth: float = 10e9) -> Topology:
    """p hosts in a cycle, each linked to its two neighbours."""
    p = _check_count("p", p, 2)
    graph = nx.cycle_graph(p) if p > 2 else nx.path_graph(p)
    return Topology(graph, list(range(p)), latency, bandwidth, name=f"ring({p})")


def star(p: int, latency: float = 1e-6, bandwidth: float = 10e9) -> Topology:
    """p hosts, each linked to one central switch."""
    p = _check_count("p", p, 2)
    graph = nx.star_graph(p)            # node 0 is the centre, hosts are 1..p
    graph = nx.relabel_nodes(graph, {0: "switch", **{i: i - 1 for i in range(1, p + 1)}})
    return Topology(graph, list(range(p)), latency, bandwidth, name=f"star({p})")


def fully_connected(p: int, latency: float = 1e-6, bandwidth: float = 10e9) -> Topology:
    """A direct link between every pair of hosts."""
    p = _check_count("p", p, 2)
    return Topology(nx.complete_graph(p), list(range(p)), latency, bandwidth,
                    name=f"fully_connected({p})")


def tree(p: int, arity: int = 2, latency: float = 1e-6, bandwidth: float = 10e9) -> Topology:
    """Hosts as the nodes of a complete `arity`-ary tree: host i's parent is (i-1)//arity."""
    p = _check_count("p", p, 2)
    arity = _check_count("arity", arity, 1)
    graph = nx.Graph()
    graph.add_nodes_from(range(p))
    graph.add_edges_from((i, (i - 1) // arity) for i in range(1, p))
    return Topology(graph, list(range(p)), latency, bandwidth, name=f"tree({p}, arity={arity})")


# -- cell 85
def torus2d(rows: int, cols: int, latency: float = 1e-6, bandwidth: float = 10e9) -> Topology:
    """A rows × cols grid with wrap-around links; host r·cols + c sits at (r, c)."""
    rows = _check_count("rows", rows, 1)
    cols = _check_count("cols", cols, 1)
    if rows * cols < 2:
        raise ValueError(f"a torus needs at least 2 hosts, got {rows}×{cols}")
    graph = nx.grid_2d_graph(rows, cols, periodic=True)
    hosts = [(r, c) for r in range(rows) for c in range(cols)]
    return Topology(graph, hosts, latency, bandwidth, name=f"torus2d({rows}×{cols})")


def two_level(nodes: int, per_node: int, intra_latency: float = 1e-6,
              intra_bandwidth: float = 100e9, inter_latency: float = 5e-6,
              inter_bandwidth: float = 10e9) -> Topology:
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
    return Topology(graph, hosts, name=f"two_level({nodes}×{per_node})")


def fat_tree(leaves: int, per_leaf: int, spines: int, latency: float = 1e-6,
             bandwidth: float = 10e9) -> Topology:
    """A two-level fat tree (leaf–spine): every leaf switch links to every spine switch.
    With spines = per_leaf the core has as much bandwidth as the hosts (full bisection),
    but traffic between two leaves follows one shortest path (no multipath spreading)."""
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
    return Topology(graph, hosts, latency, bandwidth,
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
