"""Plumbing (hand-written): validation — every all-reduce run for real beside the simulator's
prediction of the same measurement (`dsml validate`, week 2 §15, and
benchmarks/allreduce_real_engines.py).

One measurement method for all of them (`timed_allreduce`): a few warm-up all-reduces (page
faults, buffer pools), a barrier, then a loop of all-reduces **each timed on its own**; a rank
reports the **median** of its calls, a run counts as its slowest rank, and a result is the median
over repeated runs, the algorithms taking turns. The median of single calls, not the loop's mean:
on a shared machine a few calls in a loop of a hundred lose a core for milliseconds, and their
mean moved the same 1 MiB all-reduce 4× from run to run (docs/measurements.md). The simulator runs
the same loop (`predicted_allreduce`), and model and measurement are compared as a **ratio**,
measured ÷ predicted: a 3× miss reads 3× whichever side it falls on.

Each run also reports how much of it a rank spent **waiting for a CPU** (Linux's per-thread
schedstat: runnable, but another program held the core). A run with a share of more than a few
per cent measured the machine's load, not the transport: on the development machine the same
1 MiB all-reduce took 120–180 µs a call with no wait and 500–800 µs while another program kept a
core busy (docs/measurements.md).
"""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from dsml.collectives.allreduce import ALLREDUCE_ALGORITHMS, allreduce
from dsml.comm.api import SizeOnly
from dsml.comm.run import run
from dsml.comm.sim_engine import simulate

BUDGET = 64 * 2**20     # bytes all-reduced per timed loop, unless a caller asks for another


def allreduce_iterations(nbytes: int, budget: int = BUDGET, most: int = 200,
                         least: int = 5) -> tuple:
    """(warm-ups, timed) all-reduces of `nbytes` for one timed loop: as many timed ones as
    `budget` bytes allow, but between `least` and `most`; then up to 5 warm-ups."""
    timed = max(least, min(most, budget // max(1, nbytes)))
    return min(5, timed), timed


def cpu_wait_seconds():
    """Seconds this thread has spent ready to run but waiting for a CPU (Linux's schedstat:
    another program held the core), or None where the system does not say."""
    try:
        with open("/proc/thread-self/schedstat") as stat:
            return int(stat.read().split()[1]) * 1e-9
    except (OSError, ValueError, IndexError):
        return None


def timed_loop(comm, x, algorithm: str, warmups: int, timed: int, waits=None):
    """Rank program step: `warmups` all-reduces of x (first-touch costs, pools, caches), a
    barrier (a ring all-reduce of one element per rank, so that no rank starts its clock while
    another is still warming up), then `timed` all-reduces, comm.now() read after each.
    Returns (the median of this rank's seconds per all-reduce, the last result). `waits`, a
    list, gets (seconds this rank waited for a CPU during the timed calls, their seconds)."""
    for _ in range(warmups):
        yield from allreduce(comm, x, algorithm=algorithm)
    yield from allreduce(comm, np.zeros(comm.size), algorithm="ring")  # the barrier
    waited = None if waits is None else cpu_wait_seconds()
    stamps = [(yield comm.now())]
    for _ in range(timed):
        out = yield from allreduce(comm, x, algorithm=algorithm)
        stamps.append((yield comm.now()))
    if waited is not None:
        waits.append((cpu_wait_seconds() - waited, stamps[-1] - stamps[0]))
    return float(np.median(np.diff(stamps))), out


def timed_allreduce(comm, sizes, algorithm: str = "ring", dtype: str = "float64",
                    budget: int = BUDGET, most: int = 200, waits=None):
    """Rank program, the one measurement of `dsml validate`, week 2's section 15 and
    benchmarks/allreduce_real_engines.py: for each size (bytes) a `timed_loop` on a vector
    of rank + 1's, whose sum it checks. Returns this rank's seconds per all-reduce, per size."""
    seconds = []
    for nbytes in sizes:
        x = np.full(nbytes // np.dtype(dtype).itemsize, comm.rank + 1, dtype=dtype)
        t, out = yield from timed_loop(comm, x, algorithm,
                                       *allreduce_iterations(nbytes, budget, most), waits)
        if not np.all(out == comm.size * (comm.size + 1) // 2):
            raise AssertionError(f"rank {comm.rank}: wrong {algorithm} all-reduce of {nbytes} B")
        seconds.append(t)
    return seconds


def timed_allreduce_waiting(comm, sizes, algorithm: str = "ring", dtype: str = "float64",
                            budget: int = BUDGET, most: int = 200):
    """Rank program: `timed_allreduce`, and the share of its timed calls' time this rank spent
    waiting for a CPU (None where unknown): what says whether a run measured the transport or
    the load. (Start-up and warm-ups are left out: a rank waits there for the parent forking
    its peers, which says nothing about the calls.)"""
    waits = [] if cpu_wait_seconds() is not None else None
    seconds = yield from timed_allreduce(comm, sizes, algorithm, dtype, budget, most, waits)
    elapsed = sum(t for _, t in waits) if waits else 0.0
    return seconds, sum(w for w, _ in waits) / elapsed if elapsed > 0 else None


def slowest_rank(values) -> list:
    """Per size, the largest of the ranks' times (each rank returned one list of sizes)."""
    return [max(per_rank[i] for per_rank in values) for i in range(len(values[0]))]


def available_cores() -> int:
    """The CPUs this process may run on: up to this many ranks each get a core of their own."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def measure_allreduce(p: int, sizes, algorithms=("ring",), engine: str = "processes",
                      repeats: int = 3, budget: int = BUDGET, most: int = 200,
                      network=None) -> dict:
    """{algorithm: seconds per all-reduce, per size}: the median over `repeats` runs of the
    slowest rank's `timed_allreduce` (float64). Every repeat runs each algorithm once, in
    turn, so that a burst of load elsewhere hits them alike. `network`: engine "sim" only."""
    runs = measure_allreduce_runs(p, sizes, algorithms, engine, repeats, budget, most, network)
    return {a: [float(np.median([r[i] for r in runs[a]])) for i in range(len(sizes))]
            for a in algorithms}


def measure_allreduce_runs(p: int, sizes, algorithms=("ring",), engine: str = "processes",
                           repeats: int = 3, budget: int = BUDGET, most: int = 200,
                           network=None, waits: dict | None = None) -> dict:
    """{algorithm: one list per repeat of seconds per all-reduce, per size}: the runs whose
    median `measure_allreduce` takes, kept for their spread. `waits`, if given (real engines),
    gets {algorithm: per repeat, the largest share of its run a rank waited for a CPU}."""
    runs = {a: [] for a in algorithms}
    program = timed_allreduce if engine == "sim" else timed_allreduce_waiting
    for _ in range(repeats):
        for algorithm in algorithms:
            values = run(program, p, engine=engine, network=network, trace=False,
                         args=(list(sizes), algorithm, "float64", budget, most)).values
            if engine != "sim":
                shares = [share for _, share in values]
                values = [seconds for seconds, _ in values]
                if waits is not None:
                    known = [share for share in shares if share is not None]
                    waits.setdefault(algorithm, []).append(max(known) if known else None)
            runs[algorithm].append(slowest_rank(values))
    return runs


def predicted_allreduce(p: int, nbytes: int, network, algorithm: str = "ring",
                        budget: int = BUDGET, most: int = 200) -> float:
    """The simulator's seconds per all-reduce of `nbytes` on p ranks over `network`, for the
    same measurement: `timed_loop` with the same counts, the slowest rank."""
    def program(comm):
        seconds, _ = yield from timed_loop(comm, SizeOnly(nbytes), algorithm,
                                           *allreduce_iterations(nbytes, budget, most))
        return seconds
    return max(simulate(program, p, network, trace=False).values)


class Validation(NamedTuple):
    """One validated run: measured and predicted seconds per all-reduce."""
    algorithm: str
    world_size: int
    nbytes: int
    measured: float
    predicted: float
    runs: tuple = ()      # seconds per all-reduce in each repeat; `measured` is their median
    cpu_wait: float | None = None    # share of a run its slowest-waiting rank waited for a CPU
                                     # (median over repeats; None: not known on this system)

    @property
    def ratio(self) -> float:
        """measured ÷ predicted: above 1 when the model is optimistic, 3.0 for a 3× miss."""
        return self.measured / self.predicted

    @property
    def spread(self) -> tuple:
        """(fastest, slowest) repeat's seconds per all-reduce."""
        return (min(self.runs), max(self.runs)) if self.runs else (self.measured,) * 2


def miss(ratio: float) -> float:
    """How far a ratio is from 1 either way, as a factor ≥ 1: 3.0 for 3 and for 1/3."""
    return max(ratio, 1 / ratio)


def summary(rows, smallest: int = 0) -> tuple:
    """(median ratio, worst ratio) of the rows of `nbytes` ≥ `smallest`: the median of their
    measured ÷ predicted, and the ratio that misses by the largest factor either way."""
    ratios = [r.ratio for r in rows if r.nbytes >= smallest]
    return float(np.median(ratios)), max(ratios, key=miss)


def validate(network, engine: str = "processes", algorithms=ALLREDUCE_ALGORITHMS,
             sizes=(1024, 16384, 262144, 4194304), world_sizes=(2, 4), repeats: int = 3,
             budget: int = BUDGET, most: int = 200, report=None) -> list:
    """Every all-reduce algorithm for real (`measure_allreduce`) beside the simulator's
    prediction with `network`; one Validation per (world size, algorithm, size). Sizes are
    bytes, multiples of 8; `budget` and `most` set the timed loop's length
    (`allreduce_iterations`). `report(row)` after each row."""
    for nbytes in sizes:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 8 or nbytes % 8:
            raise ValueError(f"sizes must be multiples of 8 bytes (float64), got {nbytes!r}")
    rows = []
    for p in world_sizes:
        waits = {}
        runs = measure_allreduce_runs(p, sizes, algorithms, engine, repeats, budget, most,
                                      waits=waits)
        for algorithm in algorithms:
            known = [w for w in waits.get(algorithm, ()) if w is not None]
            wait = float(np.median(known)) if known else None
            for i, nbytes in enumerate(sizes):
                each = tuple(r[i] for r in runs[algorithm])
                rows.append(Validation(algorithm, p, nbytes, float(np.median(each)),
                                       predicted_allreduce(p, nbytes, network, algorithm,
                                                           budget, most), each, wait))
                if report is not None:
                    report(rows[-1])
    return rows
