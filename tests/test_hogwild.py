"""Tests for Hogwild! (`dsml.hogwild`, week 4) and the plumbing it runs on (`dsml.comm.shared`).

Lock-free runs race, so their exact values are not reproducible: these tests assert what holds
despite the races — the loss falls below a bound, every step is accounted for, lost updates lie
between none and all, and a lock or a single worker loses none. Runs with one worker are
deterministic and equal serial SGD bit for bit. Real processes on a small CI machine: generous
timeouts, and no assertion about speed.
"""
from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import pytest

from dsml.comm.shared import (SharedArrays, WorkerError, WorkerTimeout, fork_context,
                              run_workers)
from dsml.hogwild import (HogwildResult, SparseProblem, atomic_sgd_step, problem_loss,
                          run_hogwild, sample_order, serial_sgd, sparse_least_squares,
                          sparse_sgd_step)
from leaks import HAVE_DEV_SHM, nothing_left_behind, our_segments  # noqa: F401

SEED = 7
TIMEOUT = 120.0      # a bound for runs that should succeed; never a speed claim
PROBLEM = sparse_least_squares(2000, 200, 5, noise=0.1, seed=SEED)
NOISE_FLOOR = 0.1**2 / 2
STEPS, LR = 20_000, 0.1


# --- the problem and the step -------------------------------------------------------------------

@pytest.mark.parametrize("n, d, k", [(50, 30, 1), (40, 30, 5), (30, 30, 20), (20, 30, 30),
                                     (1, 1, 1)])
def test_examples_touch_k_distinct_sorted_coordinates(n, d, k):
    problem = sparse_least_squares(n, d, k, seed=SEED)
    assert isinstance(problem, SparseProblem)
    assert (problem.n, problem.d, problem.k) == (n, d, k)
    assert problem.idx.shape == problem.vals.shape == (n, k)
    assert problem.idx.min() >= 0 and problem.idx.max() < d
    assert np.all(np.diff(problem.idx, axis=1) > 0)                 # distinct and sorted
    assert np.allclose(np.linalg.norm(problem.vals, axis=1), 1.0)
    if k == d:
        assert np.array_equal(problem.idx, np.tile(np.arange(d), (n, 1)))


def test_generator_is_seeded():
    again = sparse_least_squares(2000, 200, 5, noise=0.1, seed=SEED)
    assert all(np.array_equal(getattr(PROBLEM, f), getattr(again, f))
               for f in ("idx", "vals", "y", "w_true"))
    other = sparse_least_squares(2000, 200, 5, noise=0.1, seed=SEED + 1)
    assert not np.array_equal(PROBLEM.idx, other.idx)


def test_coordinates_are_uniform():
    # Each coordinate is touched k/d of the time, on both paths of the generator.
    for k in (4, 40):
        counts = np.bincount(sparse_least_squares(5000, 80, k, seed=SEED).idx.ravel(),
                             minlength=80)
        expected = 5000 * k / 80
        assert np.all(np.abs(counts - expected) < 6 * np.sqrt(expected)), (k, counts)


@pytest.mark.parametrize("kwargs, words", [
    (dict(n=0, d=5, k=1), "n and d"), (dict(n=5, d=0, k=1), "n and d"),
    (dict(n=5, d=5, k=0), "k (coordinates per example)"),
    (dict(n=5, d=5, k=6), "k (coordinates per example)"),
    (dict(n=5, d=5, k=2, noise=-1.0), "noise"),
])
def test_generator_rejects_bad_sizes(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        sparse_least_squares(**kwargs)


def test_loss_at_the_true_weights_is_the_noise():
    problem = sparse_least_squares(20_000, 100, 5, noise=0.1, seed=SEED)
    assert abs(problem_loss(problem, problem.w_true) - NOISE_FLOOR) < 0.05 * NOISE_FLOOR
    dense_residual = np.zeros((problem.n, problem.d))
    np.put_along_axis(dense_residual, problem.idx, problem.vals, axis=1)
    w = np.random.default_rng(SEED).standard_normal(problem.d)
    assert np.isclose(problem_loss(problem, w),
                      0.5 * np.mean((dense_residual @ w - problem.y) ** 2), rtol=1e-12)


def test_step_is_the_gradient_step_on_the_example_only():
    rng = np.random.default_rng(SEED)
    state = np.column_stack([rng.standard_normal(PROBLEM.d), np.zeros(PROBLEM.d)])
    before = state.copy()
    i = 17
    sparse_sgd_step(state, PROBLEM, i, 0.3)
    x = np.zeros(PROBLEM.d)
    x[PROBLEM.idx[i]] = PROBLEM.vals[i]
    expected = before[:, 0] - 0.3 * (x @ before[:, 0] - PROBLEM.y[i]) * x
    assert np.allclose(state[:, 0], expected, rtol=1e-12, atol=1e-15)
    untouched = np.setdiff1d(np.arange(PROBLEM.d), PROBLEM.idx[i])
    assert np.array_equal(state[untouched], before[untouched])         # bit for bit
    assert state[:, 1].sum() == PROBLEM.k and set(np.flatnonzero(state[:, 1])) == \
        set(PROBLEM.idx[i])


def test_per_coordinate_adds_take_the_same_step_bit_for_bit():
    rng = np.random.default_rng(SEED)
    state = np.column_stack([rng.standard_normal(PROBLEM.d), rng.integers(0, 5, PROBLEM.d)])
    other = state.copy()
    for i in (3, 17, 17, 250):
        assert sparse_sgd_step(state, PROBLEM, i, 0.3) == 0       # nobody wrote meanwhile
        assert atomic_sgd_step(other, PROBLEM, i, 0.3) == 0
    assert np.array_equal(state, other)


class WritesBetween(np.ndarray):
    """A state array that, the second time a step reads its counters, lands another worker's
    update on `rows` first — a concurrent write between the step's read and its write."""
    def __getitem__(self, key):
        self.reads = getattr(self, "reads", 0) + 1
        if self.reads == 2:
            np.asarray(self)[self.rows, 1] += 1
        return np.asarray(super().__getitem__(key))


@pytest.mark.parametrize("step", [sparse_sgd_step, atomic_sgd_step])
def test_a_write_between_a_step_s_read_and_its_write_counts_as_stale_reads(step):
    state = np.zeros((PROBLEM.d, 2)).view(WritesBetween)
    state.rows = PROBLEM.idx[5][:2]                 # two of example 5's coordinates
    assert step(state, PROBLEM, 5, 0.3) == 2


def test_sample_order_is_seeded_per_worker_and_epoch_by_epoch():
    order = list(sample_order(10, 25, SEED, 0))
    assert len(order) == 25
    assert sorted(order[:10]) == sorted(order[10:20]) == list(range(10))   # whole epochs
    assert order == list(sample_order(10, 25, SEED, 0))
    assert order != list(sample_order(10, 25, SEED, 1))


def test_serial_sgd_learns():
    state = serial_sgd(PROBLEM, STEPS, LR, seed=SEED)
    assert state[:, 1].sum() == STEPS * PROBLEM.k
    assert problem_loss(PROBLEM, state[:, 0]) < 2 * NOISE_FLOOR


# --- runs on real processes ----------------------------------------------------------------------

@pytest.mark.parametrize("lock", [False, True])
def test_one_worker_is_serial_sgd_bit_for_bit(lock):
    result = run_hogwild(PROBLEM, 1, 5000, LR, lock=lock, seed=SEED, timeout=TIMEOUT)
    serial = serial_sgd(PROBLEM, 5000, LR, seed=SEED)
    assert isinstance(result, HogwildResult)
    assert np.array_equal(result.params, serial[:, 0])
    assert result.lost_updates == 0 and result.coordinate_updates == 5000 * PROBLEM.k
    assert result.loss == problem_loss(PROBLEM, serial[:, 0])


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("lock", [False, True])
def test_several_workers_learn_and_account_for_every_step(workers, lock):
    result = run_hogwild(PROBLEM, workers, STEPS // workers, LR, lock=lock, seed=SEED,
                         timeout=TIMEOUT)
    assert (result.workers, result.lock) == (workers, lock)
    assert result.steps == STEPS // workers * workers
    assert result.coordinate_updates == result.steps * PROBLEM.k
    assert 0 <= result.lost_updates <= result.coordinate_updates
    assert 0.0 <= result.lost_fraction <= 1.0
    if lock:
        assert result.lost_updates == 0      # every update landed
    assert result.seconds > 0 and result.updates_per_second == result.steps / result.seconds
    assert result.loss == problem_loss(PROBLEM, result.params)
    assert result.loss < 3 * NOISE_FLOOR, result.loss          # it learned, races and all


@pytest.mark.parametrize("lock", [False, True])
def test_per_coordinate_adds_on_processes(lock):
    one = run_hogwild(PROBLEM, 1, 3000, LR, seed=SEED, step=atomic_sgd_step, timeout=TIMEOUT)
    assert np.array_equal(one.params, serial_sgd(PROBLEM, 3000, LR, seed=SEED)[:, 0])
    assert one.lost_updates == one.stale_reads == 0
    two = run_hogwild(PROBLEM, 2, 3000, LR, lock=lock, seed=SEED, step=atomic_sgd_step,
                      timeout=TIMEOUT)
    assert 0 <= two.stale_reads <= two.coordinate_updates and 0 <= two.stale_fraction <= 1
    if lock:                          # read and write under one lock: nothing in between
        assert two.lost_updates == two.stale_reads == 0
    assert two.loss < 3 * NOISE_FLOOR


def test_loss_curve_runs_from_the_start_to_the_end():
    result = run_hogwild(PROBLEM, 2, 10_000, LR, seed=SEED, sample_every=0.001, timeout=TIMEOUT)
    assert result.times[0] == 0.0 and result.times[-1] == result.seconds
    assert np.all(np.diff(result.times) >= 0)
    assert len(result.times) == len(result.losses) >= 2
    assert result.losses[0] == problem_loss(PROBLEM, np.zeros(PROBLEM.d))
    assert result.losses[-1] == result.loss
    assert np.all(np.isfinite(result.losses))


@pytest.mark.parametrize("lock", [False, True])
def test_dense_problem_runs_and_a_lock_still_loses_nothing(lock):
    dense = sparse_least_squares(300, 40, 40, seed=SEED)
    result = run_hogwild(dense, 2, 2000, 0.05, lock=lock, seed=SEED, timeout=TIMEOUT)
    assert result.coordinate_updates == 4000 * 40
    assert 0 <= result.lost_updates <= result.coordinate_updates
    assert result.lost_updates == 0 or not lock
    assert result.loss < result.losses[0]


@pytest.mark.parametrize("kwargs, words", [
    (dict(workers=0), "workers must be an integer in 1..64, got 0"),
    (dict(workers=65), "workers must be an integer in 1..64, got 65"),
    (dict(workers=1.5), "workers must be an integer"),
    (dict(steps_per_worker=0), "steps_per_worker must be an integer ≥ 1, got 0"),
    (dict(steps_per_worker=2.0), "steps_per_worker must be an integer"),
    (dict(lr=0.0), "lr must be a finite number > 0, got 0.0"),
    (dict(lr=-0.1), "lr must be a finite number > 0"),
    (dict(lr=float("nan")), "lr must be a finite number > 0"),
    (dict(lr=float("inf")), "lr must be a finite number > 0"),
    (dict(sample_every=0), "sample_every must be > 0 seconds"),
    (dict(timeout=-1), "timeout must be > 0 seconds"),
    (dict(problem="not a problem"), "problem must be a SparseProblem"),
])
def test_bad_arguments_are_named(kwargs, words):
    arguments = dict(problem=PROBLEM, workers=2, steps_per_worker=10, lr=LR)
    arguments.update(kwargs)
    with pytest.raises(ValueError) as error:
        run_hogwild(**arguments)
    assert words in str(error.value)


# --- failures: named, and nothing left behind -----------------------------------------------------

def first_example_of(worker):
    return next(sample_order(PROBLEM.n, 1, SEED, worker))


def step_failing_on(example):
    def step(state, problem, i, lr):
        if i == example:
            raise ZeroDivisionError(f"example {i} is poisoned")
        sparse_sgd_step(state, problem, i, lr)
    return step


def test_a_worker_that_raises_is_named():
    # One step each: worker 1's first example is poisoned, worker 0's is not.
    poisoned = first_example_of(1)
    assert first_example_of(0) != poisoned
    with pytest.raises(WorkerError) as error:
        run_hogwild(PROBLEM, 2, 1, LR, seed=SEED, step=step_failing_on(poisoned),
                    timeout=TIMEOUT)
    assert error.value.worker == 1
    message = str(error.value)
    assert message.startswith("worker 1 failed: ZeroDivisionError")
    assert f"example {poisoned} is poisoned" in message and "traceback of worker 1" in message


def test_a_worker_that_raises_under_the_lock_is_named():
    poisoned = first_example_of(1)
    with pytest.raises(WorkerError, match="worker 1 failed: ZeroDivisionError"):
        run_hogwild(PROBLEM, 2, 1, LR, lock=True, seed=SEED, step=step_failing_on(poisoned),
                    timeout=TIMEOUT)


def test_a_worker_that_dies_is_named():
    victim = first_example_of(0)

    def step(state, problem, i, lr):
        if i == victim:
            os._exit(3)
        sparse_sgd_step(state, problem, i, lr)
    with pytest.raises(WorkerError, match=r"worker 0 died \(exit code 3\)"):
        run_hogwild(PROBLEM, 2, 1, LR, seed=SEED, step=step, timeout=TIMEOUT)


@pytest.mark.parametrize("lock", [False, True])
def test_timeout_stops_every_worker(lock):
    def stuck(state, problem, i, lr):
        time.sleep(60)
    start = time.monotonic()
    with pytest.raises(WorkerTimeout) as error:
        run_hogwild(PROBLEM, 2, 5, LR, lock=lock, seed=SEED, step=stuck, timeout=1.0)
    assert isinstance(error.value, TimeoutError) and isinstance(error.value, WorkerError)
    assert "did not finish within the timeout of 1 s" in str(error.value)
    assert "every worker was killed" in str(error.value)
    assert time.monotonic() - start < 30          # it did not wait for the sleeping workers


def stop_worker_1(worker, shared_lock):
    """Worker 1 takes the lock and stops (SIGSTOP); worker 0 then waits for the lock."""
    if worker == 1:
        shared_lock.acquire()
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(0.2)
    with shared_lock:
        pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/stat")
def test_a_stopped_worker_is_named_not_the_one_waiting_for_it():
    lock = fork_context().Lock()
    with pytest.raises(WorkerTimeout) as error:
        run_workers(stop_worker_1, 2, args=(lock,), timeout=2.0)
    assert error.value.worker == 1
    assert str(error.value).startswith("worker 1 (and 2 worker(s) in all: [0, 1]) did not finish "
                                       "within the timeout of 2 s — its process is stopped")


# --- the plumbing ---------------------------------------------------------------------------------

def write_worker_number(worker, array):
    array[worker] = worker + 1
    return os.getpid()


def test_workers_write_the_parents_array_and_return_in_order():
    with SharedArrays() as shared:
        array = shared.zeros(4)
        pids = run_workers(write_worker_number, 4, args=(array,), timeout=TIMEOUT)
        assert array.tolist() == [1.0, 2.0, 3.0, 4.0]
        del array
    assert len(set(pids)) == 4 and os.getpid() not in pids


def test_tick_is_called_while_workers_run():
    ticks = []
    run_workers(lambda worker: time.sleep(0.3), 2, timeout=TIMEOUT, every=0.01,
                tick=lambda: ticks.append(time.monotonic()))
    assert len(ticks) >= 1


@pytest.mark.skipif(not HAVE_DEV_SHM, reason="no /dev/shm listing on this platform")
def test_segments_are_unlinked_even_when_the_block_fails():
    with pytest.raises(RuntimeError, match="inside the block"):
        with SharedArrays() as shared:
            view = shared.zeros((3, 2))
            assert len(our_segments()) == 1 and our_segments()[0].startswith(shared.prefix)
            raise RuntimeError("inside the block")
    assert our_segments() == []
    assert view.tolist() == [[0.0, 0.0]] * 3        # a live view stays readable


@pytest.mark.parametrize("kwargs, words", [
    (dict(workers=0), "workers must be an integer ≥ 1, got 0"),
    (dict(workers=2, timeout=0), "timeout must be > 0 seconds, got 0"),
    (dict(workers=2, tick=lambda: None), "every must be > 0 seconds when tick is given"),
])
def test_run_workers_rejects_bad_arguments(kwargs, words):
    with pytest.raises(ValueError) as error:
        run_workers(write_worker_number, **kwargs)
    assert words in str(error.value)
