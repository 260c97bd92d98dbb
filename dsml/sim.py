"""Generated from notebooks/week1_foundations_and_communication.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 12
import heapq
import itertools
import json
from typing import Any, Callable, NamedTuple

from dsml.sim_support import Limits, Tracks, chrome_names, lay_out, message_flows
from dsml.utils import add_to_class


class SimulationError(RuntimeError):
    """Base class of the errors the simulator raises."""


class DeadlockError(SimulationError):
    """No event is left, yet some processes still wait: nothing can ever wake them."""

    def __init__(self, waiting: list, note: str = ""):
        self.waiting = waiting
        lines = [f"{p.name} {describe_wait(p.waiting_for)}" for p in waiting]
        message = (f"deadlock at t={waiting[0].sim.now:.9g} s: no event left, but "
                   f"{len(waiting)} process(es) still wait:\n  " + "\n  ".join(lines))
        super().__init__(message + ("\n" + note if note else ""))


class ProcessFailed(SimulationError):
    """A process raised; the original exception is chained as __cause__."""

    def __init__(self, process: "Process", error: BaseException):
        self.process = process
        self.error = error
        super().__init__(f"{process.name} raised {type(error).__name__}: {error}")


class LimitExceeded(SimulationError):
    """The run reached `max_events` steps or `timeout` seconds (dsml.sim_support.Limits)."""


class Thrown:
    """A result to raise inside the waiting generator rather than send to it."""
    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


def describe_wait(request: Any) -> str:
    """What a process waits for, in words (requests may define describe())."""
    describe = getattr(request, "describe", None)
    return describe() if describe else f"waits on {request!r}"


# -- cell 14
PENDING = object()    # a handler's answer meaning "not yet: resume() will be called later"


class Process:
    """A generator driven by the simulator.

    Each value the generator yields is handed to `handler(process, value)`, which returns
    the result at once, or PENDING after arranging a later `resume(result)`.
    """

    __slots__ = ("sim", "pid", "name", "gen", "handler", "done", "value",
                 "finish_time", "waiting_for", "track")

    def __init__(self, sim: "Simulator", pid: int, name: str, gen, handler: Callable):
        self.sim = sim
        self.pid = pid
        self.name = name
        self.gen = gen
        self.handler = handler
        self.done = False
        self.value = None
        self.finish_time = None
        self.waiting_for = None
        self.track = 0              # its track in a trace (set by Simulator.spawn)

    def resume(self, value: Any = None) -> None:
        """Send `value` into the generator and hand its requests to the handler, until
        one is PENDING or the generator returns. A `Thrown` value is raised inside the
        generator instead (week 4: a receive from a rank that has failed)."""
        while True:
            try:
                if type(value) is Thrown:
                    request = self.gen.throw(value.error)
                else:
                    request = self.gen.send(value)
            except StopIteration as stop:
                self.done = True
                self.value = stop.value
                self.finish_time = self.sim.now
                self.waiting_for = None
                return
            except Exception as error:
                on_failure = self.sim.on_failure
                if on_failure is None or not on_failure(self, error):
                    raise ProcessFailed(self, error) from error
                self.done, self.value, self.finish_time = True, error, self.sim.now
                self.waiting_for = None
                return
            self.waiting_for = request
            value = self.handler(self, request)
            if value is PENDING:
                return
            if self.sim.budget <= 0:          # answered at once: a step too (see run)
                self.sim.limits.check(self.sim)
            self.sim.budget -= 1


# -- cell 16
class Simulator:
    """A discrete-event loop: a clock and a heap of (time, sequence, callback, argument).

    The sequence number breaks ties between events at the same time in the order they
    were scheduled, so a run with the same inputs always unfolds the same way.
    """

    def __init__(self):
        self.now = 0.0
        self.processes: list[Process] = []
        self._heap: list = []
        self._sequence = itertools.count()
        self.events_processed = 0
        # on_failure(process, error) -> True if the failure is handled (the process simply
        # ends); None: a process that raises stops the simulation (ProcessFailed).
        self.on_failure = None
        # The guard against programs that never end (see run): `budget` steps are left
        # before `limits` next checks max_events and the wall clock.
        self.limits = Limits(error=LimitExceeded)
        self.limits.start(self)
        self.tracks = Tracks()        # which track of a trace each process is drawn on

    def at(self, time: float, callback: Callable, argument: Any = None) -> None:
        """Run `callback(argument)` at simulated `time` (seconds, not before now)."""
        if not time >= self.now:            # also refuses NaN, which would corrupt the heap
            raise ValueError(f"cannot schedule in the past (or at NaN): time={time}, now={self.now}")
        heapq.heappush(self._heap, (time, next(self._sequence), callback, argument))

    def after(self, delay: float, callback: Callable, argument: Any = None) -> None:
        """Run `callback(argument)` `delay` seconds from now."""
        self.at(self.now + delay, callback, argument)

    def spawn(self, gen, handler: Callable, name: str | None = None,
              pid: int | None = None) -> Process:
        """Start a generator as a process at the current time. Its `pid` is its place in
        `processes` unless given (week 3's second activity of a rank shares the rank's)."""
        pid = len(self.processes) if pid is None else pid
        process = Process(self, pid, name or f"process {pid}", gen, handler)
        process.track = self.tracks.place(process)
        self.processes.append(process)
        self.at(self.now, process.resume, None)
        return process


# -- cell 18
@add_to_class(Simulator)
def run(self, max_events: int | None = None, timeout: float | None = None) -> float:
    """Process events until none is left; return the final time.

    Raises DeadlockError if processes still wait when the heap is empty, and LimitExceeded
    (a guard against programs that never end) after `max_events` steps — events, and
    requests answered at once — or `timeout` seconds of wall-clock time (None: the defaults,
    DEFAULT_MAX_EVENTS and DEFAULT_TIMEOUT of dsml.sim_support).
    """
    self.limits = Limits(max_events, timeout, LimitExceeded)   # checks both arguments
    self.limits.start(self)
    heap = self._heap
    pop = heapq.heappop
    count = 0
    try:
        while heap:
            if self.budget <= 0:
                self.limits.check(self)          # raises LimitExceeded past a limit
            self.budget -= 1
            time, _, callback, argument = pop(heap)
            self.now = time
            callback(argument)
            count += 1
    finally:
        self.events_processed += count
    waiting = [p for p in self.processes if not p.done]
    if waiting:
        raise DeadlockError(waiting)
    return self.now


# -- cell 24
class TraceRecord(NamedTuple):
    """One thing a rank did: `op` from `start` to `end` (seconds).

    `src`/`dst` are the ranks a message came from / went to (-1 if none), `nbytes`
    its size, `tag` its tag; `track` which of the rank's tracks it is drawn on (0 but for
    week 3's activities running beside the rank's program).
    """
    rank: int
    op: str
    start: float
    end: float
    src: int = -1
    dst: int = -1
    nbytes: int = 0
    tag: int = 0
    track: int = 0


class Trace:
    """The records of a run, in the order they completed.

    Engines append plain tuples to `rows` (building a NamedTuple per record costs a
    quarter of a large simulation); `records` turns them into TraceRecords on demand.
    """

    def __init__(self, records=None):
        self.rows: list[tuple] = [tuple(r) for r in (records or [])]
        self._records: list[TraceRecord] = []

    def add(self, rank, op, start, end, src=-1, dst=-1, nbytes=0, tag=0, track=0) -> None:
        self.rows.append((rank, op, start, end, src, dst, nbytes, tag, track))

    @property
    def records(self) -> list[TraceRecord]:
        if len(self._records) != len(self.rows):
            self._records = [TraceRecord(*row) for row in self.rows]   # track may be left out
        return self._records

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.records)

    def __getitem__(self, index):
        return self.records[index]

    def of_rank(self, rank: int) -> list[TraceRecord]:
        return [r for r in self.records if r.rank == rank]

    def ranks(self) -> list[int]:
        return sorted({r.rank for r in self.records})


# -- cell 25
@add_to_class(Trace)
def to_chrome(self, path=None) -> dict:
    """Chrome trace-event JSON (Perfetto, chrome://tracing): a process per rank, a track
    per activity of it (the rank's program; week 3's activities beside it), and an arrow
    from each send to its receive.

    Times are in microseconds, as the format requires, rounded to whole nanoseconds (what
    Perfetto keeps), so that slices that touch never overlap by a rounding error. Written
    to `path` if given; the output is deterministic (sorted events and keys).
    """
    records = lay_out(self.records)   # real engines' records of activities: see sim_support
    width = max(self.ranks(), default=0) + 1     # track k of rank r is thread r + k·width
    events = chrome_names(records, width)        # process and thread names (sim_support)
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
    events += message_flows(records, width)     # send -> receive arrows (sim_support)
    document = {"traceEvents": events, "displayTimeUnit": "ns"}
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(document, f, sort_keys=True, separators=(",", ":"))
            f.write("\n")
    return document
