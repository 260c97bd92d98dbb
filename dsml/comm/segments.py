"""Plumbing (hand-written): shared-memory segments, the processes engine's path for large arrays.

Arrays of SHM_THRESHOLD bytes and more travel through POSIX shared memory: the sender copies
into a segment of its pool for that destination (`Segments.put`) and sends only a `ShmRef`;
the receiver hands its program a view of the segment (`Segments.take`) and acknowledges the
segment once no array made from it is left. Also here: unlinking a run's segments
(`unlink_segments`), and those of parents that died (`sweep_segments`). The module docstring
of `dsml.comm.processes` describes the whole engine.
"""
from __future__ import annotations

import os
import sys
import weakref
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

import numpy as np

SHM_THRESHOLD = 32 * 1024   # bytes: arrays this large go through shared memory
SHM_PREFIX = "dsml_"
SHM_DIR = "/dev/shm"        # where Linux shows POSIX shared memory; absent on macOS


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
