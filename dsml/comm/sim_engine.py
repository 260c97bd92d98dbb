"""Generated from notebooks/week1_foundations_and_communication.ipynb — do not edit; edit the notebook and run `make export`."""

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.comm.api import ADDED_REQUESTS, Combine, Comm, Compute, Now, RankError, Recv, RunResult, Send, SendRecv, SizeOnly, payload_nbytes, snapshot, start_rank
from dsml.sim import DeadlockError, PENDING, ProcessFailed, Simulator, Thrown, Trace


# -- cell 42
from collections import deque

from dsml.comm.mistakes import check_returned, not_a_request
from dsml.utils import add_to_class


class SimEngine:
    """Runs rank programs on the discrete-event simulator over a network model."""


    def __init__(self, world_size: int, network, trace: bool = True, failures: str = "stop"):
        self.world_size = world_size
        self.sim = Simulator()
        # failures="stop": a rank that raises stops the run. "notify" (week 4): it ends that
        # rank only, and its peers learn of it through the comm API (dsml.comm.failures);
        # failed[rank] is then the notice a receive from it raises, and notices[dst][rank] the
        # same notice once it has reached dst (after what the rank sent it before failing).
        if failures not in ("stop", "notify"):
            raise ValueError(f"failures must be 'stop' or 'notify', got {failures!r}")
        self.failed = {}
        self.notices = [dict() for _ in range(world_size)]
        if failures == "notify":
            self.sim.on_failure = self.on_rank_failure
        self.network = network
        network.attach(self.sim, world_size)
        self.trace = Trace() if trace else None
        self.rows = self.trace.rows if trace else None
        # Delivered messages nobody has asked for yet: mailbox[dst][(src, tag)] -> payloads.
        self.mailbox = [dict() for _ in range(world_size)]
        # Receives posted before their message arrived: posted[dst][(src, tag)] -> callbacks.
        self.posted = [dict() for _ in range(world_size)]
        # For week 4's receive from any source: any_posted[dst][tag] -> callbacks(src, payload),
        # and arrivals[dst][tag] -> sources in arrival order of the messages kept in the mailbox
        # (kept only for tags a receive from any source has asked for). Empty until then.
        self.any_posted = [dict() for _ in range(world_size)]
        self.arrivals = [dict() for _ in range(world_size)]
        self.exchanges = [None] * world_size          # each rank's reusable Exchange
        self.gamma = getattr(network, "gamma", 0.0)    # s/B charged by comm.combine
        self.handlers = {Send: self.on_send, Recv: self.on_recv,
                         SendRecv: self.on_sendrecv, Compute: self.on_compute,
                         Combine: self.on_combine, Now: self.on_now}
        # Requests that later weeks add: role "spawn" is handled by on_spawn, and so on.
        self.handlers.update({kind: getattr(self, "on_" + role)
                              for kind, role in ADDED_REQUESTS.items()})

    def handle(self, process, request) -> None:
        try:
            handler = self.handlers[type(request)]
        except KeyError:
            raise RankError(process.pid, not_a_request(request)) from None
        return handler(process, request)

    def record(self, rank, op, start, src=-1, dst=-1, nbytes=0, tag=0, track=None) -> None:
        if self.rows is not None:     # track: the process's (None: Tracks.infer finds it)
            if track is None:
                track = self.sim.tracks.infer(rank, op)
            self.rows.append((rank, op, start, self.sim.now, src, dst, nbytes, tag, track))


# -- cell 43
@add_to_class(SimEngine)
def deliver(self, message) -> None:
    """A message (src, dst, tag, payload) has fully arrived: hand it to a posted receive
    (one for this source first, then one from any source: week 4), or keep it in the mailbox."""
    src, dst, tag, payload = message
    key = (src, tag)
    waiting = self.posted[dst].get(key)
    if waiting:
        waiting.popleft()(payload)
        return
    anyone = self.any_posted[dst]
    if anyone and anyone.get(tag):
        anyone[tag].popleft()(src, payload)
        return
    box = self.mailbox[dst].get(key)
    if box is None:
        box = self.mailbox[dst][key] = deque()
    box.append(payload)
    order = self.arrivals[dst]
    if order and tag in order:
        order[tag].append(src)


@add_to_class(SimEngine)
def receive(self, rank, src, tag, on_message) -> None:
    """Call on_message(payload) when the next (src, tag) message is at rank (or the notice
    that src has failed, week 4, once nothing from it is left)."""
    key = (src, tag)
    box = self.mailbox[rank].get(key)
    if box:
        # Already here: complete now, through the event queue (no deep recursion).
        self.sim.at(self.sim.now, on_message, box.popleft())
        return
    if self.failed and src in self.notices[rank]:
        self.sim.at(self.sim.now, on_message, self.notices[rank][src])
        return
    waiting = self.posted[rank].get(key)
    if waiting is None:
        waiting = self.posted[rank][key] = deque()
    waiting.append(on_message)


# -- cell 45
@add_to_class(SimEngine)
def on_send(self, process, req):
    rank, start = process.pid, self.sim.now

    def sent(_):
        self.record(rank, "send", start, rank, req.dst, req.nbytes, req.tag, process.track)
        process.resume(None)
    self.network.transmit(rank, req.dst, req.nbytes, sent, self.deliver,
                          (rank, req.dst, req.tag, snapshot(req.payload)))
    return PENDING


@add_to_class(SimEngine)
def on_recv(self, process, req):
    rank, start = process.pid, self.sim.now
    box = self.mailbox[rank].get((req.src, req.tag))
    if box:                                 # already here: answer at once
        payload = box.popleft()
        self.record(rank, "recv", start, req.src, rank, payload_nbytes(payload), req.tag,
                    process.track)
        return payload

    def arrived(payload):
        if type(payload) is not Thrown:     # (a notice that the peer failed: week 4)
            self.record(rank, "recv", start, req.src, rank, payload_nbytes(payload), req.tag,
                        process.track)
        process.resume(payload)
    self.receive(rank, req.src, req.tag, arrived)
    return PENDING


# -- cell 47
class Exchange:
    """A rank's sendrecv in flight: it completes when both its send and its receive have.

    A rank program has at most one request in flight, so each keeps one Exchange and reuses
    it (with its two bound callbacks): a million-message simulation then allocates no
    Exchange per message. This is the hottest path of large simulations. (A rank that runs
    a second activity, week 3, gets a second Exchange: see `exchange_for`.)
    """
    __slots__ = ("sim", "rows", "process", "req", "start", "pending", "payload",
                 "sent", "received")

    def __init__(self, engine, process):
        self.sim = engine.sim
        self.rows = engine.rows
        self.process = process
        self.req = None
        self.start = 0.0
        self.pending = 0
        self.payload = None
        self.sent = self.on_sent               # bound once, handed out per message
        self.received = self.on_received

    def on_sent(self, _):
        if self.pending == 1:
            self.finish()
        else:
            self.pending = 1

    def on_received(self, payload):
        self.payload = payload
        if self.pending == 1:
            self.finish()
        else:
            self.pending = 1

    def finish(self):
        self.pending = 0
        req = self.req
        if self.rows is not None:         # record() inlined
            self.rows.append((self.process.pid, "sendrecv", self.start, self.sim.now, req.src,
                              req.dst, req.nbytes, req.tag, self.process.track))
        payload, self.payload = self.payload, None
        self.process.resume(payload)


# -- cell 49
@add_to_class(SimEngine)
def on_sendrecv(self, process, req):
    rank = process.pid
    exchange = self.exchanges[rank]
    if exchange is None or exchange.process is not process:
        exchange = self.exchange_for(process)
    exchange.req, exchange.start, exchange.pending = req, self.sim.now, 2
    payload = req.payload
    if type(payload) is not SizeOnly:      # the send's snapshot (placeholders are immutable)
        payload = snapshot(payload)
    self.network.transmit(rank, req.dst, req.nbytes, exchange.sent, self.deliver,
                          (rank, req.dst, req.tag, payload))
    key = (req.src, req.tag)
    box = self.mailbox[rank].get(key)
    if box:
        # Already here: count the receive as done now. The send cannot have finished yet
        # (a transmission always ends in a later event), so this cannot resume the rank.
        exchange.on_received(box.popleft())
    elif self.failed and req.src in self.notices[rank]:
        exchange.on_received(self.notices[rank][req.src])   # raised when the exchange completes
    else:
        waiting = self.posted[rank].get(key)
        if waiting is None:
            waiting = self.posted[rank][key] = deque()
        waiting.append(exchange.received)
    return PENDING


@add_to_class(SimEngine)
def exchange_for(self, process) -> Exchange:
    """The Exchange of this process: the first of a rank to ask gets the rank's slot, any
    other activity of the rank (week 3) one of its own."""
    rank = process.pid
    if self.exchanges[rank] is None:
        self.exchanges[rank] = Exchange(self, process)
        return self.exchanges[rank]
    others = self.__dict__.setdefault("other_exchanges", {})
    if process not in others:
        others[process] = Exchange(self, process)
    return others[process]


# -- cell 51
@add_to_class(SimEngine)
def on_compute(self, process, req):
    return self.spend(process, "compute", req.seconds, 0)


@add_to_class(SimEngine)
def on_combine(self, process, req):
    if self.gamma == 0 and self.rows is None:
        return None                        # free and unrecorded: the common case at scale
    return self.spend(process, "combine", req.nbytes * self.gamma, req.nbytes)


@add_to_class(SimEngine)
def on_now(self, process, req):
    return self.sim.now                    # answered at once: reading the clock takes no time


@add_to_class(SimEngine)
def spend(self, process, op, seconds, nbytes):
    """Let simulated time pass on one rank; no time at all is answered at once."""
    rank, start = process.pid, self.sim.now
    if seconds == 0:
        self.record(rank, op, start, nbytes=nbytes, track=process.track)
        return None

    def done(_):
        self.record(rank, op, start, nbytes=nbytes, track=process.track)
        process.resume(None)
    self.sim.after(seconds, done)
    return PENDING


# -- cell 53
@add_to_class(SimEngine)
def run(self, program, args=(), kwargs=None, max_events=None, timeout=None) -> RunResult:
    for rank in range(self.world_size):
        gen = start_rank(program, Comm(rank, self.world_size), args, kwargs)
        self.sim.spawn(gen, self.handle, name=f"rank {rank}")
    try:
        self.sim.run(max_events, timeout)
    except DeadlockError as deadlock:
        unread = self.unreceived()
        if unread:
            raise DeadlockError(deadlock.waiting, "messages that arrived but were never "
                                "received (a tag or peer mismatch?):\n  "
                                + describe_messages(unread)) from None
        raise
    except ProcessFailed as failure:
        error = failure.error
        raise RankError(failure.process.pid,
                        f"failed at t={self.sim.now:.9g} s: {type(error).__name__}: {error}"
                        ) from error
    self.check_all_received()
    processes = self.sim.processes[:self.world_size]    # the ranks (not their activities)
    check_returned(processes)       # a rank that returned a generator: no `yield from`?
    finish = [p.finish_time for p in processes]
    return RunResult(values=[p.value for p in processes], time=max(finish),
                     trace=self.trace, engine="sim", world_size=self.world_size,
                     finish_times=finish,
                     failed={rank: notice.error.__cause__ for rank, notice in self.failed.items()})


@add_to_class(SimEngine)
def unreceived(self) -> list:
    """(src, dst, tag, count) of messages that arrived but no receive has taken."""
    return [(src, dst, tag, len(box)) for dst, boxes in enumerate(self.mailbox)
            for (src, tag), box in sorted(boxes.items()) if box]


@add_to_class(SimEngine)
def check_all_received(self) -> None:
    """Every rank finished: a message still in a mailbox was sent but never received (to or
    from a rank that failed, week 4, it was orphaned by the failure: not an error)."""
    left = [m for m in self.unreceived() if m[0] not in self.failed and m[1] not in self.failed]
    if left:
        raise RankError(left[0][1], "finished without receiving messages sent to it "
                        "(mismatched peers or tags?):\n  " + describe_messages(left))


def describe_messages(messages) -> str:
    return "\n  ".join(f"rank {src} -> rank {dst} (tag {tag}): {n} message(s)"
                       for src, dst, tag, n in messages)


def simulate(program, world_size: int, network, args=(), kwargs=None,
             trace: bool = True, max_events: int | None = None,
             failures: str = "stop", timeout: float | None = None) -> RunResult:
    """Run `program(comm, *args, **kwargs)` on `world_size` simulated ranks over `network`
    (limits `max_events` and `timeout`: see Simulator.run; `failures`: see SimEngine)."""
    return SimEngine(world_size, network, trace, failures).run(program, args, kwargs,
                                                               max_events, timeout)
