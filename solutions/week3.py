"""Reference solutions of week 3's exercises (data parallelism).

Each function has the name of the notebook stub it solves; `check("3.k", f)` passes for each.
Arrays are float64; gradients have the shape of what they are the gradient of. The rank
program (3.6) is a generator, run with `dsml.run(program, p, ...)`. Exercises 3.7–3.10 are
formulas: a learning-rate schedule, the noise-scale estimators, a scaling efficiency, and the
iteration time of DDP's buckets.
"""
from __future__ import annotations

import numpy as np

from dsml.collectives import allreduce
from dsml.data_parallel import assign_buckets, flatten, shard_bounds, unflatten
from dsml.train import loss_and_grads


def linear_backward(X, W, dZ):
    """Exercise 3.1: (dW, db, dX) for Z = XW + b given dZ = dL/dZ.

    X (B, n_in), W (n_in, n_out), dZ (B, n_out): dW = Xᵀ dZ (n_in, n_out), db = Σ_rows dZ
    (n_out,), dX = dZ Wᵀ (B, n_in). dZ already carries the loss's 1/B, so nothing is divided.
    """
    return X.T @ dZ, dZ.sum(axis=0), dZ @ W.T


def softmax_cross_entropy_grad(logits, y):
    """Exercise 3.2: dL/dlogits of the mean cross-entropy, (softmax(logits) − onehot(y)) / B.

    The row maximum is subtracted before exp, so logits in the hundreds do not overflow.
    """
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted)
    probs /= probs.sum(axis=1, keepdims=True)
    batch = len(y)
    probs[np.arange(batch), y] -= 1.0
    return probs / batch


def adam_step(w, g, m, v, t, lr, beta1, beta2, eps):
    """Exercise 3.3: (w, m, v) after Adam's step t (t = 1 for the first step).

    m ← β₁m + (1 − β₁)g, v ← β₂v + (1 − β₂)g², m̂ = m/(1 − β₁ᵗ), v̂ = v/(1 − β₂ᵗ),
    w ← w − lr·m̂/(√v̂ + eps). Returns the uncorrected moments, as the optimizer stores them.
    """
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat = m / (1 - beta1 ** t)
    v_hat = v / (1 - beta2 ** t)
    return w - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def lars_local_lr(w, g, trust_coefficient, weight_decay):
    """Exercise 3.4: LARS's local learning rate τ‖w‖/(‖g‖ + λ‖w‖) for one tensor, and 1 when
    ‖w‖ or ‖g‖ is 0 (You, Gitman & Ginsburg 2017)."""
    w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
    if w_norm == 0 or g_norm == 0:
        return 1.0
    return trust_coefficient * w_norm / (g_norm + weight_decay * w_norm)


def accumulate_micro_grads(micro_grads, sizes):
    """Exercise 3.5: the batch's mean gradient Σ nⱼ·gⱼ / Σ nⱼ from the micro-batches' mean
    gradients gⱼ (dicts of named arrays) and their sizes nⱼ."""
    total = sum(sizes)
    return {name: sum(n * grads[name] for n, grads in zip(sizes, micro_grads)) / total
            for name in micro_grads[0]}


def data_parallel_step(comm, X, y, batch, model, optimizer):
    """Exercise 3.6: one synchronous data-parallel step (a rank program); returns the batch
    loss.

    Rank r takes rows shard_bounds(B, p, r) of the global `batch`, computes its shard's
    gradient *sums* (zeros for an empty shard) and loss sum, all-reduces them as one flat
    vector, divides by B and steps its replica: every rank takes the single-process step.
    """
    start, stop = shard_bounds(len(batch), comm.size, comm.rank)
    mine = batch[start:stop]
    if len(mine):
        loss, grads = loss_and_grads(model, X[mine], y[mine])
        sums = {name: g * len(mine) for name, g in grads.items()}
        loss_sum = loss * len(mine)
    else:
        sums = {name: np.zeros_like(w) for name, w in model.params.items()
                if name not in model.frozen}
        loss_sum = 0.0
    vector, layout = flatten(sums)
    total = yield from allreduce(comm, np.append(vector, loss_sum))
    optimizer.step(model.params, unflatten(total[:-1] / len(batch), layout))
    return float(total[-1] / len(batch))


def scaled_lr(step, base_lr, base_batch, batch, warmup_steps):
    """Exercise 3.7: the learning rate of optimizer step `step` (from 0) under the linear scaling
    rule with Goyal et al.'s gradual warm-up: base_lr at step 0, then a straight line to the
    target base_lr·batch/base_batch, reached at step warmup_steps and kept. The same line when
    batch < base_batch (the rate then falls); no warm-up when warmup_steps is 0."""
    target = base_lr * batch / base_batch
    if warmup_steps == 0:
        return target
    return base_lr + (target - base_lr) * min(1.0, step / warmup_steps)


def noise_scale_from_dp(local_sq_norms, global_sq_norm, local_batch, global_batch):
    """Exercise 3.8: (b_noise, |G|², tr Σ) from one data-parallel step (McCandlish et al. 2018,
    appendix A). The ranks' local mean gradients give |G_b|² (their squared norms, averaged),
    the all-reduced mean gives |G_B|²; E|G_n|² = |G|² + tr Σ/n at both sizes, solved for the
    two unknowns, as dsml.data_parallel.gradient_noise_scale does."""
    b, B = local_batch, global_batch
    g_small = sum(local_sq_norms) / len(local_sq_norms)
    g_square = (B * global_sq_norm - b * g_small) / (B - b)
    trace = (g_small - global_sq_norm) / (1 / b - 1 / B)
    return trace / g_square, g_square, trace


def strong_efficiency(p, t_compute, nbytes, alpha, beta):
    """Exercise 3.9: T_1/(p·T_p) for a data-parallel step without overlap: T_p = t_compute/p +
    2(p − 1)α + 2(p − 1)/p · nbytes · β (the ring all-reduce, nothing on one rank), T_1 =
    t_compute."""
    allreduce_time = 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta
    return t_compute / (p * (t_compute / p + allreduce_time))


def ddp_iteration_time(gradients, bucket_cap, p, alpha, beta, forward_seconds):
    """Exercise 3.10: one DDP step's time. Backward produces `gradients` ((name, nbytes,
    seconds), in order) after the forward pass; bucket k's ring all-reduce starts at max(when
    its last gradient is out, when bucket k − 1 ends) and takes 2(p − 1)α + 2(p − 1)/p · n_k β;
    the step ends when backward and the last bucket have."""
    nbytes, ready, clock = {}, {}, forward_seconds
    for name, size, seconds in gradients:
        clock += seconds
        nbytes[name], ready[name] = size, clock
    end = forward_seconds
    for bucket in assign_buckets([(name, nbytes[name]) for name, _, _ in reversed(gradients)],
                                 bucket_cap):
        n = sum(nbytes[name] for name in bucket)
        end = max(max(ready[name] for name in bucket), end) + \
            2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta
    return max(end, clock)


def sampler_indices(n, world_size, rank, epoch, seed):
    """Exercise 3.11: this rank's indices for one epoch, as DistributedSampler picks them.

    One permutation of range(n) from np.random.default_rng(seed + epoch), the same on every
    rank; repeated from its start up to a multiple of world_size; then every world_size-th index
    from `rank`. Every rank gets ⌈n/world_size⌉ indices, and together they cover range(n).
    """
    order = np.random.default_rng(seed + epoch).permutation(n)
    total = -(-n // world_size) * world_size
    padded = np.concatenate([order] * (total // n + 1))[:total]
    return padded[rank::world_size]
