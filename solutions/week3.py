"""Reference solutions of week 3's exercises (data parallelism).

Each function has the name of the notebook stub it solves; `check("3.k", f)` passes for each.
Arrays are float64; gradients have the shape of what they are the gradient of. The rank
program (3.6) is a generator, run with `dsml.run(program, p, ...)`.
"""
from __future__ import annotations

import numpy as np

from dsml.collectives import allreduce
from dsml.data_parallel import flatten, shard_bounds, unflatten
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
