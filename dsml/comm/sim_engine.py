"""Plumbing (hand-written): the simulator engine that `dsml.run(engine="sim")` and every week use.

Week 1's notebook writes the engine a learner reads (`dsml.comm.sim_core.SimEngine`: matching by
(source, tag), one handler per request, the trace). This subclass, under the same name, adds what
a learner need not read:

- the check of `failures`, and failure notices for `failures="notify"` (week 4,
  `dsml.comm.failures`): `failed`, `notices`, and receives that raise a notice instead of
  waiting for a rank that has failed;
- week 4's receive from any source (`dsml.comm.any_source`): the receives waiting for any
  source, and the arrival order of the tags they asked for;
- the requests later weeks register in `ADDED_REQUESTS` (week 3's `comm.spawn` / `comm.join`);
- speed paths: a `sendrecv` that reuses one `Exchange` per rank instead of allocating closures
  per message (the hottest path of large simulations), and a free `combine` answered without
  a call when γ = 0 and nothing is traced; and, when nothing is traced, collectives that skip
  their enclosing slice (`without_spans`: one generator fewer between algorithm and engine);
- a deadlock report that lists the messages delivered but never received.

For every program week 1's engine runs, both give the same trace, row for row
(tests/test_comm_sim.py checks it).
"""
from __future__ import annotations

import functools
from collections import deque

from dsml.comm import sim_core
from dsml.comm.api import ADDED_REQUESTS, Combine, RankError, RunResult, SizeOnly, snapshot
from dsml.comm.costs import simulating
from dsml.comm.deadlock import DeadlockError
from dsml.comm.mistakes import describe_messages, unreceived
from dsml.comm.tags import differing
from dsml.comm.tracebacks import trim_leading
from dsml.sim import PENDING, Thrown
from dsml.sim import DeadlockError as SimDeadlock  # the simulator's; ours subclasses it

FAILURES = ("stop", "notify")


class SimEngine(sim_core.SimEngine):
    """Week 1's engine with later weeks' hooks and the speed paths (see the module's text)."""

    def __init__(self, world_size: int, network, trace: bool = True, failures: str = "stop"):
        if failures not in FAILURES:
            raise ValueError(f"failures must be 'stop' or 'notify', got {failures!r}")
        super().__init__(world_size, network, trace)
        self.rows = self.trace.rows if trace else None
        # failures="notify": a rank that raises ends alone (on_rank_failure, dsml.comm.failures);
        # failed[rank] is the notice a receive from it raises, and notices[dst][rank] the same
        # notice once it has reached dst (after what the rank sent it before failing).
        self.failed = {}
        self.notices = [dict() for _ in range(world_size)]
        if failures == "notify":
            self.sim.on_failure = self.on_rank_failure
        # Receives from any source: any_posted[dst][tag] -> callbacks(src, payload), and
        # arrivals[dst][tag] -> sources in arrival order of the messages kept in the mailbox
        # (only for tags a receive from any source has asked for). Empty until then.
        self.any_posted = [dict() for _ in range(world_size)]
        self.arrivals = [dict() for _ in range(world_size)]
        self.exchanges = [None] * world_size          # each rank's reusable Exchange
        self.other_exchanges = {}                     # those of week 3's second activities
        self.handlers[Combine] = self.on_combine
        # Requests that later weeks add: role "spawn" is handled by on_spawn, and so on.
        self.handlers.update({kind: getattr(self, "on_" + role)
                              for kind, role in ADDED_REQUESTS.items()})

    def deliver(self, message) -> None:
        """As week 1's, but a message no receive for its source waits for goes to the first
        receive from any source waiting for its tag, if any. (Written out rather than calling
        week 1's: this runs once per message.)"""
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

    def wait_for(self, process, src, tag, on_message) -> None:
        """As week 1's, but a receive from a rank whose failure notice has arrived raises it,
        now or when it comes (the engine's `notice_arrives` hands it to posted receives)."""
        if self.sim.on_failure is None:    # failures="stop": no notices (week 1's, written out)
            key = (src, tag)
            waiting = self.posted[process.pid].get(key)
            if waiting is None:
                waiting = self.posted[process.pid][key] = deque()
            waiting.append(on_message)
            return None
        if src in self.notices[process.pid]:
            self.sim.at(self.sim.now, process.resume, self.notices[process.pid][src])
            return None

        def arrived(payload):
            if type(payload) is Thrown:              # the notice: nothing was received
                process.resume(payload)
            else:
                on_message(payload)
        return super().wait_for(process, src, tag, arrived)

    def on_combine(self, process, req):
        if self.gamma == 0 and self.rows is None:
            return None                        # free and unrecorded: the common case at scale
        return self.spend(process, "combine", req.nbytes * self.gamma, req.nbytes)

    def on_sendrecv(self, process, req):
        """Week 1's `sendrecv` (the same events in the same order) with the rank's Exchange."""
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
            exchange.on_received(self.notices[rank][req.src])   # raised when it completes
        else:
            waiting = self.posted[rank].get(key)
            if waiting is None:
                waiting = self.posted[rank][key] = deque()
            waiting.append(exchange.received)
        return PENDING

    def exchange_for(self, process) -> Exchange:
        """The Exchange of this process: the first of a rank to ask gets the rank's slot, any
        other activity of the rank (week 3) one of its own."""
        rank = process.pid
        if self.exchanges[rank] is None:
            self.exchanges[rank] = Exchange(self, process)
            return self.exchanges[rank]
        if process not in self.other_exchanges:
            self.other_exchanges[process] = Exchange(self, process)
        return self.other_exchanges[process]

    def run(self, program, args=(), kwargs=None, max_events=None, timeout=None) -> RunResult:
        if self.trace is None:
            program = without_spans(program)
        try:
            with simulating(self.network):     # "auto" collectives choose by its α, β, γ
                result = super().run(program, args, kwargs, max_events, timeout)
        except RankError as failure:
            # A rank raised: its chained exception's traceback starts at the rank's own code.
            if failure.__cause__ is not None:
                trim_leading(failure.__cause__)
            raise
        except SimDeadlock as deadlock:
            # Raised as every engine's DeadlockError (also a RankError: dsml.comm.deadlock).
            unread = unreceived(self.mailbox)
            note = ("messages that arrived but were never received (a tag or peer mismatch?):"
                    "\n  " + describe_messages(unread)) if unread else ""
            raise DeadlockError(deadlock.waiting, note,
                                left=[(src, tag) for src, _, tag, _ in unread]) from None
        result.failed = {rank: notice.error.__cause__ for rank, notice in self.failed.items()}
        return result

    def check_all_received(self) -> None:
        """As week 1's, but messages to or from a rank that failed were orphaned by the
        failure: not an error."""
        for dst, boxes in enumerate(self.mailbox):
            for (src, _), box in boxes.items():
                if src in self.failed or dst in self.failed:
                    box.clear()
        try:
            super().check_all_received()
        except RankError as error:
            # Ranks in different collective calls: say which (dsml.comm.tags.differing).
            hint = differing([], [(src, tag) for src, _, tag, _ in unreceived(self.mailbox)])
            if not hint:
                raise
            raise RankError(error.rank, f"{str(error).split(' ', 2)[2]}\n{hint}") from None


def without_spans(program):
    """`program`, with its communicator set to record no enclosing slices (`comm.tracing`, see
    dsml.comm.spans), as the real engines' driver does when no trace is kept. Without it every
    collective call would run one generator more between the algorithm and the engine (a frame
    that every message of a 1,024-rank ring passes through) and answer two requests that record
    nothing."""
    @functools.wraps(program)
    def untraced(comm, *args, **kwargs):
        comm.tracing = False
        return program(comm, *args, **kwargs)
    return untraced


class Exchange:
    """A rank's sendrecv in flight: it completes when both its send and its receive have.

    A rank program has at most one request in flight, so each keeps one Exchange and reuses
    it (with its two bound callbacks): a million-message simulation then allocates no
    Exchange per message. (A rank that runs a second activity, week 3, gets a second
    Exchange: see `SimEngine.exchange_for`.)
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


def simulate(program, world_size: int, network, args=(), kwargs=None,
             trace: bool = True, max_events: int | None = None,
             failures: str = "stop", timeout: float | None = None) -> RunResult:
    """Run `program(comm, *args, **kwargs)` on `world_size` simulated ranks over `network`
    (limits `max_events` and `timeout`: see dsml.sim.Simulator.run; `failures`: see SimEngine)."""
    return SimEngine(world_size, network, trace, failures).run(program, args, kwargs,
                                                               max_events, timeout)
