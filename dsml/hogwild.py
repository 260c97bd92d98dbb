"""Generated from notebooks/week4_async_and_parameter_servers.ipynb — do not edit; edit the notebook and run `make export`."""
from __future__ import annotations


# -- cell 46
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SparseProblem:
    """Least squares whose example i involves only the coordinates idx[i] of w (length d):
    f(w) = 1/(2n) Σᵢ (vals[i] · w[idx[i]] − y[i])². idx int64 (n, k), distinct and sorted
    within a row; vals float64 (n, k), each row of norm 1; y float64 (n,); w_true float64 (d,)
    the weights the targets were made from, with Gaussian noise of standard deviation `noise`."""
    idx: np.ndarray
    vals: np.ndarray
    y: np.ndarray
    w_true: np.ndarray
    noise: float

    @property
    def n(self) -> int:
        return self.idx.shape[0]

    @property
    def k(self) -> int:
        return self.idx.shape[1]

    @property
    def d(self) -> int:
        return len(self.w_true)


def distinct_coordinates(n: int, d: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """n rows of k distinct coordinates out of range(d), each row sorted, uniform over subsets."""
    if k * k <= d:
        # Few collisions: draw k with replacement, redraw the rows that repeat one.
        idx = np.sort(rng.integers(0, d, size=(n, k)), axis=1)
        while True:
            repeats = np.flatnonzero((np.diff(idx, axis=1) == 0).any(axis=1))
            if len(repeats) == 0:
                return idx
            idx[repeats] = np.sort(rng.integers(0, d, size=(len(repeats), k)), axis=1)
    # Dense rows: the k smallest of d random keys are a uniform k-subset (costs n·d).
    keys = rng.random((n, d))
    return np.sort(np.argpartition(keys, k - 1, axis=1)[:, :k], axis=1)


# -- cell 47
def sparse_least_squares(n: int, d: int, k: int, noise: float = 0.1,
                         seed: int = 0) -> SparseProblem:
    """A seeded SparseProblem: n examples, each touching k of d coordinates with values ±1/√k,
    targets y = x·w_true + N(0, noise²), w_true ~ N(0, I). k = d makes it dense."""
    if n < 1 or d < 1:
        raise ValueError(f"n and d must be ≥ 1, got n={n}, d={d}")
    if not 1 <= k <= d:
        raise ValueError(f"k (coordinates per example) must be in 1..d={d}, got {k}")
    if not noise >= 0:
        raise ValueError(f"noise must be ≥ 0, got {noise}")
    rng = np.random.default_rng(seed)
    idx = distinct_coordinates(n, d, k, rng)
    vals = rng.choice([-1.0, 1.0], size=(n, k)) / np.sqrt(k)
    w_true = rng.standard_normal(d)
    y = np.einsum("ij,ij->i", vals, w_true[idx]) + noise * rng.standard_normal(n)
    return SparseProblem(idx, vals, y, w_true, float(noise))


def problem_loss(problem: SparseProblem, w: np.ndarray) -> float:
    """f(w) = 1/(2n) Σᵢ (xᵢ·w − yᵢ)², reading only the coordinates each example touches."""
    residual = np.einsum("ij,ij->i", problem.vals, w[problem.idx]) - problem.y
    return 0.5 * float(np.mean(residual * residual))


# -- cell 51
def read_and_compute(state: np.ndarray, problem: SparseProblem, i: int, lr: float):
    """The first half of a step on example i: read w_e and its counters (e = problem.idx[i])
    and compute the update of the k rows, −lr·(x·w_e − y)·x in column 0 and 1 in column 1.
    Returns (e, the rows as read, the update)."""
    idx, x = problem.idx[i], problem.vals[i]
    seen = state[idx]                            # w_e and its counters, as read (a copy)
    update = np.empty((len(idx), 2))
    update[:, 0] = -lr * (x @ seen[:, 0] - problem.y[i]) * x
    update[:, 1] = 1.0
    return idx, seen, update


def sparse_sgd_step(state: np.ndarray, problem: SparseProblem, i: int, lr: float) -> int:
    """One SGD step on example i that reads and writes only its coordinates e = problem.idx[i].

    state is (d, 2): column 0 holds w, column 1 counts the updates landed on each coordinate.
    The write adds the update to the k rows in one NumPy statement: a read-modify-write of all
    k rows, not atomic, so a concurrent write to one of them between its read and its write is
    lost, counter included. Returns the number of the k coordinates whose counter moved between
    the step's read and its write — its stale reads."""
    idx, seen, update = read_and_compute(state, problem, i, lr)
    stale = int(np.count_nonzero(state[idx, 1] != seen[:, 1]))
    state[idx] += update
    return stale


def atomic_sgd_step(state: np.ndarray, problem: SparseProblem, i: int, lr: float) -> int:
    """sparse_sgd_step with the write done one coordinate at a time (np.add.at reads one
    element, adds, writes it back, then takes the next), as an atomic add per coordinate would
    — the model Niu et al. analyse. The window in which a concurrent write can be lost shrinks
    from the copy of all k rows to one element's add; stale reads are as before."""
    idx, seen, update = read_and_compute(state, problem, i, lr)
    stale = int(np.count_nonzero(state[idx, 1] != seen[:, 1]))
    np.add.at(state, idx, update)
    return stale


def sample_order(n: int, steps: int, seed: int, worker: int):
    """The examples worker `worker` visits, one epoch (a seeded permutation of range(n)) at a
    time, `steps` in all: a generator, so a long run does not hold its whole order."""
    rng = np.random.default_rng([seed, worker])
    left = steps
    while left > 0:
        epoch = rng.permutation(n)[:left]
        left -= len(epoch)
        yield from epoch


def serial_sgd(problem: SparseProblem, steps: int, lr: float, seed: int = 0) -> np.ndarray:
    """Plain SGD in this process on worker 0's order: the (d, 2) state after `steps` steps."""
    state = np.zeros((problem.d, 2))
    for i in sample_order(problem.n, steps, seed, 0):
        sparse_sgd_step(state, problem, i, lr)
    return state


# -- cell 57
import time
from typing import Callable

from dsml.comm.shared import SharedArrays, fork_context, run_workers


@dataclass
class HogwildResult:
    """What run_hogwild measured. Times in seconds from the common start; a step is one
    example's update, a coordinate update one of its k writes."""
    workers: int
    lock: bool
    steps: int                  # SGD steps taken by all workers together
    seconds: float              # wall time: first worker's start to last worker's end
    updates_per_second: float   # steps / seconds
    params: np.ndarray          # w at the end (a copy)
    loss: float                 # f(params)
    times: np.ndarray           # when the parent sampled the shared w
    losses: np.ndarray          # f at those samples
    coordinate_updates: int     # performed, as the workers counted them (exact)
    lost_updates: int           # performed − landed (what the counters hold): overwritten
    stale_reads: int = 0        # coordinates another update landed on between a read and a write

    @property
    def lost_fraction(self) -> float:
        return self.lost_updates / self.coordinate_updates

    @property
    def stale_fraction(self) -> float:
        return self.stale_reads / self.coordinate_updates


def hogwild_worker(worker: int, state: np.ndarray, problem: SparseProblem, steps: int, lr: float,
                   lock, seed: int, step: Callable, start_line, timeout: float):
    """One worker process: wait for the others at `start_line`, then take `steps` steps on
    its own order, each under `lock` if there is one. Returns (start, end, steps, coordinate
    updates, stale reads as the steps returned them), times on time.perf_counter."""
    order = sample_order(problem.n, steps, seed, worker)
    stale = 0
    start_line.wait(timeout)
    start = time.perf_counter()
    if lock is None:
        for i in order:
            stale += step(state, problem, i, lr) or 0
    else:
        for i in order:
            with lock:
                stale += step(state, problem, i, lr) or 0
    return start, time.perf_counter(), steps, steps * problem.k, stale


# -- cell 58
def _check_hogwild_arguments(problem, workers, steps_per_worker, lr, sample_every, timeout):
    if not isinstance(problem, SparseProblem):
        raise ValueError(f"problem must be a SparseProblem (see sparse_least_squares), got "
                         f"{type(problem).__name__}")
    if not isinstance(workers, (int, np.integer)) or not 1 <= workers <= 64:
        raise ValueError(f"workers must be an integer in 1..64, got {workers!r}")
    if not isinstance(steps_per_worker, (int, np.integer)) or steps_per_worker < 1:
        raise ValueError(f"steps_per_worker must be an integer ≥ 1, got {steps_per_worker!r}")
    if not (isinstance(lr, (int, float, np.floating)) and np.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if not sample_every > 0:
        raise ValueError(f"sample_every must be > 0 seconds, got {sample_every!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")


def run_hogwild(problem: SparseProblem, workers: int, steps_per_worker: int, lr: float,
                lock: bool = False, seed: int = 0, step: Callable = sparse_sgd_step,
                sample_every: float = 0.005, timeout: float = 60.0) -> HogwildResult:
    """Hogwild! (Niu, Recht, Ré & Wright 2011) on `workers` real processes sharing w in shared
    memory: each takes `steps_per_worker` SGD steps (`step`, default sparse_sgd_step) on its
    own seeded order, with no lock, or under one multiprocessing.Lock if `lock`. The parent
    samples w every `sample_every` s. A worker that raises or dies raises WorkerError naming
    it, a run longer than `timeout` s WorkerTimeout; processes and shared memory are cleaned up
    in every case."""
    _check_hogwild_arguments(problem, workers, steps_per_worker, lr, sample_every, timeout)
    workers, steps_per_worker = int(workers), int(steps_per_worker)
    context = fork_context()
    the_lock = context.Lock() if lock else None
    start_line = context.Barrier(workers)
    samples = []
    with SharedArrays() as shared:
        state = shared.zeros((problem.d, 2))

        def sample():
            samples.append((time.perf_counter(), state[:, 0].copy()))
        reports = run_workers(hogwild_worker, workers, timeout=timeout, every=sample_every,
                              tick=sample, args=(state, problem, steps_per_worker, float(lr),
                                                 the_lock, seed, step, start_line, timeout))
        params = state[:, 0].copy()
        landed = int(state[:, 1].sum())
    start = min(report[0] for report in reports)
    end = max(report[1] for report in reports)
    steps = sum(report[2] for report in reports)
    performed = sum(report[3] for report in reports)
    stale = sum(report[4] for report in reports)
    final_loss = problem_loss(problem, params)
    during = [(t - start, w) for t, w in samples if start < t < end]
    times = np.array([0.0] + [t for t, _ in during] + [end - start])
    losses = np.array([problem_loss(problem, np.zeros(problem.d))]
                      + [problem_loss(problem, w) for _, w in during] + [final_loss])
    return HogwildResult(workers, bool(lock), steps, end - start, steps / (end - start), params,
                         final_loss, times, losses, performed, performed - landed, stale)
