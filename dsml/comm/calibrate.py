"""Generated from notebooks/week2_collective_communication.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 72
import time

import numpy as np

from dsml.comm.run import run
from dsml.net.alphabeta import AlphaBeta
from dsml.net.fit import fit_alpha_beta


WARM_UP_ROUND_TRIPS = 2


def ping_pong(comm, nbytes, round_trips):
    """Rank program for 2 ranks: the one-way time (s) of an n-byte message — half the median of
    `round_trips` round trips, each timed with comm.now(), after WARM_UP_ROUND_TRIPS untimed
    ones that pay the first-touch costs (on `processes`, each side holds one message while the
    next arrives, so its shared-memory pool needs two segments per peer). The median, because a
    round trip during which another program ran on this core is not what a message costs."""
    message = np.zeros(nbytes, dtype=np.uint8)
    stamps = []
    for i in range(WARM_UP_ROUND_TRIPS + round_trips):
        if i >= WARM_UP_ROUND_TRIPS:
            stamps.append((yield comm.now()))
        if comm.rank == 0:
            yield comm.send(1, message)
            message = yield comm.recv(1)
        else:
            message = yield comm.recv(0)
            yield comm.send(0, message)
    stamps.append((yield comm.now()))
    return float(np.median(np.diff(stamps))) / 2


def measure(program, p, args, repeats: int = 3, engine: str = "processes", statistic=np.median,
            network=None):
    """`statistic` over `repeats` runs of the slowest rank's own timing (what each rank of
    `program` returns): the median by default; `min` where noise only ever adds time.
    `network` only for engine "sim"."""
    return float(statistic([max(run(program, p, engine=engine, network=network,
                                    args=args).values)
                            for _ in range(repeats)]))


# -- cell 73
def reduction_seconds_per_byte(nbytes: int, repeats: int = 5) -> float:
    """γ of this machine: the fastest of `repeats` in-place np.add of two float64 vectors of
    `nbytes` each — the reduction a combine stands for — per byte."""
    u, v = np.ones(max(1, nbytes // 8)), np.ones(max(1, nbytes // 8))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.add(u, v, out=u)
        best = min(best, time.perf_counter() - start)
    return best / u.nbytes


CALIBRATION_SIZES = [4**k for k in range(12)]        # 1 B … 4 MiB


def calibrate(engine: str = "processes", sizes=CALIBRATION_SIZES, round_trips: int = 10,
              repeats: int = 3, gamma_nbytes: int = 16 * 2**20, network=None, report=None):
    """Measure this machine as an α–β–γ model. Returns (AlphaBeta, one-way times in s).

    α (s) and β (s/byte) are fitted by least squares (`fit_alpha_beta`) to the median one-way
    ping-pong time of each size on `engine`, `round_trips` round trips at every size;
    γ (s/byte) is `np.add` on `gamma_nbytes`, larger than the caches (None: not measured, 0).
    `report(nbytes, seconds)` is called after each size, for a caller that prints as it goes."""
    times = []
    for nbytes in sizes:
        times.append(measure(ping_pong, 2, (nbytes, round_trips), repeats, engine,
                             network=network))
        if report is not None:
            report(nbytes, times[-1])
    alpha, beta = fit_alpha_beta(sizes, times)
    gamma = 0.0 if gamma_nbytes is None else reduction_seconds_per_byte(gamma_nbytes)
    return AlphaBeta(alpha, beta, gamma), times
