"""Plumbing (hand-written): dsml.viz — one plotting vocabulary for every week.

The same rank has the same colour in every figure (`rank_color`), operations have fixed
colours (`OP_COLORS`), and `timeline` draws any trace (simulated or measured) as a Gantt
chart, one row per rank. `draw_topology` draws a dsml.net.Topology with its hosts and
switches told apart. `size_label` and `size_axis` write byte counts the way the course
speaks of them (8 B, 4 KiB, 64 MiB, 1 GiB).
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import networkx as nx
from matplotlib.patches import Patch

from dsml.comm.spans import SPAN_OPS

PALETTE = ["#4477AA", "#EE6677", "#228833", "#CCBB44", "#66CCEE", "#AA3377", "#BBBBBB",
           "#000000"]
OP_COLORS = {"send": "#4477AA", "recv": "#EE6677", "sendrecv": "#AA3377",
             "compute": "#228833", "combine": "#CCBB44"}


def rank_color(rank: int) -> str:
    """The colour of `rank` in every figure of the course."""
    return PALETTE[rank % len(PALETTE)]


def use_style() -> None:
    """Course-wide Matplotlib defaults: readable sizes, light grid, no top/right spines."""
    plt.rcParams.update({
        "figure.figsize": (7.0, 4.0), "figure.dpi": 100, "axes.grid": True,
        "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
        "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
        "axes.prop_cycle": plt.cycler(color=PALETTE),
    })


def size_label(nbytes: float) -> str:
    """A byte count in binary units: 8 B, 1.5 KiB, 64 MiB, 1 GiB."""
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= factor:
            return f"{nbytes / factor:g} {unit}"
    return f"{nbytes:g} B"


def size_axis(ax, axis: str = "x", max_ticks: int = 8) -> None:
    """Put ticks at powers of two on a log-scaled size axis, labelled by `size_label`.

    Call it after plotting (it reads the axis limits). The step between ticks is 1, 2, 5 or
    10 doublings, the smallest that keeps at most `max_ticks` ticks, so that the
    labels land on whole units (1 KiB, 1 MiB, ...) when the range is wide."""
    low, high = ax.get_xlim() if axis == "x" else ax.get_ylim()
    first, last = math.ceil(math.log2(low)), math.floor(math.log2(high))
    step = next((s for s in (1, 2, 5, 10, 20) if (last - first) // s + 1 <= max_ticks), 30)
    ticks = [2.0**k for k in range(first, last + 1) if k % step == 0]
    setter = ax.set_xticks if axis == "x" else ax.set_yticks
    setter(ticks, [size_label(t) for t in ticks])
    setter([], minor=True)


def _time_scale(span: float) -> tuple[float, str]:
    for factor, unit in ((1.0, "s"), (1e3, "ms"), (1e6, "µs"), (1e9, "ns")):
        if span * factor >= 1.0:
            return factor, unit
    return 1e9, "ns"


def timeline(trace, ax=None, title: str = "Timeline", ops=None, label_messages: bool = False):
    """A Gantt chart of a trace: one row per rank, one bar per operation (µs/ms/s chosen
    from the span). `ops` limits the operations drawn (default: all but the collectives'
    enclosing slices); `label_messages` writes the peer (→dst / ←src) on each bar."""
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * max(1, len(trace.ranks()))))
    # Without `ops`, every record but the collectives' enclosing slices (dsml.comm.spans),
    # which would cover the messages they enclose.
    records = [r for r in trace if (r.op in ops if ops is not None else r.op not in SPAN_OPS)]
    span = max((r.end for r in records), default=1.0) or 1.0
    factor, unit = _time_scale(span)
    for r in records:
        ax.barh(r.rank, (r.end - r.start) * factor, left=r.start * factor, height=0.6,
                color=OP_COLORS.get(r.op, "#999999"), edgecolor="white", linewidth=0.5)
        if label_messages and r.end > r.start:
            text = {"send": f"→{r.dst}", "recv": f"←{r.src}",
                    "sendrecv": f"→{r.dst} ←{r.src}"}.get(r.op, "")
            ax.text((r.start + r.end) / 2 * factor, r.rank, text, ha="center", va="center",
                    fontsize=7, color="white")
    ranks = trace.ranks()
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(title)
    used = sorted({r.op for r in records})
    ax.legend(handles=[Patch(color=OP_COLORS.get(op, "#999999"), label=op) for op in used],
              loc="lower right", fontsize=8)
    return ax


def draw_topology(topology, ax=None, title: str | None = None, layout: str = "auto"):
    """Draw a Topology: hosts as coloured circles labelled by rank, switches as grey squares."""
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 4))
    graph = topology.graph
    hosts = topology.hosts
    if layout == "auto":
        pos = _auto_layout(graph, hosts)
    else:
        pos = getattr(nx, f"{layout}_layout")(graph)
    straight, wrapped = [], []
    for u, v in graph.edges:
        far = abs(pos[u][0] - pos[v][0]) > 1.01 or abs(pos[u][1] - pos[v][1]) > 1.01
        (wrapped if far and layout == "auto" and isinstance(u, tuple) else straight).append((u, v))
    nx.draw_networkx_edges(graph, pos, edgelist=straight, ax=ax, edge_color="#888888")
    if wrapped:   # a torus's wrap-around links, bowed so they do not hide the grid
        nx.draw_networkx_edges(graph, pos, edgelist=wrapped, ax=ax, edge_color="#888888",
                               arrows=True, arrowstyle="-", connectionstyle="arc3,rad=0.25")
    switches = [n for n in graph if n not in set(hosts)]
    nx.draw_networkx_nodes(graph, pos, nodelist=switches, node_shape="s", node_size=220,
                           node_color="#BBBBBB", ax=ax)
    nx.draw_networkx_nodes(graph, pos, nodelist=hosts, node_size=260, ax=ax,
                           node_color=[rank_color(i) for i in range(len(hosts))])
    nx.draw_networkx_labels(graph, pos, labels={h: str(i) for i, h in enumerate(hosts)},
                            font_size=8, font_color="white", ax=ax)
    ax.set_title(title or topology.name)
    ax.set_axis_off()
    return ax


def _layers(graph, sources) -> dict:
    """Node -> BFS distance from the nearest of `sources`."""
    depth = {node: 0 for node in sources}
    frontier = list(sources)
    while frontier:
        nxt = []
        for node in frontier:
            for other in graph[node]:
                if other not in depth:
                    depth[other] = depth[node] + 1
                    nxt.append(other)
        frontier = nxt
    return depth


def _layered(graph, depth: dict, bottom_up: bool, min_gap: float = 0.09) -> dict:
    """Layers stacked vertically; the first layer evenly spaced in its given order, each
    later node under (or over) the mean position of its neighbours in the layer before,
    pushed apart where two would overlap."""
    rows = {}
    for node, d in depth.items():
        rows.setdefault(d, []).append(node)
    x = {}
    for d in sorted(rows):
        nodes = rows[d]
        if d == 0:
            for i, node in enumerate(nodes):
                x[node] = (i + 0.5) / len(nodes)
            continue
        wanted = {n: sum(x[m] for m in graph[n] if depth.get(m) == d - 1) /
                  max(1, sum(1 for m in graph[n] if depth.get(m) == d - 1)) for n in nodes}
        order = sorted(nodes, key=lambda n: wanted[n])
        placed = []
        for n in order:
            placed.append(max(wanted[n], placed[-1] + min_gap) if placed else wanted[n])
        shift = sum(wanted.values()) / len(nodes) - sum(placed) / len(placed)
        for n, position in zip(order, placed):
            x[n] = position + shift
    return {n: (x[n], depth[n] if bottom_up else -depth[n]) for n in depth}


def _auto_layout(graph, hosts) -> dict:
    """Grids keep their shape; switched networks are drawn in layers above their hosts;
    trees hang from host 0; anything else sits on a circle."""
    if all(isinstance(n, tuple) and len(n) == 2 for n in graph):
        return {n: (n[1], -n[0]) for n in graph}
    if len(graph) > len(hosts):
        return _layered(graph, _layers(graph, hosts), bottom_up=True, min_gap=0.2)
    if nx.is_tree(graph):
        return _layered(graph, _layers(graph, [hosts[0]]), bottom_up=False)
    return nx.circular_layout(graph)
