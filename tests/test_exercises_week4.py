"""Tests for week 4's checkers: each reference solution passes, each named plausible mistake
fails with a hint, untouched stubs are "not attempted", a learner's crash becomes a ✗ instead
of an exception, and the notebook's exercise cells match the checkers. The contract every
week keeps is in exercise_contract; this module adds week 4's mistakes, other right answers,
hints and cases. Exercise ids come from dsml.exercises.week4, so renumbering happens there."""
from __future__ import annotations

import math

import numpy as np

import exercise_contract as contract
from dsml.exercises import grade
from dsml.exercises.week4 import (BACKUP, BACKUP_CASES, CONFLICT, CONFLICT_CASES, SPARSE_STEP,
                                  STEP_CASES, conflict_truth, simulated_conflicts,
                                  staleness_counting_events, staleness_counting_reads,
                                  staleness_from_first_read)

solution = contract.solution_module(4)
NOTEBOOK = contract.ROOT / "notebooks" / "week4_async_and_parameter_servers.ipynb"
CELLS = contract.ROOT / "build" / "week4_exercise_cells.py"
COUNT = 7   # 4.1–4.4 on parameter servers (sections 2–4), 4.5–4.6 on Hogwild! (section 5),
            # 4.7 on backup workers (section 3)


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


# --- 4.1–4.4: parameter servers --------------------------------------------------------------

# 4.1: W·n/S as a real number, forgetting that the first shards are one byte larger.
def bytes_as_fraction(workers, servers, nbytes):
    return workers * nbytes / servers


# 4.1: counts the answers going out as well as the pushes coming in.
def bytes_in_and_out(workers, servers, nbytes):
    return 2 * workers * -(-nbytes // servers)


# 4.1: every server receiving the whole gradient.
def bytes_whole_gradient(workers, servers, nbytes):
    return workers * nbytes


# 4.2: counts the worker's own apply too.
def staleness_including_itself(events):
    applied, read_at, out = 0, {}, []
    for kind, worker in events:
        if kind == "read":
            read_at[worker] = applied
        else:
            applied += 1
            out.append(applied - read_at[worker])
    return out


# 4.2: counts from the worker's first read, never refreshed (staleness_from_first_read), every
# event or the other workers' reads since the latest read: imported with the checker's hints.


# 4.3: the average worker's expected time, not the slowest's.
def bsp_mean_worker(seconds, speeds, straggle_prob, straggle_factor):
    return float(np.mean([seconds * s * (1 + straggle_prob * (straggle_factor - 1)) for s in speeds]))


# 4.3: the slowest worker's expected time: the max of the expectations.
def bsp_max_of_means(seconds, speeds, straggle_prob, straggle_factor):
    return max(seconds * s * (1 + straggle_prob * (straggle_factor - 1)) for s in speeds)


# 4.3: forgets the stragglers.
def bsp_no_stragglers(seconds, speeds, straggle_prob, straggle_factor):
    return seconds * max(speeds)


# 4.7: the synchronous step, backups ignored.
def backup_ignored(seconds, speeds, straggle_prob, straggle_factor, backups):
    return solution.bsp_expected_step(seconds, speeds, straggle_prob, straggle_factor)


# 4.7: drops the b workers of slowest speed before the step, whatever their delays.
def backup_drops_slowest_speeds(seconds, speeds, straggle_prob, straggle_factor, backups):
    fastest = sorted(speeds)[:len(speeds) - backups]
    return solution.bsp_expected_step(seconds, fastest, straggle_prob, straggle_factor)


# 4.7: waits for one worker fewer than it should (the (W − b − 1)-th finish).
def backup_one_too_many(seconds, speeds, straggle_prob, straggle_factor, backups):
    return solution.backup_expected_step(seconds, speeds, straggle_prob, straggle_factor,
                                         min(backups + 1, len(speeds) - 1))


# 4.7: the average worker's expected time.
def backup_mean_worker(seconds, speeds, straggle_prob, straggle_factor, backups):
    return float(np.mean([seconds * s * (1 + straggle_prob * (straggle_factor - 1)) for s in speeds]))


# 4.4: strictly fewer than s clocks ahead.
def may_start_strict(clocks, worker, bound):
    return clocks[worker] - min(clocks) < bound


# 4.4: compares with the fastest worker instead of the slowest.
def may_start_against_fastest(clocks, worker, bound):
    return max(clocks) - clocks[worker] <= bound


# 4.4: checks the clock the worker will have after its next step.
def may_start_next_clock(clocks, worker, bound):
    return clocks[worker] + 1 - min(clocks) <= bound


# --- plausible wrong answers, one named function per mistake --------------------------------

# The sparse step: updates a copy — w[idx] with an index array is a new array.
def step_on_a_copy(w, idx, x, y, lr):
    mine = w[idx]
    mine -= lr * (_sigmoid(x @ mine) - y) * x


# The sparse step: returns the new w instead of writing into the shared one.
def step_returns_new_w(w, idx, x, y, lr):
    new = w.copy()
    new[idx] -= lr * (_sigmoid(x @ w[idx]) - y) * x
    return new


# The sparse step: y − σ(z), the negative gradient, subtracted: a step uphill.
def step_sign_flipped(w, idx, x, y, lr):
    w[idx] -= lr * (y - _sigmoid(x @ w[idx])) * x


# The sparse step: forgets the chain rule's x_j.
def step_without_x(w, idx, x, y, lr):
    w[idx] -= lr * (_sigmoid(x @ w[idx]) - y)


# The sparse step: scatters the example over the first k coordinates instead of idx.
def step_on_the_first_coordinates(w, idx, x, y, lr):
    k = len(idx)
    w[:k] -= lr * (_sigmoid(x @ w[idx]) - y) * x


# The conflict probability: k²/d, the expected number of shared coordinates.
def conflict_expected_overlap(d, k):
    return k * k / d


# The conflict probability: the second example's coordinates drawn with replacement.
def conflict_with_replacement(d, k):
    return 1.0 - (1.0 - k / d) ** k


# The conflict probability: the probability that they share nothing.
def conflict_none_shared(d, k):
    return math.comb(d - k, k) / math.comb(d, k)


WRONG = {
    SPARSE_STEP: [step_on_a_copy, step_returns_new_w, step_sign_flipped, step_without_x,
                  step_on_the_first_coordinates],
    CONFLICT: [conflict_expected_overlap, conflict_with_replacement, conflict_none_shared],
    "4.1": [bytes_as_fraction, bytes_in_and_out, bytes_whole_gradient],
    "4.2": [staleness_including_itself, staleness_from_first_read, staleness_counting_events,
            staleness_counting_reads],
    "4.3": [bsp_mean_worker, bsp_max_of_means, bsp_no_stragglers],
    "4.4": [may_start_strict, may_start_against_fastest, may_start_next_clock],
    BACKUP: [backup_ignored, backup_drops_slowest_speeds, backup_one_too_many, backup_mean_worker],
}

HINT_WORDS = {
    bytes_as_fraction: "Bytes come in whole",
    bytes_in_and_out: "the pushes, not the answers",
    bytes_whole_gradient: "its own keys' share",
    staleness_including_itself: "one too large",
    staleness_from_first_read: "*latest* read",
    staleness_counting_events: "reads included",
    staleness_counting_reads: "other workers' reads",
    backup_ignored: "waits for all W workers",
    backup_drops_slowest_speeds: "slowest *speeds*",
    backup_one_too_many: "one backup too many",
    backup_mean_worker: "at least W − b",
    bsp_mean_worker: "expected *maximum*",
    bsp_max_of_means: "max of the expectations",
    bsp_no_stragglers: "stragglers are missing",
    may_start_strict: "≤, not <",
    may_start_against_fastest: "*slowest* worker's",
    may_start_next_clock: "which the bound allows",
    step_on_a_copy: "is a copy",
    step_returns_new_w: "as a new array",
    step_sign_flipped: "wrong way",
    step_without_x: "chain rule",
    step_on_the_first_coordinates: "does not touch",
    conflict_expected_overlap: "expected number of shared coordinates",
    conflict_with_replacement: "independent draws",
    conflict_none_shared: "share *nothing*",
}


# --- other right answers ------------------------------------------------------------------------

# The sparse step, coordinate by coordinate in a loop, and returning w as well.
def step_in_a_loop(w, idx, x, y, lr):
    z = sum(xj * w[j] for j, xj in zip(idx, x))
    error = 1.0 / (1.0 + math.exp(-z)) - y
    for j, xj in zip(idx, x):
        w[j] -= lr * error * xj
    return w


# The conflict probability as a product: the second example's j-th coordinate avoids the first's.
def conflict_as_a_product(d, k):
    none = 1.0
    for j in range(k):
        none *= max(d - k - j, 0) / (d - j)
    return 1.0 - none


# 4.3: summing over every straggler pattern (2^W of them), or the CDF for many workers.
def bsp_by_enumeration(seconds, speeds, straggle_prob, straggle_factor):
    if len(speeds) > 12:
        return _bsp_by_cdf(seconds, speeds, straggle_prob, straggle_factor)
    total = 0.0
    for pattern in range(2 ** len(speeds)):
        hit = [(pattern >> w) & 1 for w in range(len(speeds))]
        p = np.prod([straggle_prob if h else 1 - straggle_prob for h in hit])
        total += p * max(seconds * s * (straggle_factor if h else 1) for s, h in zip(speeds, hit))
    return total


def _bsp_by_cdf(seconds, speeds, p, f):
    grid = sorted({seconds * s * g for s in speeds for g in (1.0, f)})
    cdfs = [np.prod([(1 - p) * (seconds * s <= x) + p * (seconds * s * f <= x) for s in speeds])
            for x in grid]
    return float(sum(x * (c - b) for x, c, b in zip(grid, cdfs, [0.0] + cdfs[:-1])))


# 4.4: no worker is more than `bound` clocks behind this one.
def may_start_against_each(clocks, worker, bound):
    return all(clocks[worker] - c <= bound for c in clocks)


# 4.7: every straggler pattern, the (W − b)-th smallest time of each.
def backup_by_enumeration(seconds, speeds, straggle_prob, straggle_factor, backups):
    total = 0.0
    for pattern in range(2 ** len(speeds)):
        hit = [(pattern >> w) & 1 for w in range(len(speeds))]
        p = np.prod([straggle_prob if h else 1 - straggle_prob for h in hit])
        times = sorted(seconds * s * (straggle_factor if h else 1) for s, h in zip(speeds, hit))
        total += p * times[len(speeds) - backups - 1]
    return total


RIGHT = {SPARSE_STEP: [step_in_a_loop], CONFLICT: [conflict_as_a_product],
         "4.3": [bsp_by_enumeration], "4.4": [may_start_against_each],
         BACKUP: [backup_by_enumeration]}


# --- the contract every week keeps -------------------------------------------------------------

globals().update(contract.contract_tests(
    4, COUNT, solution, WRONG, not_attempted_id=CONFLICT, right=RIGHT, hint_words=HINT_WORDS))


# --- week 4's cases and hints ------------------------------------------------------------------

def test_step_cases_include_a_single_and_every_coordinate():
    sizes = {len(coordinates) / d for d, coordinates, _, _ in STEP_CASES}
    assert 1.0 in sizes and any(len(c) == 1 for _, c, _, _ in STEP_CASES)
    assert {y for _, _, y, _ in STEP_CASES} == {0, 1}
    assert any(list(c) != sorted(c) for _, c, _, _ in STEP_CASES)   # idx need not be sorted


def test_conflict_cases_include_certain_and_large():
    assert any(2 * k > d for d, k in CONFLICT_CASES)              # certain: the formula gives 1
    assert any(conflict_truth(d, k) == 1.0 for d, k in CONFLICT_CASES)
    assert any(k == 1 for _, k in CONFLICT_CASES)
    assert any(abs(conflict_truth(d, k) - k * k / d) > 0.2 for d, k in CONFLICT_CASES)


def test_conflict_formula_agrees_with_the_simulation():
    # The truth is a formula; the hint's simulation draws examples as dsml.hogwild does.
    for d, k in [(1000, 10), (50, 7), (20, 1)]:
        truth = conflict_truth(d, k)
        assert abs(simulated_conflicts(d, k) - truth) < 4 * math.sqrt(truth * (1 - truth) / 20_000)


def test_wrong_conflict_hint_shows_the_simulation():
    message = grade(CONFLICT, conflict_with_replacement).message
    assert "seeded simulation of 20,000 random pairs" in message


def test_not_a_probability_is_named():
    def above_one(d, k):
        return 1.5
    assert "not a probability" in grade(CONFLICT, above_one).message


# --- the notebook's exercise cells ------------------------------------------------------------

def test_no_stub_shadows_a_name_the_notebook_body_defines():
    contract.assert_no_stub_shadows_the_body(
        4, NOTEBOOK, {"sparse_sgd_step", "run_hogwild", "sparse_least_squares", "problem_loss"})


def test_exercise_cells_match_the_checkers():
    contract.assert_exercise_cells_match_checkers(4, contract.stub_cells(NOTEBOOK, CELLS),
                                                  solution)


def notebook_namespace() -> dict:
    """The names the exercise cells use from the notebook above them."""
    return {"np": np, "math": math}


def test_exercise_stub_cells_print_not_attempted():
    lines = contract.run_exercise_cells(contract.stub_cells(NOTEBOOK, CELLS),
                                        notebook_namespace())
    contract.assert_cells_print_not_attempted(4, lines)


def test_exercise_cells_with_solutions_print_correct():
    lines = contract.run_exercise_cells(contract.stub_cells(NOTEBOOK, CELLS),
                                        notebook_namespace(), solution)
    contract.assert_cells_print_correct(4, lines)


def test_examples_in_the_statements_hold():
    # The worked examples quote numbers; recompute them with the reference solutions.
    w = np.zeros(4)
    solution.sparse_logistic_step(w, np.array([1, 3]), np.array([1.0, -2.0]), 1, 0.5)
    assert w.tolist() == [0.0, 0.25, 0.0, -0.5]
    assert math.isclose(solution.conflict_probability(10, 2), 17 / 45)
    assert solution.conflict_probability(10, 6) == 1.0
    assert solution.backup_expected_step(1.0, [1.0, 2.0, 3.0], 0.0, 5.0, 1) == 2.0


def test_backup_cases_include_bsp_and_a_single_survivor():
    assert any(b == 0 for *_, b in BACKUP_CASES)
    assert any(b == len(speeds) - 1 for _, speeds, _, _, b in BACKUP_CASES)
    assert any(p == 0 for _, _, p, _, _ in BACKUP_CASES)


def test_the_first_backup_case_tells_the_mistakes_apart():
    case = BACKUP_CASES[0]
    answers = [f(*case) for f in (solution.backup_expected_step, backup_ignored,
                                   backup_drops_slowest_speeds, backup_one_too_many,
                                   backup_mean_worker)]
    assert len({round(a, 9) for a in answers}) == len(answers)


def test_backup_with_no_backups_is_the_synchronous_step():
    for seconds, speeds, p, factor, _ in BACKUP_CASES:
        assert math.isclose(solution.backup_expected_step(seconds, speeds, p, factor, 0),
                            solution.bsp_expected_step(seconds, speeds, p, factor), rel_tol=1e-12)
