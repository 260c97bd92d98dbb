"""Generated from notebooks/week2_collective_communication.ipynb — do not edit; edit the notebook and run `make export`."""

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.collectives.allreduce import ALLREDUCE_ALGORITHMS, allreduce
from dsml.comm.calibrate import measure


# -- cell 65
from typing import NamedTuple

import numpy as np

from dsml.comm.api import SizeOnly
from dsml.comm.sim_engine import simulate


def timed_allreduce(comm, nbytes: int, iterations: int, algorithm: str = "ring"):
    """Rank program: seconds per all-reduce of `nbytes` (float64), the mean of `iterations`
    after one warm-up; raises if the sum is wrong."""
    x = np.full(nbytes // 8, float(comm.rank + 1))
    expected = comm.size * (comm.size + 1) / 2
    out = yield from allreduce(comm, x, algorithm=algorithm)          # warm-up
    start = yield comm.now()
    for _ in range(iterations):
        out = yield from allreduce(comm, x, algorithm=algorithm)
    elapsed = ((yield comm.now()) - start) / iterations
    if not np.all(out == expected):
        raise AssertionError(f"rank {comm.rank}: wrong {algorithm} all-reduce result")
    return elapsed


def predicted_allreduce(p: int, nbytes: int, network, algorithm: str = "ring") -> float:
    """The simulator's time (s) for one all-reduce of `nbytes` on p ranks over `network`."""
    def program(comm):
        return (yield from allreduce(comm, SizeOnly(nbytes), algorithm=algorithm))
    return simulate(program, p, network, trace=False).time


class Validation(NamedTuple):
    """One validated run: measured and predicted seconds per all-reduce."""
    algorithm: str
    world_size: int
    nbytes: int
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        """predicted / measured − 1: negative when the model is optimistic."""
        return self.predicted / self.measured - 1


def validate(network, engine: str = "processes", algorithms=ALLREDUCE_ALGORITHMS,
             sizes=(1024, 16384, 262144, 4194304), world_sizes=(2, 4), repeats: int = 3,
             report=None) -> list:
    """Run every all-reduce algorithm for real (median of `repeats` runs of the slowest rank)
    and predict each run on the simulator with `network`; one Validation per (world size,
    algorithm, size). Sizes are bytes, multiples of 8. `report(row)` after each row."""
    for nbytes in sizes:
        if nbytes < 8 or nbytes % 8:
            raise ValueError(f"sizes must be multiples of 8 bytes (float64), got {nbytes}")
    rows = []
    for p in world_sizes:
        for algorithm in algorithms:
            for nbytes in sizes:
                iterations = 10 if nbytes <= 65536 else 2
                row = Validation(algorithm, p, nbytes,
                                 measure(timed_allreduce, p, (nbytes, iterations, algorithm),
                                         repeats, engine),
                                 predicted_allreduce(p, nbytes, network, algorithm))
                rows.append(row)
                if report is not None:
                    report(row)
    return rows
