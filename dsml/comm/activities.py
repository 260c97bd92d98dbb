"""Generated from notebooks/week3_data_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 51
import types

from dsml.comm.api import ADDED_REQUESTS, Comm, Request
from dsml.comm.sim_engine import SimEngine
from dsml.sim import PENDING
from dsml.utils import add_to_class


class Activity:
    """A handle on a second activity of a rank, as `comm.spawn` answers it: give it to
    `comm.join` to wait for the activity and get what it returned."""
    __slots__ = ("rank", "number", "done", "value", "joiners")

    def __init__(self, rank: int, number: int):
        self.rank, self.number = rank, number
        self.done, self.value = False, None
        self.joiners = []       # callbacks of the activities waiting in comm.join

    def __repr__(self):
        state = "done" if self.done else "running"
        return f"<activity {self.number} of rank {self.rank}, {state}>"


class Spawn(Request):
    """Start `program` (a generator of requests) as a second activity of this rank; the
    answer, at once, is its Activity handle."""
    __slots__ = ("program",)

    def __init__(self, program):
        self.program = program

    def start(self, rank: int, number: int, main_returned):
        """(handle, generator) of activity `number` of `rank`: what an engine runs, and what
        the spawning program gets. `main_returned()` says whether the rank's program has
        returned (see run_activity)."""
        handle = Activity(rank, number)
        return handle, run_activity(self.program, handle, main_returned)

    def describe(self):
        return "starts an activity"


class Join(Request):
    """Wait until `activity` has finished; the answer is what its program returned."""
    __slots__ = ("activity",)

    def __init__(self, activity):
        self.activity = activity

    def describe(self):
        return f"waits in join for its activity {self.activity.number} to finish"


# -- cell 52
@add_to_class(Comm)
def spawn(self, program) -> Spawn:
    """Request: run `program` — a generator of requests, e.g. `allreduce(comm, x)` — beside
    this one, like work queued on a second CUDA stream. Yielding it answers an Activity at once."""
    if not isinstance(program, types.GeneratorType):
        raise TypeError(f"rank {self.rank}: spawn takes a generator of requests (call the "
                        f"rank program, e.g. comm.spawn(allreduce(comm, x))), got "
                        f"{type(program).__name__}")
    return Spawn(program)


@add_to_class(Comm)
def join(self, activity) -> Join:
    """Request: wait for `activity` (a handle from spawn) to finish; answers what it returned."""
    if not isinstance(activity, Activity):
        raise TypeError(f"rank {self.rank}: join takes the Activity that yielding "
                        f"comm.spawn(...) answered, got {type(activity).__name__}")
    if activity.rank != self.rank:
        raise ValueError(f"rank {self.rank}: cannot join {activity!r}: a rank joins only the "
                         f"activities it spawned")
    return Join(activity)


# -- cell 53
def run_activity(program, handle: Activity, main_returned):
    """Drive `program` as an activity of a rank; when it returns, hand its value to whoever
    waits in join. `main_returned()` says whether the rank's program has already returned —
    an error: it must join its activities first. Shared by every engine."""
    value = yield from program
    if main_returned():
        raise RuntimeError(f"its program returned while activity {handle.number} still ran; "
                           f"join every activity before returning")
    handle.done, handle.value = True, value
    for resume in handle.joiners:
        resume(value)
    return value


@add_to_class(SimEngine)
def on_spawn(self, process, req):
    rank = process.pid
    counts = self.__dict__.setdefault("activity_counts", [0] * self.world_size)
    counts[rank] += 1
    main = self.sim.processes[rank]
    handle, gen = req.start(rank, counts[rank], lambda: main.done)
    self.sim.spawn(gen, self.handle, name=f"rank {rank} activity {handle.number}", pid=rank)
    return handle


@add_to_class(SimEngine)
def on_join(self, process, req):
    handle = req.activity
    rank, start = process.pid, self.sim.now
    if handle.done:
        self.record(rank, "join", start)
        return handle.value

    def finished(value):
        self.record(rank, "join", start)
        self.sim.at(self.sim.now, process.resume, value)   # after the activity's own step
    handle.joiners.append(finished)
    return PENDING


ADDED_REQUESTS.update({Spawn: "spawn", Join: "join"})
