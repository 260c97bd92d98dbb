"""Generated from notebooks/week1_foundations_and_communication.ipynb — do not edit; edit the notebook and run `make export`."""

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.comm.api import Combine, Comm, Compute, Now, RankError, Recv, RunResult, Send, SendRecv, payload_nbytes, snapshot, start_rank
from dsml.sim import PENDING, ProcessFailed, Simulator, Trace


# -- cell 42
from collections import deque

from dsml.comm.mistakes import check_returned, describe_messages, not_a_request, unreceived
from dsml.utils import add_to_class


class SimEngine:
    """Runs rank programs on the discrete-event simulator over a network model."""

    def __init__(self, world_size: int, network, trace: bool = True):
        self.world_size = world_size
        self.sim = Simulator()
        self.network = network
        network.attach(self.sim, world_size)
        self.trace = Trace() if trace else None
        # Delivered messages nobody has asked for yet: mailbox[dst][(src, tag)] -> payloads.
        self.mailbox = [dict() for _ in range(world_size)]
        # Receives posted before their message arrived: posted[dst][(src, tag)] -> callbacks.
        self.posted = [dict() for _ in range(world_size)]
        self.gamma = getattr(network, "gamma", 0.0)    # s/B charged by comm.combine
        self.handlers = {  # one per type of request; time spent on a rank goes to spend()
            Send: self.on_send, Recv: self.on_recv, SendRecv: self.on_sendrecv,
            Compute: lambda process, req: self.spend(process, "compute", req.seconds, 0),
            Combine: lambda process, req: self.spend(process, "combine",
                                                     req.nbytes * self.gamma, req.nbytes),
            Now: lambda process, req: self.sim.now}   # reading the clock takes no time

    def handle(self, process, request):
        """The handler of every rank's process."""
        handler = self.handlers.get(type(request))
        if handler is None:
            raise RankError(process.pid, not_a_request(request))
        return handler(process, request)

    def record(self, rank, op, start, src=-1, dst=-1, nbytes=0, tag=0, track=None) -> None:
        """Trace what `rank` did from `start` until now (track None: see Tracks.infer)."""
        if self.trace is not None:
            track = self.sim.tracks.infer(rank, op) if track is None else track
            self.trace.rows.append((rank, op, start, self.sim.now, src, dst, nbytes, tag, track))


# -- cell 43
@add_to_class(SimEngine)
def deliver(self, message) -> None:
    """A message (src, dst, tag, payload) has arrived: hand it to the first receive posted
    for it, or keep it in the mailbox until one is."""
    src, dst, tag, payload = message
    waiting = self.posted[dst].get((src, tag))
    if waiting:
        waiting.popleft()(payload)
    else:
        self.mailbox[dst].setdefault((src, tag), deque()).append(payload)


@add_to_class(SimEngine)
def wait_for(self, process, src, tag, on_message) -> None:
    """Post a receive: on_message(payload) when the next (src, tag) message reaches the rank."""
    self.posted[process.pid].setdefault((src, tag), deque()).append(on_message)


# -- cell 45
@add_to_class(SimEngine)
def on_send(self, process, req):
    rank, start = process.pid, self.sim.now

    def sent(_):                            # the network says: the message has left
        self.record(rank, "send", start, rank, req.dst, req.nbytes, req.tag, process.track)
        process.resume(None)
    self.network.transmit(rank, req.dst, req.nbytes, sent, self.deliver,
                          (rank, req.dst, req.tag, snapshot(req.payload)))
    return PENDING


@add_to_class(SimEngine)
def on_recv(self, process, req):
    rank, start = process.pid, self.sim.now

    def got(payload):
        self.record(rank, "recv", start, req.src, rank, payload_nbytes(payload), req.tag,
                    process.track)
        return payload
    box = self.mailbox[rank].get((req.src, req.tag))
    if box:                                 # already here: answer at once
        return got(box.popleft())
    self.wait_for(process, req.src, req.tag, lambda payload: process.resume(got(payload)))
    return PENDING


# -- cell 47
@add_to_class(SimEngine)
def on_sendrecv(self, process, req):
    rank, start = process.pid, self.sim.now
    state = [2, None]                       # halves still to finish, the payload received

    def half_done(payload, received: bool):
        if received:
            state[1] = payload
        state[0] -= 1
        if state[0] == 0:
            self.record(rank, "sendrecv", start, req.src, req.dst, req.nbytes, req.tag,
                        process.track)
            process.resume(state[1])
    self.network.transmit(rank, req.dst, req.nbytes, lambda _: half_done(None, False),
                          self.deliver, (rank, req.dst, req.tag, snapshot(req.payload)))
    box = self.mailbox[rank].get((req.src, req.tag))
    if box:      # already here (the send cannot have finished: it ends in a later event)
        half_done(box.popleft(), True)
    else:
        self.wait_for(process, req.src, req.tag, lambda payload: half_done(payload, True))
    return PENDING


# -- cell 49
@add_to_class(SimEngine)
def spend(self, process, op, seconds, nbytes):
    """Let `seconds` of simulated time pass on one rank (none at all: answered at once)."""
    rank, start = process.pid, self.sim.now
    if seconds == 0:
        self.record(rank, op, start, nbytes=nbytes, track=process.track)
        return None

    def done(_):
        self.record(rank, op, start, nbytes=nbytes, track=process.track)
        process.resume(None)
    self.sim.after(seconds, done)
    return PENDING


# -- cell 51
@add_to_class(SimEngine)
def run(self, program, args=(), kwargs=None, max_events=None, timeout=None) -> RunResult:
    """Run `program` on every rank (limits: see Simulator.run); report in terms of ranks."""
    for rank in range(self.world_size):
        gen = start_rank(program, Comm(rank, self.world_size), args, kwargs)
        self.sim.spawn(gen, self.handle, name=f"rank {rank}")
    try:
        self.sim.run(max_events, timeout)
    except ProcessFailed as failure:
        error = failure.error
        raise RankError(failure.process.pid, f"failed at t={self.sim.now:.9g} s: "
                        f"{type(error).__name__}: {error}") from error
    self.check_all_received()
    ranks = self.sim.processes[:self.world_size]   # the ranks (not week 3's activities)
    check_returned(ranks)          # a rank that returned a generator: no `yield from`?
    finish = [p.finish_time for p in ranks]
    return RunResult(values=[p.value for p in ranks], time=max(finish), trace=self.trace,
                     engine="sim", world_size=self.world_size, finish_times=finish)


@add_to_class(SimEngine)
def check_all_received(self) -> None:
    """Every rank has finished: a message still in a mailbox was never received."""
    left = unreceived(self.mailbox)           # (src, dst, tag, count) of each
    if left:
        raise RankError(left[0][1], "finished without receiving messages sent to it "
                        "(mismatched peers or tags?):\n  " + describe_messages(left))


# -- cell 53
def simulate(program, world_size: int, network, args=(), kwargs=None, trace: bool = True,
             max_events: int | None = None, timeout: float | None = None) -> RunResult:
    """Run `program(comm, *args, **kwargs)` on `world_size` simulated ranks over `network`."""
    return SimEngine(world_size, network, trace).run(program, args, kwargs, max_events, timeout)
