"""Generated from notebooks/week1_foundations_and_communication.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 12
import heapq
import itertools
from typing import Any, Callable, NamedTuple

from dsml.sim_support import Limits, Thrown, TraceBase, Tracks, describe_wait
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
        self.process, self.error = process, error
        super().__init__(f"{process.name} raised {type(error).__name__}: {error}")


class LimitExceeded(SimulationError):
    """The run reached `max_events` steps or `timeout` seconds (dsml.sim_support.Limits)."""


# -- cell 14
PENDING = object()    # a handler's answer meaning "not yet: resume() will be called later"


class Process:
    """A generator driven by the simulator: `handler(process, request)` answers what it yields."""
    __slots__ = ("sim", "pid", "name", "gen", "handler", "done", "value", "finish_time",
                 "waiting_for", "track")

    def __init__(self, sim: "Simulator", pid: int, name: str, gen, handler: Callable):
        self.sim, self.pid, self.name, self.gen, self.handler = sim, pid, name, gen, handler
        self.done, self.value, self.finish_time = False, None, None
        self.waiting_for = None     # the request it waits on, for a deadlock report
        self.track = 0              # its track in a trace (set by Simulator.spawn)

    def resume(self, value: Any = None) -> None:
        """Send `value` into the generator and hand its requests to the handler, until one is
        PENDING or the generator returns."""
        while True:
            try:
                if type(value) is Thrown:    # week 4: an error to raise in the generator
                    request = self.gen.throw(value.error)
                else:
                    request = self.gen.send(value)
            except StopIteration as stop:
                return self.finish(stop.value)
            except Exception as error:
                on_failure = self.sim.on_failure     # week 4: it may end just this process
                if on_failure is None or not on_failure(self, error):
                    raise ProcessFailed(self, error) from error
                return self.finish(error)
            self.waiting_for = request
            value = self.handler(self, request)
            if value is PENDING:
                return
            if self.sim.budget <= 0:          # answered at once: a step too (see run)
                self.sim.limits.check(self.sim)
            self.sim.budget -= 1

    def finish(self, value: Any) -> None:
        self.done, self.value, self.finish_time, self.waiting_for = True, value, self.sim.now, None


# -- cell 16
class Simulator:
    """A clock and a heap of (time, sequence, callback, argument): ties run in scheduling order."""

    def __init__(self):
        self.now = 0.0
        self.processes: list[Process] = []
        self._heap: list = []
        self._sequence = itertools.count()
        self.events_processed = 0
        self.on_failure = None     # week 4: on_failure(process, error) -> True if handled
        self.limits = Limits(error=LimitExceeded)    # the guard of run (dsml.sim_support)
        self.limits.start(self)
        self.tracks = Tracks()     # which track of a trace each process is drawn on

    def at(self, time: float, callback: Callable, argument: Any = None) -> None:
        """Run `callback(argument)` at simulated `time` (seconds, not before now)."""
        if not time >= self.now:            # also refuses NaN, which would corrupt the heap
            raise ValueError(f"cannot schedule in the past (or at NaN): time={time}, now={self.now}")
        heapq.heappush(self._heap, (time, next(self._sequence), callback, argument))

    def after(self, delay: float, callback: Callable, argument: Any = None) -> None:
        self.at(self.now + delay, callback, argument)

    def spawn(self, gen, handler: Callable, name: str | None = None, pid: int | None = None):
        """Start a generator as a process now. Its pid is its place in `processes` unless
        given (week 3: a rank's second activity shares the rank's)."""
        pid = len(self.processes) if pid is None else pid
        process = Process(self, pid, name or f"process {pid}", gen, handler)
        process.track = self.tracks.place(process)
        self.processes.append(process)
        self.at(self.now, process.resume, None)
        return process


# -- cell 18
@add_to_class(Simulator)
def run(self, max_events: int | None = None, timeout: float | None = None) -> float:
    """Process events until none is left; return the final time. Raises DeadlockError if
    processes still wait then, and LimitExceeded after `max_events` steps or `timeout`
    seconds of wall-clock time (None: the defaults of dsml.sim_support)."""
    self.limits = Limits(max_events, timeout, LimitExceeded)   # checks both arguments
    self.limits.start(self)
    heap, pop, count = self._heap, heapq.heappop, 0
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
    """One thing a rank did: `op` from `start` to `end` (seconds); `src`/`dst` the ranks a
    message came from / went to (-1: none); `track` which of the rank's tracks it is drawn
    on (0 but for week 3's activities running beside the rank's program)."""
    rank: int
    op: str
    start: float
    end: float
    src: int = -1
    dst: int = -1
    nbytes: int = 0
    tag: int = 0
    track: int = 0


class Trace(TraceBase):
    """The records of a run, in the order they completed. Engines append plain tuples to
    `rows` (cheaper than a record each); `records` makes TraceRecords of them on demand."""

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
