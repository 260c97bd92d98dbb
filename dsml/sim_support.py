"""Plumbing (hand-written): the simulator's guards and bookkeeping — the limits that bound a
run (`Limits`), the answer a process raises instead of receiving (`Thrown`, week 4), the trace
track each process is drawn on (`Tracks`), and what a `Trace` offers beyond its records
(`TraceBase`: list-like access, per-rank views, the Chrome trace export), and a process's wait
in words (`describe_wait`, for deadlock and limit reports).

`dsml.sim` (generated from week 1's notebook) calls these; a learner need not read them. The
import points one way: `dsml.sim` imports this module, which imports nothing of `dsml.sim` (the
error class a limit raises is handed to `Limits`).

**Limits.** A simulation counts *steps*: every event the loop processes, and every request a
handler answers at once (a zero-second `compute`, `now()`, a free `combine`, a message already
in the mailbox) — those cost no event, so a loop of them would otherwise never return to the
event loop. `Simulator.budget` is the number of steps left before the next check; the event
loop and `Process.resume` decrement it and call `Limits.check` when it reaches zero. The check
stops the run past `max_events` steps or past `timeout` seconds of wall-clock time (read every
`CHECK_EVERY` steps, so the clock costs nothing per step).
"""
from __future__ import annotations

import json
import math
import numbers
import time

DEFAULT_MAX_EVENTS = 10_000_000   # ~3× the largest run of the course (1,024-rank ring, 3.1 M)
DEFAULT_TIMEOUT = 120.0           # seconds of wall-clock time, as on the real engines
CHECK_EVERY = 10_000              # steps between two readings of the wall clock
SHOWN = 16                        # processes listed in a LimitExceeded message (then "… more")


def check_max_events(max_events) -> int:
    """`max_events` as an int ≥ 1 (None: DEFAULT_MAX_EVENTS), or a ValueError naming it."""
    if max_events is None:
        return DEFAULT_MAX_EVENTS
    if isinstance(max_events, bool) or not isinstance(max_events, numbers.Integral) \
            or max_events < 1:
        raise ValueError(f"max_events must be an integer ≥ 1 (steps: events and requests "
                         f"answered at once; None for the default {DEFAULT_MAX_EVENTS:,}), "
                         f"got {max_events!r}")
    return int(max_events)


def check_timeout(timeout) -> float:
    """`timeout` as a float > 0 (None: DEFAULT_TIMEOUT; float('inf'): no wall-clock limit), or a
    ValueError naming it."""
    if timeout is None:
        return DEFAULT_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) \
            or not timeout > 0:                     # also refuses NaN
        raise ValueError(f"timeout must be > 0 seconds (inf for no limit, None for the "
                         f"default {DEFAULT_TIMEOUT:g} s), got {timeout!r}")
    return float(timeout)


class Limits:
    """The guard of one `Simulator.run`: at most `max_events` steps and `timeout` seconds."""

    def __init__(self, max_events=None, timeout=None, error=RuntimeError):
        self.error = error       # the class to raise: dsml.sim's LimitExceeded (or a notebook's)
        self.max_events = check_max_events(max_events)
        self.timeout = check_timeout(timeout)
        self.used = 0            # steps taken before the current budget was granted
        self.granted = 0         # the size of the current budget
        self.deadline = math.inf

    def start(self, sim) -> None:
        """Start the clock and grant `sim` its first budget of steps."""
        self.deadline = time.monotonic() + self.timeout
        self.used, self.granted = 0, min(CHECK_EVERY, self.max_events)
        sim.budget = self.granted

    def check(self, sim) -> None:
        """The budget is spent: raise LimitExceeded if a limit is reached, else grant more."""
        self.used += self.granted - sim.budget
        if self.used >= self.max_events:
            raise self.exceeded(sim, f"max_events={self.max_events:,} steps (events, and "
                                     f"requests answered at once)",
                                "raise max_events to let it run longer")
        if time.monotonic() > self.deadline:
            raise self.exceeded(sim, f"timeout={self.timeout:g} s of wall-clock time "
                                     f"({self.used:,} steps)",
                                "raise timeout to let it run longer")
        self.granted = min(CHECK_EVERY, self.max_events - self.used)
        sim.budget = self.granted

    def exceeded(self, sim, limit: str, advice: str):
        error = self.error(limit_message(sim, limit, advice))
        error.waiting = [p for p in sim.processes if not p.done]
        return error


def limit_message(sim, limit: str, advice: str) -> str:
    """What LimitExceeded says: the limit reached, and what each unfinished process was doing
    (its request, as in a deadlock report; the first SHOWN of them)."""
    waiting = [p for p in sim.processes if not p.done]
    lines = [f"{p.name} " + ("has not started" if p.waiting_for is None
                             else describe_wait(p.waiting_for)) for p in waiting[:SHOWN]]
    if len(waiting) > SHOWN:
        lines.append(f"… and {len(waiting) - SHOWN} more")
    return (f"stopped after {limit} at t={sim.now:.9g} s; a program that never ends? "
            f"{len(waiting)} process(es) had not finished:\n  " + "\n  ".join(lines)
            + f"\n({advice})")


def describe_wait(request) -> str:
    """What a process waits for, in words (requests may define describe()): a deadlock report
    (dsml.sim.DeadlockError) and a LimitExceeded message list one line of it per process."""
    describe = getattr(request, "describe", None)
    return describe() if describe else f"waits on {request!r}"


class Thrown:
    """An answer that `Process.resume` raises inside the waiting generator instead of sending
    it there (week 4: a receive from a rank that has failed raises its notice)."""
    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


class Tracks:
    """Which track of a trace each process is drawn on. Processes that share a pid (a rank and
    its activities, week 3) get different tracks while they run at the same time; a process
    takes the lowest track of its pid whose last process has finished, so a loop that spawns an
    activity per step uses as many tracks as activities ever run at once. Two processes on
    one track never overlap in time, so neither do their trace records."""

    def __init__(self):
        self.holders: dict = {}      # pid -> [process on track 0, process on track 1, …]

    def place(self, process) -> int:
        holders = self.holders.setdefault(process.pid, [])
        for track, holder in enumerate(holders):
            if holder.done:
                holders[track] = process
                return track
        holders.append(process)
        return len(holders) - 1

    def infer(self, pid: int, op: str) -> int:
        """The track of a trace record made without one (by an engine extension that does not
        pass it, e.g. week 3's join): a record is made as its request completes, so it is the
        track of the process of `pid` that waits on a request whose class is named like `op`
        ("join": Join; "recv": Recv, RecvAny) and, if the request names an activity, one that
        has finished. 0 (the rank's program) if none does."""
        for track, holder in enumerate(self.holders.get(pid, ())):
            request = holder.waiting_for
            if not holder.done and type(request).__name__.lower().startswith(op) \
                    and getattr(getattr(request, "activity", None), "done", True):
                return track
        return 0


# --- what a Trace offers beyond its records -------------------------------------------------

class TraceBase:
    """The base of `dsml.sim.Trace` (week 1 writes its records: `rows`, `add`, `records`):
    list-like access, per-rank views, and the Chrome trace export."""

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.records)

    def __getitem__(self, index):
        return self.records[index]

    def of_rank(self, rank: int) -> list:
        return [r for r in self.records if r.rank == rank]

    def ranks(self) -> list:
        return sorted({r.rank for r in self.records})

    def to_chrome(self, path=None) -> dict:
        """Chrome trace-event JSON (Perfetto, chrome://tracing): a process per rank, a track
        per activity of it (the rank's program; week 3's activities beside it), and an arrow
        from each send to its receive.

        Times are in microseconds, as the format requires, rounded to whole nanoseconds (what
        Perfetto keeps), so that slices that touch never overlap by a rounding error. Written
        to `path` if given; the output is deterministic (sorted events and keys).
        """
        records = lay_out(self.records)   # real engines' records of activities: see lay_out
        width = max(self.ranks(), default=0) + 1     # track k of rank r is thread r + k·width
        events = chrome_names(records, width)        # process and thread names
        # Enclosing slices first: at equal starts, the one that ends later.
        for r in sorted(records, key=lambda r: (r.rank, r.track, r.start, -r.end)):
            args = {"nbytes": r.nbytes, "tag": r.tag}
            if r.src >= 0:
                args["src"] = r.src
            if r.dst >= 0:
                args["dst"] = r.dst
            start, end = round(r.start * 1e9), round(r.end * 1e9)        # nanoseconds
            events.append({"ph": "X", "name": r.op, "cat": r.op, "pid": r.rank,
                           "tid": r.rank + r.track * width, "ts": start / 1e3,
                           "dur": (end - start) / 1e3, "args": args})
        events += message_flows(records, width)     # send -> receive arrows
        document = {"traceEvents": events, "displayTimeUnit": "ns"}
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(document, f, sort_keys=True, separators=(",", ":"))
                f.write("\n")
        return document


# --- the Chrome trace-event format (TraceBase.to_chrome) ------------------------------------

def lay_out(records) -> list:
    """The records, each on a track of its rank where it nests in or follows every other slice
    (the format's rule; times in whole ns, as exported). The simulator's records keep it as they
    are, a track per activity; the real engines' carry no track (0), so a rank running
    activities (week 3) has slices there that overlap in part: each of those moves to the next
    track of its rank that takes it."""
    open_ends: dict = {}       # (rank, track) -> ends of the open slices, innermost last
    placed = []
    for r in sorted(records, key=lambda r: (r.rank, r.start, -r.end)):
        start, end = round(r.start * 1e9), round(r.end * 1e9)
        track = r.track
        while True:
            ends = open_ends.setdefault((r.rank, track), [])
            while ends and ends[-1] <= start:        # slices over before this one starts
                ends.pop()
            if not ends or end <= ends[-1]:          # free, or inside the innermost open one
                ends.append(end)
                break
            track += 1
        placed.append(r if track == r.track else r._replace(track=track))
    return placed


def track_name(rank: int, track: int) -> str:
    return f"rank {rank}" if track == 0 else f"rank {rank} · activity track {track}"


def chrome_names(records, width: int) -> list:
    """Metadata events: a process per rank ("rank r"), a thread per track of it."""
    events = []
    for rank in sorted({r.rank for r in records}):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": rank,
                       "args": {"name": f"rank {rank}"}})
    for rank, track in sorted({(r.rank, r.track) for r in records}):
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": rank + track * width,
                       "args": {"name": track_name(rank, track)}})
    return events


def _by_time(record):
    return (record.start, record.end, record.track)


def message_pairs(records) -> list:
    """(send record, receive record) of every message whose both ends are in the trace.

    Messages between two ranks with one tag are received in the order they were sent (MPI's
    non-overtaking rule, which every engine keeps), so the k-th send from a to b with tag t
    pairs with the k-th receive at b from a with tag t, both in order of their start. A
    `sendrecv` record is both a send (to `dst`) and a receive (from `src`)."""
    sends, receives = {}, {}
    for r in records:
        if r.op in ("send", "sendrecv") and r.dst >= 0:
            sends.setdefault((r.rank, r.dst, r.tag), []).append(r)
        if r.op in ("recv", "sendrecv") and r.src >= 0:
            receives.setdefault((r.src, r.rank, r.tag), []).append(r)
    pairs = []
    for channel in sorted(sends):
        pairs += zip(sorted(sends[channel], key=_by_time),
                     sorted(receives.get(channel, ()), key=_by_time))
    pairs.sort(key=lambda pair: (_by_time(pair[0]), pair[0].rank, pair[0].dst, pair[0].tag))
    return pairs


def _ns(time: float) -> int:
    return round(time * 1e9)


def flow_times(send, receive) -> tuple:
    """(tail, head) of a message's arrow, µs in whole ns: the tail inside the send's slice,
    the head inside the receive's and never before the tail. On a real engine a receive is
    often posted long before its message is sent, so the middles of the two slices (the
    arrow's ends before) put the head before the tail; the tail is the middle of the part of
    the send before the receive ends, the head the middle of the receive or the tail,
    whichever is later."""
    start = _ns(send.start)
    tail = (start + max(start, min(_ns(send.end), _ns(receive.end)))) // 2
    head = max(tail, (_ns(receive.start) + _ns(receive.end)) // 2)
    return tail / 1e3, head / 1e3


def message_flows(records, width: int) -> list:
    """Flow events, an arrow from each send's slice to its receive's (legacy "s"/"f" events,
    which Perfetto and chrome://tracing both draw; "bp": "e" binds the arrow's head to the
    slice that encloses it rather than the next one), times from `flow_times`."""
    events = []
    for number, (send, receive) in enumerate(message_pairs(records)):
        common = {"name": "message", "cat": "message", "id": number}
        tail, head = flow_times(send, receive)
        events.append({**common, "ph": "s", "pid": send.rank,
                       "tid": send.rank + send.track * width, "ts": tail})
        events.append({**common, "ph": "f", "bp": "e", "pid": receive.rank,
                       "tid": receive.rank + receive.track * width, "ts": head})
    return events


def partial_overlaps(document: dict) -> list:
    """Pairs of complete ("X") events of a Chrome trace that overlap partially on one (pid, tid)
    track — the format's nesting rule says slices of a track nest or follow each other, and
    viewers drop the ones that do not. Times are compared in whole nanoseconds, as Perfetto
    stores them. Empty for a valid trace."""
    tracks = {}
    for e in document["traceEvents"]:
        if e.get("ph") == "X":
            start = round(e["ts"] * 1e3)
            tracks.setdefault((e["pid"], e["tid"]), []).append(
                (start, start + round(e["dur"] * 1e3), e))
    bad = []
    for slices in tracks.values():
        slices.sort(key=lambda s: (s[0], -s[1]))
        open_ = []                                     # the enclosing slices, innermost last
        for start, end, event in slices:
            while open_ and open_[-1][1] <= start:
                open_.pop()
            if open_ and end > open_[-1][1]:
                bad.append((open_[-1][2], event))
            open_.append((start, end, event))
    return bad
