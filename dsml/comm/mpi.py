"""Plumbing (hand-written): the `mpi` engine — rank programs inside an MPI job, through mpi4py.

Every process of the job (`mpiexec -n p python script.py`) calls `run` (`run_mpi`), and each
drives its own rank — the rank of `MPI.COMM_WORLD` — with the loop every real engine shares
(`driver.drive`). Only the transport is MPI's:

- **A run's communicator.** Each run duplicates COMM_WORLD (after a barrier, below), so its
  messages never meet the script's own MPI traffic; every dsml message travels with one MPI tag
  (`DATA_TAG`) and carries its dsml tag in a small header. (source, tag) matching, in arrival
  order, is `driver.MatchingTransport`'s, as on the other engines; MPI keeps the messages of one
  sender in order, which is all it needs.
- **Eager sends.** A send packs the message into a buffer of its own — that copy is the snapshot
  every engine takes — starts a nonblocking `Isend`, keeps the request and the buffer, and
  returns at once, whatever MPI's own eager limit (a large message waits for its receive in
  MPI's rendezvous protocol, but not in the program). Finished sends are let go whenever the
  rank sends again; the rest are completed at the end of the run.
- **Payloads.** A bare C-contiguous NumPy array of a plain dtype (what collectives send) goes
  through the buffer interface: a header (kind, tag, dtype code, shape; padded to 64 bytes so
  the data is aligned) and the array's bytes in the same buffer. The receiver probes for the
  message (`Improbe`, a matched probe), allocates one buffer of its size, receives into it, and
  hands the program a view of its data part: no pickling and no copy after the receive.
  Anything else (tuples and dicts, placeholders, unusual dtypes) is pickled (protocol 5, which
  keeps NumPy's non-native byte orders).
- **Waiting.** A receive polls with `Improbe` (MPI has no file descriptor to sleep on): for
  SPIN (20 ms) — giving the core away between polls (sched_yield) when this host has more
  ranks than cores — then with sleeps that grow to SLEEP_MAX (1 ms), so that a rank waiting
  long for a busy peer does not keep a core. Polling is also what moves MPI's protocol on: a
  large message is sent only as its receiver asks for it (rendezvous), while the sender is
  inside MPI. Sleeping early cost dearly (measured, 200 µs of polling then sleeps of 20 µs
  to 1 ms: a 2-rank ring all-reduce of 4 MiB took 5.0 ms instead of 1.5 ms, a 4-rank one of
  8 B on 2 cores 10.9 ms instead of 0.26 ms). `_next_any(sources)` (activities, week 3)
  probes any source: the driver stashes what no activity waits for yet, as on `threads`.
- **Time.** Each rank's clock starts when it is through the hellos of `connect` (an all-to-all:
  nobody is through before everyone has arrived), and the times each rank reports are
  measured from there. So `result.time` is comparable with the other engines, and stays right
  on several hosts, whose clocks `perf_counter` does not share.
- **Results.** When its program has returned, a rank waits (a nonblocking barrier, polled as a
  receive is) until every rank has finished, then all ranks all-gather their outcomes: every
  process gets the same `RunResult`, with every rank's value (as DESIGN.md pins it). Messages
  nobody received are read and dropped (so that every send completes and nothing is left for
  MPI_Finalize), and `check_all_received` then fails the run on every process alike.
- **Failures end the job.** A rank that raises prints `dsml: engine mpi: rank R failed: …` and
  its traceback on stderr and calls `MPI_Abort` on COMM_WORLD: the launcher kills every process
  and exits non-zero, instead of the others waiting forever for that rank. A run that outlasts
  `timeout` is ended by a watchdog thread in each process: it prints what its rank was waiting
  for (so every rank's line appears), waits GRACE seconds for the others to print theirs, and
  aborts. In a one-process job there is nobody to wait for: errors are raised as `RankError`,
  as on the other engines, and nothing is aborted.
- **Deadlocks** are found early, as on the other engines, though MPI ranks share no memory:
  rank 0, while it waits, runs *waves* on a second communicator that ask every rank, from
  inside its own waits, for its status record; two waves in a row that find every unfinished
  rank waiting and as many messages taken as sent, with the same counts, prove that nothing
  can happen any more (Mattern's four-counter method; `Waves`). Rank 0 prints the deadlock
  report with every rank's wait and ends the job (a deadlock with timeout=5 now ends about
  0.1 s into the run instead of after the timeout).

Launching: `mpiexec_command(n, args)` is the command line that starts an n-process job on this
host (the tests and the benchmark use it): MPICH's Hydra with `-launcher fork` (ranks forked
on this host: never ssh, whatever the host name resolves to), Open MPI with
`--allow-run-as-root` when run as root and `--oversubscribe`; `mpiexec_env` gives each rank
one BLAS thread.
"""
from __future__ import annotations

import functools
import os
import pickle
import shutil
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from dsml.comm.api import RankError, RunResult
from dsml.comm.driver import (CHECK_EVERY, MatchingTransport, Outcome, Status, STATUS_FIELDS,
                              hopeless,
                              check_all_received, describe_exception, drive, make_result,
                              rank_failed, timed_out)
from dsml.comm.frames import _dtype_code, _dtype_of

INSTALL = "pip install -e '.[mpi]'"    # mpi4py and MPICH from PyPI (the `mpich` wheel)
DATA_TAG = 17               # the MPI tag of every dsml message on a run's communicator
WAVE_TAG, REPLY_TAG = 1, 2  # on a run's second communicator: deadlock waves (see Deadlocks)
DEADLOCK_EXIT = 3           # MPI_Abort error code of a run that deadlocked
SPIN = 20e-3                # s: how long a waiting rank polls before it sleeps
SLEEP_MIN = 50e-6           # s: first sleep between polls after SPIN; doubles each time ...
SLEEP_MAX = 1e-3            # s: ... up to this
GRACE = 2.0                 # s: after a timeout, how long a rank waits for the others' reports
FAILED_EXIT = 1             # MPI_Abort error code of a rank that raised
TIMEOUT_EXIT = 124          # ... of a run that timed out (as timeout(1) exits)
ALIGN = 64                  # bytes: a raw array's data starts at a multiple of this

_RAW, _PICKLED = 1, 0       # first byte of a message
_RAW_HEAD = struct.Struct("<BqBB")   # kind, tag, ndim, length of the dtype code
_DIMS = [struct.Struct(f"<{ndim}q") for ndim in range(64 + 1)]
_BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


# --- mpi4py, and the job we are in ------------------------------------------------------------

def load_mpi():
    """mpi4py's MPI module (importing it initializes MPI), or a RuntimeError saying what to
    install."""
    try:
        from mpi4py import MPI
    except ImportError as error:
        raise RuntimeError(f"engine='mpi' needs mpi4py and an MPI library, which are not "
                           f"installed: {INSTALL} (mpi4py and MPICH from PyPI), then launch "
                           f"with mpiexec -n P python your_script.py") from error
    return MPI


def launch_hint(world_size) -> str:
    return (f"launch it with `mpiexec -n {world_size} python your_script.py` (or `mpiexec -n "
            f"{world_size} python -m dsml ...`)")


def job_size() -> int:
    """How many processes this MPI job has (1 when this process was not started by mpiexec)."""
    return load_mpi().COMM_WORLD.Get_size()


def job_rank() -> int:
    """This process's rank in COMM_WORLD."""
    return load_mpi().COMM_WORLD.Get_rank()


def check_world_size(world_size, size: int, name: str = "world_size") -> int:
    """The run's world size: the job's (`size`) when `world_size` is None, else `world_size`,
    which must equal it; a ValueError says how to launch otherwise (`name`: what the caller
    calls the argument)."""
    if world_size is None:
        return size
    if size == 1 and world_size > 1:
        raise ValueError(f"engine='mpi' runs inside an MPI job, one process per rank, and this "
                         f"process is not in one (MPI.COMM_WORLD has 1 process) but "
                         f"{name}={world_size}: {launch_hint(world_size)}")
    if world_size != size:
        leave_out = ("pass world_size=None" if name == "world_size"
                     else f"leave {name} out")
        raise ValueError(f"{name}={world_size} does not match this MPI job's {size} "
                         f"processes: {launch_hint(world_size)}, or {leave_out} to take the "
                         f"job's size")
    return world_size


# --- the transport ----------------------------------------------------------------------------

class _Expired(Exception):
    """Raised in a one-process job's waits when the run's timeout has passed."""


def encode(tag: int, payload):
    """One message: a NumPy uint8 buffer (header + the array's bytes) for a bare C-contiguous
    array of a plain dtype, else bytes (kind + pickle). Either is a copy of the payload."""
    if type(payload) is np.ndarray and payload.flags.c_contiguous and -(1 << 63) <= tag < 1 << 63:
        code = _dtype_code(payload.dtype)
        if code is not None and payload.ndim <= 64:
            ndim = payload.ndim
            head = b"".join((_RAW_HEAD.pack(_RAW, tag, ndim, len(code)), code,
                             _DIMS[ndim].pack(*payload.shape)))
            offset = -(-len(head) // ALIGN) * ALIGN
            buf = np.empty(offset + payload.nbytes, np.uint8)
            buf[:len(head)] = np.frombuffer(head, np.uint8)
            buf[offset:] = payload.reshape(-1).view(np.uint8)
            return buf
    return bytes((_PICKLED,)) + pickle.dumps((tag, payload), protocol=5)


def decode(buf: np.ndarray):
    """(tag, payload) of a message received into `buf`; a raw array is a view of `buf`."""
    if buf[0] == _RAW:
        _, tag, ndim, code_size = _RAW_HEAD.unpack_from(buf, 0)
        at = _RAW_HEAD.size
        dtype = _dtype_of(buf[at:at + code_size].tobytes())
        at += code_size
        shape = _DIMS[ndim].unpack_from(buf, at)
        offset = -(-(at + 8 * ndim) // ALIGN) * ALIGN
        return tag, buf[offset:].view(dtype).reshape(shape)
    return pickle.loads(memoryview(buf)[1:])


class MpiTransport(MatchingTransport):
    """A rank's end of a run's communicator (see the module docstring)."""

    engine = "mpi"              # whose α, β, γ "auto" collectives choose by (dsml.comm.costs)

    def __init__(self, comm, status: Status, MPI, pause, expired: threading.Event):
        super().__init__(comm.Get_rank(), status)
        self.comm = comm
        self.MPI = MPI
        self.pause = pause               # called between polls while spinning (or None)
        self.expired = expired           # set by the watchdog of a one-process job
        self.pending = []                # (request, buffer) of sends not known to be complete
        size = comm.Get_size()
        self.sent_to = [0] * size        # messages sent to each peer, hellos included
        self.arrived_from = [0] * size   # messages received from each peer, hellos included
        self.probe_status = MPI.Status()
        self.waves = None                # `Waves`, in a job of several processes

    def send(self, dst, tag, payload):
        buf = encode(tag, payload)
        if self.pending:
            self.pending = [item for item in self.pending if not item[0].Test()]
        self.pending.append((self.comm.Isend(buf, dst, DATA_TAG), buf))
        self.sent_to[dst] += 1
        self.cells[self.sent_at] += 1           # for the deadlock waves (`Waves`)

    def _next(self, src):
        return self._take(self._probe(src))

    def _next_any(self, sources):
        """The next message from anyone (the driver stashes it if no activity waits for it)."""
        return self._take(self._probe(self.MPI.ANY_SOURCE))

    def _probe(self, source):
        """Wait for a message from `source` to be there (see Waiting in the module docstring);
        return its matched MPI.Message."""
        improbe, status = self.comm.Improbe, self.probe_status
        message = improbe(source, DATA_TAG, status)
        if message is not None:
            return message
        clock, pause = time.perf_counter, self.pause
        until = clock() + SPIN
        while clock() < until:
            if pause is not None:
                pause()
            message = improbe(source, DATA_TAG, status)
            if message is not None:
                return message
        sleep = SLEEP_MIN
        waves = self.waves
        while True:
            if self.expired.is_set():
                raise _Expired()
            time.sleep(sleep)
            sleep = min(2 * sleep, SLEEP_MAX)
            message = improbe(source, DATA_TAG, status)
            if message is not None:
                return message
            if waves is not None:
                waves.tend()                   # this rank waits: deadlock waves (`Waves`)

    def _take(self, message):
        """Receive the probed message (its size and source are in probe_status)."""
        status = self.probe_status
        src = status.Get_source()
        buf = np.empty(status.Get_count(self.MPI.BYTE), np.uint8)
        message.Recv(buf)
        self.arrived_from[src] += 1
        return (src,) + decode(buf)

    def drain(self, sent_to_me) -> None:
        """Receive and drop what each peer sent this rank that the program never received
        (`sent_to_me[src]`: how many messages src sent here), so that every send completes."""
        for src, count in enumerate(sent_to_me):
            while self.arrived_from[src] < count:
                self._take(self._probe(src))

    def complete_sends(self) -> None:
        """Wait for every send of this rank: each has a matching receive by now (drain)."""
        if self.pending:
            self.MPI.Request.Waitall([request for request, _ in self.pending])
            self.pending = []


def _wait_request(request, pause, expired, waves=None) -> None:
    """Wait for a nonblocking MPI operation as a receive waits: spin briefly, then sleep
    (taking part in deadlock waves meanwhile, if `waves`)."""
    clock = time.perf_counter
    until = clock() + SPIN
    while not request.Test():
        if clock() < until:
            if pause is not None:
                pause()
            continue
        if expired.is_set():
            raise _Expired()
        time.sleep(SLEEP_MAX)
        if waves is not None:
            waves.tend()


# --- deadlocks --------------------------------------------------------------------------------

class Waves:
    """Early deadlock detection on MPI, where ranks share no memory: Mattern's four-counter
    method over a run's second communicator. Rank 0, whenever it waits (a receive, or the
    final barrier), starts a *wave* every CHECK_EVERY seconds: it asks every other rank for its
    status record (state, what it waits for, messages sent and taken, stash). A rank answers
    from inside its own waits only, so each answer is the record of a waiting (or finished)
    rank at that moment; a rank busy in its code answers when it next waits. When two
    consecutive waves find every unfinished rank waiting, sent equal to taken, and the same
    counts, no message was in flight and none was sent or taken in between: the run can never
    go on (the same test as `driver.hopeless` on the other engines, which read shared memory
    instead). Rank 0 then prints the deadlock report, every rank's wait in it, and ends the
    job. What a wave leaves unmatched when the run ends is received at the end (`finish`)."""

    def __init__(self, ctl, rank: int, size: int, status: Status, MPI):
        self.ctl, self.rank, self.size, self.status, self.MPI = ctl, rank, size, status, MPI
        self.requests = []               # isends of requests and answers, completed at the end
        self.started = time.perf_counter()
        self.sent = 0                    # rank 0: waves started; others: answers sent
        self.seen = [0] * size           # rank 0: answers received from each; others: [waves]
        self.wave = None                 # rank 0: {rank: record} of the wave under way
        self.previous = None             # rank 0: the cells of the last wave that looked dead
        self.next_at = self.started + CHECK_EVERY
        self.probe = MPI.Status()

    def record(self) -> list:
        at = self.rank * STATUS_FIELDS
        return list(self.status.cells[at:at + STATUS_FIELDS])

    def tend(self) -> None:
        """Called while this rank waits: answer waves (others), run them (rank 0)."""
        ctl = self.ctl
        if self.rank != 0:
            while ctl.iprobe(source=0, tag=WAVE_TAG):
                number = ctl.recv(source=0, tag=WAVE_TAG)
                self.seen[0] += 1
                self.requests.append(ctl.isend((number, self.record()), dest=0, tag=REPLY_TAG))
                self.sent += 1
            return
        now = time.perf_counter()
        if self.wave is None:
            if now < self.next_at:
                return
            self.sent += 1
            for dst in range(1, self.size):
                self.requests.append(ctl.isend(self.sent, dest=dst, tag=WAVE_TAG))
            self.wave = {}
        probe = self.probe
        while ctl.iprobe(source=self.MPI.ANY_SOURCE, tag=REPLY_TAG, status=probe):
            src = probe.Get_source()
            number, record = ctl.recv(source=src, tag=REPLY_TAG)
            self.seen[src] += 1
            if number == self.sent:
                self.wave[src] = record
        if len(self.wave) < self.size - 1:
            return
        cells = self.record()
        for src in range(1, self.size):
            cells += self.wave[src]
        self.wave, self.next_at = None, now + CHECK_EVERY
        deadlock = hopeless(Status(cells), self.size, now - self.started, "mpi")
        if deadlock is None:
            self.previous = None
            return
        if cells != self.previous:
            self.previous = cells        # looks dead: confirm with the next wave
            return
        abort_job(f"{deadlock} (ending the MPI job)", DEADLOCK_EXIT)

    def count(self) -> tuple:
        """What this rank's side of the waves sent, for `finish` on every rank."""
        return self.sent

    def finish(self, counts) -> None:
        """The run is over (every rank is through the final barrier): receive what the waves
        left unmatched — requests for the others, answers for rank 0 (`counts[r]`: what rank
        r sent) — and complete every isend."""
        ctl = self.ctl
        if self.rank == 0:
            for src in range(1, self.size):
                for _ in range(counts[src] - self.seen[src]):
                    ctl.recv(source=src, tag=REPLY_TAG)
        else:
            for _ in range(counts[0] - self.seen[0]):
                ctl.recv(source=0, tag=WAVE_TAG)
        self.MPI.Request.Waitall(self.requests)
        self.requests = []


# --- the watchdog -----------------------------------------------------------------------------

class _Watchdog(threading.Thread):
    """Ends a run that outlasts its timeout: in a job of several processes it prints what
    its rank waits for and, after GRACE seconds (time for the other ranks to print theirs),
    aborts the job; in a one-process job it only marks the run expired, and the rank's waits
    raise (see the module docstring)."""

    def __init__(self, rank: int, size: int, status: Status, timeout: float):
        super().__init__(name=f"dsml-mpi-watchdog-{rank}", daemon=True)
        self.rank, self.size = rank, size
        self.status, self.timeout = status, timeout
        self.done = threading.Event()
        self.expired = threading.Event()

    def run(self):
        if self.done.wait(self.timeout):
            return
        if self.size == 1:
            self.expired.set()
            return
        # Not `expired`: a rank that raised here would leave the job to MPI_Finalize at exit,
        # which waits for the other ranks; the abort below is what ends every process.
        what = self.status.describe(self.rank)
        if what.endswith("finished"):
            what += " and waits for the other ranks to finish"
        _report(f"the run did not finish within the timeout of {self.timeout:g} s: {what}")
        if self.done.wait(GRACE):
            return
        abort_job(None, TIMEOUT_EXIT)


def _report(text: str) -> None:
    sys.stderr.write(f"dsml: engine mpi: {text}\n")
    sys.stderr.flush()


def abort_job(text: str | None, code: int = FAILED_EXIT):
    """End the whole MPI job from this process: print `text` (if any) on stderr, unlink
    MPICH's shared memory, and call MPI_Abort on COMM_WORLD with error code `code`."""
    if text is not None:
        _report(text)
    unlink_mpich_segments()
    load_mpi().COMM_WORLD.Abort(code)


def unlink_mpich_segments() -> None:
    """Unlink the shared-memory files MPICH mapped into this process. MPICH unlinks them in
    MPI_Finalize, which an aborted or killed job never reaches: each would leave a few MB in
    /dev/shm. Every process of the job attached them in MPI_Init, so once all are through it
    (a barrier) the names are no longer needed, and mappings outlive their names (Linux;
    elsewhere there is no /proc/self/maps). Called at the start of every run and before an
    abort; MPI_Finalize does not mind that the files are gone (MPICH 5.0.2, measured)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(maxsplit=5)[5].strip() for line in maps
                     if "/dev/shm/mpich_" in line}
    except OSError:
        return
    for path in paths:
        if not path.endswith("(deleted)"):
            try:
                os.unlink(path)
            except OSError:
                pass


def _abort_failed(error: RankError):
    """Print a failed rank's error and traceback and end the whole job."""
    first, _, rest = str(error).partition("\n")
    abort_job(f"{first} (ending the MPI job)\n{rest}".rstrip(), FAILED_EXIT)


# --- the run ----------------------------------------------------------------------------------

_ranks_here = []     # [ranks of the job on this host], once known


def _ranks_on_this_host(world, MPI) -> int:
    """Processes of the job that share this host (a collective on COMM_WORLD: every process
    calls this at the same point of its first run, and remembers the answer)."""
    if not _ranks_here:
        local = world.Split_type(MPI.COMM_TYPE_SHARED)
        _ranks_here.append(local.Get_size())
        local.Free()
    return _ranks_here[0]


def _cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _from_common_start(outcome: Outcome) -> Outcome:
    """The outcome with its times measured from this rank's start (see Time)."""
    t0 = outcome.start
    records = outcome.records
    if records is not None:
        records = [(rank, op, start - t0, end - t0, src, dst, nbytes, tag)
                   for rank, op, start, end, src, dst, nbytes, tag in records]
    return Outcome(outcome.value, 0.0, outcome.end - t0, records, outcome.sent,
                   outcome.received, outcome.tags)


def run_mpi(program, world_size: int | None, args=(), kwargs=None, trace: bool = True,
            timeout: float = 120.0) -> RunResult:
    """Run the rank program in this MPI job: every process of the job calls this, and each
    drives its own rank (COMM_WORLD's). `world_size` must be the job's size (None: take it).
    Every process returns the same RunResult. See the module docstring.

    `timeout` (s) bounds the run, from the moment this process enters it.
    """
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    MPI = load_mpi()
    world = MPI.COMM_WORLD
    size, rank = world.Get_size(), world.Get_rank()
    check_world_size(world_size, size)
    kwargs = kwargs or {}
    status = Status([0] * (size * STATUS_FIELDS))   # only this rank's cells are used here
    watchdog = _Watchdog(rank, size, status, timeout)
    watchdog.start()
    try:
        return _run(MPI, world, rank, size, program, args, kwargs, trace, timeout, status,
                    watchdog)
    finally:
        watchdog.done.set()
        watchdog.join(timeout=GRACE)


def _run(MPI, world, rank, size, program, args, kwargs, trace, timeout, status, watchdog):
    expired = watchdog.expired
    try:
        # A nonblocking barrier first, waited for without spinning in MPI, so that ranks
        # started early do not take cores from those still starting; then the blocking
        # collectives (everyone is there by now): who shares this host, the run's own
        # communicator.
        _wait_request(world.Ibarrier(), getattr(os, "sched_yield", None), expired)
        # Every process of the job is through MPI_Init, so every one has mapped MPICH's
        # shared memory: its names can go now, and a job whose rank is SIGKILLed (nobody
        # runs MPI_Finalize or abort_job) leaves nothing in /dev/shm.
        unlink_mpich_segments()
        oversubscribed = size > 1 and _ranks_on_this_host(world, MPI) > _cpus()
        pause = getattr(os, "sched_yield", None) if oversubscribed else None
        comm = world.Dup()
        ctl = world.Dup()                # the deadlock waves' own (`Waves`)
    except _Expired:
        raise timed_out({rank}, status, size, timeout) from None
    try:
        transport = MpiTransport(comm, status, MPI, pause, expired)
        waves = transport.waves = Waves(ctl, rank, size, status, MPI) if size > 1 else None
        try:
            outcome = drive(rank, size, program, args, kwargs, transport, trace)
            outcome = _from_common_start(outcome)
            blob = pickle.dumps((outcome, transport.sent_to, waves and waves.count()),
                                protocol=5)
        except _Expired:
            raise timed_out({rank}, status, size, timeout) from None
        except BaseException as error:              # the program's, or its value's pickling
            failure = rank_failed(rank, *describe_exception(error))
            if size == 1:
                raise failure from None
            _abort_failed(failure)
            raise failure from None                  # not reached: Abort ends the process
        try:
            _wait_request(comm.Ibarrier(), pause, expired, waves)   # every rank has finished
        except _Expired:                             # pragma: no cover - one process: no wait
            raise timed_out({rank}, status, size, timeout) from None
        gathered = [pickle.loads(item) for item in comm.allgather(blob)]
        outcomes = [item[0] for item in gathered]
        transport.drain([item[1][rank] for item in gathered])
        transport.complete_sends()
        if waves is not None:
            waves.finish([item[2] for item in gathered])
    finally:
        comm.Free()
        ctl.Free()
    check_all_received(outcomes)
    return make_result(outcomes, trace, "mpi")


# --- launching --------------------------------------------------------------------------------

def find_mpiexec() -> str | None:
    """The mpiexec next to this Python (the `mpich` wheel installs it in the environment's
    bin/), else the first on PATH; None if there is none."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    return shutil.which("mpiexec")


@functools.lru_cache(maxsize=None)
def mpiexec_flavor(mpiexec: str) -> str:
    """'hydra' (MPICH, Intel MPI), 'openmpi', or 'unknown', from `mpiexec --version`."""
    try:
        text = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = text.stdout + text.stderr
    if "HYDRA" in text or "Hydra" in text:
        return "hydra"
    if "Open MPI" in text or "OpenRTE" in text or "Open RTE" in text:
        return "openmpi"
    return "unknown"


def mpiexec_command(n: int, args, mpiexec: str | None = None) -> list[str]:
    """The command line that runs `args` (e.g. [sys.executable, "script.py"]) as an
    n-process MPI job on this host, with the flags this MPI needs here:

    - MPICH's Hydra: `-launcher fork`. Hydra starts its proxy through its default launcher,
      ssh, unless it recognises the host as this one; fork starts every rank here directly,
      so no ssh client, sshd or resolvable host name is needed. Hydra runs as root without
      complaint (measured: MPICH 5.0.2 from the `mpich` wheel, as root, with and without a
      network; it needs no other flag or HYDRA_* variable).
    - Open MPI: `--allow-run-as-root` when run as root (it refuses otherwise), and
      `--oversubscribe` (it refuses more ranks than cores otherwise).
    """
    if mpiexec is None:
        mpiexec = find_mpiexec()
    if mpiexec is None:
        raise RuntimeError(f"no mpiexec next to {sys.executable} or on PATH: {INSTALL} "
                           f"installs MPICH's")
    command = [mpiexec]
    flavor = mpiexec_flavor(mpiexec)
    if flavor == "hydra":
        command += ["-launcher", "fork"]
    elif flavor == "openmpi":
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            command.append("--allow-run-as-root")
        command.append("--oversubscribe")
    return command + ["-n", str(n), *map(str, args)]


def mpiexec_env(base=None) -> dict:
    """The environment for the job: `base` (default os.environ) with one BLAS thread per
    rank unless it says otherwise (as the processes engine gives its children)."""
    env = dict(os.environ if base is None else base)
    for var in _BLAS_VARS:
        env.setdefault(var, "1")
    return env
