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
The tracker is a new Python interpreter, started with the first run of a process, and it spends
tens of milliseconds of CPU importing its modules: `await_tracker` lets it finish before any
rank starts. Without that, a rank pinned to the CPU it ran on waited 8–12 ms of a 20 ms timed
loop for it, in the first run of every `dsml validate` — which measured a 1 MiB all-reduce's
loop at twice the time of later runs (docs/measurements.md).
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

Where each part lives (all in `dsml.comm`): this module starts the children, collects their
results and cleans up (`run_processes`); `rank_process` is a child from start-up to its result
(`_child_main`); `pipes` its transport (`PipeTransport`); `frames` the pipes' wire format
(`encode_frame`, `decode_whole`, the cached heads; `portable`); `segments` the shared-memory
path (`Segments`, `unlink_segments`, `sweep_segments`); `supervision` the parent waiting for
results (`_collect`, `_SigtermCleansUp`); `orphans` a rank whose parent has gone (`orphaned`,
`die_with_parent`); `blas` one BLAS thread a rank.
"""
from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import time
from multiprocessing import resource_tracker

from dsml.comm.api import RunResult
from dsml.comm.blas import _ChildEnvironment
from dsml.comm.driver import (STATUS_FIELDS, Status, check_all_received, check_timeout,
                              deadline_of, make_result, stop_children)
from dsml.comm.rank_process import _child_main
# SHM_THRESHOLD is also imported from here (week 1's notebook).
from dsml.comm.segments import SHM_PREFIX, SHM_THRESHOLD, sweep_segments, unlink_segments
from dsml.comm.supervision import _SigtermCleansUp, _collect

_run_ids = itertools.count()


def start_method() -> str:
    """The multiprocessing start method used (see the module docstring)."""
    method = os.environ.get("DSML_START_METHOD")
    if method:
        if method not in mp.get_all_start_methods():
            raise ValueError(f"DSML_START_METHOD must be one of {mp.get_all_start_methods()}, "
                             f"got {method!r}")
        return method
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"



# --- the parent -------------------------------------------------------------------------------

_settled_tracker = None      # pid of the resource tracker last seen settled


def _cpu_ticks(pid: int):
    """(state, user + system clock ticks) of process `pid` from /proc, or None (not Linux, gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def await_tracker(limit: float = 2.0, pause: float = 0.005) -> float:
    """Wait (at most `limit` s) until the resource tracker, the first time this process
    starts it, has finished starting: a new Python interpreter importing its modules for tens
    of milliseconds of CPU. Ranks pinned to the CPUs it runs on lost up to 12 ms of a 20 ms
    timed loop to it, in the first run of every `dsml validate` (docs/measurements.md).
    Settled: asleep, with no CPU time used over two looks `pause` apart. Returns the seconds
    waited (0 where /proc is not there or the tracker was already settled)."""
    global _settled_tracker
    tracker = getattr(resource_tracker, "_resource_tracker", None)
    pid = getattr(tracker, "_pid", None)
    if pid is None or pid == _settled_tracker:
        return 0.0
    start = time.monotonic()
    last = _cpu_ticks(pid)
    while last is not None and time.monotonic() - start < limit:
        time.sleep(pause)
        now = _cpu_ticks(pid)
        if now is None or (now[0] == "S" and now == last):
            break
        last = now
    _settled_tracker = pid
    return time.monotonic() - start


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
    await_tracker()                     # … and ranks start once it has stopped using a CPU
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
