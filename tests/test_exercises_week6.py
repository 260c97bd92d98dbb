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
from dsml.exercises import grade
from dsml.exercises.week6 import job_cases, job_wall_time_reference

solution = contract.solution_module(6)
NOTEBOOK = contract.ROOT / "notebooks" / "week6_fault_tolerance_and_scaling.ipynb"
COUNT = 10


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


def young_loose_search(checkpoint_cost, mtbf):
    """A numerical minimiser stopped too early: 1e-4 off."""
    return math.sqrt(2 * checkpoint_cost * mtbf) * (1 + 1e-4)


def young_golden_section(checkpoint_cost, mtbf):
    """Another right answer: minimise the waste δ/τ + τ/(2M) numerically (golden section)."""
    def waste(tau):
        return checkpoint_cost / tau + tau / (2 * mtbf)
    low, high = 1e-9, 1e9 * (checkpoint_cost + mtbf)
    ratio = (math.sqrt(5) - 1) / 2
    while high - low > 1e-12 * high:
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        if waste(a) < waste(b):
            high = b
        else:
            low = a
    return (low + high) / 2


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


def job_checkpoint_saved_early(work, interval, checkpoint_cost, restart_cost, failures):
    """Counts a segment as saved once it is computed, before its checkpoint is written."""
    now, saved, failures = 0.0, 0.0, list(failures)
    while saved < work:
        segment = min(interval, work - saved)
        end = now + segment + (0.0 if saved + segment >= work else checkpoint_cost)
        if failures and failures[0] < now + segment:
            now = failures.pop(0) + restart_cost
            while failures and failures[0] < now:
                now = failures.pop(0) + restart_cost
            continue
        if failures and failures[0] < end:              # crashed in the checkpoint: kept anyway
            now, saved = failures.pop(0) + restart_cost, saved + segment
            while failures and failures[0] < now:
                now = failures.pop(0) + restart_cost
            continue
        now, saved = end, saved + segment
    return now


def job_restart_cannot_fail(work, interval, checkpoint_cost, restart_cost, failures):
    """Drops the crashes that come during a restart."""
    now, saved, failures = 0.0, 0.0, list(failures)
    while saved < work:
        segment = min(interval, work - saved)
        end = now + segment + (0.0 if saved + segment >= work else checkpoint_cost)
        if failures and failures[0] < end:
            now = failures.pop(0) + restart_cost
            while failures and failures[0] < now:
                failures.pop(0)
            continue
        now, saved = end, saved + segment
    return now


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


def top_k_smallest(x, k):
    if not 1 <= k <= x.size:
        raise ValueError("k")
    indices = np.argsort(np.abs(x))[:k]
    return indices, x[indices]


def top_k_values_sorted(x, k):
    if not 1 <= k <= x.size:
        raise ValueError("k")
    indices = np.argsort(-np.abs(x))[:k]
    return indices, np.sort(x[indices])


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


def qsgd_divides_by_zero(x, levels, rng):
    with np.errstate(invalid="ignore", divide="ignore"):
        norm = np.linalg.norm(x)
        scaled = np.abs(x) / norm * levels
        lower = np.floor(scaled)
        return norm * np.sign(x) * (lower + (rng.random(x.shape) < scaled - lower)) / levels


def qsgd_up_with_the_wrong_probability(x, levels, rng):
    """Rounds up with probability 1 − fraction instead of the fraction."""
    norm = np.linalg.norm(x)
    if norm == 0:
        return np.zeros_like(x)
    scaled = np.abs(x) / norm * levels
    lower = np.floor(scaled)
    return norm * np.sign(x) * (lower + (rng.random(x.shape) < 1 - (scaled - lower))) / levels


def qsgd_entry_by_entry(x, levels, rng):
    """Another right answer: one draw per entry, in a loop, with rng.uniform."""
    norm = float(np.linalg.norm(x))
    out = np.zeros(len(x))
    for i, value in enumerate(x):
        if norm == 0:
            break
        scaled = abs(value) / norm * levels
        level = math.floor(scaled) + (1 if rng.uniform() < scaled - math.floor(scaled) else 0)
        out[i] = math.copysign(norm * level / levels, value)
    return out


def qsgd_binomial(x, levels, rng):
    """Another right answer: the level as floor plus a Bernoulli draw."""
    norm = np.linalg.norm(x)
    if norm == 0:
        return np.zeros_like(x)
    scaled = np.abs(x) / norm * levels
    lower = np.floor(scaled)
    return norm * np.sign(x) * (lower + rng.binomial(1, scaled - lower)) / levels


# --- 6.8 ------------------------------------------------------------------------------------------

def pays_ignoring_compression_time(nbytes, p, alpha, beta, ratio, throughput):
    return bool(cost("allreduce", "ring", p, nbytes / ratio, alpha, beta)
                < cost("allreduce", "ring", p, nbytes, alpha, beta))


def pays_always(nbytes, p, alpha, beta, ratio, throughput):
    return True


# --- 6.9 ------------------------------------------------------------------------------------------

def reshard_global_offsets(n, old_world, new_world, new_rank):
    from dsml.exercises.week6 import reshard_reference
    return reshard_reference(n, old_world, new_world, new_rank, local=False)


def reshard_equal_chunks(n, old_world, new_world, new_rank):
    """Cuts both world sizes in ⌈n/p⌉ chunks, as torch.chunk does."""
    size_old, size_new = -(-n // old_world), -(-n // new_world)
    start, stop = min(new_rank * size_new, n), min((new_rank + 1) * size_new, n)
    plan = []
    for old in range(old_world):
        low, high = min(old * size_old, n), min((old + 1) * size_old, n)
        if max(low, start) < min(high, stop):
            plan.append((old, max(low, start) - low, min(high, stop) - low))
    return plan


def reshard_keeps_empty_pieces(n, old_world, new_world, new_rank):
    from dsml.exercises.week6 import reshard_reference
    return reshard_reference(n, old_world, new_world, new_rank, keep_empty=True)


def reshard_with_numpy(n, old_world, new_world, new_rank):
    """Another right answer: np.array_split of the index range, and set intersections."""
    old_shards = np.array_split(np.arange(n), old_world)
    mine = set(np.array_split(np.arange(n), new_world)[new_rank].tolist())
    plan = []
    for old, indices in enumerate(old_shards):
        local = [i for i, index in enumerate(indices.tolist()) if index in mine]
        if local:
            plan.append((np.int64(old), np.int64(local[0]), np.int64(local[-1] + 1)))
    return plan


# --- 6.10 -----------------------------------------------------------------------------------------

def timeout_per_heartbeat(period, stall_probability, stall_mean, beats, target):
    if not 0 < target < 1:
        raise ValueError("target")
    return max(period, period + stall_mean * math.log(stall_probability / target))


def timeout_without_the_period(period, stall_probability, stall_mean, beats, target):
    if not 0 < target < 1:
        raise ValueError("target")
    allowed = 1 - (1 - target) ** (1 / beats)
    return max(period, stall_mean * math.log(stall_probability / allowed))


def timeout_unchecked(period, stall_probability, stall_mean, beats, target):
    allowed = 1 - (1 - min(max(target, 1e-12), 1 - 1e-12)) ** (1 / beats)
    return max(period, period + stall_mean * math.log(stall_probability / allowed))


def timeout_by_bisection(period, stall_probability, stall_mean, beats, target):
    """Another right answer: bisect the false-suspicion chance, which falls as T grows."""
    if not 0 < target < 1:
        raise ValueError(f"target must be in (0, 1), got {target}")

    def chance(timeout):
        late = stall_probability * math.exp(-(timeout - period) / stall_mean)
        return 1 - (1 - min(1.0, late)) ** beats
    if chance(period) <= target:
        return period
    low, high = period, period + stall_mean * 1000
    while high - low > 1e-13 * high:
        middle = (low + high) / 2
        low, high = (low, middle) if chance(middle) <= target else (middle, high)
    return high


WRONG = {
    "6.1": [mtbf_of_the_job, mtbf_in_days],
    "6.2": [young_without_two, young_inverted, young_loose_search],
    "6.3": [job_without_restart, job_with_a_final_checkpoint, job_lost_from_the_start,
            job_checkpoint_saved_early, job_restart_cannot_fail],
    "6.4": [write_in_place, write_without_cleanup],
    "6.5": [top_k_by_value, top_k_absolute_values, top_k_unchecked, top_k_smallest,
            top_k_values_sorted],
    "6.6": [feedback_ignored, feedback_residual_forgets],
    "6.7": [qsgd_nearest, qsgd_max_norm, qsgd_always_up, qsgd_divides_by_zero,
            qsgd_up_with_the_wrong_probability],
    "6.8": [pays_ignoring_compression_time, pays_always],
    "6.9": [reshard_global_offsets, reshard_equal_chunks, reshard_keeps_empty_pieces],
    "6.10": [timeout_per_heartbeat, timeout_without_the_period, timeout_unchecked],
}

HINT_WORDS = {
    mtbf_of_the_job: "job's MTBF", mtbf_in_days: "in days",
    young_without_two: "factor 2", young_inverted: "grows with the MTBF",
    young_loose_search: "tolerance",
    job_without_restart: "restarts left out", job_with_a_final_checkpoint: "last segment",
    job_lost_from_the_start: "back to its start",
    job_checkpoint_saved_early: "before its checkpoint completed",
    job_restart_cannot_fail: "during a restart ignored",
    write_in_place: "temporary file", write_without_cleanup: "left",
    top_k_by_value: "largest *values*", top_k_absolute_values: "signs",
    top_k_unchecked: "k must be", top_k_smallest: "*smallest* magnitudes",
    top_k_values_sorted: "another order",
    feedback_ignored: "ignores the residual", feedback_residual_forgets: "drops the old one",
    qsgd_nearest: "deterministic", qsgd_max_norm: "2-norm", qsgd_always_up: "deterministic",
    qsgd_divides_by_zero: "nothing to divide by",
    qsgd_up_with_the_wrong_probability: "probability of rounding up",
    pays_ignoring_compression_time: "not free", pays_always: "to compress",
    reshard_global_offsets: "*inside*", reshard_equal_chunks: "torch.chunk",
    reshard_keeps_empty_pieces: "empty pieces",
    timeout_per_heartbeat: "one heartbeat", timeout_without_the_period: "period left out",
    timeout_unchecked: "strictly between 0 and 1",
}


def job_by_events(work, interval, checkpoint_cost, restart_cost, failures):
    """Another right answer: walk every event (segment end, checkpoint end, failure) in time."""
    return job_wall_time_reference(work, interval, checkpoint_cost, restart_cost, failures)


RIGHT = {"6.2": [young_golden_section], "6.3": [job_by_events],
         "6.7": [qsgd_entry_by_entry, qsgd_binomial], "6.9": [reshard_with_numpy],
         "6.10": [timeout_by_bisection]}

globals().update(contract.contract_tests(6, COUNT, solution, WRONG, not_attempted_id="6.2",
                                         right=RIGHT, hint_words=HINT_WORDS))


def test_young_hint_never_shows_two_equal_numbers():
    from dsml.exercises import grade
    result = grade("6.2", lambda d, m: math.sqrt(2 * d * m) * (1 + 3e-7))
    assert not result.passed
    shown = [part.split(" s")[0] for part in result.message.split("returned ")[1].split(
        ", expected ")]
    assert shown[0] != shown[1], result.message


def test_qsgd_cases_avoid_nearly_whole_levels():
    from dsml.exercises.week6 import QSGD_MARGIN, qsgd_moments, qsgd_vector
    rng = np.random.default_rng(6007)
    for n, levels in ((6, 1), (10, 4), (50, 16)):
        x = qsgd_vector(n, levels, rng)
        variance, _ = qsgd_moments(x, levels)
        unit = np.linalg.norm(x) / levels
        assert np.all(variance >= QSGD_MARGIN * (1 - QSGD_MARGIN) * unit**2)


@pytest.mark.parametrize("seed_offset", [1, 2, 3])
def test_qsgd_checker_accepts_a_right_answer_under_other_seeds(seed_offset):
    """The checker hands out seeds 0 … draws − 1; a right answer that shifts them (another
    stream of draws entirely) must pass too."""
    from dsml.exercises import grade

    def shifted(x, levels, rng):
        seed = int(rng.integers(2**31)) + seed_offset
        return solution.qsgd_quantize(x, levels, np.random.default_rng(seed))
    assert grade("6.7", shifted).passed


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
        6, NOTEBOOK, {"young_interval", "qsgd", "write_atomically", "elastic_train", "TopK",
            "load_resharded"})


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
    assert solution.reshard_plan(10, 4, 3, 1) == [(1, 1, 3), (2, 0, 1)]
    assert math.isclose(solution.choose_timeout(0.01, 1.0, 0.02, 1, math.exp(-2)), 0.05)


# --- exercise 6.7 must be built: the library's own quantizer is refused -----------------------

def qsgd_from_library(x, levels, rng):
    from dsml.compression import qsgd
    return qsgd(x, levels, rng)


def qsgd_from_the_compressor(x, levels, rng):
    from dsml.compression import QSGD
    quantizer = QSGD(levels)
    return quantizer.decompress(quantizer.compress(x, rng))


@pytest.mark.parametrize("answer", [qsgd_from_library, qsgd_from_the_compressor])
def test_an_answer_that_calls_the_library_quantizer_is_refused(answer):
    result = grade("6.7", answer)
    assert result.status == "failed"
    assert result.message.startswith("exercise 6.7 asks you to build this yourself: your code "
                                     "called dsml.compression.")


# --- 6.2 draws fresh cases: a table of remembered answers does not pass ------------------------

def test_a_table_of_answers_remembered_from_hints_fails_6_2():
    # Before fresh cases, ten tries filled such a table and the next passed.
    from dsml.exercises import fresh_seed
    from dsml.exercises.week6 import YOUNG_CASES
    for base in contract.FRESH_BASES:
        with fresh_seed(base):
            passed, table, message = contract.learn_from_hints(
                "6.2", r"young_checkpoint_interval\(checkpoint_cost=(\S+), mtbf=(\S+)\)",
                r"expected (\S+) s")
        assert not passed
        assert len(table) == len(YOUNG_CASES)         # it learned the fixed cases, no more
        assert "drawn afresh for this check" in message and "expected" not in message


def test_fresh_cases_6_2_hold_the_reference_and_refuse_the_named_mistakes():
    assert contract.passes_for_every_base("6.2", solution.young_checkpoint_interval) == []
    for right in RIGHT["6.2"]:
        assert contract.passes_for_every_base("6.2", right) == []
    for wrong in WRONG["6.2"]:
        assert contract.fails_for_every_base("6.2", wrong) == [], wrong.__name__


def test_a_wrong_answer_on_a_fresh_case_is_told_the_inputs_not_the_answer():
    from dsml.exercises import fresh_rng, fresh_seed
    from dsml.exercises.week6 import YOUNG_CASES, fresh_young_cases

    def right_only_on_the_fixed_cases(delta, mtbf):
        exact = math.sqrt(2 * delta * mtbf)
        return exact if (delta, mtbf) in YOUNG_CASES else 2 * exact

    with fresh_seed(3):
        result = grade("6.2", right_only_on_the_fixed_cases)
        delta, mtbf = fresh_young_cases(fresh_rng())[0]
    assert result.status == "failed"
    assert result.message.startswith(
        f"young_checkpoint_interval(checkpoint_cost={delta:g}, mtbf={mtbf:g}) returned ")
    assert f"{math.sqrt(2 * delta * mtbf):.4g}"[:4] not in result.message.split("returned")[1] \
        .split(" s,")[1]


def young_from_library(checkpoint_cost, mtbf):
    from dsml.fault import young_interval
    return young_interval(checkpoint_cost, mtbf)


def test_an_answer_that_calls_the_library_interval_is_refused():
    result = grade("6.2", young_from_library)
    assert result.status == "failed"
    assert result.message.startswith("exercise 6.2 asks you to build this yourself: your code "
                                     "called dsml.fault.young_interval")


def mtbf_from_library(interruptions, days, gpus):
    from dsml.fault import interruption_statistics
    return interruption_statistics(interruptions, days, gpus)["mtbf_gpu"] / 3600


def atomic_write_from_library(path, chunks):
    from dsml.checkpoint import write_atomically
    write_atomically(path, b"".join(chunks))


def top_k_from_library(x, k):
    from dsml.compression import TopK
    indices = TopK(k=k).compress(x).arrays["indices"].astype(int)
    return indices, x[indices]


@pytest.mark.parametrize("exercise_id, answer, called", [
    ("6.1", mtbf_from_library, "dsml.fault.interruption_statistics"),
    ("6.5", top_k_from_library, "dsml.compression.TopK.compress"),
    ("6.4", atomic_write_from_library, "dsml.checkpoint.write_atomically")])
def test_an_answer_that_calls_the_library_is_refused(exercise_id, answer, called):
    result = grade(exercise_id, answer)
    assert result.status == "failed"
    assert result.message.startswith(f"exercise {exercise_id} asks you to build this yourself: "
                                     f"your code called {called}")
