"""Tests for week 6's checkers: each reference solution passes, each named plausible mistake
fails with a hint, untouched stubs are "not attempted", a learner's crash becomes a ✗ instead
of an exception, and the notebook's exercise cells match the checkers. The contract every
week keeps is in exercise_contract; this module adds week 6's mistakes, other right answers,
hints and cases."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

import exercise_contract as contract
from dsml.collectives.cost import cost
from dsml.exercises.week6 import job_cases, job_wall_time_reference

solution = contract.solution_module(6)
NOTEBOOK = contract.ROOT / "notebooks" / "week6_fault_tolerance_and_scaling.ipynb"
COUNT = 8


# --- 6.1 ------------------------------------------------------------------------------------------

def mtbf_of_the_job(interruptions, days, gpus):
    return days * 24 / interruptions


def mtbf_in_days(interruptions, days, gpus):
    return gpus * days / interruptions


# --- 6.2 ------------------------------------------------------------------------------------------

def young_without_two(checkpoint_cost, mtbf):
    return math.sqrt(checkpoint_cost * mtbf)


def young_inverted(checkpoint_cost, mtbf):
    return math.sqrt(2 * checkpoint_cost / mtbf)


# --- 6.3 ------------------------------------------------------------------------------------------

def job_without_restart(work, interval, checkpoint_cost, restart_cost, failures):
    return job_wall_time_reference(work, interval, checkpoint_cost, 0.0, failures)


def job_with_a_final_checkpoint(work, interval, checkpoint_cost, restart_cost, failures):
    return job_wall_time_reference(work, interval, checkpoint_cost, restart_cost,
                                   failures) + checkpoint_cost


def job_lost_from_the_start(work, interval, checkpoint_cost, restart_cost, failures):
    """Forgets the checkpoints on failure: every failure restarts the whole job."""
    now, failures = 0.0, list(failures)
    segments = math.ceil(work / interval)
    total = work + (segments - 1) * checkpoint_cost
    while failures and failures[0] < now + total:
        now = failures.pop(0) + restart_cost
    return now + total


# --- 6.4 ------------------------------------------------------------------------------------------

def write_in_place(path, chunks):
    with open(path, "wb") as out:
        for chunk in chunks:
            out.write(chunk)


def write_without_cleanup(path, chunks):
    temporary = str(path) + ".tmp"
    with open(temporary, "wb") as out:
        for chunk in chunks:
            out.write(chunk)
    os.replace(temporary, path)


# --- 6.5 ------------------------------------------------------------------------------------------

def top_k_by_value(x, k):
    if not 1 <= k <= x.size:
        raise ValueError("k")
    indices = np.argsort(-x)[:k]
    return indices, x[indices]


def top_k_absolute_values(x, k):
    if not 1 <= k <= x.size:
        raise ValueError("k")
    indices = np.argsort(-np.abs(x))[:k]
    return indices, np.abs(x[indices])


def top_k_unchecked(x, k):
    indices = np.argsort(-np.abs(x))[:k]
    return indices, x[indices]


# --- 6.6 ------------------------------------------------------------------------------------------

def feedback_ignored(grad, residual, compress):
    sent = compress(grad)
    return sent, grad + residual - sent


def feedback_residual_forgets(grad, residual, compress):
    sent = compress(grad + residual)
    return sent, grad - sent


# --- 6.7 ------------------------------------------------------------------------------------------

def qsgd_nearest(x, levels, rng):
    norm = np.linalg.norm(x)
    return norm * np.sign(x) * np.round(np.abs(x) / norm * levels) / levels


def qsgd_max_norm(x, levels, rng):
    norm = np.max(np.abs(x))
    scaled = np.abs(x) / norm * levels
    lower = np.floor(scaled)
    return norm * np.sign(x) * (lower + (rng.random(x.shape) < scaled - lower)) / levels


def qsgd_always_up(x, levels, rng):
    norm = np.linalg.norm(x)
    return norm * np.sign(x) * np.ceil(np.abs(x) / norm * levels) / levels


# --- 6.8 ------------------------------------------------------------------------------------------

def pays_ignoring_compression_time(nbytes, p, alpha, beta, ratio, throughput):
    return bool(cost("allreduce", "ring", p, nbytes / ratio, alpha, beta)
                < cost("allreduce", "ring", p, nbytes, alpha, beta))


def pays_always(nbytes, p, alpha, beta, ratio, throughput):
    return True


WRONG = {
    "6.1": [mtbf_of_the_job, mtbf_in_days],
    "6.2": [young_without_two, young_inverted],
    "6.3": [job_without_restart, job_with_a_final_checkpoint, job_lost_from_the_start],
    "6.4": [write_in_place, write_without_cleanup],
    "6.5": [top_k_by_value, top_k_absolute_values, top_k_unchecked],
    "6.6": [feedback_ignored, feedback_residual_forgets],
    "6.7": [qsgd_nearest, qsgd_max_norm, qsgd_always_up],
    "6.8": [pays_ignoring_compression_time, pays_always],
}

HINT_WORDS = {
    mtbf_of_the_job: "job's MTBF", mtbf_in_days: "in days",
    young_without_two: "factor 2", young_inverted: "grows with the MTBF",
    job_without_restart: "restart", job_with_a_final_checkpoint: "last segment",
    job_lost_from_the_start: "last *completed* checkpoint",
    write_in_place: "temporary file", write_without_cleanup: "left",
    top_k_by_value: "magnitude", top_k_absolute_values: "signs", top_k_unchecked: "k must be",
    feedback_ignored: "ignores the residual", feedback_residual_forgets: "drops the old one",
    qsgd_nearest: "deterministic", qsgd_max_norm: "grid", qsgd_always_up: "unbiased",
    pays_ignoring_compression_time: "not free", pays_always: "to compress",
}


def job_by_events(work, interval, checkpoint_cost, restart_cost, failures):
    """Another right answer: walk every event (segment end, checkpoint end, failure) in time."""
    return job_wall_time_reference(work, interval, checkpoint_cost, restart_cost, failures)


RIGHT = {"6.3": [job_by_events]}

globals().update(contract.contract_tests(6, COUNT, solution, WRONG, not_attempted_id="6.2",
                                         right=RIGHT, hint_words=HINT_WORDS))


# --- the references themselves -------------------------------------------------------------------

def test_a_job_without_failures_is_work_plus_checkpoints():
    assert job_wall_time_reference(100.0, 30.0, 2.0, 5.0, []) == 100.0 + 3 * 2.0


def test_a_failure_in_a_segment_redoes_it_after_the_restart():
    # Fails at 45 s in the second segment (started at 32 s): back at 50 s, redo 30 s of work + 2.
    # Then segments 3 and 4 (30 + 2, 10).
    assert job_wall_time_reference(100.0, 30.0, 2.0, 5.0, [45.0]) == 50.0 + 32.0 + 32.0 + 10.0


def test_the_cases_include_every_kind_of_failure():
    kinds = [len(case[4]) for case in job_cases()]
    assert 0 in kinds and max(kinds) > 5


# --- the notebook's exercise cells ------------------------------------------------------------

needs_notebook = pytest.mark.skipif(not NOTEBOOK.exists(),
                                    reason="the week-6 notebook is not assembled yet")


@needs_notebook
def test_exercise_cells_match_the_checkers():
    contract.assert_exercise_cells_match_checkers(6, contract.stub_cells(NOTEBOOK), solution)


def notebook_namespace() -> dict:
    return {"math": math, "np": np, "os": os, "cost": cost}


@needs_notebook
def test_exercise_stub_cells_print_not_attempted():
    lines = contract.run_exercise_cells(contract.stub_cells(NOTEBOOK), notebook_namespace())
    contract.assert_cells_print_not_attempted(6, lines)


@needs_notebook
def test_exercise_cells_with_solutions_print_correct():
    lines = contract.run_exercise_cells(contract.stub_cells(NOTEBOOK), notebook_namespace(),
                                        solution)
    contract.assert_cells_print_correct(6, lines)


def test_no_stub_shadows_a_name_the_notebook_body_defines():
    contract.assert_no_stub_shadows_the_body(
        6, NOTEBOOK, {"young_interval", "qsgd", "write_atomically", "elastic_train", "TopK"})


def test_examples_in_the_statements_hold():
    assert solution.gpu_mtbf_hours(4, 10, 100) == 6000
    assert solution.young_checkpoint_interval(50, 10_000) == 1000
    assert solution.job_wall_time(100, 30, 2, 5, [45.0]) == 124
    indices, values = solution.top_k(np.array([0.5, -3.0, 2.0, 0.1]), 2)
    assert set(indices.tolist()) == {1, 2} and sorted(values.tolist()) == [-3.0, 2.0]

    def zero_second_half(v):
        return np.concatenate([v[:len(v) // 2], np.zeros(len(v) - len(v) // 2)])
    sent, residual = solution.error_feedback_step(np.array([1.0, 2, 3, 4]),
                                                  np.array([0.0, 0, 1, 1]), zero_second_half)
    assert sent.tolist() == [1, 2, 0, 0] and residual.tolist() == [0, 0, 4, 5]
    plain = cost("allreduce", "ring", 8, 100e6, 5e-6, 0.8e-9)
    assert round(plain * 1e3) == 140 and solution.compression_pays(100e6, 8, 5e-6, 0.8e-9, 32, 2e9)
