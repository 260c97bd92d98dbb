"""Benchmark (hand-written): dsml's ring all-reduce on real processes against MPI and gloo.

Four implementations of the same operation — the sum of a float32 vector over p processes on
this machine — timed the same way:

- **dsml**: `dsml.run(program, p, engine="processes")`, where the program runs
  `dsml.collectives.allreduce(comm, x, algorithm="ring")`, timed with `comm.now()`
  (`--dsml-algorithm` times another of our algorithms in this column, e.g. recursive doubling,
  which MPICH uses for short vectors and which week 2's section 18 measures to be the fastest
  of ours here well past 4 KiB; the table's title names the algorithm).
- **MPI**: mpi4py's `comm.Allreduce` (MPICH from the `mpich` wheel), launched as
  `mpiexec -n p python allreduce_real_engines.py --mpi-worker ...`, timed with `MPI.Wtime`.
- **gloo**: `torch.distributed.all_reduce` on a CPU tensor, backend "gloo", p processes
  started by this script (rendezvous over TCP on 127.0.0.1), one torch thread each.
- **dsml-mpi**: the dsml program on `engine="mpi"` — our algorithms on MPI's own transport
  (mpi4py point-to-point), launched with mpiexec as MPI is; its column in the first table is
  the ring, and a second table holds every algorithm of `--algorithms` against MPI's
  Allreduce: the overhead of our algorithms (and of Python) over MPI's, on the same transport.

- **plain**: the same ring with nothing but NumPy, shared memory and pipes — no dsml, no
  request objects, no message framing: each rank writes the block it sends into a fixed slot
  of its own segment, writes one byte down a pipe to its right neighbour, waits for one from
  its left, and adds (or copies) straight out of the left neighbour's slot. It is the floor
  for a ring written in Python on this machine; the gap between it and **dsml** is what the
  engine's generality costs (framing, segment pools, acknowledgements, the driver). Its ranks
  are pinned and allocate as dsml's do (one core each when there are enough; freed memory
  kept for reuse), so the two differ only in the code between the copies.

Both MPI jobs are started with `dsml.comm.mpi.mpiexec_command` (the flags this host's mpiexec
needs) and one BLAS thread per rank.

Each measurement, for every size: a few warm-up all-reduces, a barrier, N timed all-reduces
(N from `dsml.collectives.validate.allreduce_iterations`: as many as 64 MiB allows, 5 to 200 —
the same rule, and for dsml the same rank program `timed_allreduce`, as `dsml validate` and
week 2 section 15 use); the time per all-reduce is the slowest rank's (max over ranks). They are run
**alternating** — for each repeat, for each world size, dsml then MPI then gloo (the order
rotates every repeat) — so that noise on this shared machine hits all three alike; the table
shows the median over repeats. busbw = 2(p − 1)/p · nbytes / time, as nccl-tests reports it.

Run (from the repository root; mpi4py and torch are optional, their columns are skipped if
they are missing):

    OMP_NUM_THREADS=1 python benchmarks/allreduce_real_engines.py            # p = 2, 4; 4K … 64M
    python benchmarks/allreduce_real_engines.py --engines mpi,dsml-mpi --algorithms ring,tree
    python benchmarks/allreduce_real_engines.py --world-sizes 2 -b 4K -e 1M --repeats 3
    python benchmarks/allreduce_real_engines.py --quick                     # a smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from dsml.cli import format_bytes, parse_size  # noqa: E402
from dsml.collectives import ALLREDUCE_ALGORITHMS, busbw_factor  # noqa: E402
from dsml.collectives.buffers import block_sizes  # noqa: E402
from dsml.collectives.validate import (BUDGET, allreduce_iterations, slowest_rank,  # noqa: E402
                                       timed_allreduce)
from dsml.comm.mpi import (find_mpiexec, mpiexec_command, mpiexec_env,  # noqa: E402
                           unlink_mpich_segments)

ENGINES = ("dsml", "mpi", "gloo", "dsml-mpi", "plain")
RESULT_MARK = "RESULT "        # a worker's line of JSON results on stdout starts with this
QUICK_BUDGET = 16 * 1024**2     # bytes all-reduced per measurement under --quick


def iterations(nbytes: int, quick: bool) -> tuple[int, int]:
    """(warm-up, timed) all-reduces for a message of nbytes: dsml's one rule
    (`allreduce_iterations`, also used by `dsml validate` and week 2), with a smaller budget
    under --quick."""
    return allreduce_iterations(nbytes, budget=QUICK_BUDGET if quick else BUDGET,
                                most=20 if quick else 200)


def vector(nbytes: int, rank: int) -> np.ndarray:
    """Rank r's input: small integers in float32, so every sum is exact and checkable."""
    n = nbytes // 4
    return ((np.arange(n, dtype=np.int64) + rank) % 7).astype(np.float32)


def expected_sum(nbytes: int, p: int) -> np.ndarray:
    return sum(vector(nbytes, r) for r in range(p))


# --- dsml ---------------------------------------------------------------------------------------

def dsml_program(comm, sizes, quick, algorithm="ring"):
    """Rank program: `dsml.collectives.validate.timed_allreduce` on float32 — the measurement
    `dsml validate` and week 2 make (warm-ups, a barrier, the timed loop, a checked sum)."""
    return (yield from timed_allreduce(comm, sizes, algorithm, "float32",
                                       QUICK_BUDGET if quick else BUDGET, 20 if quick else 200))


def run_dsml(p, sizes, quick, algorithm="ring"):
    import dsml
    result = dsml.run(dsml_program, p, engine="processes", args=(sizes, quick, algorithm),
                      trace=False,
                      timeout=1800)
    return slowest_rank(result.values)


# --- MPI ------------------------------------------------------------------------------------------

def mpi_worker(sizes, quick):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    comm.Barrier()               # all through MPI_Init: MPICH's /dev/shm file can go (a killed
    unlink_mpich_segments()      # job would leave it), as dsml's engine does
    p, rank = comm.Get_size(), comm.Get_rank()
    times = []
    for nbytes in sizes:
        x = vector(nbytes, rank)
        out = np.empty_like(x)
        warm, timed = iterations(nbytes, quick)
        for _ in range(warm):
            comm.Allreduce(x, out, op=MPI.SUM)
        comm.Barrier()
        t0 = MPI.Wtime()
        for _ in range(timed):
            comm.Allreduce(x, out, op=MPI.SUM)
        mine = (MPI.Wtime() - t0) / timed
        times.append(comm.allreduce(mine, op=MPI.MAX))
        if not np.array_equal(out, expected_sum(nbytes, p)):
            comm.Abort(3)
    if rank == 0:
        print(RESULT_MARK + json.dumps(times), flush=True)


def run_mpi(p, sizes, quick):
    command = mpiexec_command(p, [sys.executable, str(Path(__file__).resolve()), "--mpi-worker",
                                  "--sizes", ",".join(map(str, sizes))] + ["--quick"] * quick)
    return _run_workers([command])


# --- dsml on the mpi engine --------------------------------------------------------------------

def dsml_mpi_worker(sizes, quick, algorithms):
    """One process of the job: each algorithm over every size, on engine="mpi"."""
    import dsml
    from dsml.comm.mpi import job_rank
    times = {}
    for algorithm in algorithms:
        result = dsml.run(dsml_program, None, engine="mpi", args=(sizes, quick, algorithm),
                          trace=False, timeout=1800)
        times[algorithm] = slowest_rank(result.values)
    if job_rank() == 0:
        print(RESULT_MARK + json.dumps(times), flush=True)


def run_dsml_mpi(p, sizes, quick, algorithms):
    command = mpiexec_command(p, [sys.executable, str(Path(__file__).resolve()),
                                  "--dsml-mpi-worker", "--sizes", ",".join(map(str, sizes)),
                                  "--algorithms", ",".join(algorithms)] + ["--quick"] * quick)
    return _run_workers([command])


# --- plain: NumPy, shared memory and pipes, nothing else -----------------------------------------

def _wait_byte(fd, pause):
    """Spin until one byte can be read from the non-blocking pipe `fd` (giving the CPU away
    between tries when this rank has no core of its own)."""
    while True:
        try:
            if os.read(fd, 1):
                return
        except BlockingIOError:
            pass
        if pause is not None:
            pause()


def plain_worker(rank, p, sizes, quick, names, slot, pipes, result_conn):
    """One rank of the plain ring. Its segment holds 2(p − 1) slots of `slot` bytes, one per
    step of an all-reduce (p − 1 reduce-scatter steps, then p − 1 all-gather steps), so a
    slot is never rewritten within an all-reduce; at the end each rank tells its left
    neighbour it has finished reading, and waits to hear the same from its right one before
    it writes into its slots again."""
    from multiprocessing import shared_memory

    from dsml.comm.rank_process import keep_freed_memory
    keep_freed_memory()       # the malloc setting dsml's ranks use: results reuse freed memory
    right, left = (rank + 1) % p, (rank - 1) % p
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pause = None
    if p <= len(cpus):
        os.sched_setaffinity(0, {cpus[rank]})
    else:
        pause = getattr(os, "sched_yield", None)
    ready_out, ready_in = pipes[("ready", rank)][1], pipes[("ready", left)][0]
    done_out, done_in = pipes[("done", rank)][1], pipes[("done", right)][0]
    for fd in (ready_in, done_in):
        os.set_blocking(fd, False)
    mine_seg = shared_memory.SharedMemory(names[rank])
    left_seg = shared_memory.SharedMemory(names[left])
    steps = 2 * (p - 1)
    out_slots = [np.ndarray(slot // 4, np.float32, mine_seg.buf, s * slot) for s in range(steps)]
    in_slots = [np.ndarray(slot // 4, np.float32, left_seg.buf, s * slot) for s in range(steps)]

    def allreduce(x):
        if p == 1:
            return x.copy()
        n = x.size
        counts = block_sizes(n, p)
        starts = [sum(counts[:i]) for i in range(p)]
        block = [slice(starts[i], starts[i] + counts[i]) for i in range(p)]
        result = np.empty(n, np.float32)
        for s in range(p - 1):                       # reduce-scatter
            send, recv = (rank - s - 1) % p, (rank - s - 2) % p
            source = x if s == 0 else result
            out_slots[s][:counts[send]] = source[block[send]]
            os.write(ready_out, b"r")
            _wait_byte(ready_in, pause)
            np.add(x[block[recv]], in_slots[s][:counts[recv]], out=result[block[recv]])
        for t in range(p - 1):                       # all-gather
            send, recv = (rank - t) % p, (rank - t - 1) % p
            out_slots[p - 1 + t][:counts[send]] = result[block[send]]
            os.write(ready_out, b"r")
            _wait_byte(ready_in, pause)
            result[block[recv]] = in_slots[p - 1 + t][:counts[recv]]
        os.write(done_out, b"d")                     # done reading the left one's slots
        _wait_byte(done_in, pause)                   # the right one is done reading mine
        return result

    try:
        times = []
        token = np.zeros(p, np.float32)
        for nbytes in sizes:
            x = vector(nbytes, rank)
            warm, timed = iterations(nbytes, quick)
            for _ in range(warm):
                out = allreduce(x)
            allreduce(token)                         # a barrier
            t0 = time.perf_counter()
            for _ in range(timed):
                out = allreduce(x)
            times.append((time.perf_counter() - t0) / timed)
            if not np.array_equal(out, expected_sum(nbytes, p)):
                raise AssertionError(f"plain all-reduce of {nbytes} B gave a wrong sum")
        result_conn.send(("ok", times))
    except BaseException as error:                   # report, never hang the parent
        result_conn.send(("error", f"rank {rank}: {error!r}"))
    finally:
        del out_slots, in_slots
        mine_seg.close()
        left_seg.close()


def run_plain(p, sizes, quick, timeout=1800):
    import multiprocessing as mp
    from multiprocessing import shared_memory
    from multiprocessing.connection import wait
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    slot = 4 * -(-max(sizes) // 4 // p)              # bytes of the largest block
    segments = [shared_memory.SharedMemory(create=True, size=max(1, 2 * (p - 1)) * slot)
                for _ in range(p)]
    pipes = {(kind, r): os.pipe() for kind in ("ready", "done") for r in range(p)}
    conns = [ctx.Pipe(duplex=False) for _ in range(p)]
    procs = [ctx.Process(target=plain_worker, daemon=True,
                         args=(r, p, sizes, quick, [s.name for s in segments], slot, pipes,
                               conns[r][1]))
             for r in range(p)]
    try:
        for proc in procs:
            proc.start()
        times, deadline = {}, time.monotonic() + timeout
        while len(times) < p:                        # the first failure ends the run
            pending = [r for r in range(p) if r not in times]
            if not wait([conns[r][0] for r in pending] + [procs[r].sentinel for r in pending],
                        timeout=max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"plain ring: ranks {pending} did not report in {timeout} s")
            for r in pending:
                if conns[r][0].poll():
                    kind, value = conns[r][0].recv()
                    if kind == "error":
                        raise RuntimeError(f"plain ring failed: {value}")
                    times[r] = value
                elif not procs[r].is_alive():
                    raise RuntimeError(f"plain ring: rank {r} died (exit code "
                                       f"{procs[r].exitcode}) without a result")
        return [max(times[r][i] for r in range(p)) for i in range(len(sizes))]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
        for read_end, write_end in pipes.values():
            os.close(read_end)
            os.close(write_end)
        for segment in segments:
            segment.close()
            segment.unlink()


# --- gloo -----------------------------------------------------------------------------------------

def gloo_worker(rank, p, port, sizes, quick):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=p)
    times = []
    for nbytes in sizes:
        x = torch.from_numpy(vector(nbytes, rank))
        warm, timed = iterations(nbytes, quick)
        for _ in range(warm):
            y = x.clone()
            dist.all_reduce(y)
        # all_reduce works in place: time it on one buffer that keeps growing (the values do
        # not matter for the time), then check the sum once on a fresh copy.
        y = x.clone()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(timed):
            dist.all_reduce(y)
        mine = torch.tensor([(time.perf_counter() - t0) / timed], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        times.append(float(mine))
        y = x.clone()
        dist.all_reduce(y)
        if not np.array_equal(y.numpy(), expected_sum(nbytes, p)):
            raise AssertionError(f"gloo all-reduce of {nbytes} B gave a wrong sum")
    if rank == 0:
        print(RESULT_MARK + json.dumps(times), flush=True)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_gloo(p, sizes, quick):
    port = free_port()
    script = str(Path(__file__).resolve())
    commands = [[sys.executable, script, "--gloo-worker", "--rank", str(r), "--world", str(p),
                 "--port", str(port), "--sizes", ",".join(map(str, sizes))] + (["--quick"] * quick)
                for r in range(p)]
    return _run_workers(commands)


def _run_workers(commands, timeout=1800):
    """Start the commands, wait for all, return the JSON list a worker printed."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL, env=mpiexec_env())
             for c in commands]
    results, errors = None, []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            for line in out.splitlines():
                if line.startswith(RESULT_MARK):
                    results = json.loads(line[len(RESULT_MARK):])
            if proc.returncode:
                errors.append(err.strip()[-2000:])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if errors or results is None:
        raise RuntimeError("worker failed:\n" + "\n".join(errors))
    return results


# --- the table ------------------------------------------------------------------------------------

def available() -> dict:
    """Which engines can run here, and why not if not."""
    missing = {}
    try:
        import mpi4py  # noqa: F401
        if find_mpiexec() is None:
            missing["mpi"] = "mpi4py is installed but no mpiexec was found"
    except ImportError:
        missing["mpi"] = "mpi4py is not installed (pip install -e '.[mpi]')"
    if "mpi" in missing:
        missing["dsml-mpi"] = missing["mpi"]
    try:
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_gloo_available():
            missing["gloo"] = "this torch has no gloo backend"
    except ImportError:
        missing["gloo"] = ("torch is not installed (pip install -e '.[torch]': the CPU build "
                           "of torch 2.13.0)")
    return missing


def busbw(nbytes, p, seconds) -> float:
    """Bus bandwidth in GB/s: the all-reduce correction factor 2(p − 1)/p of nccl-tests."""
    return busbw_factor("allreduce", p) * nbytes / seconds / 1e9


def print_table(p, sizes, medians, engines, repeats, dsml_algorithm="ring"):
    name = "ring" if dsml_algorithm == "ring" else \
        f"dsml {dsml_algorithm}, plain and gloo ring, MPI its own choice:"
    print(f"\n# {name} all-reduce, float32 sum, {p} processes, median of {repeats} repeats; "
          f"time per all-reduce (slowest rank), busbw = 2(p-1)/p * size / time")
    # dsml against each of the others: busbw ratio, > 1 when dsml is faster
    others = [e for e in engines if e != "dsml"] if "dsml" in engines else []
    head = f"{'p':>2} {'size':>6}"
    for e in engines:
        head += f" {e + ' µs':>11}"
    for e in engines:
        head += f" {e + ' GB/s':>10}"
    for e in others:
        head += f" {'dsml/' + e:>9}"
    print(head)
    for i, nbytes in enumerate(sizes):
        row = f"{p:>2} {format_bytes(nbytes):>6}"
        for e in engines:
            row += f" {medians[e][i] * 1e6:>11.1f}"
        for e in engines:
            row += f" {busbw(nbytes, p, medians[e][i]):>10.3f}"
        for e in others:
            row += f" {medians[e][i] / medians['dsml'][i]:>9.2f}"
        print(row)
    for e in [e for e in others if e == "mpi"]:       # the target is stated against MPI
        print(f"# {format_bytes(sizes[0])}: dsml time / {e} time = "
              f"{medians['dsml'][0] / medians[e][0]:.1f}x")


def print_algorithms_table(p, sizes, by_algorithm, mpi_medians, repeats):
    """dsml's algorithms on engine mpi: time per all-reduce and, if MPI's Allreduce ran, how
    many times slower than it (> 1: MPI is faster)."""
    print(f"\n# dsml's all-reduce algorithms on engine mpi, float32 sum, {p} processes, median "
          f"of {repeats} repeats; time per all-reduce (slowest rank)"
          + ("; xMPI = time / MPI Allreduce's time" if mpi_medians else ""))
    head = f"{'p':>2} {'size':>6}" + (f" {'MPI µs':>10}" if mpi_medians else "")
    widths = {a: max(9, len(a) + 3) for a in by_algorithm}
    for algorithm in by_algorithm:
        head += f" {algorithm + ' µs':>{widths[algorithm]}}" + (f" {'xMPI':>5}" if mpi_medians
                                                                else "")
    print(head)
    for i, nbytes in enumerate(sizes):
        row = f"{p:>2} {format_bytes(nbytes):>6}"
        if mpi_medians:
            row += f" {mpi_medians[i] * 1e6:>10.1f}"
        for algorithm, times in by_algorithm.items():
            row += f" {times[i] * 1e6:>{widths[algorithm]}.1f}"
            if mpi_medians:
                row += f" {times[i] / mpi_medians[i]:>5.1f}"
        print(row)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-sizes", default="2,4", help="comma-separated (default 2,4)")
    parser.add_argument("-b", "--begin", type=parse_size, default=4096, help="default 4K")
    parser.add_argument("-e", "--end", type=parse_size, default=64 * 1024**2, help="default 64M")
    parser.add_argument("-f", "--factor", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer iterations and repeats")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--algorithms", default=",".join(ALLREDUCE_ALGORITHMS),
                        help="dsml-mpi: the all-reduce algorithms to time (default all; the "
                             "ring is always timed, for the first table)")
    parser.add_argument("--dsml-algorithm", default="ring", choices=ALLREDUCE_ALGORITHMS + ("auto",),
                        help="the algorithm of the dsml column (default ring; MPI picks its own)")
    parser.add_argument("--raw", help="also write every repeat's times here (JSON)")
    # worker modes (started by this script)
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dsml-mpi-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gloo-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    algorithms = ["ring"] + [a for a in args.algorithms.split(",") if a and a != "ring"]
    unknown = [a for a in algorithms if a not in ALLREDUCE_ALGORITHMS]
    if unknown:
        parser.error(f"unknown algorithm(s) {', '.join(unknown)}; choose from "
                     f"{', '.join(ALLREDUCE_ALGORITHMS)}")
    if args.mpi_worker or args.gloo_worker or args.dsml_mpi_worker:
        sizes = [int(s) for s in args.sizes.split(",")]
        if args.mpi_worker:
            mpi_worker(sizes, args.quick)
        elif args.dsml_mpi_worker:
            dsml_mpi_worker(sizes, args.quick, algorithms)
        else:
            gloo_worker(args.rank, args.world, args.port, sizes, args.quick)
        return 0

    sizes, n = [], args.begin
    while n <= args.end:
        sizes.append(n)
        n *= args.factor
    if any(s % 4 for s in sizes):
        parser.error("sizes must be multiples of 4 bytes (float32)")
    repeats = 2 if args.quick and args.repeats == 5 else args.repeats
    world_sizes = [int(w) for w in args.world_sizes.split(",")]
    engines = [e for e in args.engines.split(",") if e]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        parser.error(f"unknown engine(s) {', '.join(unknown)}; choose from {', '.join(ENGINES)}")
    missing = available()
    for e in engines:
        if e in missing:
            print(f"# {e}: skipped, {missing[e]}")
    engines = [e for e in engines if e not in missing]
    runners = {"dsml": lambda p, sizes, quick: run_dsml(p, sizes, quick, args.dsml_algorithm), "mpi": run_mpi, "gloo": run_gloo, "plain": run_plain,
               "dsml-mpi": lambda p, sizes, quick: run_dsml_mpi(p, sizes, quick, algorithms)}
    print(f"# sizes {format_bytes(sizes[0])} … {format_bytes(sizes[-1])}, world sizes {world_sizes}, "
          f"{repeats} repeats, engines alternating: {', '.join(engines)}")
    raw = {p: {e: [] for e in engines} for p in world_sizes}
    for repeat in range(repeats):
        for p in world_sizes:
            order = engines[repeat % len(engines):] + engines[:repeat % len(engines)]
            for e in order:
                t = time.perf_counter()
                raw[p][e].append(runners[e](p, sizes, args.quick))
                print(f"#   repeat {repeat + 1}/{repeats}, p={p}, {e}: "
                      f"{time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    def median_times(runs):
        return [statistics.median(run[i] for run in runs) for i in range(len(sizes))]

    for p in world_sizes:
        by_algorithm = {}
        if "dsml-mpi" in engines:          # each of its runs: algorithm -> times per size
            by_algorithm = {a: median_times([run[a] for run in raw[p]["dsml-mpi"]])
                            for a in algorithms}
        medians = {e: by_algorithm["ring"] if e == "dsml-mpi" else median_times(raw[p][e])
                   for e in engines}
        print_table(p, sizes, medians, engines, repeats, args.dsml_algorithm)
        if by_algorithm:
            print_algorithms_table(p, sizes, by_algorithm, medians.get("mpi"), repeats)
    if args.raw:
        Path(args.raw).write_text(json.dumps({"sizes": sizes, "times": raw}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
