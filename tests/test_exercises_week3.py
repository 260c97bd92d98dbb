"""Tests for week 3's checkers: each reference solution passes, each named plausible mistake
fails with a hint, untouched stubs are "not attempted", a learner's crash becomes a ✗ instead
of an exception, and the notebook's exercise cells match the checkers. The contract every
week keeps is in exercise_contract; this module adds week 3's mistakes, other right answers,
hints and cases."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import exercise_contract as contract
from dsml.collectives import allreduce
from dsml.data_parallel import assign_buckets, flatten, shard_bounds, unflatten
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


# 3.7: forgets the scaling: the warm-up "ramps" from base_lr to base_lr.
def lr_not_scaled(step, base_lr, base_batch, batch, warmup_steps):
    if warmup_steps == 0:
        return base_lr
    return base_lr + (base_lr - base_lr) * min(1.0, step / warmup_steps)


# 3.7: ramps from 0 to the target instead of from base_lr.
def lr_warmup_from_zero(step, base_lr, base_batch, batch, warmup_steps):
    target = base_lr * batch / base_batch
    return target * min(1.0, step / warmup_steps) if warmup_steps else target


# 3.7: section 7's ramp, (step + 1)/warmup of the target: from (almost) 0, and one step early.
def lr_warmup_as_section_7(step, base_lr, base_batch, batch, warmup_steps):
    target = base_lr * batch / base_batch
    return target * min(1.0, (step + 1) / warmup_steps) if warmup_steps else target


# 3.7: counts the step being taken as done: reaches the target at warmup_steps − 1.
def lr_warmup_one_step_early(step, base_lr, base_batch, batch, warmup_steps):
    target = base_lr * batch / base_batch
    if warmup_steps == 0:
        return target
    return base_lr + (target - base_lr) * min(1.0, (step + 1) / warmup_steps)


# 3.7: spreads the ramp over warmup_steps + 1 steps: reaches the target one step late.
def lr_warmup_one_step_late(step, base_lr, base_batch, batch, warmup_steps):
    target = base_lr * batch / base_batch
    return base_lr + (target - base_lr) * min(1.0, step / (warmup_steps + 1))


# 3.7: square-root scaling instead of linear.
def lr_sqrt_scaling(step, base_lr, base_batch, batch, warmup_steps):
    target = base_lr * (batch / base_batch) ** 0.5
    if warmup_steps == 0:
        return target
    return base_lr + (target - base_lr) * min(1.0, step / warmup_steps)


# 3.7: floor division of the batch sizes: right only for integer ratios.
def lr_floor_ratio(step, base_lr, base_batch, batch, warmup_steps):
    target = base_lr * (batch // base_batch)
    if warmup_steps == 0:
        return target
    return base_lr + (target - base_lr) * min(1.0, step / warmup_steps)


# 3.7: no special case for warmup_steps = 0: ZeroDivisionError.
def lr_divides_by_zero(step, base_lr, base_batch, batch, warmup_steps):
    target = base_lr * batch / base_batch
    return base_lr + (target - base_lr) * min(1.0, step / warmup_steps)


def _estimates(g_small, g_big, b, B):
    g_square = (B * g_big - b * g_small) / (B - b)
    trace = (g_small - g_big) / (1 / b - 1 / B)
    return trace / g_square, g_square, trace


# 3.8: uses rank 0's local norm only (unbiased, but noisier, and not the formula).
def noise_rank0_only(local_sq_norms, global_sq_norm, local_batch, global_batch):
    return _estimates(local_sq_norms[0], global_sq_norm, local_batch, global_batch)


# 3.8: divides tr Σ by |G_B|², which still holds the noise tr Σ/B.
def noise_divides_by_global_norm(local_sq_norms, global_sq_norm, local_batch, global_batch):
    _, g_square, trace = _estimates(np.mean(local_sq_norms), global_sq_norm, local_batch,
                                    global_batch)
    return trace / global_sq_norm, g_square, trace


# 3.8: the batch sizes swapped in the formulas.
def noise_swapped_batches(local_sq_norms, global_sq_norm, local_batch, global_batch):
    return _estimates(np.mean(local_sq_norms), global_sq_norm, global_batch, local_batch)


# 3.8: the mean of the local norms (square roots), squared.
def noise_mean_of_norms_squared(local_sq_norms, global_sq_norm, local_batch, global_batch):
    g_small = float(np.mean(np.sqrt(local_sq_norms))) ** 2
    return _estimates(g_small, global_sq_norm, local_batch, global_batch)


# 3.8: takes |G_B|² as |G|² (biased by tr Σ/B) — caught by the statistics too.
def noise_global_norm_as_g_square(local_sq_norms, global_sq_norm, local_batch, global_batch):
    _, _, trace = _estimates(np.mean(local_sq_norms), global_sq_norm, local_batch,
                             global_batch)
    return trace / global_sq_norm, global_sq_norm, trace


# 3.8: clips the estimate of |G|² at 0, since a squared norm "cannot be negative".
def noise_clipped_at_zero(local_sq_norms, global_sq_norm, local_batch, global_batch):
    _, g_square, trace = _estimates(np.mean(local_sq_norms), global_sq_norm, local_batch,
                                    global_batch)
    g_square = max(g_square, 0.0)
    return (trace / g_square if g_square else math.inf), g_square, trace


# 3.8: takes the absolute value of the estimate of |G|².
def noise_absolute_value(local_sq_norms, global_sq_norm, local_batch, global_batch):
    _, g_square, trace = _estimates(np.mean(local_sq_norms), global_sq_norm, local_batch,
                                    global_batch)
    return trace / abs(g_square), abs(g_square), trace


def _ring(p, nbytes, alpha, beta):
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta


# 3.9: the ring's bandwidth term without (p − 1)/p: 2·nbytes·β.
def eff_without_ring_fraction(p, t_compute, nbytes, alpha, beta):
    allreduce_time = 2 * (p - 1) * alpha + (2 * nbytes * beta if p > 1 else 0.0)
    return t_compute / (p * (t_compute / p + allreduce_time))


# 3.9: T_p/T_1, the inverse of the speed-up.
def eff_inverted(p, t_compute, nbytes, alpha, beta):
    return (t_compute / p + _ring(p, nbytes, alpha, beta)) / t_compute


# 3.9: weak-scaling efficiency: every rank computes the whole batch.
def eff_weak_scaling(p, t_compute, nbytes, alpha, beta):
    return t_compute / (t_compute + _ring(p, nbytes, alpha, beta))


# 3.9: no latency term.
def eff_without_alpha(p, t_compute, nbytes, alpha, beta):
    return t_compute / (p * (t_compute / p + 2 * (p - 1) / p * nbytes * beta))


# 3.9: the speed-up T_1/T_p, not divided by p.
def eff_speedup(p, t_compute, nbytes, alpha, beta):
    return t_compute / (t_compute / p + _ring(p, nbytes, alpha, beta))


# 3.10: the shared scaffolding of the wrong answers: bucket k starts at start(k) and costs c(n).
def _ddp_walk(gradients, cap, p, start, cost_of):
    from dsml.data_parallel import assign_buckets
    nbytes, ready, begun, clock = {}, {}, {}, 0.0
    for name, size, seconds in gradients:
        begun[name] = clock
        clock += seconds
        nbytes[name], ready[name] = size, clock
    buckets = assign_buckets([(n, nbytes[n]) for n, _, _ in reversed(gradients)], cap)
    return buckets, nbytes, ready, begun, clock


def _ring_time(p, n, alpha, beta):
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta


# 3.10: no overlap: backward, then every bucket.
def ddp_time_no_overlap(gradients, bucket_cap, p, alpha, beta, forward_seconds):
    buckets, nbytes, _, _, clock = _ddp_walk(gradients, bucket_cap, p, None, None)
    return forward_seconds + clock + sum(_ring_time(p, sum(nbytes[n] for n in b), alpha, beta)
                                         for b in buckets)


# 3.10: assign_buckets given the gradients in backward order (it wants forward order).
def ddp_time_backward_order_buckets(gradients, bucket_cap, p, alpha, beta, forward_seconds):
    nbytes = {n: b for n, b, _ in gradients}
    ready, clock = {}, forward_seconds
    for name, _, seconds in gradients:
        clock += seconds
        ready[name] = clock
    end = forward_seconds
    for bucket in assign_buckets([(n, nbytes[n]) for n, _, _ in gradients], bucket_cap):
        end = max(max(ready[n] for n in bucket), end) + \
            _ring_time(p, sum(nbytes[n] for n in bucket), alpha, beta)
    return max(end, clock)


# 3.10: buckets overlap each other: each starts when ready, ignoring the one before.
def ddp_time_no_queue(gradients, bucket_cap, p, alpha, beta, forward_seconds):
    buckets, nbytes, ready, _, clock = _ddp_walk(gradients, bucket_cap, p, None, None)
    return forward_seconds + max([clock] + [max(ready[n] for n in b)
                                            + _ring_time(p, sum(nbytes[n] for n in b), alpha, beta)
                                            for b in buckets])


def _ddp_queue(gradients, bucket_cap, p, forward_seconds, start_of, cost_of):
    buckets, nbytes, ready, begun, clock = _ddp_walk(gradients, bucket_cap, p, None, None)
    end = 0.0
    for b in buckets:
        end = max(start_of(b, ready, begun), end) + cost_of(sum(nbytes[n] for n in b))
    return forward_seconds + max(end, clock)


# 3.10: a bucket starts when its first gradient starts being computed.
def ddp_time_first_gradient(gradients, bucket_cap, p, alpha, beta, forward_seconds):
    return _ddp_queue(gradients, bucket_cap, p, forward_seconds,
                      lambda b, ready, begun: min(begun[n] for n in b),
                      lambda n: _ring_time(p, n, alpha, beta))


# 3.10: no latency per bucket.
def ddp_time_no_alpha(gradients, bucket_cap, p, alpha, beta, forward_seconds):
    return _ddp_queue(gradients, bucket_cap, p, forward_seconds,
                      lambda b, ready, begun: max(ready[n] for n in b),
                      lambda n: 2 * (p - 1) / p * n * beta)


# 3.10: the ring moves 2·n·β instead of 2(p − 1)/p · n · β.
def ddp_time_no_fraction(gradients, bucket_cap, p, alpha, beta, forward_seconds):
    return _ddp_queue(gradients, bucket_cap, p, forward_seconds,
                      lambda b, ready, begun: max(ready[n] for n in b),
                      lambda n: 2 * (p - 1) * alpha + 2 * n * beta)


# 3.11: no padding: the shards differ in length when world_size does not divide n.
def sampler_no_padding(n, world_size, rank, epoch, seed):
    return np.random.default_rng(seed + epoch).permutation(n)[rank::world_size]


# 3.11: contiguous blocks of the padded permutation instead of a stride.
def sampler_blocks(n, world_size, rank, epoch, seed):
    share = -(-n // world_size)
    padded = np.resize(np.random.default_rng(seed + epoch).permutation(n), share * world_size)
    return padded[rank * share:(rank + 1) * share]


# 3.11: the epoch forgotten: the same order every epoch.
def sampler_ignores_epoch(n, world_size, rank, epoch, seed):
    total = -(-n // world_size) * world_size
    return np.resize(np.random.default_rng(seed).permutation(n), total)[rank::world_size]


# 3.11: np.array_split of the permutation: unequal contiguous pieces.
def sampler_array_split(n, world_size, rank, epoch, seed):
    return np.array_split(np.random.default_rng(seed + epoch).permutation(n), world_size)[rank]


WRONG = {
    "3.1": [linear_backward_mean_bias, linear_backward_divides_by_batch,
            linear_backward_transposed_dw, linear_backward_wrong_dx],
    "3.2": [grad_sums_over_batch, grad_without_onehot, grad_without_max_shift],
    "3.3": [adam_without_bias_correction, adam_correction_off_by_one, adam_old_moments,
            adam_returns_corrected_moments],
    "3.4": [lars_without_zero_rule, lars_without_weight_decay, lars_upside_down],
    "3.5": [accumulate_sum_of_means, accumulate_mean_of_means, accumulate_weighted_sum],
    "3.6": [dp_mean_of_shard_means, dp_local_step_only, dp_allreduce_per_tensor, dp_np_split],
    "3.7": [lr_not_scaled, lr_warmup_from_zero, lr_warmup_as_section_7, lr_warmup_one_step_early,
            lr_warmup_one_step_late, lr_sqrt_scaling, lr_floor_ratio, lr_divides_by_zero],
    "3.8": [noise_rank0_only, noise_divides_by_global_norm, noise_swapped_batches,
            noise_mean_of_norms_squared, noise_global_norm_as_g_square, noise_clipped_at_zero,
            noise_absolute_value],
    "3.9": [eff_without_ring_fraction, eff_inverted, eff_weak_scaling, eff_without_alpha,
            eff_speedup],
    "3.11": [sampler_no_padding, sampler_blocks, sampler_ignores_epoch, sampler_array_split],
    "3.10": [ddp_time_backward_order_buckets, ddp_time_no_overlap, ddp_time_no_queue, ddp_time_first_gradient, ddp_time_no_alpha,
             ddp_time_no_fraction],
}

# The words each mistake's hint must contain: it names what went wrong, not just "wrong".
HINT_WORDS = {
    ddp_time_backward_order_buckets: "filled in the wrong order",
    sampler_no_padding: "Pad the permutation",
    sampler_blocks: "every world_size-th index",
    sampler_ignores_epoch: "Every epoch gets the same order",
    sampler_array_split: "np.array_split",
    ddp_time_no_overlap: "the step without overlap",
    ddp_time_no_queue: "one at a time, in order",
    ddp_time_first_gradient: "*last* gradient",
    ddp_time_no_alpha: "latency term is missing",
    ddp_time_no_fraction: "not 2·n·β",
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
    lr_not_scaled: "multiplies the rate by k = batch/base_batch",
    lr_warmup_from_zero: "ramps up from 0",
    lr_warmup_as_section_7: "ramps up from 0",
    lr_warmup_one_step_early: "one step early",
    lr_warmup_one_step_late: "one step late",
    lr_sqrt_scaling: "square-root scaling",
    lr_floor_ratio: "floor division",
    lr_divides_by_zero: "With warmup_steps = 0 there is no warm-up",
    noise_rank0_only: "only rank 0",
    noise_divides_by_global_norm: "Divide by the unbiased |G|²",
    noise_swapped_batches: "b and B are swapped",
    noise_mean_of_norms_squared: "Average the squared norms",
    noise_global_norm_as_g_square: "still holds the noise tr Σ/B",
    noise_clipped_at_zero: "clipping it (max with 0)",
    noise_absolute_value: "clipping it (max with 0) or taking its absolute value",
    eff_without_ring_fraction: "2(p − 1)/p · nbytes · β",
    eff_inverted: "upside down",
    eff_weak_scaling: "weak-scaling efficiency",
    eff_without_alpha: "The α term is missing",
    eff_speedup: "That is the speed-up",
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


# 3.7: interpolation between the two ends of the ramp, np.interp clamping beyond them.
def lr_by_interpolation(step, base_lr, base_batch, batch, warmup_steps):
    target = base_lr * batch / base_batch
    if warmup_steps == 0:
        return target
    return float(np.interp(step, [0, warmup_steps], [base_lr, target]))


# 3.7: a constant increment per step during the warm-up, as Goyal et al. describe it.
def lr_by_increments(step, base_lr, base_batch, batch, warmup_steps):
    target = base_lr * batch / base_batch
    if step >= warmup_steps:
        return target
    return base_lr + step * (target - base_lr) / warmup_steps


# 3.8: the two equations E|G_n|² = |G|² + tr Σ/n solved as a linear system.
def noise_by_linear_solve(local_sq_norms, global_sq_norm, local_batch, global_batch):
    equations = np.array([[1.0, 1.0 / local_batch], [1.0, 1.0 / global_batch]])
    g_square, trace = np.linalg.solve(equations, [np.mean(local_sq_norms), global_sq_norm])
    return trace / g_square, g_square, trace


# 3.9: the all-reduce from the library's closed-form cost.
def eff_from_library_cost(p, t_compute, nbytes, alpha, beta):
    from dsml.collectives import cost
    return t_compute / (p * (t_compute / p + cost("allreduce", "ring", p, nbytes, alpha, beta)))


# 3.9: Amdahl's form: t_compute / (t_compute + p · all-reduce time).
def eff_amdahl_form(p, t_compute, nbytes, alpha, beta):
    return 1.0 / (1.0 + p * _ring(p, nbytes, alpha, beta) / t_compute)


# 3.10: event by event with the library's closed-form cost, buckets from a running total.
def ddp_time_with_library_cost(gradients, bucket_cap, p, alpha, beta, forward_seconds):
    from dsml.collectives import cost
    t, comm_end, bucket = forward_seconds, forward_seconds, 0
    for i, (_, nbytes, seconds) in enumerate(gradients):
        t += seconds
        bucket += nbytes
        if bucket >= bucket_cap or i == len(gradients) - 1:
            comm_end = max(t, comm_end) + cost("allreduce", "ring", p, bucket, alpha, beta)
            bucket = 0
    return max(t, comm_end)


# 3.11: built with a loop over positions and the modulo of the permutation's length.
def sampler_by_loop(n, world_size, rank, epoch, seed):
    order = np.random.default_rng(seed + epoch).permutation(n)
    total = -(-n // world_size) * world_size
    return np.array([order[k % n] for k in range(rank, total, world_size)], dtype=np.int64)


RIGHT = {
    "3.1": [linear_backward_einsum],
    "3.2": [grad_via_logsumexp],
    "3.4": [lars_by_hand],
    "3.5": [accumulate_in_place],
    "3.6": [dp_library_step, dp_recursive_doubling],
    "3.7": [lr_by_interpolation, lr_by_increments],
    "3.8": [noise_by_linear_solve],
    "3.9": [eff_from_library_cost, eff_amdahl_form],
    "3.10": [ddp_time_with_library_cost],
    "3.11": [sampler_by_loop],
}

RANK_PROGRAMS = ["3.6"]   # the exercises whose answer is a rank program


# --- the contract every week keeps -------------------------------------------------------------

globals().update(contract.contract_tests(
    3, 11, solution, WRONG, not_attempted_id="3.4", right=RIGHT, hint_words=HINT_WORDS,
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


def test_warmup_cases_cover_the_awkward_ones():
    from dsml.exercises.week3 import WARMUP_CASES
    assert any(batch < base for _, base, batch, _ in WARMUP_CASES)          # scaling down
    assert any(w == 0 for *_, w in WARMUP_CASES)                            # no warm-up
    assert any(batch % base for _, base, batch, _ in WARMUP_CASES)          # ratio not integer
    assert any(batch == base for _, base, batch, _ in WARMUP_CASES)         # nothing to scale


def test_warmup_steps_tried_straddle_the_end_of_the_ramp():
    from dsml.exercises.week3 import _warmup_steps_to_try
    assert {0, 9, 10, 11, 37} <= set(_warmup_steps_to_try(10))
    assert _warmup_steps_to_try(0)[0] == 0 and all(s >= 0 for s in _warmup_steps_to_try(0))


def test_scaling_down_is_the_same_line():
    # batch < base_batch: the "warm-up" falls from base_lr to the smaller target.
    rates = [solution.scaled_lr(s, 0.4, 512, 128, 8) for s in range(10)]
    assert rates[0] == 0.4 and math.isclose(rates[8], 0.1) and rates[9] == rates[8]
    assert all(a > b for a, b in zip(rates[:8], rates[1:9]))


def test_noise_cases_agree_with_the_formula_and_are_positive():
    # The checker's truth is gradient_noise_scale fed the ranks' batches: it must be the
    # formula on the mean local norm, with unequal local norms (or rank 0 alone would pass).
    from dsml.exercises.week3 import noise_cases
    for p, b, local, global_, truth in noise_cases():
        assert len(local) == p and len(set(local)) == p
        expected = solution.noise_scale_from_dp(local, global_, b, p * b)
        assert np.allclose(truth, expected, rtol=1e-12, atol=0.0)
        assert all(v > 0 for v in truth)


def test_noise_statistics_hold_for_the_reference_and_not_for_a_biased_estimator():
    from dsml.exercises.week3 import NOISE_SYNTHETIC, NOISE_TOLERANCE, noise_statistics
    truth = np.array([NOISE_SYNTHETIC["g_square"], NOISE_SYNTHETIC["trace_sigma"]])
    means, _ = noise_statistics(solution.noise_scale_from_dp)
    assert np.all(np.abs(means - truth) < NOISE_TOLERANCE / 2 * truth)
    means, _ = noise_statistics(noise_mean_of_norms_squared)
    assert abs(means[1] - truth[1]) > 1.5 * NOISE_TOLERANCE * truth[1]


def test_about_a_third_of_the_synthetic_estimates_of_g_square_are_negative():
    # So that clipping at 0 or taking the absolute value shows as a bias the checker sees.
    from dsml.exercises.week3 import NOISE_SYNTHETIC, NOISE_TOLERANCE, _noise_trials
    means, negative, _ = _noise_trials(solution.noise_scale_from_dp)
    assert 0.2 < negative < 0.4, negative
    for wrong in (noise_clipped_at_zero, noise_absolute_value):
        biased, never, _ = _noise_trials(wrong)
        assert never == 0 and biased[0] > (1 + 2 * NOISE_TOLERANCE) * NOISE_SYNTHETIC["g_square"]


def test_noise_statistics_catch_what_the_exact_cases_miss():
    # Right on the checker's library cases, biased on the synthetic steps (b = 4, B = 16):
    # only the statistical half of the checker can see it.
    def special_cased(local_sq_norms, global_sq_norm, local_batch, global_batch):
        if (local_batch, global_batch) == (4, 16):
            return noise_mean_of_norms_squared(local_sq_norms, global_sq_norm, 4, 16)
        return solution.noise_scale_from_dp(local_sq_norms, global_sq_norm, local_batch,
                                            global_batch)
    message = grade("3.8", special_cased).message
    assert "the estimator is biased" in message and "synthetic steps" in message, message


def test_strong_cases_are_exact_in_the_simulator():
    # nbytes divisible by p, so the ring's blocks are equal and the simulated step is the
    # closed form (dsml.collectives.cost) to round-off; one latency-bound, one bandwidth-bound.
    from dsml.collectives import cost
    from dsml.exercises.week3 import STRONG_CASES, strong_step_times
    assert {1, 2, 3, 8, 64} <= {p for p, *_ in STRONG_CASES}
    for p, t_compute, nbytes, alpha, beta in STRONG_CASES:
        assert nbytes % p == 0
        t1, tp = strong_step_times(p, t_compute, nbytes, alpha, beta)
        assert t1 == t_compute
        assert math.isclose(tp, t_compute / p + cost("allreduce", "ring", p, nbytes, alpha, beta),
                            rel_tol=1e-12)
    terms = [(2 * (p - 1) * a, 2 * (p - 1) / p * n * b) for p, _, n, a, b in STRONG_CASES if p > 1]
    assert any(lat > 100 * bw for lat, bw in terms) and any(bw > 100 * lat for lat, bw in terms)


def test_examples_of_exercises_7_to_9_hold():
    rates = [solution.scaled_lr(s, 0.1, 256, 1024, 4) for s in range(6)]
    assert np.allclose(rates, [0.1, 0.175, 0.25, 0.325, 0.4, 0.4], rtol=1e-12)
    assert np.allclose([solution.scaled_lr(s, 0.1, 256, 128, 4) for s in (0, 1, 2, 3, 4, 9)],
                       [0.1, 0.0875, 0.075, 0.0625, 0.05, 0.05], rtol=1e-12)
    assert solution.scaled_lr(0, 0.1, 256, 1024, 0) == 0.4
    assert np.allclose(solution.noise_scale_from_dp([5.0, 3.0], 2.5, 16, 32), (48.0, 1.0, 48.0),
                       rtol=1e-12)
    assert math.isclose(solution.strong_efficiency(4, 0.1, 10 ** 8, 1e-5, 1e-10), 0.1 / 0.16024,
                        rel_tol=1e-12)
    assert round(solution.strong_efficiency(4, 0.1, 10 ** 8, 1e-5, 1e-10), 3) == 0.624
    assert solution.strong_efficiency(1, 0.1, 10 ** 8, 1e-5, 1e-10) == 1.0


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


# --- exercise 3.2 must be built: the library's own loss is refused ---------------------------

def softmax_grad_from_library(logits, y):
    from dsml.train import softmax_cross_entropy
    return softmax_cross_entropy(logits, y)[1]


def softmax_grad_from_models(logits, y):
    import dsml.train.models
    return dsml.train.models.softmax_cross_entropy(logits, y)[1]


@pytest.mark.parametrize("answer", [softmax_grad_from_library, softmax_grad_from_models])
def test_an_answer_that_calls_the_library_loss_is_refused(answer):
    import dsml.train
    import dsml.train.models
    real = dsml.train.models.softmax_cross_entropy
    result = grade("3.2", answer)
    assert result.status == "failed"
    assert result.message.startswith("exercise 3.2 asks you to build this yourself: your code "
                                     "called dsml.train.models.softmax_cross_entropy")
    assert dsml.train.softmax_cross_entropy is real is dsml.train.models.softmax_cross_entropy
    assert grade("3.2", solution.softmax_cross_entropy_grad).passed   # the checker's own use


def sampler_from_library(n, world_size, rank, epoch, seed):
    from dsml.data_parallel import distributed_indices
    return distributed_indices(n, world_size, rank, epoch, seed)


def test_an_answer_that_calls_the_library_sampler_is_refused():
    result = grade("3.11", sampler_from_library)
    assert result.status == "failed"
    assert result.message.startswith("exercise 3.11 asks you to build this yourself: your code "
                                     "called dsml.data_parallel.distributed_indices")


def test_fresh_cases_3_2_keep_the_contract_for_every_base():
    contract.fresh_cases_keep_the_contract("3.2", solution.softmax_cross_entropy_grad, WRONG,
                                           RIGHT)


def test_a_fresh_case_of_3_2_says_how_to_make_its_inputs():
    import re

    def right_on_the_fixed_shapes_only(logits, y):
        got = solution.softmax_cross_entropy_grad(logits, y)
        return got if logits.shape in [(4, 3), (1, 5), (6, 4), (3, 4)] else 2 * got

    message = grade("3.2", right_on_the_fixed_shapes_only).message
    found = re.search(r"default_rng\((\d+)\); logits = (\S+) \* rng.standard_normal\(\((\d+), "
                      r"(\d+)\)\)", message)
    assert found, message
    seed, scale, batch, classes = found.groups()
    rng = np.random.default_rng(int(seed))
    logits = float(scale) * rng.standard_normal((int(batch), int(classes)))
    y = rng.integers(0, int(classes), size=int(batch))
    assert f"y={y.tolist()}" in message                  # the same inputs, made again
    assert f"{np.max(np.abs(logits)):.3g}" in message


def adam_step_from_library(w, g, m, v, t, lr, beta1, beta2, eps):
    from dsml.train.optim import Adam
    optimizer = Adam(lr, betas=(beta1, beta2), eps=eps)
    optimizer.state["w"] = (m.copy(), v.copy(), t - 1)
    params = {"w": w.copy()}
    optimizer.step(params, {"w": g.copy()})
    new_m, new_v, _ = optimizer.state["w"]
    return params["w"], new_m, new_v


def lars_from_library(w, g, trust_coefficient, weight_decay):
    from dsml.train.optim import LARS
    optimizer = LARS(1.0, weight_decay=weight_decay, trust_coefficient=trust_coefficient)
    optimizer.update("w", w.copy(), g.copy())
    return optimizer.trust["w"]


@pytest.mark.parametrize("exercise_id, answer, method", [
    ("3.3", adam_step_from_library, "Adam.update"), ("3.4", lars_from_library, "LARS.update")])
def test_an_answer_that_runs_the_library_optimizer_is_refused(exercise_id, answer, method):
    from dsml.train import optim
    before = (optim.Adam.update, optim.LARS.update, optim.LAMB.update)
    result = grade(exercise_id, answer)
    assert result.status == "failed"
    assert result.message.startswith(f"exercise {exercise_id} asks you to build this yourself: "
                                     f"your code called dsml.train.optim.{method}")
    assert (optim.Adam.update, optim.LARS.update, optim.LAMB.update) == before
    assert "update" not in vars(optim.LAMB) or optim.LAMB.update is before[2]
