"""Tests for bonus notebook 5c's checkers: each reference solution passes, each named plausible
mistake fails with a hint, untouched stubs are "not attempted", a learner's crash becomes a ✗
instead of an exception, and the notebook's exercise cells match the checkers. The contract
every week keeps is in exercise_contract; this module adds 5c's mistakes, other right answers,
hints and cases."""
from __future__ import annotations

import math
from collections import Counter

import exercise_contract as contract
from dsml.exercises.week5c import dropped_reference, measured_dispatch_bytes

WEEK = "5c"
solution = contract.solution_module(WEEK)
NOTEBOOK = contract.ROOT / "notebooks" / "week5c_expert_parallelism.ipynb"
COUNT = 2


# --- 5c.1: dropped tokens ----------------------------------------------------------------------

def dropped_capacity_rounded_down(choices, experts, capacity_factor):
    slots = math.floor(capacity_factor * len(choices) / experts)
    return sum(max(n - slots, 0) for n in Counter(choices).values())


def dropped_without_capacity_factor(choices, experts, capacity_factor):
    slots = math.ceil(len(choices) / experts)
    return sum(max(n - slots, 0) for n in Counter(choices).values())


def dropped_returns_kept(choices, experts, capacity_factor):
    slots = math.ceil(capacity_factor * len(choices) / experts)
    return sum(min(n, slots) for n in Counter(choices).values())


def dropped_counts_full_experts(choices, experts, capacity_factor):
    slots = math.ceil(capacity_factor * len(choices) / experts)
    return sum(n > slots for n in Counter(choices).values())


def dropped_with_numpy(choices, experts, capacity_factor):       # right, written another way
    import numpy as np
    counts = np.bincount(np.asarray(choices), minlength=experts)
    return int(np.clip(counts - -(-capacity_factor * len(choices) // experts), 0, None).sum())


# --- 5c.2: the bytes of one dispatch -----------------------------------------------------------

def dispatch_whole_buffer(tokens, hidden, experts, k, capacity_factor, ep, itemsize):
    return experts * math.ceil(capacity_factor * tokens * k / experts) * hidden * itemsize


def dispatch_without_k(tokens, hidden, experts, k, capacity_factor, ep, itemsize):
    slots = math.ceil(capacity_factor * tokens / experts)
    return (ep - 1) * (experts // ep) * slots * hidden * itemsize


def dispatch_without_capacity_factor(tokens, hidden, experts, k, capacity_factor, ep, itemsize):
    slots = math.ceil(tokens * k / experts)
    return (ep - 1) * (experts // ep) * slots * hidden * itemsize


def dispatch_values_not_bytes(tokens, hidden, experts, k, capacity_factor, ep, itemsize):
    slots = math.ceil(capacity_factor * tokens * k / experts)
    return (ep - 1) * (experts // ep) * slots * hidden


def dispatch_as_fraction(tokens, hidden, experts, k, capacity_factor, ep, itemsize):
    slots = math.ceil(capacity_factor * tokens * k / experts)     # right, written another way
    return (1 - 1 / ep) * experts * slots * hidden * itemsize


WRONG = {"5c.1": [dropped_capacity_rounded_down, dropped_without_capacity_factor,
                  dropped_returns_kept, dropped_counts_full_experts],
         "5c.2": [dispatch_whole_buffer, dispatch_without_k, dispatch_without_capacity_factor,
                  dispatch_values_not_bytes]}
RIGHT = {"5c.1": [dropped_with_numpy], "5c.2": [dispatch_as_fraction]}
HINTS = {dropped_capacity_rounded_down: "rounded down",
         dropped_without_capacity_factor: "capacity factor was left out",
         dropped_returns_kept: "tokens kept",
         dropped_counts_full_experts: "experts over capacity",
         dispatch_whole_buffer: "whole buffer",
         dispatch_without_k: "k was left out",
         dispatch_without_capacity_factor: "capacity factor was left out",
         dispatch_values_not_bytes: "bytes, not values"}

globals().update(contract.contract_tests(WEEK, COUNT, solution, WRONG, "5c.1", RIGHT, HINTS))


def test_exercise_cells_match_the_checkers():
    contract.assert_exercise_cells_match_checkers(WEEK, contract.stub_cells(NOTEBOOK), solution)


def test_exercise_stub_cells_print_not_attempted():
    lines = contract.run_exercise_cells(contract.stub_cells(NOTEBOOK), {})
    contract.assert_cells_print_not_attempted(WEEK, lines)


def test_exercise_cells_with_solutions_print_correct():
    lines = contract.run_exercise_cells(contract.stub_cells(NOTEBOOK), {}, solution)
    contract.assert_cells_print_correct(WEEK, lines)


def test_examples_in_the_statements_hold():
    assert solution.dropped_tokens([0, 0, 0, 1], 2, 1) == 1
    assert dropped_reference([0, 0, 0, 1], 2, 1) == 1
    assert solution.dispatch_bytes(8, 4, 4, 1, 1, 2, 8) == 128
    assert measured_dispatch_bytes(8, 4, 4, 1, 1, 2, 8) == 128


def test_first_cases_separate_the_mistakes():
    from dsml.exercises.week5c import DISPATCH_CASES, DROP_CASES
    drop = [f(*DROP_CASES[0]) for f in [solution.dropped_tokens] + WRONG["5c.1"]]
    dispatch = [f(*DISPATCH_CASES[0]) for f in [solution.dispatch_bytes] + WRONG["5c.2"]]
    assert len(set(drop)) == len(drop) and len(set(dispatch)) == len(dispatch)


def test_a_table_of_answers_copied_from_hints_fails_5c_2():
    # On main, such a table passed after 5 checks.
    contract.copied_answers_never_pass(
        "5c.2", r"dispatch_bytes\(tokens=(\S+), hidden=(\S+), experts=(\S+), k=(\S+), "
                r"capacity_factor=(\S+), ep=(\S+), itemsize=(\S+)\)", r"measured (\S+) B")


def test_fresh_cases_5c_2_keep_the_contract_for_every_base():
    contract.fresh_cases_keep_the_contract("5c.2", solution.dispatch_bytes, WRONG, RIGHT)


def dropped_from_the_library_router(choices, experts, capacity_factor):
    import numpy as np
    from dsml.expert_parallel import route
    probs = np.zeros((len(choices), experts))
    probs[np.arange(len(choices)), choices] = 1.0
    _, slot, _ = route(probs, 1, math.ceil(capacity_factor * len(choices) / experts))
    return int(np.sum(slot < 0))


def test_an_answer_that_runs_the_library_router_is_refused():
    from dsml.exercises import grade
    result = grade("5c.1", dropped_from_the_library_router)
    assert result.status == "failed"
    assert result.message.startswith("exercise 5c.1 asks you to build this yourself: your code "
                                     "called dsml.expert_parallel.route")
