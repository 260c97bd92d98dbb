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
its inbound channel is shared — and returns `(source, tag, payload)`.
"""
from __future__ import annotations

import time
import traceback
from collections import deque
from typing import Any, NamedTuple

import numpy as np

from dsml.comm import api
from dsml.comm.api import (Combine, Comm, Compute, RankError, Recv, RunResult, Send, SendRecv,
                           payload_nbytes, start_rank)
from dsml.sim import Trace

# `comm.now()` arrived with week 2; engines answer it when the vocabulary has it.
Now = getattr(api, "Now", None)

# States in a Status record.
RUNNING, RECEIVING, DONE = 0, 1, 3
STATUS_FIELDS = 3     # state, peer, tag
HELLO = -1            # tag of start-up handshakes (user tags are ≥ 0)


# What the hellos carry: a small array, so that the first user message does not pay for
# first-time work on the way (pickling NumPy arrays imports and caches on first use).
_WARM_UP = (np.zeros(1), 0.0)


class Cancelled(Exception):
    """Raised inside a rank whose run was cancelled because another rank failed or the run
    timed out (threads cannot be killed: they poll for this)."""


class Outcome(NamedTuple):
    """What a rank that finished reports: its value, its start and end (perf_counter
    seconds), its trace rows, and the user messages it sent to / received from each peer."""
    value: Any
    start: float
    end: float
    records: list | None
    sent: list
    received: list


class Status:
    """What each rank is doing, in a flat sequence of STATUS_FIELDS numbers per rank: a list
    for threads, a shared `RawArray` for processes (written by the child, read by the parent)."""

    def __init__(self, cells):
        self.cells = cells

    def set(self, rank, state, peer=-1, tag=-1):
        base = rank * STATUS_FIELDS
        cells = self.cells
        cells[base], cells[base + 1], cells[base + 2] = state, peer, tag

    def describe(self, rank) -> str:
        base = rank * STATUS_FIELDS
        state, peer, tag = self.cells[base], self.cells[base + 1], self.cells[base + 2]
        if state == RECEIVING:
            return f"rank {rank} waits for a message from rank {peer} (tag {tag})"
        if state == DONE:
            return f"rank {rank} finished"
        return f"rank {rank} is running its program (not waiting on a message)"


class MatchingTransport:
    """Receive side shared by the real transports: take messages from `_next` until one with
    the wanted (source, tag) arrives; keep the others, in arrival order, for later receives."""

    def __init__(self, rank: int, status: Status):
        self.rank = rank
        self.status = status
        self.early = {}     # (src, tag) -> deque of payloads that arrived before their recv

    def recv(self, src, tag):
        key = (src, tag)
        stash = self.early.get(key)
        if stash:
            return stash.popleft()
        self.status.set(self.rank, RECEIVING, src, tag)
        while True:
            got_src, got_tag, payload = self._next(src)
            if got_src == src and got_tag == tag:
                self.status.set(self.rank, RUNNING)
                return payload
            self.stash(got_src, got_tag, payload)

    def stash(self, src, tag, payload):
        """Keep a message that arrived before its receive was posted."""
        stash = self.early.get((src, tag))
        if stash is None:
            stash = self.early[(src, tag)] = deque()
        stash.append(payload)

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


def _not_a_request(request) -> TypeError:
    choices = "comm.send(...), comm.recv(...), comm.sendrecv(...), comm.compute(...)"
    choices += ", comm.combine(...) or comm.now()" if Now is not None else \
        " or comm.combine(...)"
    return TypeError(f"yielded {request!r}, which is not a request; yield {choices}")


def drive(rank: int, size: int, program, args, kwargs, transport,
          record_trace: bool) -> Outcome:
    """Run one rank's program on `transport` until it returns; see the module docstring.

    The rank first says hello to every peer and hears from every peer (`transport.connect`):
    an all-to-all, so when it is through, every rank has started — the common start, from
    which its clock runs. Exceptions (the program's, or the transport's) propagate.
    """
    gen = start_rank(program, Comm(rank, size), args, kwargs)
    transport.connect(size)
    sent = [0] * size          # user messages sent to each peer (the hellos do not count)
    received = [0] * size      # user messages taken by a receive from each peer
    records = [] if record_trace else None
    clock = time.perf_counter
    t0 = clock()
    value = None
    while True:
        try:
            request = gen.send(value)
        except StopIteration as stop:
            t_end = clock()
            transport.status.set(rank, DONE)
            return Outcome(stop.value, t0, t_end, records, sent, received)
        start = clock()
        kind = type(request)
        if kind is SendRecv:
            transport.send(request.dst, request.tag, request.payload)
            sent[request.dst] += 1
            value = transport.recv(request.src, request.tag)
            received[request.src] += 1
            op, src, dst, nbytes = "sendrecv", request.src, request.dst, request.nbytes
        elif kind is Send:
            transport.send(request.dst, request.tag, request.payload)
            sent[request.dst] += 1
            value, op, src, dst, nbytes = None, "send", rank, request.dst, request.nbytes
        elif kind is Recv:
            value = transport.recv(request.src, request.tag)
            received[request.src] += 1
            op, src, dst, nbytes = "recv", request.src, rank, None
        elif kind is Compute:
            value, op, src, dst, nbytes = None, "compute", -1, -1, 0
        elif kind is Combine:
            value, op, src, dst, nbytes = None, "combine", -1, -1, request.nbytes
        elif kind is Now:
            value = start - t0           # reading the clock is not recorded (as on sim)
            continue
        else:
            raise _not_a_request(request)
        if records is not None:
            if nbytes is None:
                nbytes = payload_nbytes(value)
            records.append((rank, op, start, clock(), src, dst, nbytes,
                            getattr(request, "tag", 0)))


# --- what the parent makes of the ranks' reports ------------------------------------------------

def describe_exception(error: BaseException) -> tuple[str, str]:
    """(one-line summary, traceback text) of the exception being handled."""
    return f"{type(error).__name__}: {error}", traceback.format_exc()


def rank_failed(rank: int, summary: str, traceback_text: str) -> RankError:
    return RankError(rank, f"failed: {summary}\n--- traceback of rank {rank} ---\n"
                     f"{traceback_text}")


def timed_out(pending, status: Status, world_size: int, timeout: float) -> RankError:
    waiting = "\n  ".join(status.describe(r) for r in range(world_size))
    return RankError(min(pending), f"(and {len(pending)} rank(s) in all) did not finish "
                     f"within the timeout of {timeout:g} s:\n  {waiting}")


def check_all_received(outcomes) -> None:
    """Every rank finished: compare what each sent to each peer with what that peer received,
    as the simulator does, so that a message nobody received is an error on every engine."""
    missing = [(src, dst, sent - outcomes[dst].received[src])
               for src, outcome in enumerate(outcomes) for dst, sent in enumerate(outcome.sent)
               if sent > outcomes[dst].received[src]]
    if missing:
        lines = "\n  ".join(f"rank {src} -> rank {dst}: {n} message(s)" for src, dst, n in missing)
        raise RankError(missing[0][1], "finished without receiving messages sent to it "
                        f"(mismatched peers or tags?):\n  {lines}")


def make_result(outcomes, trace: bool, engine: str) -> RunResult:
    """The RunResult of a run where every rank finished: times from the earliest start."""
    t0 = min(o.start for o in outcomes)
    ends = [o.end - t0 for o in outcomes]
    records = None
    if trace:
        records = Trace()
        for outcome in outcomes:
            for rank, op, start, end, src, dst, nbytes, tag in outcome.records:
                records.add(rank, op, start - t0, end - t0, src, dst, nbytes, tag)
        records.rows.sort(key=lambda row: (row[3], row[0]))   # by end time, then rank
    return RunResult(values=[o.value for o in outcomes], time=max(ends), trace=records,
                     engine=engine, world_size=len(outcomes), finish_times=ends)
