"""Plumbing (hand-written): one enclosing trace slice per collective call.

A rank that runs `yield from allreduce(comm, x)` leaves in its trace the messages and combines
the algorithm made; `traced` wraps a collective so that the trace also gets one slice named
after the collective ("allreduce") spanning the whole call, on the same track as the slices
it encloses. A trace viewer then shows each call as one bar with its messages nested under it.

The slice is recorded by a request, `Span` (`comm.span(op, start)`): the wrapper reads the
clock before the call (`comm.now()`) and, when the call returns, asks the engine to record a
slice `op` from that time to now. Every engine answers it at once and it costs no time: the
simulator through `SimEngine.on_span` (added here), the real engines in `dsml.comm.driver`. The
slice encloses the call's records because they all start after its start and end before the
engine answers the `Span` (Perfetto drops slices that overlap partially; the test suite checks
every exported trace for that).

`SPAN_OPS` lists the slice names, so that code drawing or summing a trace can tell an
enclosing slice from the work under it (`dsml.viz.timeline` leaves them out by default).
"""
from __future__ import annotations

import functools
import inspect

from dsml.comm.api import ADDED_REQUESTS, Comm, Request, payload_nbytes
from dsml.comm.sim_engine import SimEngine
from dsml.utils import add_to_class

# The collectives of dsml.collectives whose calls get an enclosing slice.
SPAN_OPS = ("broadcast", "reduce", "allreduce", "allgather", "reduce_scatter", "alltoall",
            "allreduce_hierarchical", "gather", "scatter", "barrier")


class Span(Request):
    """Record a slice `op` from `start` (a time `comm.now()` returned) until now, of `nbytes`
    bytes (the caller's payload). Answered at once; costs no time."""
    __slots__ = ("op", "start", "nbytes")

    def __init__(self, op: str, start: float, nbytes: int = 0):
        self.op, self.start, self.nbytes = op, start, nbytes

    def describe(self):
        return f"records its {self.op} slice"


ADDED_REQUESTS[Span] = "span"


@add_to_class(Comm)
def span(self, op: str, start: float, nbytes: int = 0) -> Span:
    """A request: record in the trace one slice `op` from `start` (what `yield comm.now()`
    returned) until now; costs no time. Used by the collectives to enclose each call."""
    return Span(op, start, nbytes)


@add_to_class(SimEngine)
def on_span(self, process, req):
    self.record(process.pid, req.op, req.start, nbytes=req.nbytes, track=process.track)
    return None                            # answered at once


# Whether the run records a trace: the real engines' driver sets it on each rank's Comm (off:
# no slice, and no cost — two requests more per call were 10 % of a 4 KiB all-reduce on
# `processes`); the simulator leaves the default (its requests answered at once cost little).
Comm.tracing = True


def clock_of(comm):
    """The communicator whose `now()` reads the engine's clock: `comm` itself, or the one
    a sub-communicator (dsml.collectives.Group: `.comm`) wraps; None if there is none."""
    for _ in range(8):                     # groups of groups, a few deep at most
        if isinstance(comm, Comm):
            return comm
        if callable(getattr(comm, "now", None)):
            return comm if hasattr(comm, "tracing") else None
        comm = getattr(comm, "comm", None)
        if comm is None:
            return None
    return None


def traced(collective, op: str | None = None, sign=None):
    """The collective (a rank program: `yield from` it), recording one enclosing slice named
    `op` (default: the function's name) per call; its return value is the collective's.

    Without a trace (or with a communicator whose clock is unknown) a call returns the
    collective's own generator, so that no extra generator frame sits between the collective
    and the engine; with one, a generator that records the slice around it. The wrapper has
    the collective's own parameters (`_same_signature`): forwarding `*args, **kwargs` costs
    about 0.6 µs a call, a few % of a 4 KiB all-reduce on `processes`.

    `sign(comm, *args)`, if given, returns the communicator the collective runs on (the
    collectives' signature tags: dsml.collectives.signatures); the clock stays `comm`'s."""
    name = op or collective.__name__

    def spanned(comm, clock, args, kwargs=None):
        start = yield clock.now()
        result = yield from collective(comm, *args, **(kwargs or {}))
        payload = args[0] if args else None
        yield Span(name, start, payload_nbytes(payload) if payload is not None else 0)
        return result

    # A generator is named after its function: errors about it name the collective.
    spanned.__name__, spanned.__qualname__ = collective.__name__, collective.__qualname__
    return functools.wraps(collective)(_same_signature(collective, spanned, sign))


def _same_signature(collective, spanned, sign=None):
    """`call(comm, ...)` with the parameters (and defaults) of `collective`: the collective's
    generator when the communicator records no trace, else `spanned(comm, clock, args)`, the
    arguments after `comm` passed by position. A collective whose parameters are not all plain
    (positional or keyword), or whose names the generated code uses, gets a `*args, **kwargs`
    wrapper instead."""
    params = list(inspect.signature(collective).parameters.values())
    taken = {"clock", "Comm", "clock_of", "collective", "spanned", "sign"}
    if not params or any(p.kind is not p.POSITIONAL_OR_KEYWORD or p.name in taken
                         or p.name.startswith("_default_") for p in params):
        def call(comm, *args, **kwargs):
            clock = comm if type(comm) is Comm else clock_of(comm)
            runs_on = comm if sign is None else sign(comm, *args, *kwargs.values())
            if clock is None or not clock.tracing:    # no trace, or not a communicator we know
                return collective(runs_on, *args, **kwargs)
            return spanned(runs_on, clock, args, kwargs)
        return call
    names = [p.name for p in params]
    defaults = {f"_default_{p.name}": p.default for p in params if p.default is not p.empty}
    head = ", ".join(p.name if p.default is p.empty else f"{p.name}=_default_{p.name}"
                     for p in params)
    comm, rest = names[0], ", ".join(names[1:])
    runs_on = comm if sign is None else f"sign({', '.join(names)})"
    source = (f"def call({head}):\n"
              f"    clock = {comm} if type({comm}) is Comm else clock_of({comm})\n"
              f"    if clock is None or not clock.tracing:\n"
              f"        return collective({', '.join([runs_on] + names[1:])})\n"
              f"    return spanned({runs_on}, clock, ({rest + ',' if rest else ''}))\n")
    namespace = {"Comm": Comm, "clock_of": clock_of, "collective": collective,
                 "spanned": spanned, "sign": sign, **defaults}
    exec(source, namespace)
    return namespace["call"]
