"""Generated from notebooks/week2_collective_communication.ipynb — do not edit; edit the notebook and run `make export`."""

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.collectives.allreduce import ALLREDUCE_ALGORITHMS, allreduce


# -- cell 76
import os
from typing import NamedTuple

import numpy as np

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


def timed_loop(comm, x, algorithm: str, warmups: int, timed: int):
    """Rank program step: `warmups` all-reduces of x (first-touch costs, pools, caches), a
    barrier (a ring all-reduce of one element per rank, so that no rank starts its clock while another is
    still warming up), then `timed` all-reduces between two readings of comm.now().
    Returns (this rank's seconds per all-reduce, the last result)."""
    for _ in range(warmups):
        yield from allreduce(comm, x, algorithm=algorithm)
    yield from allreduce(comm, np.zeros(comm.size), algorithm="ring")  # the barrier
    start = yield comm.now()
    for _ in range(timed):
        out = yield from allreduce(comm, x, algorithm=algorithm)
    return ((yield comm.now()) - start) / timed, out


def timed_allreduce(comm, sizes, algorithm: str = "ring", dtype: str = "float64",
                    budget: int = BUDGET, most: int = 200):
    """Rank program, the one measurement of `dsml validate`, week 2's section 15 and
    benchmarks/allreduce_real_engines.py: for each size (bytes) a `timed_loop` on a vector
    of rank + 1's, whose sum it checks. Returns this rank's seconds per all-reduce, per size."""
    seconds = []
    for nbytes in sizes:
        x = np.full(nbytes // np.dtype(dtype).itemsize, comm.rank + 1, dtype=dtype)
        t, out = yield from timed_loop(comm, x, algorithm,
                                       *allreduce_iterations(nbytes, budget, most))
        if not np.all(out == comm.size * (comm.size + 1) // 2):
            raise AssertionError(f"rank {comm.rank}: wrong {algorithm} all-reduce of {nbytes} B")
        seconds.append(t)
    return seconds


def slowest_rank(values) -> list:
    """Per size, the largest of the ranks' times (each rank returned one list of sizes)."""
    return [max(per_rank[i] for per_rank in values) for i in range(len(values[0]))]


# -- cell 77
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
                           network=None) -> dict:
    """{algorithm: one list per repeat of seconds per all-reduce, per size}: the runs whose
    median `measure_allreduce` takes, kept for their spread."""
    runs = {a: [] for a in algorithms}
    for _ in range(repeats):
        for algorithm in algorithms:
            values = run(timed_allreduce, p, engine=engine, network=network, trace=False,
                         args=(list(sizes), algorithm, "float64", budget, most)).values
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


# -- cell 78
class Validation(NamedTuple):
    """One validated run: measured and predicted seconds per all-reduce."""
    algorithm: str
    world_size: int
    nbytes: int
    measured: float
    predicted: float
    runs: tuple = ()      # seconds per all-reduce in each repeat; `measured` is their median

    @property
    def error(self) -> float:
        """predicted / measured − 1: negative when the model is optimistic."""
        return self.predicted / self.measured - 1


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
        runs = measure_allreduce_runs(p, sizes, algorithms, engine, repeats, budget, most)
        for algorithm in algorithms:
            for i, nbytes in enumerate(sizes):
                each = tuple(r[i] for r in runs[algorithm])
                rows.append(Validation(algorithm, p, nbytes, float(np.median(each)),
                                       predicted_allreduce(p, nbytes, network, algorithm,
                                                           budget, most), each))
                if report is not None:
                    report(rows[-1])
    return rows
