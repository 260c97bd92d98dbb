"""Generated from notebooks/week1_foundations_and_communication.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 27
import numbers
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dsml.utils import add_to_class

# Size charged for the envelope of a structured message (a tuple or dict of arrays and
# scalars), on top of its arrays; each scalar counts 8 bytes. A bare array costs its nbytes.
STRUCT_HEADER_BYTES = 16
SCALAR_BYTES = 8


class SizeOnly:
    """A payload that has a size but no data: lets 1,000-rank simulations run without
    allocating the arrays. Real engines send it as a tiny object."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int):
        if type(nbytes) is int and nbytes >= 0:       # fast path: scale runs make millions
            self.nbytes = nbytes
            return
        if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes < 0:
            raise ValueError(f"SizeOnly nbytes must be an integer ≥ 0, got {nbytes!r}")
        self.nbytes = int(nbytes)

    def __repr__(self):
        return f"SizeOnly({self.nbytes})"

    def copy(self) -> "SizeOnly":
        return self                                   # immutable, like a number

    def __eq__(self, other):
        return isinstance(other, SizeOnly) and other.nbytes == self.nbytes

    def __hash__(self):
        return hash(("SizeOnly", self.nbytes))


# -- cell 28
_SCALARS = (bool, numbers.Number, np.generic, str, type(None))
_PAYLOAD_RULE = ("a payload must be a NumPy array, a SizeOnly placeholder, or a "
                 "tuple/list/dict of arrays and scalars")


def payload_nbytes(payload: Any) -> int:
    """Bytes a payload occupies on the wire (see STRUCT_HEADER_BYTES)."""
    kind = type(payload)
    if kind is np.ndarray or kind is SizeOnly:      # the common case, checked cheaply first
        return payload.nbytes
    if isinstance(payload, (np.ndarray, SizeOnly)):
        return payload.nbytes
    return STRUCT_HEADER_BYTES + _struct_nbytes(payload)


def _struct_nbytes(payload: Any) -> int:
    if isinstance(payload, (np.ndarray, SizeOnly)):
        return payload.nbytes
    if isinstance(payload, (tuple, list)):
        return sum(_struct_nbytes(item) for item in payload)
    if isinstance(payload, dict):
        return sum(_struct_nbytes(key) + _struct_nbytes(value) for key, value in payload.items())
    if isinstance(payload, str):
        return len(payload.encode())
    if isinstance(payload, _SCALARS):
        return SCALAR_BYTES
    hint = (" (a collective called without `yield from`?)"
            if isinstance(payload, types.GeneratorType) else "")
    raise TypeError(f"{_PAYLOAD_RULE}; got {type(payload).__name__}{hint}")


def snapshot(payload: Any) -> Any:
    """A copy of the payload as it is now, so that later changes to the sender's
    arrays do not change what was sent (the semantics of a buffered send)."""
    if type(payload) is SizeOnly:
        return payload
    if isinstance(payload, np.ndarray):
        return payload.copy()
    if isinstance(payload, tuple):
        return tuple(snapshot(item) for item in payload)
    if isinstance(payload, list):
        return [snapshot(item) for item in payload]
    if isinstance(payload, dict):
        return {key: snapshot(value) for key, value in payload.items()}
    if isinstance(payload, (SizeOnly,) + _SCALARS):
        return payload
    raise TypeError(f"{_PAYLOAD_RULE}; got {type(payload).__name__}")


# -- cell 30
from dsml.comm.tags import tag_words   # "tag 7", or with a meaning a later layer gave it


class Request:
    """Something a rank program yields; an engine decides what it costs and does."""
    __slots__ = ()


# Requests that later weeks add (week 3: comm.spawn, comm.join) register here, type -> role
# ("spawn"), and every engine looks them up: additions to the vocabulary, not rewrites.
ADDED_REQUESTS: dict = {}


def request_choices() -> str:
    """The requests a rank program may yield, for the error that says it yielded something else."""
    added = sorted(set(ADDED_REQUESTS.values()))
    return ("comm.send(...), comm.recv(...), comm.sendrecv(...), comm.compute(...), "
            "comm.combine(...), comm.now()" + "".join(f", comm.{role}(...)" for role in added))


class Send(Request):
    """Send `payload` to rank `dst`. Eager: completes when the message has left, without
    waiting for the matching receive."""
    __slots__ = ("dst", "payload", "tag", "nbytes")

    def __init__(self, dst, payload, tag, nbytes):
        self.dst, self.payload, self.tag, self.nbytes = dst, payload, tag, nbytes

    def describe(self):
        return f"waits to finish sending {self.nbytes} B to rank {self.dst} ({tag_words(self.tag)})"


class Recv(Request):
    """Receive the next message from rank `src` with tag `tag`; the result is its payload."""
    __slots__ = ("src", "tag")

    def __init__(self, src, tag):
        self.src, self.tag = src, tag

    def describe(self):
        return f"waits for a message from rank {self.src} ({tag_words(self.tag)})"


class SendRecv(Request):
    """Send to `dst` and receive from `src` at the same time; the result is what arrived.
    The idiom for exchanges: it cannot deadlock on a ring, whatever the engine."""
    __slots__ = ("dst", "payload", "src", "tag", "nbytes")

    def __init__(self, dst, payload, src, tag, nbytes):
        self.dst = dst
        self.payload = payload
        self.src = src
        self.tag = tag
        self.nbytes = nbytes

    def describe(self):
        return (f"waits in sendrecv for a message from rank {self.src} ({tag_words(self.tag)}) "
                f"while sending to rank {self.dst}")


# -- cell 32
class Compute(Request):
    """Spend `seconds` computing. The simulator advances time; real engines do nothing,
    since there the computation is the code itself."""
    __slots__ = ("seconds",)

    def __init__(self, seconds):
        self.seconds = seconds

    def describe(self):
        return f"computes for {self.seconds} s"


class Now(Request):
    """Ask for the current time (s): simulated time on the simulator, seconds since the common
    start on real engines. Lets a rank program time its own phases, as benchmarks do."""
    __slots__ = ()

    def describe(self):
        return "reads the clock"


class Combine(Request):
    """Charge the reduction of `nbytes` bytes (adding a received block into one's own): the
    simulator spends γ·nbytes, with γ (s/B) from the network model; real engines do nothing,
    since there the reduction is the NumPy code itself. Collectives yield it (week 2)."""
    __slots__ = ("nbytes",)

    def __init__(self, nbytes):
        self.nbytes = nbytes

    def describe(self):
        return f"combines {self.nbytes} B"


# -- cell 34
class Comm:
    """A rank's view of the world: who it is, how many there are, and the requests it can make.

    The methods only build requests; nothing happens until the rank program yields one.
    """

    def __init__(self, rank: int, size: int):
        self.rank = rank
        self.size = size

    def _peer(self, peer, role: str) -> int:
        # Fast path first: this runs for every request, millions of times in large simulations.
        if type(peer) is int and 0 <= peer < self.size and peer != self.rank:
            return peer
        if isinstance(peer, bool) or not isinstance(peer, numbers.Integral) \
                or not 0 <= peer < self.size:
            raise ValueError(f"rank {self.rank}: {role} must be a rank in 0..{self.size - 1}, "
                             f"got {peer!r}")
        if peer == self.rank:
            raise ValueError(f"rank {self.rank}: {role} is this rank itself; "
                             f"keep local data local instead of messaging yourself")
        return int(peer)

    def _tag(self, tag) -> int:
        if type(tag) is int and tag >= 0:
            return tag
        if isinstance(tag, bool) or not isinstance(tag, numbers.Integral) or tag < 0:
            raise ValueError(f"rank {self.rank}: tag must be an integer ≥ 0, got {tag!r}")
        return int(tag)

    def send(self, dst: int, payload, tag: int = 0) -> Send:
        """Request: send `payload` to `dst`; the engine snapshots it when this is yielded."""
        return Send(self._peer(dst, "dst"), payload, self._tag(tag), payload_nbytes(payload))

    def recv(self, src: int, tag: int = 0) -> Recv:
        """Request: receive from `src`; yielding it returns the payload."""
        return Recv(self._peer(src, "src"), self._tag(tag))

    def sendrecv(self, dst: int, payload, src: int, tag: int = 0) -> SendRecv:
        """Request: send `payload` to `dst` and receive from `src`; returns what arrived."""
        # The exchange is the workhorse of every collective: check the common case inline.
        size, rank = self.size, self.rank
        if not (type(dst) is int and type(src) is int and type(tag) is int and tag >= 0
                and 0 <= dst < size and 0 <= src < size and dst != rank and src != rank):
            dst, src, tag = self._peer(dst, "dst"), self._peer(src, "src"), self._tag(tag)
        if type(payload) is SizeOnly:                 # the common case at scale
            return SendRecv(dst, payload, src, tag, payload.nbytes)
        return SendRecv(dst, payload, src, tag, payload_nbytes(payload))


# -- cell 36
from dsml.validate_args import positive_number


@add_to_class(Comm)
def compute(self, seconds: float) -> Compute:
    """Request: `seconds` of computation (simulated time; a no-op on real engines)."""
    return Compute(positive_number("compute seconds", seconds, allow_zero=True))


@add_to_class(Comm)
def now(self) -> Now:
    """Request: the current time in seconds (see Now)."""
    return Now()


@add_to_class(Comm)
def combine(self, nbytes: int) -> Combine:
    """Request: the cost of reducing `nbytes` bytes (γ·nbytes simulated; free for real)."""
    if type(nbytes) is int and nbytes >= 0:
        return Combine(nbytes)
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes < 0:
        raise ValueError(f"rank {self.rank}: combine nbytes must be an integer ≥ 0, "
                         f"got {nbytes!r}")
    return Combine(int(nbytes))


# -- cell 38
class RankError(RuntimeError):
    """A rank program failed (raised, crashed, or timed out); `.rank` says which."""

    def __init__(self, rank: int, message: str):
        self.rank = rank
        super().__init__(f"rank {rank} {message}")


def start_rank(program, comm: Comm, args=(), kwargs=None):
    """Call a rank program and check that it is a generator (it must yield requests)."""
    gen = program(comm, *args, **(kwargs or {}))
    if not isinstance(gen, types.GeneratorType):
        name = getattr(program, "__name__", repr(program))
        raise TypeError(
            f"program {name} must be a generator function (a rank program that yields "
            f"requests such as comm.send(...)); calling it returned {type(gen).__name__}")
    return gen


@dataclass
class RunResult:
    """What `run` returns: per-rank values, the makespan in seconds, and the trace."""
    values: list
    time: float
    trace: Any
    engine: str
    world_size: int
    finish_times: list = field(default_factory=list)
    failed: dict = field(default_factory=dict)    # rank -> its exception (failures="notify")
