"""Tests for bonus week 5b's checkers (context parallelism): each reference solution passes,
each named plausible mistake fails with a hint, untouched stubs are "not attempted", a learner's
crash becomes a ✗, and the notebook's exercise cells match the checkers. The contract every
week keeps is in exercise_contract; this module adds 5b's mistakes, other right answers and
hints, and ties the bytes checker's measurement to the closed form."""
from __future__ import annotations

import numpy as np

import exercise_contract as contract
from dsml.exercises import grade
from dsml.exercises.week5b import measured_ring_bytes

solution = contract.solution_module("5b")
NOTEBOOK = contract.ROOT / "notebooks" / "week5b_context_parallelism.ipynb"
COUNT = 3


# --- 5b.1: merging partial results -------------------------------------------------------------

def merge_average(out_a, lse_a, out_b, lse_b):
    return (out_a + out_b) / 2, np.logaddexp(lse_a, lse_b)


def merge_without_shift(out_a, lse_a, out_b, lse_b):
    with np.errstate(all="ignore"):                             # overflows for large scores
        weight_a, weight_b = np.exp(lse_a), np.exp(lse_b)
        total = weight_a + weight_b
        return ((weight_a[:, None] * out_a + weight_b[:, None] * out_b) / total[:, None],
                np.log(total))


def merge_lse_max(out_a, lse_a, out_b, lse_b):
    out, _ = solution.merge_partials(out_a, lse_a, out_b, lse_b)
    return out, np.maximum(lse_a, lse_b)


def merge_with_logaddexp(out_a, lse_a, out_b, lse_b):           # right, written another way
    lse = np.logaddexp(lse_a, lse_b)
    return (np.exp(lse_a - lse)[:, None] * out_a + np.exp(lse_b - lse)[:, None] * out_b), lse


# --- 5b.2: zig-zag -----------------------------------------------------------------------------

def zigzag_contiguous(seq, cp, rank):
    return np.arange(rank * seq // cp, (rank + 1) * seq // cp)


def zigzag_striped(seq, cp, rank):
    return np.arange(rank, seq, cp)


def zigzag_mirror_of_cp(seq, cp, rank):
    chunk = seq // (2 * cp)                                      # mirrors among cp, not 2cp
    return np.concatenate([np.arange(rank * chunk, (rank + 1) * chunk),
                           np.arange((cp - 1 - rank) * chunk, (cp - rank) * chunk)])


def zigzag_as_list_in_another_order(seq, cp, rank):              # right: order does not matter
    return sorted(solution.zigzag_positions(seq, cp, rank).tolist(), reverse=True)


# --- 5b.3: bytes -------------------------------------------------------------------------------

def bytes_forward_only(batch, seq, hidden, cp, itemsize):
    return 2 * (cp - 1) * batch * (seq // cp) * hidden * itemsize


def bytes_no_gradient_trip(batch, seq, hidden, cp, itemsize):
    return 4 * (cp - 1) * batch * (seq // cp) * hidden * itemsize


def bytes_gradients_stop_short(batch, seq, hidden, cp, itemsize):   # no last hop home
    return 6 * (cp - 1) * batch * (seq // cp) * hidden * itemsize


def bytes_elements(batch, seq, hidden, cp, itemsize):
    return solution.ring_attention_bytes(batch, seq, hidden, cp, itemsize) / itemsize


def bytes_k_only(batch, seq, hidden, cp, itemsize):
    return solution.ring_attention_bytes(batch, seq, hidden, cp, itemsize) / 2


WRONG = {
    "5b.1": [merge_average, merge_without_shift, merge_lse_max],
    "5b.2": [zigzag_contiguous, zigzag_striped, zigzag_mirror_of_cp],
    "5b.3": [bytes_forward_only, bytes_no_gradient_trip, bytes_gradients_stop_short,
             bytes_elements, bytes_k_only],
}
RIGHT = {"5b.1": [merge_with_logaddexp], "5b.2": [zigzag_as_list_in_another_order]}
HINT_WORDS = {
    merge_average: "plain average", merge_without_shift: "overflow", merge_lse_max: "larger",
    zigzag_contiguous: "plain split", zigzag_striped: "striped", zigzag_mirror_of_cp: "mirrors",
    bytes_forward_only: "forward alone", bytes_no_gradient_trip: "dK and dV",
    bytes_gradients_stop_short: "end up",
    bytes_elements: "itemsize", bytes_k_only: "Half",
}

globals().update(contract.contract_tests("5b", COUNT, solution, WRONG, not_attempted_id="5b.2",
                                         right=RIGHT, hint_words=HINT_WORDS))


def test_measured_bytes_follow_the_closed_form():
    for case in [(1, 12, 4, 3, 4), (2, 16, 6, 4, 2), (3, 8, 2, 1, 2), (1, 6, 2, 2, 8)]:
        assert measured_ring_bytes(*case) == solution.ring_attention_bytes(*case)


# --- the notebook's exercise cells ------------------------------------------------------------

def test_no_stub_shadows_a_name_the_notebook_body_defines():
    contract.assert_no_stub_shadows_the_body(
        "5b", NOTEBOOK, {"zigzag_layout", "online_update", "ring_attention_step", "BF16"})


def test_exercise_cells_match_the_checkers():
    contract.assert_exercise_cells_match_checkers("5b", contract.stub_cells(NOTEBOOK), solution)


def test_exercise_stub_cells_print_not_attempted():
    lines = contract.run_exercise_cells(contract.stub_cells(NOTEBOOK), {})
    contract.assert_cells_print_not_attempted("5b", lines)


def test_exercise_cells_with_solutions_print_correct():
    lines = contract.run_exercise_cells(contract.stub_cells(NOTEBOOK), {}, solution)
    contract.assert_cells_print_correct("5b", lines)


def test_examples_in_the_statements_hold():
    out, lse = solution.merge_partials(np.array([[1.0]]), np.array([0.0]), np.array([[3.0]]),
                                       np.array([0.0]))
    assert out[0, 0] == 2.0 and np.isclose(lse[0], np.log(2))
    assert sorted(solution.zigzag_positions(8, 2, 0)) == [0, 1, 6, 7]
    assert sorted(solution.zigzag_positions(8, 2, 1)) == [2, 3, 4, 5]
    assert solution.ring_attention_bytes(1, 8, 2, 2, 8) - 2 * 4 * 2 * 8 > 0   # forward 128 B
    assert 2 * (2 - 1) * (8 // 2) * 2 * 8 == 128


# --- exercise 5b.2 must be built: the library's own layout is refused -------------------------

def zigzag_from_library(seq, cp, rank):
    from dsml.context_parallel import zigzag_layout
    return zigzag_layout(seq, cp)[rank]


def test_an_answer_that_calls_the_library_layout_is_refused():
    import dsml.context_parallel
    real = dsml.context_parallel.zigzag_layout
    result = grade("5b.2", zigzag_from_library)
    assert result.status == "failed"
    assert result.message.startswith("exercise 5b.2 asks you to build this yourself: your code "
                                     "called dsml.context_parallel.zigzag_layout")
    assert dsml.context_parallel.zigzag_layout is real


def test_fresh_cases_5b_2_keep_the_contract_for_every_base():
    contract.fresh_cases_keep_the_contract("5b.2", solution.zigzag_positions, WRONG, RIGHT)


def ring_bytes_from_library(batch, seq, hidden, cp, itemsize):
    from dsml.context_parallel import ring_attention_kv_bytes
    forward = ring_attention_kv_bytes(seq, hidden, cp, batch, itemsize)
    return 2 * forward + (2 * seq * hidden * itemsize * batch if cp > 1 else 0)


def test_an_answer_that_calls_the_library_formula_is_refused():
    result = grade("5b.3", ring_bytes_from_library)
    assert result.status == "failed"
    assert result.message.startswith("exercise 5b.3 asks you to build this yourself: your code "
                                     "called dsml.context_parallel.ring_attention_kv_bytes")
