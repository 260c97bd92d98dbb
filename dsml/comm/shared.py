"""Plumbing (hand-written): worker processes that share NumPy arrays in POSIX shared memory.

Week 4's Hogwild! runs several OS processes that read and write one parameter array directly,
with no messages at all. Two pieces make that safe to run from a notebook or a test:

    with SharedArrays() as shared:
        w = shared.zeros((d,))                               # a NumPy view of a fresh segment
        values = run_workers(work, 4, args=(w,), timeout=60)   # work(worker, w) in 4 processes

- `SharedArrays` creates one segment per array, named `dsml_<pid>_shared<n>_<k>` (the prefix
  that the leak checks of the tests look for), and unlinks every one of them when the block
  ends, whatever happened inside it. Unlinking removes the name; the memory goes when the last
  mapping does, so arrays still alive after the block stay readable (see `SharedArrays` for why
  this does not use `multiprocessing.shared_memory.SharedMemory`).
- `run_workers` starts the workers with `fork`: each inherits the parent's mappings, so a worker
  writes the very pages the parent and its siblings see, and no child attaches to a segment by
  name (so nothing registers with Python's resource tracker in a child). Locks, barriers and
  other synchronisation objects made with `fork_context()` before the call are inherited the
  same way. DSML_START_METHOD, which the `processes` engine honours, does not apply here: a
  spawned child could not inherit a mapping.
- The parent waits for the workers' return values with a deadline, and calls `tick()` every
  `every` seconds meanwhile (Hogwild! samples the shared parameters with it, to draw the loss
  against wall time). When a worker raises, dies, or the deadline passes, every worker is killed
  and joined before `WorkerError` (`WorkerTimeout` for the deadline) names the worker. Children
  use one BLAS thread, as the engines' do, and end when the parent dies (as the engines' ranks
  do: `orphans.die_with_parent`); the parent's segments are then unlinked by Python's resource
  tracker, with which each is registered.
"""
from __future__ import annotations

import itertools
import mmap
import multiprocessing as mp
import os
import pickle
import time
from multiprocessing import resource_tracker
from multiprocessing.connection import wait
from typing import Callable

import _posixshmem

import numpy as np

from dsml.comm.blas import one_blas_thread
from dsml.comm.driver import describe_exception, stop_children
from dsml.comm.orphans import die_with_parent
from dsml.comm.segments import SHM_PREFIX
from dsml.comm.supervision import _stopped

__all__ = ["SharedArrays", "run_workers", "fork_context", "WorkerError", "WorkerTimeout"]

_ids = itertools.count()


class WorkerError(RuntimeError):
    """A worker process failed (raised, died, or did not finish in time); `.worker` says which."""

    def __init__(self, worker: int, message: str):
        self.worker = worker
        super().__init__(f"worker {worker} {message}")


class WorkerTimeout(WorkerError, TimeoutError):
    """Workers did not finish before the deadline; `.worker` is the first of them."""


def fork_context():
    """The multiprocessing context the workers start in ("fork": see the module docstring).
    Make locks and barriers for the workers with it."""
    if "fork" not in mp.get_all_start_methods():
        raise RuntimeError("workers that share memory need the 'fork' start method, which this "
                           "platform lacks (Linux and macOS have it; on Windows use WSL)")
    return mp.get_context("fork")


def _create_mapping(name: str, nbytes: int) -> mmap.mmap:
    """A new POSIX shared-memory segment `name` of nbytes, mapped; the descriptor is closed."""
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        os.ftruncate(fd, nbytes)
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


class SharedArrays:
    """Arrays in POSIX shared memory, unlinked when the `with` block ends (see the module
    docstring). Create them before `run_workers` forks, so the workers inherit them.

    Not `multiprocessing.shared_memory.SharedMemory`: its close() (called by its __del__ too)
    unmaps the segment even while an array made with `np.ndarray(buffer=shm.buf)` points into
    it — NumPy keeps a reference to the mmap but no buffer export on it (NumPy 2.4, Python
    3.11) — and reading that array afterwards is a segmentation fault. Here each array comes
    from `np.frombuffer(mapping)`, whose memoryview holds an export: the mapping cannot be
    closed under it, and is unmapped only when the last view of it is gone. Each segment is
    registered with Python's resource tracker while it exists, as SharedMemory does, so that
    it is unlinked even if this process is killed."""

    def __init__(self):
        self.prefix = f"{SHM_PREFIX}{os.getpid()}_shared{next(_ids)}_"
        self.names: list[str] = []

    def zeros(self, shape, dtype=np.float64) -> np.ndarray:
        """A new array of zeros of `shape` and `dtype`, in a segment of its own."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        name = f"{self.prefix}{len(self.names)}"
        mapping = _create_mapping(name, max(count * dtype.itemsize, 1))
        self.names.append(name)
        resource_tracker.register("/" + name, "shared_memory")
        array = np.frombuffer(mapping, dtype=dtype, count=count).reshape(shape)
        array[...] = 0
        return array

    def __enter__(self) -> "SharedArrays":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Unlink every segment (idempotent). Arrays stay usable until they are dropped."""
        for name in self.names:
            try:
                _posixshmem.shm_unlink("/" + name)
            except FileNotFoundError:
                pass
            resource_tracker.unregister("/" + name, "shared_memory")
        self.names = []


def _child_main(target, worker, args, conn, parent=None):
    die_with_parent(parent)     # a worker never outlives the process that started it
    one_blas_thread()
    try:
        value = target(worker, *args)
        # Protocol 5, as the engines use: NumPy's older protocols lose a non-native byte order.
        conn.send_bytes(pickle.dumps(("ok", value), protocol=5))
    except BaseException as error:   # report everything, including KeyboardInterrupt
        summary, text = describe_exception(error)
        conn.send_bytes(pickle.dumps(("error", summary, text), protocol=5))
    finally:
        conn.close()


def _read(conn):
    """The worker's message, or None if it sent none (it died: its end of the pipe closed)."""
    try:
        return pickle.loads(conn.recv_bytes()) if conn.poll() else None
    except (EOFError, OSError):
        return None


def run_workers(target: Callable, workers: int, args=(), timeout: float = 60.0,
                every: float | None = None, tick: Callable[[], None] | None = None) -> list:
    """Run `target(worker, *args)` in `workers` forked processes; return their values in
    worker order.

    `timeout` (s) bounds the whole run from the first fork. With `tick`, the parent calls
    `tick()` about every `every` seconds while it waits (on its own clock, never inside a
    worker). Raises `WorkerError` naming the first worker that raised or died, `WorkerTimeout`
    if some had not finished at the deadline; every worker is killed and joined first.
    """
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer ≥ 1, got {workers!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    if tick is not None and not (every is not None and every > 0):
        raise ValueError(f"every must be > 0 seconds when tick is given, got {every}")
    ctx = fork_context()
    deadline = time.monotonic() + timeout
    children, conns = [], []
    try:
        for worker in range(workers):
            parent_end, child_end = ctx.Pipe(duplex=False)
            child = ctx.Process(target=_child_main, name=f"dsml-worker-{worker}", daemon=True,
                                args=(target, worker, args, child_end, os.getpid()))
            child.start()
            child_end.close()
            children.append(child)
            conns.append(parent_end)
        values = [None] * workers
        pending = set(range(workers))
        next_tick = time.monotonic() + every if tick is not None else None
        while pending:
            now = time.monotonic()
            if now >= deadline:
                late = sorted(pending)
                # A worker the operating system has stopped (SIGSTOP, a debugger) is the
                # cause: name it, not the lowest late worker (which may wait for it).
                stopped = sorted(_stopped(children, pending))
                cause = ""
                if stopped:
                    cause = (f" — its process is stopped (SIGSTOP or a debugger?)"
                             + (f", and so are workers {stopped[1:]}" if stopped[1:] else ""))
                raise WorkerTimeout((stopped or late)[0],
                                    f"(and {len(late)} worker(s) in all: {late}) did not "
                                    f"finish within the timeout of {timeout:g} s{cause}; "
                                    f"every worker was killed")
            until = deadline if next_tick is None else min(deadline, next_tick)
            waiting = {}
            for worker in pending:
                waiting[conns[worker]] = worker
                waiting[children[worker].sentinel] = worker
            for ready in wait(list(waiting), timeout=max(0.0, until - now)):
                worker = waiting[ready]
                if worker not in pending:
                    continue
                message = _read(conns[worker])
                if message is None:
                    if children[worker].is_alive():
                        continue             # woken without a message from a live worker
                    message = _read(conns[worker])   # it may have written just before dying
                if message is None:
                    children[worker].join(timeout=1)
                    raise WorkerError(worker, f"died (exit code {children[worker].exitcode}) "
                                              f"before returning a result")
                if message[0] == "error":
                    raise WorkerError(worker, f"failed: {message[1]}\n--- traceback of worker "
                                              f"{worker} ---\n{message[2]}")
                values[worker] = message[1]
                pending.discard(worker)
            if next_tick is not None and time.monotonic() >= next_tick:
                tick()
                next_tick = max(next_tick + every, time.monotonic())
        return values
    finally:
        stop_children(children, conns)
