"""Plumbing (hand-written): the `threads` engine — rank programs on threads of this process.

One thread per rank, one inbound queue per rank. A send puts `(source, tag, payload)` on the
receiver's queue and returns at once (an unbounded queue never blocks: sends are eager, as on
every engine); a receive matches (source, tag) in arrival order, stashing the others
(`driver.MatchingTransport`). The send takes the snapshot of the payload (`api.snapshot`, a
copy made before the rank runs on), and the receiver gets that snapshot itself.

A rank that spawns activities (week 3, `comm.spawn`) runs them in its own thread, by turns
(`driver._drive_activities`); when all of them wait, it takes the next message from its inbox,
whoever sent it.

All ranks share one interpreter, so under the GIL the threads take turns: this engine shows
shared-memory behaviour and interleavings, not parallel speed-up (DESIGN.md: use it to
illustrate, and real processes to measure).

Failure handling: threads cannot be killed. When a rank raises, or the run times out, the
engine sets a cancellation flag; a blocked receive polls its queue with a short timeout and
checks the flag, a send checks it too, and a busy rank checks it between requests every 50 ms,
so every rank ends at its next request (a rank stuck in its own code, never yielding, cannot be
stopped: the error says so). The engine joins the threads before it raises. A timeout reports
what each rank was waiting for; a run that can never go on (`driver.hopeless`) is a
DeadlockError at once.
"""
from __future__ import annotations

import queue
import threading
import time

from dsml.comm.api import RankError, RunResult, snapshot
from dsml.comm.driver import (CHECK_EVERY, DONE, FAILED, Cancelled, MatchingTransport,
                              Status, STATUS_FIELDS, check_all_received, check_timeout,
                              deadline_of, describe_exception, drive, hopeless, make_result,
                              rank_failed, timed_out)

POLL = 0.05          # s: how often a blocked receive checks for cancellation
JOIN_TIMEOUT = 10.0  # s: how long to wait for the threads to end after a failure


class ThreadTransport(MatchingTransport):
    """A rank's end of the in-process queues."""

    engine = "threads"          # whose α, β, γ "auto" collectives choose by (dsml.comm.costs)

    def __init__(self, rank, inboxes, status, cancelled: threading.Event):
        super().__init__(rank, status)
        self.inboxes = inboxes
        self.inbox = inboxes[rank]
        self.cancelled = cancelled

    def send(self, dst, tag, payload):
        if self.cancelled.is_set():
            raise Cancelled()
        payload = snapshot(payload)
        self.cells[self.sent_at] += 1        # counted before it can be taken
        self.inboxes[dst].put((self.rank, tag, payload))

    def checkpoint(self):
        """A busy rank (one that never waits, e.g. looping on compute) stops here when the
        run is cancelled."""
        if self.cancelled.is_set():
            raise Cancelled()

    def _next(self, src):
        get, cancelled = self.inbox.get, self.cancelled
        while True:
            try:
                return get(timeout=POLL)
            except queue.Empty:
                if cancelled.is_set():
                    raise Cancelled() from None

    def send_notice(self, dst, error):
        """A failure notice (failures="notify"): the exception itself, after this rank's
        earlier messages in dst's inbox."""
        self.cells[self.sent_at] += 1
        self.inboxes[dst].put((self.rank, FAILED, error))

    def _next_any(self, sources):
        """The next message from any of `sources` (activities, week 3): the one inbox already
        holds every source's, so this is the next message from anyone (the driver stashes it
        if nobody waits for it)."""
        return self._next(None)


def run_threads(program, world_size: int, args=(), kwargs=None, trace: bool = True,
                timeout: float = 120.0, failures: str = "stop") -> RunResult:
    """Run the rank program on `world_size` threads; see the module docstring.

    `timeout` (s) bounds the whole run, from the moment the threads are started.
    `failures="notify"`: a rank that raises tells its peers (FAILED notices) and ends alone.
    """
    timeout = check_timeout(timeout)
    kwargs = kwargs or {}
    inboxes = [queue.SimpleQueue() for _ in range(world_size)]
    status = Status([0] * (world_size * STATUS_FIELDS))
    cancelled = threading.Event()
    reports = queue.SimpleQueue()   # (rank, Outcome or None, (summary, traceback) or None)
    deadline = deadline_of(timeout)

    def rank_main(rank):
        transport = ThreadTransport(rank, inboxes, status, cancelled)
        try:
            # The hellos of connect() are the common start (an all-to-all: no barrier needed).
            outcome = drive(rank, world_size, program, args, kwargs, transport, trace)
        except Cancelled:
            reports.put((rank, None, None))         # stopped because the run failed elsewhere
        except Exception as error:
            if failures == "notify":                # the others go on without this rank
                transport.notify_peers(world_size, error)
                status.set(rank, DONE)
                failed_at = time.perf_counter()
                started = transport.started if transport.started is not None else failed_at
                reports.put((rank, (error, started, failed_at), None))
            else:
                reports.put((rank, None, describe_exception(error)))
        except BaseException as error:              # report everything, like a child process
            reports.put((rank, None, describe_exception(error)))
        else:
            reports.put((rank, outcome, None))

    threads = [threading.Thread(target=rank_main, args=(rank,), name=f"dsml-rank-{rank}",
                                daemon=True) for rank in range(world_size)]
    error = None
    try:
        for rank, thread in enumerate(threads):
            if time.monotonic() > deadline:        # starting thousands of threads takes time
                raise timed_out(set(range(world_size)), status, world_size, timeout)
            thread.start()
        outcomes, failed = _collect(reports, status, world_size, deadline, timeout)
    except BaseException as caught:      # a failed rank, a timeout, or Ctrl-C in the caller
        error = caught
        raise
    finally:
        cancelled.set()
        stuck = _join(threads)
        if stuck and isinstance(error, RankError):
            error.args = (error.args[0] + "\n(still running their own code, never yielding a "
                          "request, so they could not be stopped: "
                          + ", ".join(thread.name for thread in stuck) + ")",)
    check_all_received(outcomes, failed)
    return make_result(outcomes, trace, "threads", failed)


def _collect(reports, status, world_size, deadline, timeout):
    """Wait for every rank's report; raise RankError naming the first failure. Returns the
    outcomes and, with failures="notify", {rank: the exception it raised}."""
    outcomes = [None] * world_size
    failed = {}
    pending = set(range(world_size))
    started = time.monotonic()
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise timed_out(pending, status, world_size, timeout)
        try:
            rank, outcome, failure = reports.get(timeout=min(remaining, CHECK_EVERY))
        except queue.Empty:
            deadlock = hopeless(status, world_size, time.monotonic() - started, "threads")
            if deadlock is not None:
                raise deadlock from None
            continue
        if failure is not None:
            raise rank_failed(rank, *failure)
        if outcome is None:      # pragma: no cover - cancelled ranks report only after a failure
            continue
        if type(outcome) is tuple:        # (error, time): failed, and its peers were told
            failed[rank] = outcome
        else:
            outcomes[rank] = outcome
        pending.discard(rank)
    return outcomes, failed


def _join(threads) -> list:
    """Join every thread, waiting at most JOIN_TIMEOUT in all; return those still alive."""
    end = time.monotonic() + JOIN_TIMEOUT
    for thread in threads:
        if thread.ident is not None:
            thread.join(timeout=max(0.0, end - time.monotonic()))
    return [thread for thread in threads if thread.is_alive()]
