"""Benchmark (hand-written): the cost of one small message on the `processes` engine, per call.

`allreduce_real_engines.py` times a loop and divides; at 4 KiB the loop's mean is dominated by
the few calls in which a rank waited for a core (on a shared 2-core machine, 1–8 % of calls
take over 1 ms). This script times **each call** with `time.perf_counter` around it, inside
the rank, and reports the per-call median and p10–p90 — the figure that says what one message
costs when nothing gets in the way. Measured on rank 0, p = 2, after `--warm-up` calls:

- **pingpong**: dsml `send` then `recv` (rank 1: `recv` then `send`) of a float32 array on
  `engine="processes"`, `trace=False`: one round trip, two messages.
- **default**: `dsml.collectives.allreduce(comm, x)` with no algorithm named — "auto" since
  the all-reduce chooses by the engine's α, β, γ (`dsml.comm.costs`), the ring before; with
  `--before`, the two side by side.
- **ring**, **recursive_doubling**: `dsml.collectives.allreduce(comm, x, algorithm=...)`, same
  engine. At p = 2 the ring is two exchanges (reduce-scatter, all-gather), recursive doubling
  one. Every result is checked against the exact sum.
- **mpi**: mpi4py `comm.Allreduce` on preallocated buffers (MPICH chooses its algorithm),
  launched with `dsml.comm.mpi.mpiexec_command`; **mpi-pingpong**: `Send`/`Recv` round trip.
  Skipped when mpi4py is not installed (`pip install -e '.[mpi]'`).
- **pipe**: the floor for Python here — a round trip of the same bytes through two bare pipes
  between two processes pinned to a core each (as dsml's ranks are), non-blocking reads
  spinning, nothing else.

`--before ROOT` adds a column for each dsml measurement run with the dsml package at ROOT (a
checkout of another commit, e.g. `main`'s), with `--before-python` (default: this Python);
each dsml measurement runs in a fresh process, so both copies are timed alike. The
measurements **alternate**: each repeat runs every column once, the order rotating from
repeat to repeat, so that the load of a shared machine hits all of them alike. The table
gives, per column, the median over repeats of each repeat's per-call median (and the range
of those medians), p10 and p90 (median over repeats), the share of calls over 1 ms, and the
ratio of the median to MPI's median Allreduce. It also prints `uptime` before and after.

Run (from the repository root):

    OMP_NUM_THREADS=1 python benchmarks/small_messages.py                     # 4 KiB, 3 repeats
    python benchmarks/small_messages.py --before /work/main --before-python /work/main/.venv/bin/python
    python benchmarks/small_messages.py --size 64K --calls 500 --columns ring,mpi
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = str(Path(__file__).resolve())
RESULT_MARK = "RESULT "
DSML_KINDS = ("pingpong", "default", "ring", "recursive_doubling")
COLUMNS = DSML_KINDS + ("mpi", "mpi-pingpong", "pipe")

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def vector(nbytes: int, rank: int):
    """Rank r's input: small integers in float32, so every sum is exact and checkable."""
    import numpy as np
    return ((np.arange(nbytes // 4, dtype=np.int64) + rank) % 7).astype(np.float32)


def emit(times) -> None:
    print(RESULT_MARK + json.dumps([float(t) for t in times]), flush=True)


# --- workers (each runs in a process of its own) -------------------------------------------------

def dsml_worker(kind, nbytes, warm, calls, root=None):
    """One dsml measurement on engine="processes"; prints rank 0's per-call times."""
    if root is not None:
        sys.path.insert(0, root)
    import numpy as np

    import dsml
    from dsml.collectives import allreduce
    print(f"# dsml from {Path(dsml.__file__).parent}", file=sys.stderr)

    def program(comm):
        x = vector(nbytes, comm.rank)
        expected = vector(nbytes, 0) + vector(nbytes, 1)
        peer = 1 - comm.rank
        times = np.empty(warm + calls)
        clock = time.perf_counter
        for i in range(warm + calls):
            t = clock()
            if kind == "pingpong" and comm.rank == 0:
                yield comm.send(peer, x)
                out = yield comm.recv(peer)
            elif kind == "pingpong":
                out = yield comm.recv(peer)
                yield comm.send(peer, out)
            elif kind == "default":         # no algorithm named: what a user gets
                out = yield from allreduce(comm, x)
            else:
                out = yield from allreduce(comm, x, algorithm=kind)
            times[i] = clock() - t
        if kind != "pingpong" and not np.array_equal(out, expected):
            raise AssertionError(f"{kind}: wrong sum")
        if kind == "pingpong" and not np.array_equal(out, x if comm.rank == 0 else vector(nbytes, 0)):
            raise AssertionError("pingpong: wrong payload")
        return times[warm:]

    result = dsml.run(program, 2, engine="processes", trace=False, timeout=600)
    emit(result.values[0])


def mpi_worker(kind, nbytes, warm, calls):
    import numpy as np
    from mpi4py import MPI

    from dsml.comm.mpi import unlink_mpich_segments
    comm = MPI.COMM_WORLD
    comm.Barrier()
    unlink_mpich_segments()
    rank, peer = comm.Get_rank(), 1 - comm.Get_rank()
    x = vector(nbytes, rank)
    out = np.empty_like(x)
    times = np.empty(warm + calls)
    clock = time.perf_counter
    for i in range(warm + calls):
        t = clock()
        if kind == "mpi":
            comm.Allreduce(x, out, op=MPI.SUM)
        elif rank == 0:
            comm.Send(x, dest=peer)
            comm.Recv(out, source=peer)
        else:
            comm.Recv(out, source=peer)
            comm.Send(out, dest=peer)
        times[i] = clock() - t
    expected = vector(nbytes, 0) + vector(nbytes, 1) if kind == "mpi" else vector(nbytes, 0)
    if not np.array_equal(out, expected):
        comm.Abort(3)
    if rank == 0:
        emit(times[warm:])


def _pin(rank):
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) >= 2:
            os.sched_setaffinity(0, {cpus[rank]})


def _read_exactly(fd, n):
    got = b""
    while len(got) < n:
        try:
            got += os.read(fd, n - len(got))
        except BlockingIOError:
            pass
    return got


def pipe_worker(nbytes, warm, calls):
    """Bare-pipe ping-pong between this process (rank 0) and a forked child (rank 1)."""
    import numpy as np
    a_read, a_write = os.pipe()          # 0 -> 1
    b_read, b_write = os.pipe()          # 1 -> 0
    for fd in (a_read, b_read):
        os.set_blocking(fd, False)
    child = os.fork()
    if child == 0:                       # rank 1: echo
        try:
            _pin(1)
            for _ in range(warm + calls):
                os.write(b_write, _read_exactly(a_read, nbytes))
        finally:
            os._exit(0)
    _pin(0)
    data = vector(nbytes, 0).tobytes()
    times = np.empty(warm + calls)
    clock = time.perf_counter
    for i in range(warm + calls):
        t = clock()
        os.write(a_write, data)
        back = _read_exactly(b_read, nbytes)
        times[i] = clock() - t
    os.waitpid(child, 0)
    if back != data:
        raise AssertionError("pipe: wrong payload")
    emit(times[warm:])


# --- the parent -----------------------------------------------------------------------------------

def run_worker(command, timeout=900):
    env = dict(os.environ)
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}):\n"
                       f"{proc.stderr.strip()[-3000:]}")


def commands(columns, args) -> dict:
    """name -> the command line of one measurement."""
    common = ["--size", str(args.size), "--warm-up", str(args.warm_up), "--calls", str(args.calls)]
    out = {}
    for column in columns:
        if column in DSML_KINDS:
            out[column] = [sys.executable, HERE, "--worker", column, "--root", str(ROOT)] + common
            if args.before:
                out[f"{column} (before)"] = [args.before_python or sys.executable, HERE,
                                             "--worker", column, "--root", args.before] + common
        elif column in ("mpi", "mpi-pingpong"):
            from dsml.comm.mpi import mpiexec_command
            out[column] = mpiexec_command(2, [sys.executable, HERE, "--worker", column] + common)
        else:
            out[column] = [sys.executable, HERE, "--worker", column] + common
    return out


def summarize(times) -> dict:
    ordered = sorted(times)
    n = len(ordered)
    return {"median": statistics.median(ordered), "p10": ordered[n // 10],
            "p90": ordered[(9 * n) // 10], "slow": sum(t > 1e-3 for t in ordered) / n}


def uptime() -> str:
    try:
        with open("/proc/loadavg") as f:
            return "load average " + " ".join(f.read().split()[:3])
    except OSError:
        return "load average unknown"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=4096, help="bytes per message (default 4096)")
    parser.add_argument("--calls", type=int, default=2000, help="timed calls (default 2000)")
    parser.add_argument("--warm-up", type=int, default=100, help="untimed calls first (100)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--columns", default=",".join(COLUMNS))
    parser.add_argument("--before", help="also time dsml from this checkout (e.g. main's)")
    parser.add_argument("--before-python", help="the Python for --before (default this one)")
    parser.add_argument("--raw", help="write every repeat's summaries here (JSON)")
    parser.add_argument("--worker", choices=COLUMNS, help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.size % 4 or args.size <= 0:
        parser.error("--size must be a positive multiple of 4 bytes (float32)")

    if args.worker in DSML_KINDS:
        dsml_worker(args.worker, args.size, args.warm_up, args.calls, args.root)
        return 0
    if args.worker in ("mpi", "mpi-pingpong"):
        mpi_worker(args.worker, args.size, args.warm_up, args.calls)
        return 0
    if args.worker == "pipe":
        pipe_worker(args.size, args.warm_up, args.calls)
        return 0

    sys.path.insert(0, str(ROOT))
    columns = [c for c in args.columns.split(",") if c]
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        parser.error(f"unknown column(s) {', '.join(unknown)}; choose from {', '.join(COLUMNS)}")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        for c in ("mpi", "mpi-pingpong"):
            if c in columns:
                print(f"# {c}: skipped, mpi4py is not installed (pip install -e '.[mpi]')")
        columns = [c for c in columns if c not in ("mpi", "mpi-pingpong")]
    jobs = commands(columns, args)
    names = list(jobs)
    print(f"# {args.size} B per message, p = 2, {args.calls} timed calls after {args.warm_up} "
          f"warm-ups, {args.repeats} repeats, columns alternating; start: {uptime()}")
    runs = {name: [] for name in names}
    for repeat in range(args.repeats):
        order = names[repeat % len(names):] + names[:repeat % len(names)]
        for name in order:
            summary = summarize(run_worker(jobs[name]))
            runs[name].append(summary)
            print(f"#   repeat {repeat + 1}: {name:<30} median {summary['median'] * 1e6:7.1f} µs"
                  f"  ({uptime()})", file=sys.stderr, flush=True)
    print(f"# end: {uptime()}")
    mpi = statistics.median(r["median"] for r in runs["mpi"]) if "mpi" in runs else None
    print(f"{'per call, rank 0':<30} {'median µs':>10} {'range':>15} {'p10':>7} {'p90':>7} "
          f"{'>1ms':>6}" + (f" {'/ MPI':>6}" if mpi else ""))
    for name in names:
        medians = [r["median"] * 1e6 for r in runs[name]]
        median = statistics.median(medians)
        p10 = statistics.median(r["p10"] for r in runs[name]) * 1e6
        p90 = statistics.median(r["p90"] for r in runs[name]) * 1e6
        slow = statistics.median(r["slow"] for r in runs[name]) * 100
        span = f"{min(medians):.1f}-{max(medians):.1f}"
        print(f"{name:<30} {median:>10.1f} {span:>15} {p10:>7.1f} {p90:>7.1f} {slow:>5.1f}%"
              + (f" {median / (mpi * 1e6):>5.1f}x" if mpi else ""))
    if args.raw:
        Path(args.raw).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
