"""Plumbing (hand-written): calibration — this machine measured as an α–β–γ model, the way the
collectives use it, for the simulator to predict real runs (`dsml calibrate`, week 2 §15).

What a collective does at each step is an **exchange**: both ranks of a pair send a block to
each other at once (`sendrecv`), then write what arrived into a buffer of their own — copied
(an all-gather step) or added to their own block (a reduce-scatter or recursive-doubling step)
— and every call makes fresh result buffers. `collective_steps` times exactly that on two ranks,
per size, alternating the copying and the adding step so that load hits both alike:

- α (s) and β (s/byte) are the least-squares line (`fit_alpha_beta`, relative error) through
  the median time of the copying step: the model's α + nβ for one message each way at once
  (fitted again without the sizes that lie twice or more off the first line, if they are a
  quarter of the sizes or fewer and not the two largest: one burst of load would otherwise bend
  the line);
- γ (s/byte) is what adding costs beyond copying: the adding step's fitted slope minus the
  copying step's (never below 0).

A ping-pong (`ping_pong`, week 1's and `dsml pingpong`'s measurement) sends one way at a time,
reuses the array it received, and neither copies nor adds: on the development machine a model
fitted to it predicted all-reduces of 64 KiB and more 1.3–3.6× too fast, its β moving 1.3×
between back-to-back runs (docs/measurements.md). `calibrate` also says what makes a fit suspect: a size whose median
lies far off the line (a burst of load during its runs), and a half-performance size α/β
beyond the largest size measured (then β rests on no size that is bandwidth-bound).
"""
from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from dsml.comm.run import run
from dsml.net.alphabeta import AlphaBeta
from dsml.net.fit import fit_alpha_beta

WARM_UP_ROUND_TRIPS = 2
WARM_UP_STEPS = 4           # untimed steps per size: segments, pools, first-touch pages
CALIBRATION_SIZES = [2**k for k in range(3, 23)]     # 8 B … 4 MiB, every power of two
CALIBRATION_TAG = 7
OUTLIER = 2.0               # a size this many times off the fitted line is named in a warning


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


def reduction_seconds_per_byte(nbytes: int, repeats: int = 5) -> float:
    """The fastest of `repeats` in-place np.add of two float64 vectors of `nbytes` each, per
    byte: what a reduction costs on its own, with no message around it."""
    u, v = np.ones(max(1, nbytes // 8)), np.ones(max(1, nbytes // 8))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.add(u, v, out=u)
        best = min(best, time.perf_counter() - start)
    return best / u.nbytes


def collective_steps(comm, sizes, steps: int):
    """Rank program for 2 ranks: per size (bytes, multiples of 8), the median seconds of a
    collective's step — exchange n bytes of float64 with the other rank (`sendrecv`), then
    copy what arrived into a fresh buffer — and of the same step adding it to this rank's own
    block instead (charging the simulator's γ with a combine). `steps` timed steps of each,
    alternating, after WARM_UP_STEPS untimed ones. Returns (copy medians, add medians)."""
    peer = 1 - comm.rank
    copies, adds = [], []
    for nbytes in sizes:
        mine = np.full(nbytes // 8, comm.rank + 1.0)
        timed = ([], [])
        for i in range(WARM_UP_STEPS + 2 * steps):
            adding = i % 2
            start = yield comm.now()
            got = yield comm.sendrecv(peer, mine, peer, CALIBRATION_TAG)
            out = np.empty_like(mine)              # every collective call makes new buffers
            if adding:
                yield comm.combine(got.nbytes)
                np.add(mine, got, out=out)
            else:
                np.copyto(out, got)
            if i >= WARM_UP_STEPS:
                timed[adding].append((yield comm.now()) - start)
        copies.append(float(np.median(timed[0])))
        adds.append(float(np.median(timed[1])))
    return copies, adds


class Calibration(NamedTuple):
    """What `calibrate` measured: the model, and the medians it was fitted to."""
    network: AlphaBeta
    sizes: list             # bytes
    step_seconds: list      # a copying exchange step per size (the slowest rank, median of runs)
    add_seconds: list       # the same step adding instead of copying
    warnings: list          # sentences: what makes this fit suspect (empty when nothing does)


def off_line(nbytes: int, seconds: float, alpha: float, beta: float) -> bool:
    """True if a size's time lies OUTLIER times or more off the line α + nβ, either way."""
    line = alpha + nbytes * beta
    return line <= 0 or not 1 / OUTLIER < seconds / line < OUTLIER


def fit_warnings(sizes, seconds, alpha: float, beta: float) -> list[str]:
    """Sentences naming what makes a fitted line suspect: sizes whose time is OUTLIER times off
    the line either way, and a half-performance size α/β beyond the largest size measured."""
    warnings = []
    for nbytes, t in zip(sizes, seconds):
        line = alpha + nbytes * beta
        ratio = t / line if line > 0 else float("inf")
        if off_line(nbytes, t, alpha, beta):
            warnings.append(f"{nbytes} B took {t * 1e6:.1f} µs where the fitted line says "
                            f"{line * 1e6:.1f} µs ({ratio:.2f}×): the line does not describe "
                            f"this size (a burst of load during its runs, or a change of path "
                            f"such as the processes engine's pipe-to-shared-memory switch at "
                            f"32 KiB)")
    return warnings + half_size_warning(sizes, alpha, beta)


def half_size_warning(sizes, alpha: float, beta: float) -> list[str]:
    """A sentence if the half-performance size α/β lies beyond the largest size measured."""
    warnings = []
    if beta > 0 and alpha / beta > max(sizes):
        warnings.append(f"the half-performance size α/β = {alpha / beta:.0f} B lies beyond the "
                        f"largest size measured ({max(sizes)} B): β rests on no size whose "
                        f"time the bandwidth decides; measure larger sizes (-e)")
    return warnings


def calibrate(engine: str = "processes", sizes=CALIBRATION_SIZES, steps: int = 10,
              repeats: int = 3, network=None, report=None) -> Calibration:
    """Measure this machine as an α–β–γ model (see the module docstring) on `engine` with two
    ranks. Each of `repeats` runs times every size (`collective_steps`); per size the slowest
    rank counts and the median over runs is fitted. `network`: engine "sim" only (it then
    recovers that network's α, β, γ). `report(nbytes, step seconds, add seconds)` per size."""
    for nbytes in sizes:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 8 or nbytes % 8:
            raise ValueError(f"calibration sizes must be multiples of 8 bytes (float64), got "
                             f"{nbytes!r}")
    if len(sizes) < 2:
        raise ValueError(f"calibration needs at least 2 sizes to fit a line, got {list(sizes)}")
    runs = [run(collective_steps, 2, engine=engine, network=network, trace=False,
                args=(list(sizes), steps)).values for _ in range(repeats)]
    copies, adds = [], []
    for i, nbytes in enumerate(sizes):
        copies.append(float(np.median([max(v[0][i] for v in values) for values in runs])))
        adds.append(float(np.median([max(v[1][i] for v in values) for values in runs])))
        if report is not None:
            report(nbytes, copies[-1], adds[-1])
    alpha, beta = fit_alpha_beta(sizes, copies)
    warnings = fit_warnings(sizes, copies, alpha, beta)
    # One burst of load can leave a size 10× off, and a least-squares line bends to it: fit
    # again without the sizes far off the first line (said in a warning) — but never without
    # the two largest, whose times carry β (a slope they share is no burst of load), and only
    # when a quarter of the sizes or fewer are off.
    largest = sorted(sizes)[-2:]
    kept = [i for i, (n, t) in enumerate(zip(sizes, copies))
            if n in largest or not off_line(n, t, alpha, beta)]
    if len(kept) < len(sizes) and len(sizes) - len(kept) <= len(sizes) // 4:
        sizes_kept = [sizes[i] for i in kept]
        alpha, beta = fit_alpha_beta(sizes_kept, [copies[i] for i in kept])
        _, beta_add = fit_alpha_beta(sizes_kept, [adds[i] for i in kept])
        left_out = sorted(set(sizes) - set(sizes_kept))
        warnings = [w for w in warnings if not w.startswith("the half-performance")]
        warnings.append(f"fitted again without {', '.join(f'{n} B' for n in left_out)}; "
                        f"the model describes the other {len(kept)} sizes")
        warnings += half_size_warning(sizes_kept, alpha, beta)
    else:
        _, beta_add = fit_alpha_beta(sizes, adds)
    gamma = max(0.0, beta_add - beta)
    return Calibration(AlphaBeta(alpha, beta, gamma), list(sizes), copies, adds, warnings)
