"""Generated from notebooks/week1_foundations_and_communication.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 12
import heapq
import itertools
import json
from typing import Any, Callable, NamedTuple

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


def describe_wait(request: Any) -> str:
    """What a process waits for, in words (requests may define describe())."""
    describe = getattr(request, "describe", None)
    return describe() if describe else f"waits on {request!r}"


# -- cell 14
PENDING = object()    # a handler's answer meaning "not yet: resume() will be called later"


class Thrown:
    """A result to raise inside the waiting generator rather than send to it."""
    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


class Process:
    """A generator driven by the simulator.

    Each value the generator yields is handed to `handler(process, value)`, which returns
    the result at once, or PENDING after arranging a later `resume(result)`.
    """

    __slots__ = ("sim", "pid", "name", "gen", "handler", "done", "value",
                 "finish_time", "waiting_for")

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
        self.processes.append(process)
        self.at(self.now, process.resume, None)
        return process


# -- cell 18
@add_to_class(Simulator)
def run(self, max_events: int | None = None) -> float:
    """Process events until none is left; return the final time.

    Raises DeadlockError if processes still wait when the heap is empty, and
    SimulationError after `max_events` events (a guard against programs that never end).
    """
    heap = self._heap
    pop = heapq.heappop
    limit = -1 if max_events is None else max_events
    count = 0
    try:
        while heap:
            if count == limit:
                raise SimulationError(
                    f"stopped after max_events={max_events} events at t={self.now:.9g} s; a "
                    f"process that never ends? Raise max_events to let it run longer")
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
    its size, `tag` its tag.
    """
    rank: int
    op: str
    start: float
    end: float
    src: int = -1
    dst: int = -1
    nbytes: int = 0
    tag: int = 0


class Trace:
    """The records of a run, in the order they completed.

    Engines append plain tuples to `rows` (building a NamedTuple per record costs a
    quarter of a large simulation); `records` turns them into TraceRecords on demand.
    """

    def __init__(self, records=None):
        self.rows: list[tuple] = [tuple(r) for r in (records or [])]
        self._records: list[TraceRecord] = []

    def add(self, rank, op, start, end, src=-1, dst=-1, nbytes=0, tag=0) -> None:
        self.rows.append((rank, op, start, end, src, dst, nbytes, tag))

    @property
    def records(self) -> list[TraceRecord]:
        if len(self._records) != len(self.rows):
            self._records = [TraceRecord._make(row) for row in self.rows]
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
    """Chrome trace-event JSON (Perfetto, chrome://tracing): one track per rank.

    Times are in microseconds, as the format requires. Written to `path` if given;
    the output is deterministic (sorted events and keys).
    """
    events = []
    for rank in self.ranks():
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": rank,
                       "args": {"name": f"rank {rank}"}})
    for r in sorted(self.records, key=lambda r: (r.rank, r.start, r.end)):
        args = {"nbytes": r.nbytes, "tag": r.tag}
        if r.src >= 0:
            args["src"] = r.src
        if r.dst >= 0:
            args["dst"] = r.dst
        events.append({"ph": "X", "name": r.op, "cat": r.op, "pid": 0, "tid": r.rank,
                       "ts": r.start * 1e6, "dur": (r.end - r.start) * 1e6, "args": args})
    document = {"traceEvents": events, "displayTimeUnit": "ns"}
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(document, f, sort_keys=True, separators=(",", ":"))
            f.write("\n")
    return document
