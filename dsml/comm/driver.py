"""Plumbing (hand-written): what every real engine does the same way, whatever carries its bytes.

The `threads` and `processes` engines differ only in their transport — how a message gets from
one rank to another and how a rank waits. Everything else lives here, once:

- `drive` runs one rank's program: it waits for the common start, hands each request the
  program yields to the transport (`send`, `recv`), answers `compute`/`combine` (no-ops on
  real engines) and `now`, records trace rows and counts the messages sent to and received
  from each peer.
- `MatchingTransport` is the receive side both transports share: (source, tag) matching in
  arrival order, with a stash for messages that came before their receive was posted.
- `Status` records what each rank is doing, for the report when a run times out.
- `check_all_received`, `rank_failed`, `timed_out` and `make_result` turn what the ranks
  report into the `RankError`s and the `RunResult` every engine returns.

A transport has `send(dst, tag, payload)`, which never blocks (sends are eager), and
`_next(src)`, which blocks until one more message has arrived — from `src`, or from anyone if
its inbound channel is shared — and returns `(source, tag, payload)`; `_next_any(sources)` does
the same for a set of sources (week 3's activities, below).

Activities (week 3: `comm.spawn` / `comm.join`, `dsml.comm.activities`). A program that never
spawns runs in `drive`'s loop, one request at a time, as it always has. At its first Spawn (or
Join) `drive` hands the rank to `_drive_activities`, a cooperative scheduler inside the rank's
own thread or process — no extra OS thread: it keeps the rank's activities (main first, each a
generator — spawned ones wrapped in `run_activity`, the rule every engine shares), steps every
activity that can go on (send, compute, combine, now, spawn at once; a receive when its message
is in the stash; a join when its activity is done), and when none can, blocks in
`transport._next_any` until one more message arrives from any source a blocked receive waits
for, gives it to the first activity that posted a receive for its (source, tag) — or to the
stash — and goes on. The activities share the rank's mailbox, as on the simulator: a message
goes to whichever activity's receive takes it first.
"""
from __future__ import annotations

import math
import numbers
import time
from collections import deque
from typing import Any, NamedTuple

import numpy as np

from dsml.comm.api import (ADDED_REQUESTS, Combine, Comm, Compute, Now, RankError, Recv,
                           RunResult, Send, SendRecv, payload_nbytes, start_rank)
from dsml.comm.costs import engine_costs
from dsml.comm.deadlock import DeadlockError
from dsml.comm.mistakes import not_a_request, returned_generator
from dsml.comm.spans import Span
from dsml.comm.tags import differing, tag_words
from dsml.comm.tracebacks import user_traceback
from dsml.sim import Trace

# States in a Status record.
RUNNING, RECEIVING, JOINING, DONE = 0, 1, 2, 3
# state, peer (the activity joined, when JOINING), tag, then for a rank that runs activities:
# which one the record shows (0: the main program), how many others wait too, and whether
# the main program has already returned (1); then the messages the rank has sent (hellos and
# failure notices included), the messages it has taken from its channels (matched or
# stashed), and how many of those wait in its stash — what the parent needs to see that a
# run cannot go on (`hopeless`) —, and the tag and sender of the last message it stashed.
STATUS_FIELDS = 11
SENT, TAKEN, STASHED = 6, 7, 8
STASHED_TAG, STASHED_FROM = 9, 10   # tag and sender of the message last stashed (`differing`)
CHECK_EVERY = 0.05    # s: how often a busy rank checks that its run goes on (`drive`)
HELLO = -1            # tag of start-up handshakes (user tags are ≥ 0)
ANY_SOURCE = -2       # the peer of a receive from any source, in a Status record
FAILED = -3           # tag of a failure notice: the sender's program raised (failures="notify")


# What the hellos carry: a small array, so that the first user message does not pay for
# first-time work on the way (pickling NumPy arrays imports and caches on first use).
_WARM_UP = (np.zeros(1), 0.0)


class Cancelled(Exception):
    """Raised inside a rank whose run was cancelled because another rank failed or the run
    timed out (threads cannot be killed: they poll for this)."""


class Outcome(NamedTuple):
    """What a rank that finished reports: its value, its start and end (perf_counter
    seconds), its trace rows, and the user messages it sent to / received from each peer;
    `tags`: (peer, "sent" or "received", how many before, tag) wherever the tag of the messages
    to or from a peer changed — enough to tell the tags of any message left unreceived
    (`check_all_received`); None where it was not kept (a rank that ran activities)."""
    value: Any
    start: float
    end: float
    records: list | None
    sent: list
    received: list
    tags: list | None = None


class Status:
    """What each rank is doing, in a flat sequence of STATUS_FIELDS numbers per rank: a list
    for threads, a shared `RawArray` for processes (written by the child, read by the parent).

    A rank with one activity writes the first three (`set`); a rank that runs several
    (`set_activities`) shows one activity's wait — the main program's if it waits for a
    message, else the first other activity that does, else a join — and how many others wait."""

    def __init__(self, cells):
        self.cells = cells

    def set(self, rank, state, peer=-1, tag=-1):
        base = rank * STATUS_FIELDS
        cells = self.cells
        cells[base], cells[base + 1], cells[base + 2] = state, peer, tag

    def set_activities(self, rank, state, peer, tag, activity, others, returned):
        base = rank * STATUS_FIELDS
        self.cells[base:base + 6] = [state, peer, tag, activity, others, int(returned)]

    def describe(self, rank) -> str:
        who, what = self.wait_of(rank)
        return f"{who} {what}"

    def wait_of(self, rank) -> tuple[str, str]:
        """(who, what it does) of a rank: ("rank 1", "waits for a message from rank 0 (tag 0)"),
        in the simulator's words."""
        base = rank * STATUS_FIELDS
        state, peer, tag, activity, others, returned = self.cells[base:base + 6]
        if state == DONE:
            return f"rank {rank}", "finished"
        who = f"rank {rank}" if activity == 0 else f"rank {rank} activity {activity}"
        if state == RECEIVING and peer == ANY_SOURCE:
            text = f"waits for a message from any rank ({tag_words(tag)})"
        elif state == RECEIVING:
            text = f"waits for a message from rank {peer} ({tag_words(tag)})"
        elif state == JOINING:
            text = f"waits in join for its activity {peer} to finish"
        else:
            return f"rank {rank}", "is running its program (not waiting on a message)"
        if others:
            text += (f" (and {others} other activit{'y' if others == 1 else 'ies'} of rank "
                     f"{rank} wait{'s' if others == 1 else ''})")
        if returned:
            text += "; its program has returned without joining it"
        return who, text

    def count(self, rank, field) -> None:
        """One more message sent (SENT) or taken (TAKEN) by `rank`."""
        self.cells[rank * STATUS_FIELDS + field] += 1


def peer_failed(rank: int, error: BaseException) -> Exception:
    """The exception a receive from a failed rank raises: week 4's PeerFailed (imported here,
    when a failure first happens, because dsml.comm.failures is generated from the week-4
    notebook and imports the simulator)."""
    from dsml.comm.failures import PeerFailed
    return PeerFailed(rank, error)


class PeerGone(Exception):
    """Raised by a transport's receive from a rank that failed (failures="notify"); the rank
    loop turns it into PeerFailed inside the program."""

    def __init__(self, rank: int, error: BaseException):
        super().__init__(rank, error)
        self.rank, self.error = rank, error


class RankDied(Exception):
    """A rank's process ended without a result (killed by a signal, `os._exit`): with
    failures="notify" it is a failed rank like one that raised, and this is its error."""


class RemoteFailure(Exception):
    """What a rank raised, when the exception itself could not be sent (it does not pickle):
    its one-line summary."""


NOT_ARRIVED = object()     # early_payload: nothing stashed for that (source, tag)


class MatchingTransport:
    """Receive side shared by the real transports: take messages from `_next` until one with
    the wanted (source, tag) arrives; keep the others, in arrival order, for later receives.

    With failures="notify" a rank whose program raises sends every peer a FAILED notice
    (`notify_peers`) after the messages it sent before; a receive from that rank then raises
    PeerFailed once nothing from it is left (`failed`), and the next receive from any source
    raises it once (`unnotified`, see `_drive_activities`)."""

    engine = None               # the engine's name, for its α, β, γ (dsml.comm.costs)

    def __init__(self, rank: int, status: Status):
        self.rank = rank
        self.status = status
        self.notify = False       # failures="notify": a peer's death is a failure too
        # Where this rank's message counts live (counted inline on every message: cheap).
        self.cells = status.cells
        self.sent_at = rank * STATUS_FIELDS + SENT
        self.taken_at = rank * STATUS_FIELDS + TAKEN
        self.early = {}     # (src, tag) -> deque of payloads that arrived before their recv
        self.held = 0       # how many payloads wait in `early` (kept by `unstashed`)
        self.failed = {}    # rank -> the exception its program raised (failures="notify")
        self.started = None       # perf_counter time of the common start (set by drive)
        self.unnotified = set()   # failed ranks that no receive from any source has reported

    def early_payload(self, src, tag):
        """What arrived early for (src, tag), else NOT_ARRIVED; PeerGone if `src` has failed
        and nothing of it is left. The start of every transport's receive."""
        if self.held:
            stash = self.early.get((src, tag))
            if stash:
                self.unstashed(1)
                return stash.popleft()
        if src in self.failed:
            raise PeerGone(src, self.failed[src])
        return NOT_ARRIVED

    def recv(self, src, tag):
        early = self.early_payload(src, tag)
        if early is not NOT_ARRIVED:
            return early
        status, rank = self.status, self.rank
        status.set(rank, RECEIVING, src, tag)
        while True:
            got_src, got_tag, payload = self._next(src)
            if got_src == src and (got_tag == tag or got_tag == FAILED):
                # RUNNING before the count: the parent reads counts, states, counts again
                # (`hopeless`), so it never sees this rank waiting with its message taken.
                status.set(rank, RUNNING)
                self.cells[self.taken_at] += 1
                if got_tag == tag:
                    return payload
                self.note_failure(src, payload)
                raise PeerGone(src, payload)
            self.cells[self.taken_at] += 1      # still waiting: a message for later
            if got_tag == FAILED:
                self.note_failure(got_src, payload)
                continue
            self.stash(got_src, got_tag, payload)

    def note_failure(self, src, error) -> None:
        """A FAILED notice from src arrived: everything src sent before it has arrived too."""
        self.failed[src] = error
        self.unnotified.add(src)

    def notify_peers(self, size: int, error: BaseException) -> None:
        """This rank's program raised (failures="notify"): tell every peer still alive."""
        for peer in range(size):
            if peer != self.rank and peer not in self.failed:
                self.send_notice(peer, error)

    def send_notice(self, dst, error):          # pragma: no cover - each transport has one
        raise NotImplementedError

    def stash(self, src, tag, payload):
        """Keep a message that arrived before its receive was posted (a failure notice is
        noted instead: see `note_failure`)."""
        if tag == FAILED:
            self.note_failure(src, payload)
            return
        stash = self.early.get((src, tag))
        if stash is None:
            stash = self.early[(src, tag)] = deque()
        stash.append(payload)
        self.unstashed(-1)
        at = self.rank * STATUS_FIELDS
        self.cells[at + STASHED_TAG], self.cells[at + STASHED_FROM] = tag, src

    def unstashed(self, count) -> None:
        """`count` messages left the stash (negative: came into it): keep the number that
        wait there in the status record (for the report of a deadlock)."""
        self.held -= count
        self.status.cells[self.rank * STATUS_FIELDS + STASHED] -= count

    def checkpoint(self) -> None:
        """Called by a busy rank about every CHECK_EVERY seconds, between requests: a
        transport raises or exits here when the run is over for this rank (threads: the run
        was cancelled; processes: the parent has gone)."""

    def connect(self, size: int):
        """Say hello to every peer and hear from every peer, so that every channel is open
        (and warm) before the clock starts."""
        for peer in range(size):
            if peer != self.rank:
                self.send(peer, HELLO, _WARM_UP)
        for peer in range(size):
            if peer != self.rank:
                self.recv(peer, HELLO)

    def send(self, dst, tag, payload):          # pragma: no cover - each transport has one
        raise NotImplementedError

    def _next(self, src):                       # pragma: no cover - each transport has one
        raise NotImplementedError

    def _next_any(self, sources):               # pragma: no cover - each transport has one
        raise NotImplementedError


def _not_a_request(request) -> TypeError:
    return TypeError(not_a_request(request))


def _finished(value):
    """The program returned `value`: refuse a generator (a collective called without
    `yield from`)."""
    mistake = returned_generator(value)
    if mistake is not None:
        raise TypeError(mistake)
    return value


def drive(rank: int, size: int, program, args, kwargs, transport,
          record_trace: bool) -> Outcome:
    """Run one rank's program on `transport` until it returns; see the module docstring.

    The rank first says hello to every peer and hears from every peer (`transport.connect`):
    an all-to-all, so when it is through, every rank has started — the common start, from
    which its clock runs. Exceptions (the program's, or the transport's) propagate.
    """
    comm = Comm(rank, size)
    comm.tracing = record_trace      # no trace: collectives skip their enclosing slice (spans)
    comm.costs = engine_costs(transport.engine)     # what "auto" collectives choose by
    gen = start_rank(program, comm, args, kwargs)
    transport.connect(size)
    sent = [0] * size          # user messages sent to each peer (the hellos do not count)
    received = [0] * size      # user messages taken by a receive from each peer
    # The tags of those messages, where they change (see Outcome): one comparison a message.
    sent_tag, received_tag, tags = [None] * size, [None] * size, []
    records = [] if record_trace else None
    clock = time.perf_counter
    t0 = transport.started = clock()
    value = None
    throw = None              # a PeerFailed for the program (failures="notify")
    check_at = t0 + CHECK_EVERY
    send, recv = transport.send, transport.recv
    # Each branch records its own trace row: with no trace, a request costs no more than
    # handing it to the transport (the small-message path of the processes engine).
    while True:
        try:
            if throw is None:
                request = gen.send(value)
                # Let go of what the program was handed: a received array may be a view of a
                # peer's shared-memory segment, which goes back to that peer (an ACK frame,
                # piggybacked on this rank's next send) only once no one holds it.
                value = None
            else:
                request, throw = gen.throw(throw), None
        except StopIteration as stop:
            t_end = clock()
            result = _finished(stop.value)
            transport.status.set(rank, DONE)
            return Outcome(result, t0, t_end, records, sent, received, tags)
        start = clock()
        if start >= check_at:       # a rank that never waits still learns the run is over
            transport.checkpoint()
            check_at = start + CHECK_EVERY
        kind = type(request)
        if kind is SendRecv:
            dst, src, tag = request.dst, request.src, request.tag
            send(dst, tag, request.payload)
            if tag != sent_tag[dst]:
                sent_tag[dst] = tag
                tags.append((dst, "sent", sent[dst], tag))
            sent[dst] += 1
            try:
                value = recv(src, tag)
            except PeerGone as gone:
                throw = peer_failed(gone.rank, gone.error)
                continue
            if tag != received_tag[src]:
                received_tag[src] = tag
                tags.append((src, "received", received[src], tag))
            received[src] += 1
            if records is not None:
                records.append((rank, "sendrecv", start, clock(), src, dst, request.nbytes, tag))
        elif kind is Combine:
            if records is not None:
                records.append((rank, "combine", start, clock(), -1, -1, request.nbytes, 0))
        elif kind is Send:
            dst = request.dst
            send(dst, request.tag, request.payload)
            if request.tag != sent_tag[dst]:
                sent_tag[dst] = request.tag
                tags.append((dst, "sent", sent[dst], request.tag))
            sent[dst] += 1
            if records is not None:
                records.append((rank, "send", start, clock(), rank, dst, request.nbytes,
                                request.tag))
        elif kind is Recv:
            src = request.src
            try:
                value = recv(src, request.tag)
            except PeerGone as gone:
                throw = peer_failed(gone.rank, gone.error)
                continue
            if request.tag != received_tag[src]:
                received_tag[src] = request.tag
                tags.append((src, "received", received[src], request.tag))
            received[src] += 1
            if records is not None:
                records.append((rank, "recv", start, clock(), src, rank, payload_nbytes(value),
                                request.tag))
        elif kind is Compute:
            if records is not None:
                records.append((rank, "compute", start, clock(), -1, -1, 0, 0))
        elif kind is Now:
            value = start - t0           # reading the clock is not recorded (as on sim)
        elif kind is Span:               # a collective's enclosing slice: no time passes
            if records is not None:
                records.append((rank, request.op, t0 + request.start, clock(), -1, -1,
                                request.nbytes, 0))
        elif ADDED_REQUESTS.get(kind) in ("spawn", "join", "recv_any"):
            # A second activity (week 3) or a receive from any source (week 4): from here on,
            # the scheduler runs the rank.
            return _drive_activities(rank, size, gen, request, start, transport, t0, sent,
                                     received, records)
        else:
            raise _not_a_request(request)


class _Activity:
    """One activity of a rank under `_drive_activities`: its generator, and what it waits for
    (`request`, None when it is ready or running) since when (`start`). `value` is what it
    is sent when it runs next (what its last request answered)."""
    __slots__ = ("number", "gen", "request", "start", "value", "done", "throw")

    def __init__(self, number, gen):
        self.number, self.gen = number, gen
        self.request, self.start, self.value, self.done = None, 0.0, None, False
        self.throw = None       # a PeerFailed to raise in it when it runs next (week 4)


def _drive_activities(rank, size, main_gen, request, start, transport, t0, sent, received,
                      records) -> Outcome:
    """Run a rank whose program has just yielded its first Spawn, Join or RecvAny `request`
    at `start`: the rank's activities, cooperatively, until the main program has returned and
    no activity is left running (see the module docstring)."""
    clock = time.perf_counter
    stash = transport.early                 # (src, tag) -> payloads nobody has taken yet
    main = _Activity(0, main_gen)
    running = [main]                        # activities not finished, main first
    ready = deque()                         # activities that can go on, in the order they can
    posted = {}                             # (src, tag) -> activities waiting, in posting order
    posted_any = {}                         # tag -> activities waiting for it from any source
    peers = set(range(size)) - {rank}
    spawned = 0
    outcome = None
    checks = [start + CHECK_EVERY]          # when a busy rank next checks that the run goes on

    def main_returned():
        return main.done

    def resumer(activity):
        def resume(value):                  # a joined activity finished (run_activity calls it)
            activity.value = value
            ready.append(activity)
        return resume

    def step(activity, request, start):
        """Hand the activity its requests until one must wait or the activity ends."""
        nonlocal spawned, outcome
        gen, value, activity.value = activity.gen, activity.value, None
        throw, activity.throw = activity.throw, None
        failed = transport.failed
        while True:
            if request is None:
                try:
                    if throw is None:
                        request = gen.send(value)
                        value = None           # the program has it now (see drive)
                    else:
                        request, throw = gen.throw(throw), None
                except StopIteration as stop:
                    activity.done = True
                    running.remove(activity)
                    if activity is main:
                        outcome = Outcome(_finished(stop.value), t0, clock(), records, sent,
                                          received)
                    return
                start = clock()
                if start >= checks[0]:
                    transport.checkpoint()
                    checks[0] = start + CHECK_EVERY
            kind = type(request)
            if kind is SendRecv or kind is Recv:
                if kind is SendRecv:
                    transport.send(request.dst, request.tag, request.payload)
                    sent[request.dst] += 1
                key = (request.src, request.tag)
                queue, box = posted.get(key), stash.get(key)
                if not box and request.src in failed:     # nothing left from a failed rank
                    throw, request = peer_failed(request.src, failed[request.src]), None
                    continue
                if queue or not box:        # someone posted first, or nothing is here: wait
                    activity.request, activity.start = request, start
                    if queue is None:
                        queue = posted[key] = deque()
                    queue.append(activity)
                    return
                value = box.popleft()
                transport.unstashed(1)
                received[request.src] += 1
                if records is not None:
                    if kind is SendRecv:
                        records.append((rank, "sendrecv", start, clock(), request.src,
                                        request.dst, request.nbytes, request.tag))
                    else:
                        records.append((rank, "recv", start, clock(), request.src, rank,
                                        payload_nbytes(value), request.tag))
            elif kind is Send:
                transport.send(request.dst, request.tag, request.payload)
                sent[request.dst] += 1
                value = None
                if records is not None:
                    records.append((rank, "send", start, clock(), rank, request.dst,
                                    request.nbytes, request.tag))
            elif kind is Compute or kind is Combine:
                value = None
                if records is not None:
                    op, nbytes = ("compute", 0) if kind is Compute else ("combine",
                                                                         request.nbytes)
                    records.append((rank, op, start, clock(), -1, -1, nbytes, 0))
            elif kind is Now:
                value = start - t0
            elif kind is Span:
                value = None
                if records is not None:
                    records.append((rank, request.op, t0 + request.start, clock(), -1, -1,
                                    request.nbytes, 0))
            elif ADDED_REQUESTS.get(kind) == "recv_any":
                tag = request.tag
                found = None
                if transport.unnotified:        # a peer failed: say so once (as on sim)
                    gone = min(transport.unnotified)
                    transport.unnotified.discard(gone)
                    throw, request = peer_failed(gone, failed[gone]), None
                    continue
                if not posted_any.get(tag):     # nobody asked first: the lowest source's
                    found = min((key for key, box in stash.items() if key[1] == tag and box),
                                default=None)
                if found is None:
                    activity.request, activity.start = request, start
                    posted_any.setdefault(tag, deque()).append(activity)
                    return
                value = (found[0], stash[found].popleft())
                transport.unstashed(1)
                received[found[0]] += 1
                if records is not None:
                    records.append((rank, "recv", start, clock(), found[0], rank,
                                    payload_nbytes(value[1]), tag))
            elif ADDED_REQUESTS.get(kind) == "spawn":
                spawned += 1
                handle, gen_of_child = request.start(rank, spawned, main_returned)
                child = _Activity(spawned, gen_of_child)
                running.append(child)
                ready.append(child)         # starts once this one waits, as on the simulator
                value = handle
            elif ADDED_REQUESTS.get(kind) == "join":
                handle = request.activity
                if not handle.done:
                    activity.request, activity.start = request, start
                    handle.joiners.append(resumer(activity))
                    return
                value = handle.value
                if records is not None:
                    records.append((rank, "join", start, clock(), -1, -1, 0, 0))
            else:
                raise _not_a_request(request)
            request = None

    def woken(activity):
        """The activity's wait is over (its message or its joined activity is in `value`):
        record the wait, from its start until now, when the activity resumes."""
        request, activity.request = activity.request, None
        if records is None or activity.throw is not None:
            return
        kind = type(request)
        if kind is SendRecv:
            row = (rank, "sendrecv", activity.start, clock(), request.src, request.dst,
                   request.nbytes, request.tag)
        elif kind is Recv:
            row = (rank, "recv", activity.start, clock(), request.src, rank,
                   payload_nbytes(activity.value), request.tag)
        elif ADDED_REQUESTS.get(kind) == "recv_any":
            src, payload = activity.value
            row = (rank, "recv", activity.start, clock(), src, rank, payload_nbytes(payload),
                   request.tag)
        else:
            row = (rank, "join", activity.start, clock(), -1, -1, 0, 0)
        records.append(row)

    def fail(src, error) -> None:
        """A FAILED notice from src (failures="notify"): every activity waiting for a message
        from src gets PeerFailed, and so does the first waiting for one from anyone (else
        the next receive from any source will)."""
        transport.note_failure(src, error)
        for key in [key for key in posted if key[0] == src]:
            for activity in posted.pop(key):
                activity.throw = peer_failed(src, error)
                ready.append(activity)
        waiting = next((queue for queue in posted_any.values() if queue), None)
        if waiting:
            activity = waiting.popleft()
            activity.throw = peer_failed(src, error)
            transport.unnotified.discard(src)
            ready.append(activity)

    def deliver(src, tag, payload) -> None:
        """A message arrived: to the first activity waiting for it, or to the stash."""
        if tag == FAILED:
            fail(src, payload)
            return
        key = (src, tag)
        queue = posted.get(key)
        if queue:
            activity = queue.popleft()
            if not queue:
                del posted[key]
            activity.value = payload
        elif posted_any.get(tag):               # a receive from any source (week 4)
            activity = posted_any[tag].popleft()
            activity.value = (src, payload)
        else:
            transport.stash(src, tag, payload)
            return
        received[src] += 1
        ready.append(activity)

    def from_stash() -> None:
        """Give stashed messages to the activities waiting for them. A send may stash what
        it reads while it makes room (processes), after a receive for it was posted."""
        for key in [key for key in posted if stash.get(key)]:
            queue, box = posted[key], stash[key]
            while queue and box:
                activity = queue.popleft()
                activity.value = box.popleft()
                transport.unstashed(1)
                received[key[0]] += 1
                ready.append(activity)
            if not queue:
                del posted[key]
        for tag, queue in posted_any.items():
            while queue:
                key = min((key for key, box in stash.items() if key[1] == tag and box),
                          default=None)
                if key is None:
                    break
                activity = queue.popleft()
                activity.value = (key[0], stash[key].popleft())
                transport.unstashed(1)
                received[key[0]] += 1
                ready.append(activity)

    def show_waits() -> None:
        """Status, when every running activity waits: the main program's wait if it waits
        for a message, else the first other activity's that does, else a join; and how many
        other activities wait."""
        shown = running[0]
        for activity in running:
            if ADDED_REQUESTS.get(type(activity.request)) != "join":
                shown = activity
                break
        request = shown.request
        if ADDED_REQUESTS.get(type(request)) == "join":
            state, peer, tag = JOINING, request.activity.number, -1
        elif ADDED_REQUESTS.get(type(request)) == "recv_any":
            state, peer, tag = RECEIVING, ANY_SOURCE, request.tag
        else:
            state, peer, tag = RECEIVING, request.src, request.tag
        transport.status.set_activities(rank, state, peer, tag, shown.number,
                                        len(running) - 1, main.done)

    step(main, request, start)
    while True:
        while ready:
            activity = ready.popleft()
            if activity.request is not None:
                woken(activity)
            step(activity, None, 0.0)
        if main.done and len(running) == 0:
            transport.status.set(rank, DONE)
            return outcome
        from_stash()
        if ready:
            continue
        # Nothing can go on: wait for one more message from a source that a receive waits
        # for (none, if every activity waits in join: only the run's timeout ends that).
        show_waits()
        sources = peers if any(posted_any.values()) else {key[0] for key in posted}
        src, tag, payload = transport._next_any(sources)
        transport.status.set(rank, RUNNING)          # before the count (see recv)
        transport.status.count(rank, TAKEN)
        deliver(src, tag, payload)


# --- what the parent makes of the ranks' reports ------------------------------------------------

def stop_children(children, conns) -> None:
    """Kill the child processes still alive, join all of them (10 s each at most), and close
    the connections to them: the clean-up every process-based runner ends with."""
    for child in children:
        if child.is_alive():
            child.kill()
    for child in children:
        child.join(timeout=10)
    for conn in conns:
        conn.close()


def describe_exception(error: BaseException) -> tuple[str, str]:
    """(one-line summary, traceback text) of the exception being handled; the traceback
    starts at the rank's own code (the engine's frames above it are left out) and keeps the
    chain of exceptions (`dsml.comm.tracebacks`)."""
    return f"{type(error).__name__}: {error}", user_traceback(error)


def rank_failed(rank: int, summary: str, traceback_text: str) -> RankError:
    return RankError(rank, f"failed: {summary}\n--- traceback of rank {rank} ---\n"
                     f"{traceback_text}")


def timed_out(pending, status: Status, world_size: int, timeout: float,
              stopped=()) -> RankError:
    """The error of a run that outlasted its timeout, which leads with its cause: a rank in
    `stopped` (processes the operating system has stopped, e.g. by SIGSTOP) if there is one,
    else the lowest unfinished rank that is not waiting for a message (busy in its own code),
    else the lowest unfinished rank. Then what every rank was doing; the question about ops
    only when the waits show ranks in collectives with different ones (`tags.differing`)."""
    lines = []
    for r in range(world_size):
        line = status.describe(r)
        if r in stopped:
            line += " — its process is stopped (SIGSTOP or a debugger?)"
        lines.append(line)
    busy = [r for r in sorted(pending) if status.cells[r * STATUS_FIELDS] == RUNNING]
    named = min(stopped) if stopped else busy[0] if busy else min(pending)
    waiting = "\n  ".join(lines)
    late = f"the run did not finish within the timeout of {timeout:g} s " \
           f"({len(pending)} rank(s) unfinished)"
    if stopped:
        head = f"is stopped (SIGSTOP or a debugger?), so {late}"
    elif busy:
        head = f"is busy in its own code (not waiting on a message), so {late}"
    else:
        head = (f"(and {len(pending)} rank(s) in all) did not finish within the timeout of "
                f"{timeout:g} s")
    hint = ""
    if not stopped and not busy:
        cells = status.cells
        waits = [(r, cells[r * STATUS_FIELDS + 2]) for r in sorted(pending)
                 if cells[r * STATUS_FIELDS] == RECEIVING]
        hint = differing(waits, [(cells[r * STATUS_FIELDS + STASHED_FROM],
                                  cells[r * STATUS_FIELDS + STASHED_TAG])
                                 for r in range(world_size)
                                 if cells[r * STATUS_FIELDS + STASHED] > 0])
    return RankError(named, f"{head}:\n  {waiting}" + (f"\n{hint}" if hint else ""))


def check_timeout(timeout) -> float | None:
    """`timeout` as the engines take it: seconds > 0, or None (also float('inf')) for no
    limit; anything else is a ValueError naming the argument and its range."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) \
            or not timeout > 0:                     # also refuses NaN
        raise ValueError(f"timeout must be > 0 seconds (or None for no limit), got {timeout!r}")
    if math.isinf(timeout):
        return None
    return float(timeout)


def deadline_of(timeout: float | None) -> float:
    """The time.monotonic() at which a run of `timeout` seconds (None: no limit) ends."""
    return math.inf if timeout is None else time.monotonic() + timeout


class _Waiting:
    """A rank that waits, in the shape `dsml.sim.DeadlockError` describes: `name`,
    `waiting_for` (with `describe()`) and `sim.now`."""

    def __init__(self, name, what, now, tag=None, rank=None):
        self.name, self.waiting_for = name, self
        self.pid = rank
        self.what = what
        self.sim = self
        self.now = now
        self.tag = tag          # the tag it waits on (None: a join), for `tags.differing`

    def describe(self):
        return self.what


# The deadlock a real engine finds (`hopeless`) is the one every engine raises.
RealDeadlock = DeadlockError


def hopeless(status: Status, world_size: int, elapsed: float, engine: str):
    """A DeadlockError if the run cannot go on, else None.

    It cannot when no rank runs (each has finished, or waits for a message or a join), at
    least one waits, and every message sent has been taken from its channel (so nothing is
    on its way that could wake anyone: what was taken and not received waits in a stash, and
    a waiting rank has looked there). Ranks set RUNNING before counting the message that
    woke them, so reading the counts, then the states, then the counts again, and asking
    that nothing was taken in between, never mistakes a rank just woken for a waiting one."""
    cells = status.cells
    before = cells[:]
    states = cells[:]
    after = cells[:]
    width = STATUS_FIELDS
    waiting = []
    for r in range(world_size):
        state = states[r * width]
        if state == RUNNING:
            return None
        if state != DONE:
            waiting.append(r)
    if not waiting:
        return None
    taken = after[TAKEN::width]
    if before[TAKEN::width] != taken or sum(after[SENT::width]) != sum(taken):
        return None
    view = Status(states)
    ranks = []
    for r in waiting:
        who, what = view.wait_of(r)
        receiving = states[r * width] == RECEIVING
        ranks.append(_Waiting(who, what, elapsed, states[r * width + 2] if receiving else None,
                              r))
    held = [(r, after[r * width + STASHED]) for r in range(world_size)
            if after[r * width + STASHED] > 0]
    note = (f"(found by engine={engine!r}: every unfinished rank waits for a message that "
            f"no rank will send)")
    if held:
        note = ("messages that arrived but were never received (a tag or peer mismatch?):\n  "
                + "\n  ".join(f"rank {r} holds {n} message(s) no receive has taken"
                               for r, n in held) + "\n" + note)
    return DeadlockError(ranks, note, waiting[0],
                         left=[(after[r * width + STASHED_FROM], after[r * width + STASHED_TAG])
                               for r, _ in held])


def check_all_received(outcomes, failed=None) -> None:
    """Every rank finished: compare what each sent to each peer with what that peer received,
    as the simulator does, so that a message nobody received is an error on every engine; it
    names each channel's source, destination and the tags left (from `Outcome.tags`, where
    both ranks kept them), and what differs if the tags are collectives' calls.
    Messages to or from a rank in `failed` (failures="notify") were orphaned by the failure:
    not an error."""
    failed = failed or {}
    missing = [(src, dst, sent - outcomes[dst].received[src])
               for src, outcome in enumerate(outcomes) if src not in failed
               for dst, sent in enumerate(outcome.sent)
               if dst not in failed and sent > outcomes[dst].received[src]]
    if missing:
        lines, left = [], []
        for src, dst, n in missing:
            by_tag = _left_by_tag(outcomes[src], outcomes[dst], src, dst)
            if by_tag is None:
                lines.append(f"rank {src} -> rank {dst}: {n} message(s)")
                continue
            for tag, count in by_tag.items():
                lines.append(f"rank {src} -> rank {dst} ({tag_words(tag)}): {count} message(s)")
                left.append((src, tag))
        hint = differing([], left)
        text = "\n  ".join(lines) + (f"\n{hint}" if hint else "")
        raise RankError(missing[0][1], "finished without receiving messages sent to it "
                        f"(mismatched peers or tags?):\n  {text}")


def _tag_counts(outcome, peer, side, total) -> dict | None:
    """tag -> how many of the `total` messages `outcome`'s rank sent to / received from `peer`
    (side "sent" / "received") had it, from the outcome's tag changes; None if not kept."""
    if outcome.tags is None:
        return None
    changes = [(before, tag) for who, which, before, tag in outcome.tags
               if who == peer and which == side]
    counts = {}
    for i, (before, tag) in enumerate(changes):
        until = changes[i + 1][0] if i + 1 < len(changes) else total
        counts[tag] = counts.get(tag, 0) + until - before
    return counts


def _left_by_tag(sender, receiver, src, dst) -> dict | None:
    """tag -> messages from src to dst that dst never received; None if a rank kept no tags."""
    sent = _tag_counts(sender, dst, "sent", sender.sent[dst])
    received = _tag_counts(receiver, src, "received", receiver.received[src])
    if sent is None or received is None:
        return None
    return {tag: n - received.get(tag, 0) for tag, n in sent.items()
            if n > received.get(tag, 0)}


def make_result(outcomes, trace: bool, engine: str, failed=None) -> RunResult:
    """The RunResult of a run where every rank finished or failed (failures="notify":
    `failed` maps those ranks to (exception, start, time of the failure), perf_counter
    seconds; their value is the exception, their finish time the failure's, and their trace
    rows are lost): times from the earliest start."""
    failed = failed or {}
    finished = [o for o in outcomes if o is not None]
    t0 = min([o.start for o in finished] + [start for _, start, _ in failed.values()])
    ends = [failed[rank][2] - t0 if o is None else o.end - t0 for rank, o in enumerate(outcomes)]
    values = [failed[rank][0] if o is None else o.value for rank, o in enumerate(outcomes)]
    records = None
    if trace:
        records = Trace()
        for outcome in finished:
            for rank, op, start, end, src, dst, nbytes, tag in outcome.records:
                records.add(rank, op, start - t0, end - t0, src, dst, nbytes, tag)
        records.rows.sort(key=lambda row: (row[3], row[0]))   # by end time, then rank
    return RunResult(values=values, time=max(ends), trace=records, engine=engine,
                     world_size=len(outcomes), finish_times=ends,
                     failed={rank: error for rank, (error, *_) in sorted(failed.items())})
