"""Plumbing (hand-written): the max-min fair flow engine behind `Topology(sharing="fair")`.

A message is a *flow*: after its route's latency (seconds, paid once) its bytes cross every
directed link of the route at one rate (bytes/s). The rates are the max-min fair allocation
of the link capacities among the flows active at that moment, found by progressive filling:
raise every flow's rate together until some link is full; the flows crossing it are fixed at
that link's equal share; remove them and the capacity they use, and repeat with the rest.
(SimGrid's CM02 model without its cross-traffic and TCP-window terms.)

Rates change only when a flow starts or ends, and only inside the *component* of flows
linked to it through shared links (directly or through other flows): a flow that shares no
link with the one that came or went keeps its rate. So a start or an end re-solves just that
component, once per instant however many flows started or ended in it, and a flow alone on
its links (the common case of a ring on a star) takes a fast path with no solving at all. A
flow whose rate changes gets a new completion time; the event scheduled for the old one stays
in the simulator's heap and is ignored when it fires (it no longer matches the flow's `due`
time, or the flow is already done).

Deterministic: flows sit in insertion-ordered dicts, never sets, and the simulator breaks ties
between events at the same time by their sequence number.

Speed: links are numbered (lists, not dicts keyed by node pairs), and each pair's route,
latency and uncontended rate are looked up once, and the two events of an uncontended
message go onto the simulator's heap directly, as `AlphaBeta.transmit` does (sim.at inlined:
the times are ≥ now by construction). A message whose route is idle when it is sent starts
*ahead of time*: `transmit` puts it on its links at once, with its start time (now + latency)
as `updated` and its finish event on the heap, so it costs one event instead of two. Until its
start time it is alone on its links (a flow sent later onto a busy link waits for its own start
event); if another flow starts on one of those links before it does, `_postpone` takes it off
and schedules its start event as for any other message. The rates and times are the same.
"""
from __future__ import annotations

from collections.abc import Mapping
from heapq import heappush


class Flow:
    """One message in the network: its links, bytes left, current rate (B/s)."""
    __slots__ = ("links", "remaining", "rate", "updated", "due", "done", "on_sent",
                 "on_delivered", "message")

    def __init__(self, links, nbytes, on_sent, on_delivered, message):
        self.links = links               # link numbers
        self.remaining = nbytes          # bytes left at time `updated`
        self.rate = 0.0                  # bytes/s since `updated`
        self.updated = 0.0
        self.due = -1.0                  # when it ends at the current rate (s)
        self.done = False
        self.on_sent = on_sent
        self.on_delivered = on_delivered
        self.message = message


class FairSharing:
    """Max-min fair sharing of directed links among the flows crossing them.

    `links` lists the directed links, `capacity` their bandwidths (bytes/s, same order), and
    `path(src, dst)` gives the (links, latency in s) of a message from rank src to rank dst.
    `link_bytes[link]` counts the bytes that crossed a link and `link_busy[link]` the seconds
    during which at least one flow crossed it; `recomputations` counts progressive fillings.
    """

    def __init__(self, sim, links: list, capacity: list, path):
        self.sim = sim
        self.links = list(links)
        self.number = {link: i for i, link in enumerate(self.links)}
        self.capacity = [float(c) for c in capacity]
        self.path = path
        self.on_link = [{} for _ in self.links]     # link -> {flow: None}, in arrival order
        self.carried = [0.0] * len(self.links)
        self.busy = [0.0] * len(self.links)
        self._since = [0.0] * len(self.links)
        self.link_bytes = LinkView(self.number, self.carried)
        self.link_busy = LinkView(self.number, self.busy)
        self._routes = {}                           # (src, dst) -> (links, latency, rate)
        self.recomputations = 0
        self._dirty = []                            # links whose flows changed at this instant

    def transmit(self, src, dst, nbytes, on_sent, on_delivered, message) -> None:
        """Start a message of `nbytes` bytes from rank src to rank dst; call on_sent(None),
        then on_delivered(message), when its last byte arrives."""
        route = self._routes.get((src, dst))
        if route is None:
            route = self._route(src, dst)
        flow = Flow(route[0], nbytes, on_sent, on_delivered, message)
        flow.rate = route[2]                        # its rate if it turns out to be alone
        sim = self.sim
        start = sim.now + route[1]
        if nbytes > 0:
            on_link = self.on_link
            for i in route[0]:
                if on_link[i]:
                    break
            else:      # every link of its route idle: start it ahead of time (see _start)
                flow.updated = start
                flow.due = due = start + nbytes / flow.rate
                carried, since = self.carried, self._since
                for i in route[0]:
                    on_link[i][flow] = None
                    carried[i] += nbytes
                    since[i] = start
                heappush(sim._heap, (due, next(sim._sequence), self._finish, flow))
                return
        heappush(sim._heap, (start, next(sim._sequence), self._start, flow))

    def _route(self, src, dst):
        links, latency = self.path(src, dst)
        numbers = tuple(self.number[link] for link in links)
        route = (numbers, latency, min(self.capacity[i] for i in numbers))
        self._routes[(src, dst)] = route
        return route

    # -- a flow starts or ends -----------------------------------------------------------
    def _start(self, flow) -> None:
        sim = self.sim
        now = sim.now
        flow.updated = now
        if flow.remaining <= 0:                  # an empty message: latency only
            self._complete(flow)
            return
        on_link, carried, since = self.on_link, self.carried, self._since
        alone = True
        for i in flow.links:
            flows = on_link[i]
            if flows and len(flows) == 1:
                other = next(iter(flows))
                if other.updated > now:          # started ahead of time, due later: undo
                    self._postpone(other)
            if flows:
                alone = False
            else:
                since[i] = now
            flows[flow] = None
            carried[i] += flow.remaining
        if alone:                                # fast path: nobody to share with
            flow.due = due = now + flow.remaining / flow.rate
            heappush(sim._heap, (due, next(sim._sequence), self._finish, flow))
        else:
            flow.rate = 0.0                      # allocated by _flush, at this same instant
            self._mark(flow.links)

    def _postpone(self, flow) -> None:
        """Undo a flow started ahead of time (by `transmit`) whose start another flow now
        precedes on one of its links: off its links, its finish event stale, and a start
        event at its start time, as any other flow."""
        on_link, carried = self.on_link, self.carried
        for i in flow.links:
            del on_link[i][flow]
            carried[i] -= flow.remaining
        flow.due = -1.0
        sim = self.sim
        heappush(sim._heap, (flow.updated, next(sim._sequence), self._start, flow))

    def _finish(self, flow) -> None:
        now = self.sim.now
        if flow.due != now or flow.done:         # stale: its rate changed since
            return
        on_link, busy, since = self.on_link, self.busy, self._since
        shared = None
        for i in flow.links:
            flows = on_link[i]
            del flows[flow]
            if flows:
                if shared is None:
                    shared = []
                shared.append(i)
            else:
                busy[i] += now - since[i]
        flow.remaining = 0.0
        if shared is not None:
            self._mark(shared)
        flow.done = True                         # _complete, inlined: the hottest path
        flow.on_sent(None)
        flow.on_delivered(flow.message)

    def _complete(self, flow) -> None:
        flow.done = True
        flow.on_sent(None)
        flow.on_delivered(flow.message)

    # -- max-min fair rates for the flows linked to some links ---------------------------
    def _mark(self, links) -> None:
        """Re-solve the flows around `links` once every start and end at this instant is in
        (an incast of k flows starting together is then one filling, not k)."""
        if not self._dirty:
            self.sim.at(self.sim.now, self._flush)
        self._dirty.extend(links)

    def _flush(self, _=None) -> None:
        seeds, self._dirty = self._dirty, []
        self._reallocate(seeds)

    def _component(self, seeds):
        """The flows reachable from the links `seeds` through shared links, and their links."""
        on_link = self.on_link
        flows, links = {}, {}
        stack = list(seeds)
        while stack:
            i = stack.pop()
            if i in links:
                continue
            links[i] = None
            for flow in on_link[i]:
                if flow not in flows:
                    flows[flow] = None
                    stack.extend(flow.links)
        return flows, links

    def _reallocate(self, seeds) -> None:
        """Progressive filling over the component of `seeds`; reschedule the flows whose
        rate changed."""
        self.recomputations += 1
        flows, links = self._component(seeds)
        on_link, capacity = self.on_link, self.capacity
        left = {i: capacity[i] for i in links}          # unallocated bytes/s
        count = {i: len(on_link[i]) for i in links}     # flows not yet fixed
        rates = {}
        while len(rates) < len(flows):
            bottleneck, share = -1, 0.0
            for i, n in count.items():
                if n:
                    fair = left[i] / n
                    if bottleneck < 0 or fair < share:
                        bottleneck, share = i, fair
            share = max(share, 1e-12 * capacity[bottleneck])   # rounding never stops a flow
            for flow in on_link[bottleneck]:
                if flow in rates:
                    continue
                rates[flow] = share
                for i in flow.links:
                    left[i] -= share
                    count[i] -= 1
        now = self.sim.now
        at, finish = self.sim.at, self._finish
        for flow, rate in rates.items():
            if rate == flow.rate:
                continue
            flow.remaining = max(0.0, flow.remaining - flow.rate * (now - flow.updated))
            flow.updated = now
            flow.rate = rate
            flow.due = due = now + flow.remaining / rate
            at(due, finish, flow)


class LinkView(Mapping):
    """A read-only mapping link → value over one of FairSharing's per-link lists."""

    def __init__(self, number: dict, values: list):
        self._number, self._values = number, values

    def __getitem__(self, link):
        return self._values[self._number[link]]

    def __iter__(self):
        return iter(self._number)

    def __len__(self):
        return len(self._number)
