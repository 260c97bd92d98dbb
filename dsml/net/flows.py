"""Plumbing (hand-written): the max-min fair flow engine behind `Topology(sharing="fair")`.

A message is a *flow*: after its route's latency (seconds, paid once) its bytes cross every
directed link of the route at one rate (bytes/s). The rates are the max-min fair allocation
of the link capacities among the flows active at that moment, found by progressive filling:
raise every flow's rate together until some link is full; the flows crossing it are fixed at
that link's equal share; remove them and the capacity they use, and repeat with the rest.
(SimGrid's CM02 model without its cross-traffic and TCP-window terms.)

Rates change only when a flow starts or ends, and only inside the *component* of flows
linked to it through shared links (directly or through other flows): a flow that shares no
link with the one that came or went keeps its rate. So each start or end re-solves just that
component. A flow whose rate changes gets a new completion time; the event scheduled for
the old one stays in the simulator's heap and is ignored when it fires (each flow carries a
version number, and a completion event names the version it was scheduled for).

Deterministic: flows sit in insertion-ordered dicts, never sets, and the simulator breaks ties
between events at the same time by their sequence number.
"""
from __future__ import annotations


class Flow:
    """One message in the network: its links, bytes left, current rate (B/s)."""
    __slots__ = ("links", "remaining", "rate", "updated", "version", "on_sent",
                 "on_delivered", "message")

    def __init__(self, links, nbytes, on_sent, on_delivered, message):
        self.links = links
        self.remaining = float(nbytes)   # bytes left at time `updated`
        self.rate = 0.0                  # bytes/s since `updated`
        self.updated = 0.0
        self.version = 0
        self.on_sent = on_sent
        self.on_delivered = on_delivered
        self.message = message


class FairSharing:
    """Max-min fair sharing of directed links among the flows crossing them.

    `capacity[link]` is the link's bandwidth in bytes/s. `transmit` starts a flow;
    `link_bytes[link]` counts the bytes that crossed a link and `link_busy[link]` the seconds
    during which at least one flow crossed it.
    """

    def __init__(self, sim, capacity: dict):
        self.sim = sim
        self.capacity = capacity
        self.on_link = {link: {} for link in capacity}   # link -> {flow: None}, in order
        self.link_bytes = dict.fromkeys(capacity, 0)
        self.link_busy = dict.fromkeys(capacity, 0.0)
        self._busy_since = {}
        self.active = 0
        self.recomputations = 0          # progressive fillings run (not the fast path)

    def transmit(self, links, latency, nbytes, on_sent, on_delivered, message) -> None:
        """Start a message of `nbytes` bytes over `links` (a list of directed links) after
        `latency` seconds; call on_sent(None), then on_delivered(message), when its last
        byte arrives."""
        flow = Flow(links, nbytes, on_sent, on_delivered, message)
        self.sim.at(self.sim.now + latency, self._start, flow)

    # -- a flow starts or ends -----------------------------------------------------------
    def _start(self, flow) -> None:
        sim = self.sim
        now = sim.now
        flow.updated = now
        if flow.remaining <= 0:                  # an empty message: latency only
            self._complete(flow)
            return
        on_link = self.on_link
        alone = True
        for link in flow.links:
            flows = on_link[link]
            if not flows:
                self._busy_since[link] = now
            else:
                alone = False
            flows[flow] = None
            self.link_bytes[link] += flow.remaining
        self.active += 1
        if alone:                                # fast path: nobody to share with
            capacity = self.capacity
            flow.rate = min(capacity[link] for link in flow.links)
            sim.at(now + flow.remaining / flow.rate, self._finish, (flow, 0))
        else:
            self._reallocate(flow.links)

    def _finish(self, event) -> None:
        flow, version = event
        if version != flow.version:              # stale: the rate changed since
            return
        now = self.sim.now
        on_link = self.on_link
        shared = []
        for link in flow.links:
            flows = on_link[link]
            del flows[flow]
            if flows:
                shared.append(link)
            else:
                self.link_busy[link] += now - self._busy_since.pop(link)
        self.active -= 1
        flow.remaining = 0.0
        if shared:
            self._reallocate(shared)
        self._complete(flow)

    def _complete(self, flow) -> None:
        flow.on_sent(None)
        flow.on_delivered(flow.message)

    # -- max-min fair rates for the flows linked to some links ---------------------------
    def _component(self, seeds):
        """The flows reachable from the links `seeds` through shared links, and their links."""
        on_link = self.on_link
        flows, links = {}, {}
        stack = list(seeds)
        while stack:
            link = stack.pop()
            if link in links:
                continue
            links[link] = None
            for flow in on_link[link]:
                if flow not in flows:
                    flows[flow] = None
                    stack.extend(flow.links)
        return flows, links

    def _reallocate(self, seeds) -> None:
        """Progressive filling over the component of `seeds`; reschedule the flows whose
        rate changed."""
        self.recomputations += 1
        flows, links = self._component(seeds)
        on_link = self.on_link
        left = {link: self.capacity[link] for link in links}      # unallocated B/s
        count = {link: len(on_link[link]) for link in links}      # flows not yet fixed
        rates = {}
        while len(rates) < len(flows):
            bottleneck, share = None, 0.0
            for link, n in count.items():
                if n:
                    fair = left[link] / n
                    if bottleneck is None or fair < share:
                        bottleneck, share = link, fair
            share = max(share, 0.0)
            for flow in on_link[bottleneck]:
                if flow in rates:
                    continue
                rates[flow] = share
                for link in flow.links:
                    left[link] -= share
                    count[link] -= 1
        now = self.sim.now
        at, finish = self.sim.at, self._finish
        for flow, rate in rates.items():
            if rate == flow.rate:
                continue
            flow.remaining = max(0.0, flow.remaining - flow.rate * (now - flow.updated))
            flow.updated = now
            flow.rate = rate
            flow.version += 1
            at(now + flow.remaining / rate, finish, (flow, flow.version))
