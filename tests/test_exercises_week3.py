"""Tests for week 3's checkers: each reference solution passes, each named plausible mistake
fails with a hint, untouched stubs are "not attempted", a learner's crash becomes a ✗ instead
of an exception, and the notebook's exercise cells match the checkers. The contract every
week keeps is in exercise_contract; this module adds week 3's mistakes, other right answers,
hints and cases."""
from __future__ import annotations

import warnings

import numpy as np

import exercise_contract as contract
from dsml.collectives import allreduce
from dsml.data_parallel import flatten, shard_bounds, unflatten
from dsml.exercises import grade
from dsml.train import loss_and_grads

solution = contract.solution_module(3)
NOTEBOOK = contract.ROOT / "notebooks" / "week3_data_parallelism.ipynb"
CELLS = contract.ROOT / "build" / "week3_exercise_cells.py"


# --- plausible wrong answers, one named function per mistake --------------------------------

# 3.1: db as the mean over the batch, as if the bias were shared by the batch's mean.
def linear_backward_mean_bias(X, W, dZ):
    return X.T @ dZ, dZ.mean(axis=0), dZ @ W.T


# 3.1: divides dW by the batch size a second time (dZ already carries the loss's 1/B).
def linear_backward_divides_by_batch(X, W, dZ):
    return X.T @ dZ / len(X), dZ.sum(axis=0), dZ @ W.T


# 3.1: dW = dZᵀ X: the right numbers, transposed.
def linear_backward_transposed_dw(X, W, dZ):
    return dZ.T @ X, dZ.sum(axis=0), dZ @ W.T


# 3.1: applies a ReLU derivative to dX, which belongs to the layer below, not to this one.
def linear_backward_wrong_dx(X, W, dZ):
    return X.T @ dZ, dZ.sum(axis=0), (dZ @ W.T) * (X > 0)


# 3.2: the gradient of the summed loss: no division by B.
def grad_sums_over_batch(logits, y):
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    probs[np.arange(len(y)), y] -= 1.0
    return probs


# 3.2: softmax / B, without subtracting the one-hot labels.
def grad_without_onehot(logits, y):
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    return probs / len(y)


# 3.2: exp of the raw logits: overflows to inf/inf = nan for logits in the hundreds.
def grad_without_max_shift(logits, y):
    with np.errstate(over="ignore", invalid="ignore"):
        probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    probs[np.arange(len(y)), y] -= 1.0
    return probs / len(y)


# 3.3: no bias correction.
def adam_without_bias_correction(w, g, m, v, t, lr, beta1, beta2, eps):
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    return w - lr * m / (np.sqrt(v) + eps), m, v


# 3.3: corrects with t − 1, as if t counted the steps taken before this one.
def adam_correction_off_by_one(w, g, m, v, t, lr, beta1, beta2, eps):
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1 ** (t - 1)), v / (1 - beta2 ** (t - 1))
    return w - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


# 3.3: steps with the moments from before this gradient.
def adam_old_moments(w, g, m, v, t, lr, beta1, beta2, eps):
    step = lr * (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps)
    return w - step, beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g


# 3.3: returns the bias-corrected moments as the new state.
def adam_returns_corrected_moments(w, g, m, v, t, lr, beta1, beta2, eps):
    m = (beta1 * m + (1 - beta1) * g) / (1 - beta1 ** t)
    v = (beta2 * v + (1 - beta2) * g * g) / (1 - beta2 ** t)
    return w - lr * m / (np.sqrt(v) + eps), m, v


# 3.4: no rule for zero norms: a fresh bias gets rate 0 and never moves.
def lars_without_zero_rule(w, g, trust_coefficient, weight_decay):
    w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
    return trust_coefficient * w_norm / (g_norm + weight_decay * w_norm)


# 3.4: leaves weight decay out of the denominator.
def lars_without_weight_decay(w, g, trust_coefficient, weight_decay):
    w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
    if w_norm == 0 or g_norm == 0:
        return 1.0
    return trust_coefficient * w_norm / g_norm


# 3.4: the ratio upside down.
def lars_upside_down(w, g, trust_coefficient, weight_decay):
    w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
    if w_norm == 0 or g_norm == 0:
        return 1.0
    return trust_coefficient * (g_norm + weight_decay * w_norm) / w_norm


# 3.5: adds the micro-batch means: k times too large.
def accumulate_sum_of_means(micro_grads, sizes):
    return {name: sum(grads[name] for grads in micro_grads) for name in micro_grads[0]}


# 3.5: averages the means: right only for equal micro-batches.
def accumulate_mean_of_means(micro_grads, sizes):
    return {name: sum(grads[name] for grads in micro_grads) / len(micro_grads)
            for name in micro_grads[0]}


# 3.5: weights by size but forgets to divide by the batch size.
def accumulate_weighted_sum(micro_grads, sizes):
    return {name: sum(n * grads[name] for n, grads in zip(sizes, micro_grads))
            for name in micro_grads[0]}


def _shard_sums(comm, X, y, batch, model):
    start, stop = shard_bounds(len(batch), comm.size, comm.rank)
    mine = batch[start:stop]
    if len(mine) == 0:
        return {name: np.zeros_like(w) for name, w in model.params.items()
                if name not in model.frozen}, 0.0, mine
    loss, grads = loss_and_grads(model, X[mine], y[mine])
    return {name: g * len(mine) for name, g in grads.items()}, loss * len(mine), mine


# 3.6: all-reduces the shard *means* with op="mean": wrong when the shards differ in size.
def dp_mean_of_shard_means(comm, X, y, batch, model, optimizer):
    sums, loss_sum, mine = _shard_sums(comm, X, y, batch, model)
    n = max(len(mine), 1)
    vector, layout = flatten({name: s / n for name, s in sums.items()})
    total = yield from allreduce(comm, np.append(vector, loss_sum / n), op="mean")
    optimizer.step(model.params, unflatten(total[:-1], layout))
    return float(total[-1])


# 3.6: every rank steps with its own shard's gradient: no communication at all.
def dp_local_step_only(comm, X, y, batch, model, optimizer):
    sums, loss_sum, mine = _shard_sums(comm, X, y, batch, model)
    n = max(len(mine), 1)
    optimizer.step(model.params, {name: s / n for name, s in sums.items()})
    yield comm.compute(0.0)
    return loss_sum / n


# 3.6: right values, but one all-reduce per tensor (and one more for the loss).
def dp_allreduce_per_tensor(comm, X, y, batch, model, optimizer):
    sums, loss_sum, _ = _shard_sums(comm, X, y, batch, model)
    grads = {}
    for name, s in sums.items():
        grads[name] = (yield from allreduce(comm, s)) / len(batch)
    loss = yield from allreduce(comm, np.array([loss_sum]))
    optimizer.step(model.params, grads)
    return float(loss[0] / len(batch))


# 3.6: cuts the batch with np.split, which insists on equal shards.
def dp_np_split(comm, X, y, batch, model, optimizer):
    mine = np.split(batch, comm.size)[comm.rank]
    loss, grads = loss_and_grads(model, X[mine], y[mine])
    vector, layout = flatten({name: g * len(mine) for name, g in grads.items()})
    total = yield from allreduce(comm, np.append(vector, loss * len(mine)))
    optimizer.step(model.params, unflatten(total[:-1] / len(batch), layout))
    return float(total[-1] / len(batch))


WRONG = {
    "3.1": [linear_backward_mean_bias, linear_backward_divides_by_batch,
            linear_backward_transposed_dw, linear_backward_wrong_dx],
    "3.2": [grad_sums_over_batch, grad_without_onehot, grad_without_max_shift],
    "3.3": [adam_without_bias_correction, adam_correction_off_by_one, adam_old_moments,
            adam_returns_corrected_moments],
    "3.4": [lars_without_zero_rule, lars_without_weight_decay, lars_upside_down],
    "3.5": [accumulate_sum_of_means, accumulate_mean_of_means, accumulate_weighted_sum],
    "3.6": [dp_mean_of_shard_means, dp_local_step_only, dp_allreduce_per_tensor, dp_np_split],
}

# The words each mistake's hint must contain: it names what went wrong, not just "wrong".
HINT_WORDS = {
    linear_backward_mean_bias: "the mean over the batch",
    linear_backward_divides_by_batch: "divided by the batch size",
    linear_backward_transposed_dw: "has shape (4, 3), expected (3, 4)",
    linear_backward_wrong_dx: "dX = dZ Wᵀ",
    grad_sums_over_batch: "times the expected gradient",
    grad_without_onehot: "without subtracting the one-hot",
    grad_without_max_shift: "Subtract each row's maximum",
    adam_without_bias_correction: "without bias correction",
    adam_correction_off_by_one: "uses t = 1 where this is step t = 2",
    adam_old_moments: "from *before* this gradient",
    adam_returns_corrected_moments: "before the bias correction",
    lars_without_zero_rule: "the local rate is 1",
    lars_without_weight_decay: "weight decay belongs in it",
    lars_upside_down: "upside down",
    accumulate_sum_of_means: "too large",
    accumulate_mean_of_means: "right only when the micro-batches are equal",
    accumulate_weighted_sum: "divide by the batch size",
    dp_mean_of_shard_means: "averaging the shard means",
    dp_local_step_only: "the ranks hold different",
    dp_allreduce_per_tensor: "all-reduce it once",
    dp_np_split: "np.split insists on equal shards",
}


# --- other right answers, which must pass too ------------------------------------------------

# 3.1: with einsum.
def linear_backward_einsum(X, W, dZ):
    return (np.einsum("bi,bo->io", X, dZ), np.einsum("bo->o", dZ),
            np.einsum("bo,io->bi", dZ, W))


# 3.2: log-softmax via log-sum-exp, then exp.
def grad_via_logsumexp(logits, y):
    top = logits.max(axis=1, keepdims=True)
    log_probs = logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
    onehot = np.eye(logits.shape[1])[y]
    return (np.exp(log_probs) - onehot) / len(y)


# 3.4: the norms taken by hand, zero rule written as a product test.
def lars_by_hand(w, g, trust_coefficient, weight_decay):
    w_norm, g_norm = float(np.sqrt(np.sum(w * w))), float(np.sqrt(np.sum(g * g)))
    if w_norm * g_norm == 0:
        return 1
    return trust_coefficient * w_norm / (g_norm + weight_decay * w_norm)


# 3.5: accumulate in place, one micro-batch at a time, as a training loop would.
def accumulate_in_place(micro_grads, sizes):
    total = {name: np.zeros_like(g) for name, g in micro_grads[0].items()}
    for n, grads in zip(sizes, micro_grads):
        for name, g in grads.items():
            total[name] += n * g
    return {name: g / sum(sizes) for name, g in total.items()}


# 3.6: the library's own step, through data_parallel_sgd with one batch.
def dp_library_step(comm, X, y, batch, model, optimizer):
    from dsml.data_parallel import data_parallel_sgd
    losses = yield from data_parallel_sgd(comm, model, optimizer, X, y, [batch])
    return losses[0]


# 3.6: recursive doubling instead of the ring: fewer α terms on a small gradient.
def dp_recursive_doubling(comm, X, y, batch, model, optimizer):
    sums, loss_sum, _ = _shard_sums(comm, X, y, batch, model)
    vector, layout = flatten(sums)
    total = yield from allreduce(comm, np.append(vector, loss_sum),
                                 algorithm="recursive_doubling")
    optimizer.step(model.params, unflatten(total[:-1] / len(batch), layout))
    return float(total[-1] / len(batch))


RIGHT = {
    "3.1": [linear_backward_einsum],
    "3.2": [grad_via_logsumexp],
    "3.4": [lars_by_hand],
    "3.5": [accumulate_in_place],
    "3.6": [dp_library_step, dp_recursive_doubling],
}

RANK_PROGRAMS = ["3.6"]   # the exercises whose answer is a rank program


# --- the contract every week keeps -------------------------------------------------------------

globals().update(contract.contract_tests(
    3, 6, solution, WRONG, not_attempted_id="3.4", right=RIGHT, hint_words=HINT_WORDS,
    rank_programs=RANK_PROGRAMS))


# --- week 3's hints ----------------------------------------------------------------------------

def test_hint_states_input_and_what_went_wrong():
    message = grade("3.4", lars_without_zero_rule).message
    assert "for a fresh bias (all zeros)" in message                 # the input
    assert "returned 0, expected 1" in message                      # returned and expected


def test_unequal_micro_batches_are_what_catches_the_mean_of_means():
    # Equal micro-batches alone would let the plain mean pass: the cases must include both.
    from dsml.exercises.week3 import ACCUMULATION_CASES
    assert any(len(set(sizes)) > 1 for _, sizes in ACCUMULATION_CASES)
    assert any(len(set(sizes)) == 1 and len(sizes) > 1 for _, sizes in ACCUMULATION_CASES)
    assert all(sum(sizes) == n for n, sizes in ACCUMULATION_CASES)


def test_data_parallel_cases_include_awkward_shards():
    from dsml.exercises.week3 import DP_CASES
    assert any(p == 1 for p, _ in DP_CASES)
    assert any(n < p for p, n in DP_CASES)                           # empty shards
    assert any(n % p for p, n in DP_CASES if n >= p)                 # unequal shards


def test_empty_shard_failure_gets_advice():
    # A step that calls loss_and_grads on an empty shard sends a nan loss (0/0).
    def naive(comm, X, y, batch, model, optimizer):
        start, stop = shard_bounds(len(batch), comm.size, comm.rank)
        mine = batch[start:stop]
        with np.errstate(invalid="ignore", divide="ignore"):
            loss, grads = loss_and_grads(model, X[mine], y[mine])
        vector, layout = flatten({name: g * len(mine) for name, g in grads.items()})
        total = yield from allreduce(comm, np.append(vector, loss * len(mine)))
        optimizer.step(model.params, unflatten(total[:-1] / len(batch), layout))
        return float(total[-1] / len(batch))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)    # the mean of an empty slice
        message = grade("3.6", naive).message
    assert "empty shard" in message and "contribute zeros" in message, message


def test_adam_checker_uses_steps_beyond_the_first():
    from dsml.exercises.week3 import ADAM_CASES
    assert all(t >= 2 for _, t, *_ in ADAM_CASES)


# --- the notebook's exercise cells ------------------------------------------------------------

def test_no_stub_shadows_a_name_the_notebook_body_defines():
    contract.assert_no_stub_shadows_the_body(
        3, NOTEBOOK, {"MLP", "softmax_cross_entropy", "shard_bounds", "data_parallel_sgd",
                      "accumulated_grads", "make_optimizer"})


def test_exercise_cells_match_the_checkers():
    contract.assert_exercise_cells_match_checkers(3, contract.stub_cells(NOTEBOOK, CELLS),
                                                  solution)


def notebook_namespace() -> dict:
    """The names the exercise cells use from the notebook above them."""
    import dsml
    from dsml.collectives import allreduce as library_allreduce
    from dsml.data_parallel import flatten as library_flatten
    from dsml.data_parallel import shard_bounds as library_shard_bounds
    from dsml.data_parallel import unflatten as library_unflatten
    from dsml.train import MLP, loss_and_grads as library_loss_and_grads, make_optimizer

    return {"np": np, "dsml": dsml, "MLP": MLP, "make_optimizer": make_optimizer,
            "loss_and_grads": library_loss_and_grads, "allreduce": library_allreduce,
            "flatten": library_flatten, "unflatten": library_unflatten,
            "shard_bounds": library_shard_bounds}


def test_exercise_stub_cells_print_not_attempted():
    lines = contract.run_exercise_cells(contract.stub_cells(NOTEBOOK, CELLS),
                                        notebook_namespace())
    contract.assert_cells_print_not_attempted(3, lines)


def test_exercise_cells_with_solutions_print_correct():
    lines = contract.run_exercise_cells(contract.stub_cells(NOTEBOOK, CELLS),
                                        notebook_namespace(), solution)
    contract.assert_cells_print_correct(3, lines)


def test_examples_in_the_statements_hold():
    # The worked examples quote numbers; recompute them with the reference solutions.
    import math

    import dsml
    from dsml.data_parallel import train_single
    from dsml.train import MLP, make_optimizer
    dW, db, dX = solution.linear_backward(np.array([[1.0, 2.0], [3.0, 4.0]]),
                                          np.array([[1.0, 0.0, -1.0], [0.0, 1.0, 2.0]]),
                                          np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))
    assert dW.tolist() == [[1.0, 3.0, 1.0], [2.0, 4.0, 2.0]]
    assert db.tolist() == [1.0, 1.0, 1.0]
    assert dX.tolist() == [[0.0, 2.0], [0.0, 1.0]]
    grad = solution.softmax_cross_entropy_grad(np.array([[0.0, 0.0], [1000.0, 1000.0]]),
                                               np.array([0, 1]))
    assert np.allclose(grad, [[-0.25, 0.25], [0.25, -0.25]])
    w, m, v = solution.adam_step(np.array([1.0]), np.array([0.5]), np.array([0.0]),
                                 np.array([0.0]), 1, 0.1, 0.9, 0.999, 1e-8)
    assert math.isclose(w[0], 0.9, rel_tol=1e-7)
    assert math.isclose(m[0], 0.05) and math.isclose(v[0], 0.00025)
    assert math.isclose(solution.lars_local_lr(np.array([3.0, 4.0]), np.array([0.0, 0.5]),
                                               0.01, 0.1), 0.05)
    assert solution.lars_local_lr(np.zeros(3), np.ones(3), 0.01, 0.1) == 1.0
    got = solution.accumulate_micro_grads([{"w": np.array([1.0, 2.0])},
                                           {"w": np.array([4.0, 8.0])}], [3, 1])
    assert got["w"].tolist() == [1.75, 3.5]
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((12, 4)), rng.integers(0, 3, size=12)
    batch = np.arange(7)

    def program(comm):
        model = MLP([4, 8, 3], seed=1)
        loss = yield from solution.data_parallel_step(comm, X, y, batch, model,
                                                      make_optimizer("sgd", 0.1))
        return loss, model.params["layer0.weight"].copy()
    values = dsml.run(program, 3, network=dsml.net.AlphaBeta(2e-6, 1e-9), trace=False).values
    single = MLP([4, 8, 3], seed=1)
    single_loss = train_single(single, make_optimizer("sgd", 0.1), X, y, [batch])[0]
    assert all(math.isclose(loss, single_loss, rel_tol=1e-12) for loss, _ in values)
    assert all(np.allclose(w, single.params["layer0.weight"], rtol=1e-12, atol=1e-15)
               for _, w in values)
