"""Plumbing (hand-written): the `processes` engine — rank programs on real OS processes.

Each rank is a child process that drives its rank program's generator (`driver.drive`, shared
with the `threads` engine). The transport:

- **Small messages** travel through one pipe per ordered pair of ranks (p·(p − 1) pipes),
  written directly by the sender — no feeder thread, no lock, since each pipe has one writer.
  A frame is an 8-byte length and a body. A bare C-contiguous array of a plain dtype — what
  collectives send — goes raw: tag, dtype code, shape, padding so that the array's bytes start
  16 bytes aligned, then its bytes (`encode_frame`), one copy each way and no pickling
  (pickling cost ~4 µs a message each way, more than the pipe). Anything else (tuples and
  dicts, object or structured dtypes, Fortran order, placeholders) is the pickled
  `(tag, payload)`. On this machine a 4 KiB message is a few µs of pipe and, before the
  small-message path, ~13 µs of Python; so the path keeps the Python per message short: the
  sender reuses the head it built for the same tag, dtype and shape (`_HEADS`), and a frame
  that a read returns whole and alone — the common case — becomes the received array in
  place, as a view of one private copy of what was read (`decode_whole`, whose head is also
  parsed once per tag, dtype and shape). `PipeTransport.recv` is the shared receive
  (`MatchingTransport.recv`) with this inline; it reads before it polls (in an exchange the
  peer's message is usually there by the time the rank's own send is out) and marks the rank
  RECEIVING in its status record only when it has to wait. Write ends are non-blocking:
  when a pipe is full, the rest of the frame (and every later frame to that rank, to keep the
  order) waits in a per-destination backlog, written out whenever the rank waits — in a
  receive, or after its program has returned. So a send never blocks and pipe buffer sizes
  never turn a correct program into a deadlock (the eager semantics of every engine).
- **The snapshot.** A send's payload is copied exactly once, by the transport: into the frame's
  bytes (or the pickle) for small messages, into the segment for large arrays — before the
  rank program runs on, which is all the snapshot semantics of a send asks.
- **Waiting.** When there are no more ranks than CPUs this process may use (Linux), each rank
  is pinned to a CPU of its own, and a waiting receive polls its pipe for SPIN (5 ms) before
  it sleeps in poll(): a wake-up through the kernel costs tens of µs, more on a virtual
  machine whose idle CPU the host has descheduled, and the core is the rank's alone anyway.
  It polls with poll() and a zero timeout (`_await`), ~0.4 µs a turn, where a read that finds
  the pipe empty raises BlockingIOError and costs ~1.7 µs.
  (With 200 µs, a 2-rank ring all-reduce of 16 MiB — ~1 ms per step, so the faster rank often
  waited longer than that and slept — took 4.86 ms against 4.40 ms with 5 ms; median of 5
  runs each, alternating.) Unpinned (more ranks than CPUs), a rank must not spin — on a shared
  core it would take the time that the peer it waits for needs — so it yields the CPU
  (sched_yield) between polls for YIELD_SPIN (200 µs), which runs a ready peer at once (a
  4-rank ring all-reduce of 4 KiB on 2 CPUs: ~210 µs instead of ~370 µs sleeping at once),
  and then sleeps.
- **Activities** (week 3, `comm.spawn`): a rank runs its activities in its own process, by
  turns (`driver._drive_activities`); when all of them wait, `_next_any` waits as a receive
  does — parse, read, spin, then poll() — on the pipes of every peer they wait for at once. A
  program that never spawns never gets there: its receives keep the one-pipe path above.
- **Large arrays** (`nbytes ≥ SHM_THRESHOLD`, 32 KiB, where a ping-pong through shared memory
  starts to beat the pipe on the development machine; anywhere in a payload, also inside
  tuples and dicts) travel through POSIX shared memory: the sender copies the array into a
  segment and sends only its name, shape and dtype through the pipe; the receiver attaches
  and hands the program a view of the segment itself — no copy on the receiving side. The
  segment stays that array's while any array made from it (slices, reshapes) is alive: a
  weak reference to the view's buffer notes when the last one is gone, and the next time the
  receiver sends or waits it acknowledges the segment (in the same write as its next frame
  to that rank, if it has one), after which the sender may reuse it for its next array to
  that rank. Each rank keeps a pool of segments per destination
  (power-of-two sizes; a new one is created only when none is free — a sender never waits
  for an acknowledgement), and the receiver keeps its attachments: a fresh segment per
  message costs page faults on both sides, about 15 times the copy itself for 1 MiB. The
  pools grow to the most bytes a rank's peer held at once and live until the run ends.
- **Memory.** Each rank asks glibc's malloc to keep what it frees (`keep_freed_memory`):
  otherwise every array of ≥ 128 KiB–32 MiB is a fresh mmap whose pages fault in again each
  time, and a collective that allocates a few blocks per step pays that as often as it copies.
- **Clean-up.** Segments are named `dsml_<parent pid>_<run>_<rank>_<n>`. After every run,
  successful or not, the parent unlinks every segment with its run's prefix: from a listing of
  /dev/shm where there is one (Linux), else by trying every name the ranks counted in a shared
  array (a rank counts a segment before creating it). A rank whose parent dies unlinks the
  segments it created (`orphaned`), and each run first sweeps the segments of parents that no
  longer exist (`sweep_segments`).

Python's resource tracker: before 3.13 every `SharedMemory` — created *or attached* —
registers with the tracker, which unlinks and warns about what is still registered when it
shuts down. The parent starts the tracker before forking, so every rank shares one; a sender
unregisters each segment it creates at once (3.13+: `track=False`), and the parent's clean-up
attaches (registering again is a no-op) and unlinks (which unregisters) every segment of the
run, so that whatever a receiver registered is unregistered and the tracker ends with nothing.
A rank never closes a segment it has mapped (`_Mapped`): arrays it handed out, or its own
cached views, may still use it when the rank ends, and the mapping goes with the process.

Start method: "fork" where the platform has it (Linux, macOS), because a rank program
defined in a notebook cell lives in the kernel's `__main__`, which a "spawn"ed child cannot
import. Set DSML_START_METHOD=spawn (or forkserver) to override; then the program and its
arguments must be importable/picklable.

BLAS threads: each child sets OMP/OPENBLAS/MKL_NUM_THREADS=1 in its environment and, since
a BLAS already loaded by the parent ignores the environment after a fork, also calls the
library's own set-threads function (OpenBLAS as NumPy's wheels bundle it, MKL, BLIS) through
ctypes. Spawned children get the variables in their environment before NumPy loads.

Failure handling: the parent waits on every child's result pipe and process sentinel with
a deadline, reading results without blocking. A rank that raises sends its traceback; a rank
that dies is noticed through its sentinel (with failures="notify" it is a failed rank, and its
peers see the end of its pipes without a goodbye frame); every 50 ms the parent asks
`driver.hopeless` whether the run can still go on, and raises the deadlock at once if not; on
timeout each unfinished rank's last request is read from a shared status array ("rank 1 waits
for a message from rank 0 (tag 0)"), and a stopped process is named. In every case all children
are killed and joined, and the run's shared-memory segments unlinked, before the error is
raised — also when SIGTERM reaches the parent. A child whose parent has gone away exits by
itself: SIGTERM from the kernel on Linux (PR_SET_PDEATHSIG), and everywhere a check of
getppid() every 50 ms while busy and every second while it waits.
"""
from __future__ import annotations

import ctypes
import itertools
import multiprocessing as mp
import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
import weakref
from collections import deque
from multiprocessing import resource_tracker
from multiprocessing.connection import wait
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from dsml.comm.api import RankError, RunResult
from dsml.comm.driver import (CHECK_EVERY, DONE, FAILED, NOT_ARRIVED, RECEIVING, RUNNING,
                              MatchingTransport, PeerGone, RankDied, RemoteFailure, Status,
                              STATUS_FIELDS, check_all_received, check_timeout, deadline_of,
                              describe_exception, drive, hopeless, make_result, rank_failed,
                              stop_children, timed_out)

SHM_THRESHOLD = 32 * 1024   # bytes: arrays this large go through shared memory
SHM_PREFIX = "dsml_"
SHM_DIR = "/dev/shm"        # where Linux shows POSIX shared memory; absent on macOS
POLL = 1.0                  # s: how often a waiting child checks that its parent is alive
ORPHANED = 70               # exit code of a rank whose parent has gone
SPIN = 5e-3                 # s: how long a pinned rank's receive polls its pipe before sleeping
YIELD_SPIN = 200e-6         # s: the same without a core of its own (sched_yield between polls)
READ_SIZE = 1 << 18         # bytes asked of a pipe per read
MMAP_THRESHOLD = 1 << 30    # bytes: smaller allocations come from (and go back to) the heap
_FRAME = struct.Struct("<Q")
_run_ids = itertools.count()
_BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def start_method() -> str:
    """The multiprocessing start method used (see the module docstring)."""
    method = os.environ.get("DSML_START_METHOD")
    if method:
        if method not in mp.get_all_start_methods():
            raise ValueError(f"DSML_START_METHOD must be one of {mp.get_all_start_methods()}, "
                             f"got {method!r}")
        return method
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"


# --- shared memory ----------------------------------------------------------------------------

class ShmRef:
    """Stands in a pickled payload for an array that waits in a shared-memory segment."""
    __slots__ = ("name", "shape", "dtype")

    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, shape, dtype

    def __reduce__(self):
        return ShmRef, (self.name, self.shape, self.dtype)


class _Mapped(SharedMemory):
    """A segment this rank has mapped: one of its own, or a peer's it attached. Arrays may
    still be views of it when the rank ends — the sender's cached views of its own segments,
    arrays received from a peer's (a failed rank's traceback holds them) — and closing then
    raises BufferError, which would be printed from __del__. The mapping goes with the process
    anyway."""

    def __del__(self):
        try:
            self.close()
        except BufferError:
            pass


if sys.version_info >= (3, 13):
    def _create_segment(name, size):
        return _Mapped(name, create=True, size=size, track=False)
else:
    def _create_segment(name, size):
        segment = _Mapped(name, create=True, size=size)
        # The receiver owns it from now on; the sender's registration would otherwise stay
        # with the tracker and be "cleaned up" (with a warning) when the run is over.
        resource_tracker.unregister(segment._name, "shared_memory")
        return segment


class Segments:
    """One rank's side of the shared-memory path.

    Sending: `put(dst, array)` copies the array into a segment of this rank's pool for `dst`
    and returns the ShmRef to send. Segments come in power-of-two sizes; one is reused once
    the receiver has said (an ACK frame) that it is done with the array, and a new one is
    created when none is free. Receiving: `take(src, ref)` attaches (once per segment) and
    returns the array as a view of the segment — no copy; when the program has dropped every
    array made from it, the segment is listed for the transport to acknowledge.
    """

    def __init__(self, prefix: str, rank: int, created):
        self.prefix = f"{prefix}{rank}_"
        self.rank = rank
        self.created = created     # shared counter per rank: the parent can find every name
        self.owned = {}            # name -> (dst, size, SharedMemory) of this rank's segments
        self.free = {}             # (dst, size) -> names acknowledged by their receiver
        self.attached = {}         # name -> SharedMemory of a peer's segment
        self.returned = []         # (src, name): received arrays that are gone (see take)
        self.views = {}            # name -> the last view of this rank's segment it copied into
        self.watched = {}          # id -> (weak reference to a received array's buffer, src, name)

    def reusable(self, dst, nbytes) -> bool:
        return bool(self.free.get((dst, _size_class(nbytes))))

    def put(self, dst, array: np.ndarray) -> ShmRef:
        size = _size_class(array.nbytes)
        free = self.free.get((dst, size))
        if free:
            name = free.pop()
            segment = self.owned[name][2]
        else:
            n = self.created[self.rank]
            self.created[self.rank] = n + 1     # counted before it exists, so never missed
            name = f"{self.prefix}{n}"
            segment = _create_segment(name, size)
            self.owned[name] = (dst, size, segment)
        # The view of the segment that the copy goes into is kept for the next message of the
        # same shape and dtype through this segment (the common case: a collective's steps),
        # which saves making an array on the segment's buffer for each one.
        view = self.views.get(name)
        if view is None or view.shape != array.shape or view.dtype != array.dtype:
            view = self.views[name] = np.ndarray(array.shape, array.dtype, buffer=segment.buf)
        np.copyto(view, array, casting="no")
        return ShmRef(name, array.shape, array.dtype)

    def release(self, name) -> None:
        """The receiver is done with the array in segment `name`: it can be reused."""
        dst, size, _ = self.owned[name]
        self.free.setdefault((dst, size), []).append(name)

    def take(self, src, ref: ShmRef) -> np.ndarray:
        """The array in a peer's segment, as a view of the segment itself: no copy. The
        segment stays the array's until the last array made from it is gone; then the weak
        reference's callback lists it in `returned`, and the transport acknowledges it to
        `src`."""
        segment = self.attached.get(ref.name)
        if segment is None:
            segment = self.attached[ref.name] = _Mapped(ref.name)
        count = 1
        for extent in ref.shape:
            count *= extent
        window = segment.buf[:count * ref.dtype.itemsize]
        array = np.frombuffer(window, ref.dtype, count)
        del window
        # NumPy's base for the array (and for every view of it) is a memoryview made for
        # this message alone: when it dies, no array of this message is left.
        reference = weakref.ref(array.base, self._gone)
        self.watched[id(reference)] = (reference, src, ref.name)
        return array.reshape(ref.shape)

    def _gone(self, reference) -> None:
        # Looks up self.returned when called: take_returned() replaces the list.
        _, src, name = self.watched.pop(id(reference))
        self.returned.append((src, name))

    def encode(self, payload, dst, make_room):
        """The payload with every large array replaced by a ShmRef to a segment holding it;
        `make_room(dst, nbytes)` is called first when no segment is free for an array."""
        kind = type(payload)
        if kind is np.ndarray:
            if payload.nbytes >= SHM_THRESHOLD and not payload.dtype.hasobject:
                if not self.reusable(dst, payload.nbytes):
                    make_room(dst, payload.nbytes)
                return self.put(dst, payload)
            return payload
        if kind is tuple:
            return tuple(self.encode(item, dst, make_room) for item in payload)
        if kind is list:
            return [self.encode(item, dst, make_room) for item in payload]
        if kind is dict:
            return {key: self.encode(value, dst, make_room) for key, value in payload.items()}
        return payload

    def decode(self, payload, src):
        """The payload with every ShmRef (from `src`) replaced by its array (see `take`)."""
        kind = type(payload)
        if kind is ShmRef:
            return self.take(src, payload)
        if kind is tuple:
            return tuple(self.decode(item, src) for item in payload)
        if kind is list:
            return [self.decode(item, src) for item in payload]
        if kind is dict:
            return {key: self.decode(value, src) for key, value in payload.items()}
        return payload

    def _returned(self, src, name) -> None:
        # Looks up self.returned when called: take_returned() replaces the list.
        self.returned.append((src, name))

    def take_returned(self) -> dict:
        """src -> names of its segments whose arrays are all gone since the last call."""
        returned, self.returned = self.returned, []
        by_source = {}
        for src, name in returned:
            by_source.setdefault(src, []).append(name)
        return by_source


def _size_class(nbytes: int) -> int:
    """Segment size for an array of nbytes: the next power of two (at least a page)."""
    return max(4096, 1 << (int(nbytes) - 1).bit_length())


def unlink_segments(prefix: str, created) -> list[str]:
    """Unlink every segment whose name starts with `prefix`; return their names.

    Attaching before unlinking keeps the resource tracker's books straight: whatever a killed
    rank left registered is registered once more (a no-op) and then unregistered."""
    if os.path.isdir(SHM_DIR):
        names = [name for name in os.listdir(SHM_DIR) if name.startswith(prefix)]
    else:
        names = [f"{prefix}{rank}_{i}" for rank, count in enumerate(created)
                 for i in range(count)]
    unlinked = []
    for name in names:
        try:
            segment = SharedMemory(name)
        except FileNotFoundError:
            continue
        except ValueError:          # created but never sized: its creator was killed
            try:
                import _posixshmem
                _posixshmem.shm_unlink("/" + name)
                unlinked.append(name)
            except (ImportError, OSError):
                pass
            continue
        segment.close()
        segment.unlink()
        unlinked.append(name)
    return unlinked


# --- pipes ------------------------------------------------------------------------------------

_ACK = -2      # frame tag: "I am done with the arrays in these segments of yours" (names)
_BYE = -4      # frame tag: "my program has returned" (failures="notify": end of file is death)

# A frame is its length (8 bytes) and a body whose first byte says how to read the rest:
_PICKLED = 0   # pickle of (tag, payload): structured messages, anything unusual
_RAW = 1       # a bare array: tag, ndim, dtype code, shape, then its bytes as they are in memory
_REF = 2       # a bare array in shared memory: tag, ndim, dtype code, segment name, shape
_NAMES = 3     # an acknowledgement: the names of the segments, one a line
_PICKLED_HEAD = struct.Struct("<QB")
_TAG = struct.Struct("<q")
_RAW_HEAD = struct.Struct("<QBqBB")   # frame length, kind, tag, ndim, length of the dtype code
_REF_HEAD = struct.Struct("<QBqBBB")  # ... and the length of the segment's name
_DIMS = [struct.Struct(f"<{ndim}q") for ndim in range(64 + 1)]
_BIG_TAG = 1 << 63  # tags outside ±2**63 do not fit the raw headers: such frames are pickled
_DTYPE_CODES = {}   # dtype -> its code (dtype.str as bytes), or None if it cannot go raw
_DTYPES = {}        # code -> dtype
# A raw frame's head is padded so that the array's bytes start _ALIGN bytes into the frame (a
# multiple of every item size): a frame read whole into a buffer of its own is an aligned array.
_ALIGN = 16
# The small-message path caches both ends of a raw frame's head, since a collective sends the
# same tag, dtype and shape again and again (building or parsing a head costs more than the
# pipe): _HEADS, (tag, dtype, shape) -> the head, for arrays below SHM_THRESHOLD; _FORMATS,
# a head's bytes after the kind byte -> (tag, dtype, shape). Each holds at most _CACHED.
_HEADS = {}
_FORMATS = {}
_CACHED = 1024


def _dtype_code(dtype):
    """dtype.str as bytes, if that describes the dtype completely (no fields, no objects,
    no sub-arrays, items of at least one byte); else None and the array is pickled."""
    try:
        return _DTYPE_CODES[dtype]
    except KeyError:
        pass
    text = dtype.str
    code = None
    if not dtype.hasobject and dtype.names is None and dtype.itemsize > 0 \
            and dtype.subdtype is None and np.dtype(text) == dtype:
        code = text.encode()
        _DTYPES[code] = np.dtype(text)
    _DTYPE_CODES[dtype] = code
    return code


def encode_frame(tag, payload) -> bytes:
    """The frame for one message. A C-contiguous array of a plain dtype (the common message
    of a collective) goes raw — a header and its bytes, one copy and no pickling; so do a
    bare reference to a segment and an acknowledgement; anything else is pickled (protocol
    5: NumPy keeps non-native byte orders there)."""
    kind = type(payload)
    if not -_BIG_TAG <= tag < _BIG_TAG:       # any integer tag ≥ 0 works, as on every engine
        kind = None
    if kind is np.ndarray and payload.flags.c_contiguous:
        head = _HEADS.get((tag, payload.dtype, payload.shape))
        if head is None:
            head = _raw_head(tag, payload.dtype, payload.shape, payload.nbytes)
        if head is not None:
            # A C-contiguous array hands its bytes to join() through the buffer protocol.
            return b"".join((head, payload))
    elif kind is ShmRef:
        code = _dtype_code(payload.dtype)
        if code is not None and len(payload.shape) <= 64:
            ndim, name = len(payload.shape), payload.name.encode()
            size = _REF_HEAD.size - 8 + len(code) + len(name) + 8 * ndim
            return b"".join((_REF_HEAD.pack(size, _REF, tag, ndim, len(code), len(name)), code,
                             name, _DIMS[ndim].pack(*payload.shape)))
    elif tag == _ACK and kind is not None:
        body = "\n".join(payload).encode()
        return _PICKLED_HEAD.pack(len(body) + 1, _NAMES) + body
    body = pickle.dumps((tag, payload), protocol=5)
    return _PICKLED_HEAD.pack(len(body) + 1, _PICKLED) + body


def _head_size(ndim: int, code_size: int) -> int:
    """Bytes of a raw frame's head (length included) before the array's bytes: padded to
    _ALIGN."""
    size = _RAW_HEAD.size + code_size + 8 * ndim
    return size + -size % _ALIGN


def _raw_head(tag, dtype, shape, nbytes):
    """The head of the raw frame of an array (None if its dtype cannot go raw); kept in
    _HEADS for arrays small enough to go through the pipe."""
    code = _dtype_code(dtype)
    if code is None or len(shape) > 64:
        return None
    ndim = len(shape)
    start = _head_size(ndim, len(code))
    described = _RAW_HEAD.size + len(code) + 8 * ndim
    head = b"".join((_RAW_HEAD.pack(start - 8 + nbytes, _RAW, tag, ndim, len(code)), code,
                     _DIMS[ndim].pack(*shape), bytes(start - described)))
    if nbytes < SHM_THRESHOLD:
        if len(_HEADS) >= _CACHED:
            _HEADS.clear()
        _HEADS[(tag, dtype, tuple(shape))] = head
    return head


def _dtype_of(code: bytes) -> np.dtype:
    """The dtype a frame's dtype code names (cached: decoding a name costs microseconds)."""
    dtype = _DTYPES.get(code)
    if dtype is None:
        dtype = _DTYPES[code] = np.dtype(code.decode())
    return dtype


def decode_frame(buf, pos, size):
    """(tag, payload) of the frame whose body is buf[pos + 8 : pos + 8 + size]."""
    kind = buf[pos + 8]
    if kind == _RAW:
        _, _, tag, ndim, code_size = _RAW_HEAD.unpack_from(buf, pos)
        at = pos + _RAW_HEAD.size
        dtype = _dtype_of(bytes(buf[at:at + code_size]))
        shape = _DIMS[ndim].unpack_from(buf, at + code_size)
        at = pos + _head_size(ndim, code_size)
        count = (pos + 8 + size - at) // dtype.itemsize
        if not count:
            return tag, np.empty(shape, dtype)
        # A copy the program owns: the read buffer is reused for the next frames.
        return tag, np.frombuffer(buf, dtype, count, at).reshape(shape).copy()
    if kind == _REF:
        _, _, tag, ndim, code_size, name_size = _REF_HEAD.unpack_from(buf, pos)
        at = pos + _REF_HEAD.size
        dtype = _dtype_of(bytes(buf[at:at + code_size]))
        at += code_size
        name = buf[at:at + name_size].decode()
        shape = _DIMS[ndim].unpack_from(buf, at + name_size)
        return tag, ShmRef(name, shape, dtype)
    if kind == _NAMES:
        return _ACK, buf[pos + 9:pos + 8 + size].decode().split("\n")
    with memoryview(buf) as view:
        return pickle.loads(view[pos + 9:pos + 8 + size])


def decode_whole(chunk: bytes):
    """(tag, array) of a raw frame that is the whole of `chunk` (bytes, as read), the common
    case of a small message: the array is a view of one private copy of the chunk — aligned,
    writable, its own — with its head parsed once per (tag, dtype, shape) (`_FORMATS`)."""
    start = (_RAW_HEAD.size + _ALIGN - 1 + chunk[18] + 8 * chunk[17]) & -_ALIGN  # _head_size
    known = _FORMATS.get(chunk[9:start])
    if known is None:
        ndim, code_size, at = chunk[17], chunk[18], _RAW_HEAD.size
        dtype = _dtype_of(chunk[at:at + code_size])
        shape = _DIMS[ndim].unpack_from(chunk, at + code_size)
        (tag,) = _TAG.unpack_from(chunk, 9)
        if len(_FORMATS) >= _CACHED:
            _FORMATS.clear()
        known = _FORMATS[chunk[9:start]] = (tag, dtype, shape)
    tag, dtype, shape = known
    return tag, np.ndarray(shape, dtype, bytearray(chunk), start)


class PipeTransport(MatchingTransport):
    """A rank's ends of the pipes: one in from every peer, one out to every peer."""

    def __init__(self, rank, status, readers: dict, writers: dict, segments: Segments):
        super().__init__(rank, status)
        self.readers = readers                   # src -> fd (non-blocking)
        self.writers = writers                   # dst -> fd (non-blocking)
        self.dst_of = {fd: dst for dst, fd in writers.items()}
        self.segments = segments
        self.inbuf = {src: bytearray() for src in readers}
        self.inpos = dict.fromkeys(readers, 0)
        self.backlog = {dst: deque() for dst in writers}
        self.pending = set()                     # destinations with a backlog
        self.parent = os.getppid()
        self.finished = set()                    # peers that said goodbye (failures="notify")
        self.polls = {}                          # src -> poll() of a poll object on its pipe
        for src, fd in readers.items():
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            self.polls[src] = poller.poll
        self.state_at = rank * STATUS_FIELDS     # this rank's status record, in self.cells
        # Spin hard only when this rank has a core of its own (pinned): on a core it shares
        # with a peer, spinning would take the time that peer needs to send what we wait
        # for. Without one, give the CPU away between polls (sched_yield), so that a peer
        # that is ready runs at once, and poll again when the scheduler comes back.
        pinned = _pin_to_own_core(rank, len(writers) + 1)
        self.pause = None if pinned else getattr(os, "sched_yield", None)
        self.spin = SPIN if pinned else YIELD_SPIN if self.pause is not None else 0.0

    # sending
    def send(self, dst, tag, payload):
        head = None
        if type(payload) is np.ndarray and payload.flags.c_contiguous:
            # The small-message path: a head cached for this tag, dtype and shape (only
            # arrays below SHM_THRESHOLD have one), then the array's bytes.
            head = _HEADS.get((tag, payload.dtype, payload.shape))
        if head is not None:
            frame = b"".join((head, payload))
        else:
            frame = encode_frame(tag, self.segments.encode(payload, dst, self._make_room))
        self.cells[self.sent_at] += 1        # counted before it can be taken
        if self.segments.returned:
            frame = self._acknowledge(dst) + frame       # one write for both
        if self.pending:                     # a backlog, to dst or another: keep the order
            self._send_frame(dst, frame)
            return
        try:
            written = os.write(self.writers[dst], frame)
        except BlockingIOError:
            written = 0
        except BrokenPipeError:              # dst has gone (the parent reports why)
            return
        if written < len(frame):
            self.backlog[dst].append(memoryview(frame)[written:])
            self.pending.add(dst)

    def _acknowledge(self, dst=None) -> bytes:
        """Tell each peer which of its segments this rank's program is done with; the frame
        for `dst` is returned instead, for the caller to send with its own."""
        for_dst = b""
        for src, names in self.segments.take_returned().items():
            if src == dst:
                for_dst = encode_frame(_ACK, names)
            else:
                self._send_frame(src, encode_frame(_ACK, names))
        return for_dst

    def _send_frame(self, dst, frame):
        if dst in self.pending and not self._flush(dst):
            self.backlog[dst].append(frame)
            return
        written = self._write_some(dst, frame)
        if written is not None and written < len(frame):
            self.backlog[dst].append(memoryview(frame)[written:])
            self.pending.add(dst)

    def _write_some(self, dst, data) -> int | None:
        """Write as much of `data` as the channel to dst takes now, without waiting: the
        number of bytes written, or None if dst is gone (the parent reports why)."""
        try:
            return os.write(self.writers[dst], data)
        except BlockingIOError:
            return 0
        except BrokenPipeError:
            return None

    def _make_room(self, dst, nbytes):
        """No segment for dst is free: read what dst has sent so far (without waiting), so
        that its acknowledgements free ours; its messages go to the stash, in order."""
        if self._fill(dst):
            while True:
                frame = self._parse(dst)
                if frame is None:
                    break
                tag, payload = frame
                self.cells[self.taken_at] += 1
                self.stash(dst, tag, payload)

    def _flush(self, dst) -> bool:
        """Write as much of dst's backlog as the channel takes now; True if it is all out."""
        backlog = self.backlog[dst]
        while backlog:
            data = backlog[0]
            written = self._write_some(dst, data)
            if written is None:
                backlog.clear()
                break
            if written < len(data):
                backlog[0] = data[written:]
                return False
            backlog.popleft()
        self.pending.discard(dst)
        return True

    def send_notice(self, dst, error):
        """A failure notice (failures="notify"), after this rank's earlier frames to dst."""
        self.cells[self.sent_at] += 1
        self._send_frame(dst, encode_frame(FAILED, portable(error)))

    def say_goodbye(self) -> None:
        """This rank's program has returned (failures="notify"): tell every peer, after its
        last message, so that the end of file that follows is not taken for a death."""
        for dst in self.writers:
            self._send_frame(dst, encode_frame(_BYE, None))

    def died(self, src):
        """src's pipe is at its end with no goodbye and no failure notice (failures="notify"):
        src died. The FAILED notice that stands for it, as `_next` returns one; it was never
        sent, so it is not counted as taken either."""
        self.cells[self.taken_at] -= 1
        return (src, FAILED, RankDied(f"rank {src}'s process ended without a result"))

    def gone(self, src) -> bool:
        """True if src's end of file means it died (see `died`)."""
        return self.notify and src not in self.finished and src not in self.failed

    def checkpoint(self):
        """A busy rank checks that its parent is still there (see `orphaned`)."""
        if os.getppid() != self.parent:
            orphaned()

    def finish(self):
        """After the program has returned: deliver what is still in the backlogs."""
        while self.pending:
            self._wait(None)

    # receiving
    def _parse(self, src):
        """The next complete (tag, payload) frame from src already read, or None.
        Acknowledgements are handled here; arrays in shared memory come out as views of
        their segments (see Segments.take)."""
        buf = self.inbuf[src]
        while True:
            pos = self.inpos[src]
            available = len(buf) - pos
            if available < 8:
                return None
            (size,) = _FRAME.unpack_from(buf, pos)
            if available < 8 + size:
                return None
            tag, payload = decode_frame(buf, pos, size)
            pos += 8 + size
            if pos == len(buf):
                buf.clear()
                pos = 0
            self.inpos[src] = pos
            if tag == _ACK:
                for name in payload:
                    self.segments.release(name)
                continue
            if tag == _BYE:
                self.finished.add(src)
                continue
            if type(payload) is not np.ndarray:
                payload = self.segments.decode(payload, src)
            return tag, payload

    def _fill(self, src):
        """Read what src's pipe holds now, without waiting: True if something came, False
        if nothing has, None if src's end is closed (it died)."""
        buf, pos = self.inbuf[src], self.inpos[src]
        if pos:
            del buf[:pos]
            self.inpos[src] = 0
        try:
            chunk = os.read(self.readers[src], READ_SIZE)
        except BlockingIOError:
            return False
        if not chunk:
            return None
        buf += chunk
        return True

    def recv(self, src, tag):
        """MatchingTransport.recv, with the pipe's small-message path inline: a frame that
        arrives whole and alone is decoded straight from what `os.read` returned
        (`decode_whole`); the status record says RECEIVING only once the rank has to wait."""
        early = self.early_payload(src, tag)
        if early is not NOT_ARRIVED:
            return early
        cells, at = self.cells, self.state_at
        waiting = False
        while True:
            frame = self._take(src)
            if frame is None:
                if not waiting:
                    # Peer and tag before the state, so that a report never shows stale ones.
                    cells[at + 1], cells[at + 2], cells[at] = src, tag, RECEIVING
                    waiting = True
                self._await(src)
                continue
            got_tag, payload = frame
            if got_tag == tag or got_tag == FAILED:
                # RUNNING before the count: the parent reads counts, states, counts again
                # (`hopeless`), so it never sees this rank waiting with its message taken.
                if waiting:
                    cells[at] = RUNNING
                cells[self.taken_at] += 1
                if got_tag == tag:
                    return payload
                self.note_failure(src, payload)
                raise PeerGone(src, payload)
            cells[self.taken_at] += 1          # still waiting: a message for later
            self.stash(src, got_tag, payload)

    def _take(self, src):
        """The next (tag, payload) from src: a whole frame already read, else what its pipe
        holds now; None if no whole frame is there yet. When src's process has ended: the
        FAILED notice of `died` if that means it died, else None after a wait (the parent
        ends the run). (It reads without polling first: in an exchange the peer's message is
        usually there by the time the rank's own send is out.)"""
        buf = self.inbuf[src]
        if buf:                              # bytes read before: frames first, in order
            frame = self._parse(src)
            if frame is not None:
                return frame
        try:
            chunk = os.read(self.readers[src], READ_SIZE)
        except BlockingIOError:
            return None
        if not chunk:                        # src's process has ended
            if self.gone(src):
                return self.died(src)[1:]
            self._wait(None)
            return None
        if not buf and len(chunk) > 8 and chunk[8] == _RAW \
                and len(chunk) == 8 + _FRAME.unpack_from(chunk)[0]:
            return decode_whole(chunk)       # one whole raw frame: the common case
        pos = self.inpos[src]
        if pos:
            del buf[:pos]
            self.inpos[src] = 0
        buf += chunk
        return self._parse(src)

    def _await(self, src) -> bool:
        """Wait until src's pipe has something to read (or has ended) and return True: poll
        it without waiting — cheaper than a read that fails — for `spin` seconds, then sleep
        in poll() (`_wait`; False if that returned for another reason). First acknowledge
        segments the program is done with: the peer may want them back."""
        if self.segments.returned:
            self._acknowledge()
        poll = self.polls[src]
        if self.spin:
            # Poll a little before sleeping: a wake-up through the kernel costs tens of µs.
            clock, pause = time.perf_counter, self.pause
            until = clock() + self.spin
            while True:
                if poll(0):
                    return True
                if clock() >= until:
                    break
                if pause is not None:
                    pause()
        elif poll(0):
            return True
        self._wait(self.readers[src])
        return False

    def _next(self, src):
        while True:
            frame = self._take(src)
            if frame is not None:
                return (src,) + frame
            self._await(src)

    def _next_any(self, sources):
        """The next message from any of `sources` (a set of ranks: the peers that a rank's
        activities wait for, week 3), as `_next` waits for one: parse what is already read,
        read what the pipes hold, spin, then sleep in poll() on all of their pipes at once.
        With no source (every activity waits in join) it only waits, writing out backlogs,
        until the parent ends the run."""
        if len(sources) == 1:
            for src in sources:
                return self._next(src)
        sources = sorted(sources)
        closed = set()                # sources whose sender has gone (end of file)
        while True:
            for src in sources:
                frame = self._parse(src)
                if frame is not None:
                    return (src,) + frame
            got = self._fill_any(sources, closed)
            for src in closed:
                if self.gone(src):
                    return self.died(src)
            if not got and self.segments.returned:
                self._acknowledge()
            if not got and self.spin and sources:
                until = time.perf_counter() + self.spin
                pause = self.pause
                while not got and time.perf_counter() < until:
                    if pause is not None:
                        pause()
                    got = self._fill_any(sources, closed)
            if not got:
                self._wait(None, [self.readers[src] for src in sources if src not in closed])

    def _fill_any(self, sources, closed) -> bool:
        """`_fill` every source not known to be closed: True if anything came from any."""
        got = False
        for src in sources:
            if src not in closed:
                filled = self._fill(src)
                if filled:
                    got = True
                elif filled is None:
                    closed.add(src)
        return got

    def _wait(self, fd, more=()):
        """Block until `fd` (if given) or one of the descriptors in `more` is readable, or
        a backlogged pipe has room, writing out backlogs meanwhile; give up after POLL
        seconds to check on the parent."""
        poller = select.poll()
        if fd is not None:
            poller.register(fd, select.POLLIN)
        for other in more:
            poller.register(other, select.POLLIN)
        for dst in self.pending:
            poller.register(self.writers[dst], select.POLLOUT)
        ready = poller.poll(POLL * 1000)
        if not ready and os.getppid() != self.parent:
            orphaned()
        for ready_fd, _ in ready:
            dst = self.dst_of.get(ready_fd)
            if dst is not None and ready_fd != fd:
                self._flush(dst)



def _pin_to_own_core(rank: int, size: int) -> bool:
    """Bind this process to one CPU of those it may use, a different one for each rank, when
    there are enough (Linux); True if it is now bound."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    cpus = sorted(os.sched_getaffinity(0))
    if size > len(cpus):
        return False
    try:
        os.sched_setaffinity(0, {cpus[rank]})
    except OSError:
        return False
    return True


# --- BLAS threads -----------------------------------------------------------------------------

_BLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                 "openblas_set_num_threads64_", "openblas_set_num_threads",
                 "MKL_Set_Num_Threads", "bli_thread_set_num_threads")
_BLAS_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
                 "openblas_get_num_threads64_", "openblas_get_num_threads",
                 "MKL_Get_Max_Threads", "bli_thread_get_num_threads")


def _blas_libraries() -> list:
    """The BLAS libraries loaded in this process (Linux: from /proc/self/maps; elsewhere the
    ones NumPy's wheel bundles)."""
    paths = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) >= 6 and fields[5].startswith("/"):
                    name = os.path.basename(fields[5]).lower()
                    if any(key in name for key in ("blas", "mkl_rt", "blis")):
                        paths.add(fields[5])
    except OSError:
        base = os.path.dirname(os.path.dirname(np.__file__))
        for folder in (os.path.join(base, "numpy.libs"), os.path.join(np.__path__[0], ".dylibs")):
            if os.path.isdir(folder):
                paths.update(os.path.join(folder, name) for name in os.listdir(folder)
                             if "blas" in name.lower())
    libraries = []
    for path in sorted(paths):
        try:
            libraries.append(ctypes.CDLL(path))
        except OSError:
            pass
    return libraries


def one_blas_thread() -> None:
    """Make this process's BLAS use one thread (see the module docstring)."""
    for var in _BLAS_VARS:
        os.environ[var] = "1"
    for library in _blas_libraries():
        for name in _BLAS_SETTERS:
            setter = getattr(library, name, None)
            if setter is not None:
                setter(1)
                break


def blas_threads() -> list[int]:
    """Threads each loaded BLAS library uses (for tests; empty if none can be asked)."""
    counts = []
    for library in _blas_libraries():
        for name in _BLAS_GETTERS:
            getter = getattr(library, name, None)
            if getter is not None:
                counts.append(int(getter()))
                break
    return counts


# --- the child --------------------------------------------------------------------------------

def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse instead of handing it back to the
    kernel; True if it agreed. By default an array of ≥ 128 KiB (the threshold adapts, up to
    32 MiB) is an mmap of its own and its pages are returned when it is freed, so the next
    array of that size page-faults every page again — for a collective that allocates a few
    blocks per step, that cost about as much as the copies themselves. A rank lives for one
    run, so what it keeps is bounded by the most it held at once."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):     # not glibc (macOS, musl): leave malloc alone
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(M_TRIM_THRESHOLD, MMAP_THRESHOLD))


def portable(error: BaseException) -> BaseException:
    """`error` if it survives pickling both ways (so a peer and the parent can have it), else a
    RemoteFailure with its summary."""
    try:
        pickle.loads(pickle.dumps(error, protocol=5))
        return error
    except Exception:
        return RemoteFailure(f"{type(error).__name__}: {error}")


# --- a rank whose parent has gone -------------------------------------------------------------

_transport = None       # this rank's PipeTransport (in a child), for `orphaned`


def orphaned(signum=None, frame=None) -> None:
    """The run is over for this rank without its parent (the parent died, or this rank was
    sent SIGTERM): unlink the segments this rank created — nobody else will once the parent
    is gone — and exit at once. Also SIGTERM's handler in a rank."""
    transport = _transport
    if transport is not None:
        for name in list(transport.segments.owned):
            _unlink_quietly(name)
        _forget_attached(transport.segments.attached)
    os._exit(ORPHANED if signum is None else 128 + signum)


def _forget_attached(attached) -> None:
    """Unregister the peers' segments this rank attached (attaching registers them with the
    resource tracker before 3.13), which their owners unlink themselves: otherwise the
    tracker, left alone once every rank has gone, warns about each. Skipped if this process
    was interrupted while talking to the tracker (its lock is held: waiting would hang)."""
    if sys.version_info >= (3, 13) or not attached:
        return
    lock = getattr(getattr(resource_tracker, "_resource_tracker", None), "_lock", None)
    if lock is None or not lock.acquire(blocking=False):
        return
    lock.release()
    for name in attached:
        try:
            resource_tracker.unregister("/" + name, "shared_memory")
        except Exception:
            return


def _unlink_quietly(name) -> None:
    try:
        import _posixshmem
        _posixshmem.shm_unlink("/" + name)
    except (ImportError, OSError):
        pass


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Ask Linux to send this process SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG),
    and make SIGTERM end it through `orphaned`. Elsewhere only the time-based checks remain
    (`PipeTransport.checkpoint` between requests, and every POLL seconds while waiting).
    The parent (`parent`, its pid; None to skip the check) may have died before the request
    took effect: then end now."""
    signal.signal(signal.SIGTERM, orphaned)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if parent is not None and os.getppid() != parent:
        orphaned()


def _write_result(conn, message) -> None:
    """Send the result to the parent: its length (8 bytes) and its pickle, written whole
    (a blocking write; the parent reads it without blocking, within its deadline). If the
    parent has gone, the write fails (every other process closed its copy of the pipe's
    read end) and the rank ends as an orphan."""
    body = pickle.dumps(message, protocol=5)
    head = _FRAME.pack(len(body))
    fd = conn.fileno()
    try:
        os.set_blocking(fd, True)
        if len(body) < READ_SIZE:
            _write_all(fd, memoryview(head + body))
        else:
            _write_all(fd, memoryview(head))
            _write_all(fd, memoryview(body))
    except BrokenPipeError:
        orphaned()


def _write_all(fd, data) -> None:
    while len(data):
        data = data[os.write(fd, data):]


def _child_main(rank, size, program, args, kwargs, channels, status_cells, created, result_conn,
                record_trace, prefix, failures="stop", parent=None, inherited=()):
    global _transport
    die_with_parent(parent)
    for conn in inherited:       # other ranks' result pipes, copied by fork: not ours to hold
        conn.close()
    one_blas_thread()
    keep_freed_memory()
    readers, writers = {}, {}
    for (src, dst), (read_end, write_end) in channels.items():
        if dst == rank:
            write_end.close()
            readers[src] = read_end
        elif src == rank:
            read_end.close()
            writers[dst] = write_end
        else:
            read_end.close()
            write_end.close()
    for conn in itertools.chain(readers.values(), writers.values()):
        os.set_blocking(conn.fileno(), False)
    transport = PipeTransport(rank, Status(status_cells),
                              {src: conn.fileno() for src, conn in readers.items()},
                              {dst: conn.fileno() for dst, conn in writers.items()},
                              Segments(prefix, rank, created))
    transport.notify = failures == "notify"
    _transport = transport

    try:
        # The hellos of connect() are the common start: a rank is through them only when
        # every rank has reached them (an all-to-all), so no separate barrier is needed.
        outcome = drive(rank, size, program, args, kwargs, transport, record_trace)
        if transport.notify:
            transport.say_goodbye()
        # Protocol 5, as for messages: NumPy's older protocols lose a non-native byte order.
        _write_result(result_conn, ("ok", outcome))
    except Exception as error:
        if failures != "notify":
            _write_result(result_conn, ("error",) + describe_exception(error))
            return
        # failures="notify": tell the peers (after what this rank sent them before), then the
        # parent; the run goes on without this rank.
        failed_at = time.perf_counter()
        started = transport.started if transport.started is not None else failed_at
        error = portable(error)
        transport.notify_peers(size, error)
        transport.status.set(rank, DONE)
        _write_result(result_conn, ("failed", error, started, failed_at))
    except BaseException as error:   # report everything, including KeyboardInterrupt
        _write_result(result_conn, ("error",) + describe_exception(error))
        return
    finally:
        result_conn.close()
    # Reported; now deliver what is still queued for ranks that may yet receive it. The
    # parent kills this process once every rank has reported.
    transport.finish()


# --- the parent -------------------------------------------------------------------------------

def _reserve_descriptors(world_size: int) -> None:
    """Each ordered pair of ranks has a pipe: 2·p·(p − 1) descriptors in the parent while the
    children start. Raise the soft limit if that is needed and allowed."""
    needed = 2 * world_size * (world_size - 1) + 4 * world_size + 256
    try:
        import resource
    except ImportError:             # pragma: no cover - not on Linux or macOS
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return
    if hard != resource.RLIM_INFINITY and needed > hard:
        raise ValueError(f"engine='processes' with {world_size} ranks needs about {needed} "
                         f"file descriptors (a pipe per pair of ranks); this system allows "
                         f"{hard}. Use fewer ranks, or engine='sim'.")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


class _ChildEnvironment:
    """One BLAS thread in the environment of spawned children (a forked child inherits the
    parent's loaded BLAS and sets its threads itself)."""

    def __init__(self, method):
        self.method = method
        self.saved = {}

    def __enter__(self):
        if self.method != "fork":
            self.saved = {var: os.environ.get(var) for var in _BLAS_VARS}
            os.environ.update(dict.fromkeys(_BLAS_VARS, "1"))
        return self

    def __exit__(self, *exc):
        for var, value in self.saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while a run was under way: raised like Ctrl-C's KeyboardInterrupt, so
    that the run cleans up (children stopped, segments unlinked); the signal's own effect
    follows (`_SigtermCleansUp`)."""


class _SigtermCleansUp:
    """While a run is under way in the main thread, SIGTERM raises Terminated (the clean-up
    of the run's `finally` happens), and afterwards the previous handler gets the signal —
    by default this process then ends by SIGTERM, as it would have."""

    def __enter__(self):
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGTERM)
            if previous not in (signal.SIG_IGN, None):
                self.previous = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise Terminated("SIGTERM during a run of the processes engine")

    def __exit__(self, kind, error, tb):
        if self.previous is None:
            return False
        signal.signal(signal.SIGTERM, self.previous)
        if kind is Terminated:
            if self.previous is signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGTERM)      # ends this process, as SIGTERM does
            elif callable(self.previous):
                self.previous(signal.SIGTERM, None)
        return False


def sweep_segments() -> list[str]:
    """Unlink the segments of runs whose parent process has died (it was killed before it
    could clean up): every name in /dev/shm that starts with `dsml_<pid>_` where no process
    <pid> exists. Returns their names. Called at the start of every run (Linux)."""
    if not os.path.isdir(SHM_DIR):
        return []
    swept = []
    for name in os.listdir(SHM_DIR):
        if not name.startswith(SHM_PREFIX):
            continue
        owner = name[len(SHM_PREFIX):].split("_", 1)[0]
        if not owner.isdigit() or _alive(int(owner)):
            continue
        _unlink_quietly(name)
        swept.append(name)
    return swept


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # someone else's process
        return True
    return True


def run_processes(program, world_size: int, args=(), kwargs=None, trace: bool = True,
                  timeout: float | None = 120.0, failures: str = "stop") -> RunResult:
    """Run the rank program on `world_size` real processes; see the module docstring.

    `timeout` (s; None for no limit) bounds the whole run, from the moment the children are
    started. `failures="notify"`: a rank that raises or dies tells its peers (FAILED notices,
    or the end of its pipes), and the run goes on without it.
    """
    timeout = check_timeout(timeout)
    method = start_method()
    ctx = mp.get_context(method)
    _reserve_descriptors(world_size)
    sweep_segments()
    resource_tracker.ensure_running()   # one tracker, shared by every rank (see docstring)
    prefix = f"{SHM_PREFIX}{os.getpid()}_{next(_run_ids)}_"
    channels = {(src, dst): ctx.Pipe(duplex=False)
                for src in range(world_size) for dst in range(world_size) if src != dst}
    status_cells = ctx.RawArray("q", world_size * STATUS_FIELDS)
    created = ctx.RawArray("q", world_size)
    deadline = deadline_of(timeout)
    children, result_conns = [], []
    with _SigtermCleansUp():
        try:
            with _ChildEnvironment(method):
                for rank in range(world_size):
                    parent_end, child_end = ctx.Pipe(duplex=False)
                    # A forked child holds copies of the parent's ends of every result pipe
                    # made so far, its own included: it closes them (a dead parent then
                    # means a broken pipe, not a write that waits forever).
                    inherited = result_conns + [parent_end] if method == "fork" else []
                    child = ctx.Process(
                        target=_child_main, name=f"dsml-rank-{rank}", daemon=True,
                        args=(rank, world_size, program, args, kwargs or {}, channels,
                              status_cells, created, child_end, trace, prefix, failures,
                              # a forkserver child's parent is the server, not this process
                              None if method == "forkserver" else os.getpid(), inherited))
                    child.start()
                    child_end.close()
                    children.append(child)
                    result_conns.append(parent_end)
            _close_channels(channels)      # the children hold their own ends now
            outcomes, failed = _collect(children, result_conns, Status(status_cells), deadline,
                                        timeout, failures)
        finally:
            stop_children(children, result_conns)
            _close_channels(channels)
            unlink_segments(prefix, created)
    check_all_received(outcomes, failed)
    return make_result(outcomes, trace, "processes", failed)


def _close_channels(channels):
    for read_end, write_end in channels.values():
        read_end.close()
        write_end.close()


class _Result:
    """The parent's end of one child's result pipe, read without blocking: the message is
    an 8-byte length and a pickle (`_write_result`)."""

    def __init__(self, conn):
        self.fd = conn.fileno()
        os.set_blocking(self.fd, False)
        self.buf = bytearray()
        self.closed = False

    def read(self):
        """Read what is there now; the message if it is complete, else None."""
        while not self.closed:
            try:
                chunk = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            self.buf += chunk
        if len(self.buf) >= 8:
            (size,) = _FRAME.unpack_from(self.buf)
            if len(self.buf) >= 8 + size:
                with memoryview(self.buf) as view:
                    return pickle.loads(view[8:8 + size])
        return None


def _stopped(children, pending) -> set:
    """Unfinished ranks whose process the operating system has stopped (Linux: state T or t
    in /proc/<pid>/stat), e.g. by SIGSTOP or a debugger."""
    stopped = set()
    for rank in pending:
        try:
            with open(f"/proc/{children[rank].pid}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state in ("T", "t"):
            stopped.add(rank)
    return stopped


def _collect(children, result_conns, status, deadline, timeout, failures="stop"):
    """Wait for every child's result; raise RankError naming the first failure, or a
    deadlock as soon as `hopeless` sees one. Returns the outcomes and, with failures="notify",
    {rank: (its exception, start, time of the failure)}; a rank that dies is failed too."""
    world_size = len(children)
    outcomes = [None] * world_size
    failed = {}
    pending = set(range(world_size))
    results = [_Result(conn) for conn in result_conns]
    started = time.monotonic()
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise timed_out(pending, status, world_size, timeout, _stopped(children, pending))
        objects = {}
        for r in pending:
            objects[results[r].fd] = r
            objects[children[r].sentinel] = r
        ready = wait(list(objects), timeout=min(remaining, CHECK_EVERY))
        if not ready:
            deadlock = hopeless(status, world_size, time.monotonic() - started, "processes")
            if deadlock is not None:
                raise deadlock
            continue
        for handle in ready:
            rank = objects[handle]
            if rank not in pending:
                continue
            message = results[rank].read()
            if message is None:
                if children[rank].is_alive():
                    continue        # the rest of the result is still on its way
                message = results[rank].read()      # all it wrote is in the pipe by now
            if message is None:     # the child is gone and sent no whole result
                children[rank].join(timeout=1)
                code = children[rank].exitcode
                if failures != "notify":
                    raise RankError(rank, f"died (exit code {code}) before returning a result")
                now = time.perf_counter()
                failed[rank] = (RankDied(f"rank {rank} died (exit code {code}) before "
                                         f"returning a result"), now, now)
                status.set(rank, DONE)
            elif message[0] == "error":
                raise rank_failed(rank, message[1], message[2])
            elif message[0] == "failed":      # failures="notify": its peers have been told
                failed[rank] = message[1:]
            else:
                outcomes[rank] = message[1]
            pending.discard(rank)
    return outcomes, failed
