"""Plumbing (hand-written): the checkers of week 3's exercises (data parallelism).

Each checker calls the learner's function on inputs different from the worked example in
the notebook and raises `Wrong` with a hint that says what was tried, what was expected,
what came back and what to reconsider. The truth is measured with the library: backward
passes against `dsml.train`'s MLP and central differences, optimizer steps against
`dsml.train.optim`'s Adam and LARS run on the same state, accumulated gradients against one
pass over the whole batch, the data-parallel rank program on the simulator against
`train_single` (its values) and `data_parallel_sgd` (its simulated time), the noise-scale
estimates against `dsml.data_parallel.gradient_noise_scale` fed the very batches the ranks used
(and, for bias, against the known |G|² and tr Σ of synthetic gradients averaged over many
steps), and strong-scaling efficiency against a data-parallel step timed on the simulator with
a ring all-reduce; DDP's iteration time against one DDP step (`ddp_allreduce`, buckets on a
second activity) timed on the simulator; the distributed sampler against
`dsml.data_parallel.distributed_indices`. The learning-rate schedule has no library counterpart: its checker holds
Goyal et al.'s formula, base_lr + (target − base_lr)·min(1, step/warmup_steps).

This module imports from the lower layers only (`dsml.comm`, `dsml.net`, `dsml.collectives`,
`dsml.train`, `dsml.data_parallel`), never the top-level `dsml` package, which sits above it.
"""
from __future__ import annotations

import copy
import math

import numpy as np

from dsml.collectives import allreduce
from dsml.comm.api import Comm, RankError, SizeOnly
from dsml.comm.run import run
from dsml.data_parallel import (assign_buckets, data_parallel_sgd, ddp_allreduce,
                                distributed_indices, gradient_noise_scale, shard_bounds,
                                train_single)
from dsml.exercises import (Wrong, _not_implemented, as_float, checker, expect_close, fresh_rng,
                            expect_rank_program)
from dsml.net.alphabeta import AlphaBeta
from dsml.sim import DeadlockError
from dsml.train.models import MLP, loss_and_grads, softmax_cross_entropy
from dsml.train.optim import LARS, Adam, make_optimizer

# Gradients computed two ways (different summation orders) agree to round-off.
_RTOL, _ATOL = 1e-9, 1e-12
# "No slower than the library's step": simulated times are sums of the same floating-point
# terms, so an equally fast program can differ in the last bits only.
_TIME_RTOL = 1e-9


def _as_array(value, what: str, shape: tuple) -> np.ndarray:
    """`value` as a float array of `shape`, or Wrong saying what came back instead."""
    if value is None:
        raise Wrong(f"{what} is None; did you forget a `return`?")
    array = np.asarray(value, dtype=float) if isinstance(value, (np.ndarray, list, float,
                                                                 int)) else None
    if array is None:
        raise Wrong(f"{what} is a {type(value).__name__}; expected a NumPy array of shape "
                    f"{shape}")
    if array.shape != shape:
        raise Wrong(f"{what} has shape {array.shape}, expected {shape}: a gradient has the "
                    f"shape of the thing it is the gradient of.")
    return array


def _close(got, expected) -> bool:
    return bool(np.allclose(got, expected, rtol=_RTOL, atol=_ATOL))


def _unpack(result, names: tuple, what: str) -> tuple:
    """A returned tuple of len(names) items, or Wrong naming what came back."""
    if not isinstance(result, (tuple, list)) or len(result) != len(names):
        kind = type(result).__name__
        size = f" of {len(result)} items" if isinstance(result, (tuple, list)) else ""
        raise Wrong(f"{what} returned a {kind}{size}; return a tuple ({', '.join(names)}).")
    return tuple(result)


# --- 3.1 ----------------------------------------------------------------------------------

# (batch, inputs, outputs): shapes all different, so a transposed product shows as a shape.
LINEAR_CASES = [(5, 3, 4), (1, 6, 2), (7, 2, 3)]


def _linear_truth(X, W, b, dZ):
    """(dW, db, dX) of L = Σ dZ ⊙ (XW + b): dW and db from dsml.train's MLP (one linear layer,
    fed dZ as dL/d(output)); dX by central differences, exact for a function linear in X."""
    model = MLP([W.shape[0], W.shape[1]], activation=None)
    model.params["layer0.weight"][...] = W
    model.params["layer0.bias"][...] = b
    model.forward(X)
    grads = model.backward(dZ)
    dX = np.zeros_like(X)
    eps = 0.5
    for index in np.ndindex(X.shape):
        up, down = X.copy(), X.copy()
        up[index] += eps
        down[index] -= eps
        dX[index] = (np.sum(dZ * (up @ W + b)) - np.sum(dZ * (down @ W + b))) / (2 * eps)
    return grads["layer0.weight"], grads["layer0.bias"], dX


@checker("3.1", "backward of one linear layer")
def check_linear_backward(linear_backward):
    rng = np.random.default_rng(3001)
    for batch, n_in, n_out in LINEAR_CASES:
        X = rng.standard_normal((batch, n_in))
        W = rng.standard_normal((n_in, n_out))
        b = rng.standard_normal(n_out)
        dZ = rng.standard_normal((batch, n_out))
        dW, db, dX = _linear_truth(X, W, b, dZ)
        call = (f"linear_backward(X of shape {X.shape}, W of shape {W.shape}, dZ of shape "
                f"{dZ.shape})")
        got = _unpack(linear_backward(X.copy(), W.copy(), dZ.copy()), ("dW", "db", "dX"), call)
        got_dW = _as_array(got[0], f"{call}: dW", W.shape)
        got_db = _as_array(got[1], f"{call}: db", b.shape)
        got_dX = _as_array(got[2], f"{call}: dX", X.shape)
        if not _close(got_dW, dW):
            scaled = " — exactly the right one divided by the batch size" \
                if batch > 1 and _close(got_dW * batch, dW) else ""
            raise Wrong(f"{call}: dW is off by up to {np.max(np.abs(got_dW - dW)):.3g}"
                        f"{scaled}. Z = XW + b, so dW = Xᵀ dZ: a sum over the batch's rows. "
                        f"dZ is already dL/dZ of the whole loss (its 1/B, if any, is inside), "
                        f"so nothing is divided here.")
        if not _close(got_db, db):
            hint = ""
            if batch > 1 and _close(got_db * batch, db):
                hint = (" — the mean over the batch, where the sum is right: b is added to "
                        "every row, so every row's dZ contributes to db in full")
            raise Wrong(f"{call}: db is off by up to {np.max(np.abs(got_db - db)):.3g}{hint}. "
                        f"Expected db = the column sums of dZ, {np.round(db, 4).tolist()}.")
        if not _close(got_dX, dX):
            raise Wrong(f"{call}: dX is off by up to {np.max(np.abs(got_dX - dX)):.3g}. Each "
                        f"input X[i, j] reaches every output of its row through W[j, :], so "
                        f"dX = dZ Wᵀ. (An activation's derivative belongs to the layer that "
                        f"applies the activation, not to this linear one.)")
    return "dW = Xᵀ dZ, db = Σ rows of dZ, dX = dZ Wᵀ match the MLP's backward"


# --- 3.2 ----------------------------------------------------------------------------------

# (batch, classes, logit scale): the last case has logits in the hundreds, where exp overflows
# unless the row maximum is subtracted first.
SOFTMAX_CASES = [(4, 3, 2.0), (1, 5, 1.0), (6, 4, 3.0), (3, 4, 800.0)]


@checker("3.2", "softmax cross-entropy gradient",
         builds=("dsml.train.models.softmax_cross_entropy",))
def check_softmax_cross_entropy_grad(softmax_cross_entropy_grad):
    rng = np.random.default_rng(3002)
    fresh = fresh_rng()       # two more cases, drawn afresh for every check
    cases = [(case, None) for case in SOFTMAX_CASES]
    cases += [((int(fresh.integers(1, 9)), int(fresh.integers(2, 11)),
                float(fresh.choice([0.5, 2.0, 5.0, 300.0]))), int(fresh.integers(2 ** 31)))
              for _ in range(2)]
    for (batch, classes, scale), seed in cases:
        draw = rng if seed is None else np.random.default_rng(seed)
        logits = scale * draw.standard_normal((batch, classes))
        y = draw.integers(0, classes, size=batch)
        _, expected = softmax_cross_entropy(logits, y)
        call = (f"softmax_cross_entropy_grad(logits of shape {logits.shape} with entries up to "
                f"{np.max(np.abs(logits)):.3g}, y={y.tolist()})")
        if seed is not None:   # a fresh case: say how to make its inputs again
            call += (f" (a case drawn afresh for this check: rng = np.random.default_rng({seed}); "
                     f"logits = {scale:g} * rng.standard_normal(({batch}, {classes})); "
                     f"y = rng.integers(0, {classes}, size={batch}))")
        got = _as_array(softmax_cross_entropy_grad(logits.copy(), y.copy()), call,
                        logits.shape)
        if _close(got, expected):
            continue
        if not np.all(np.isfinite(got)):
            raise Wrong(f"{call} returned non-finite values (nan or inf): exp of a logit in the "
                        f"hundreds overflows. Subtract each row's maximum before exp — "
                        f"softmax does not change when a constant is added to a row.")
        onehot = np.zeros_like(expected)
        onehot[np.arange(batch), y] = 1.0
        if batch > 1 and _close(got, expected * batch):
            raise Wrong(f"{call} returned {batch} times the expected gradient: that is the "
                        f"gradient of the *sum* of the per-example losses. The loss is the mean "
                        f"over the batch, so divide by B = {batch}.")
        if _close(got, expected + onehot / batch) or _close(got, expected * batch + onehot):
            raise Wrong(f"{call} returned the softmax probabilities without subtracting the "
                        f"one-hot labels: the label's own logit gets an extra term from "
                        f"−log softmax(z)_y, and it is what pushes the right class up.")
        worst = int(np.argmax(np.max(np.abs(got - expected), axis=1)))
        raise Wrong(f"{call}: the gradient is off by up to {np.max(np.abs(got - expected)):.3g}, "
                    f"most in row {worst}. Differentiate one row's −log softmax(z)_y by each "
                    f"logit: what does the label's entry get that the others do not, and what "
                    f"does taking the mean over the batch add?")
    return "(softmax − onehot)/B, and finite for logits in the hundreds"


# --- 3.3 ----------------------------------------------------------------------------------

# (shape, t, lr, beta1, beta2, eps); t ≥ 2 so that every off-by-one in t shows.
ADAM_CASES = [((3, 2), 2, 0.01, 0.9, 0.999, 1e-8), ((4,), 5, 0.1, 0.8, 0.99, 1e-6),
              ((2, 3), 3, 0.05, 0.5, 0.9, 1e-3)]


def adam_reference(w, g, m, v, t, lr, beta1, beta2, eps):
    """(w, m, v) after step t of dsml.train's Adam, started from the state (m, v, t − 1)."""
    optimizer = Adam(lr, betas=(beta1, beta2), eps=eps)
    optimizer.state["w"] = (m.copy(), v.copy(), t - 1)
    params = {"w": w.copy()}
    optimizer.step(params, {"w": g.copy()})
    new_m, new_v, _ = optimizer.state["w"]
    return params["w"], new_m, new_v


@checker("3.3", "one Adam step", builds=("dsml.train.optim.Adam.update",))
def check_adam_step(adam_step):
    rng = np.random.default_rng(3003)
    for shape, t, lr, beta1, beta2, eps in ADAM_CASES:
        w, g, m = (rng.standard_normal(shape) for _ in range(3))
        v = rng.random(shape)
        expected = adam_reference(w, g, m, v, t, lr, beta1, beta2, eps)
        call = (f"adam_step(w, g, m, v, t={t}, lr={lr}, beta1={beta1}, beta2={beta2}, "
                f"eps={eps}) on arrays of shape {shape}")
        got = _unpack(adam_step(w.copy(), g.copy(), m.copy(), v.copy(), t, lr, beta1, beta2,
                                eps), ("w", "m", "v"), call)
        got_w, got_m, got_v = (_as_array(x, f"{call}: {name}", shape)
                               for x, name in zip(got, ("w", "m", "v")))
        if not _close(got_m, expected[1]) or not _close(got_v, expected[2]):
            raise Wrong(f"{call}: the new moments are wrong. m ← β₁m + (1 − β₁)g and "
                        f"v ← β₂v + (1 − β₂)g², elementwise; return them before the bias "
                        f"correction (the corrected ones are only used for the step).")
        if _close(got_w, expected[0]):
            continue
        m_new, v_new = expected[1], expected[2]
        uncorrected = w - lr * m_new / (np.sqrt(v_new) + eps)
        if _close(got_w, uncorrected):
            raise Wrong(f"{call}: the step uses m and v without bias correction. Both start at "
                        f"0, so early on they are too small by factors 1 − β₁ᵗ and 1 − β₂ᵗ: "
                        f"divide by them (m̂ = m/(1 − β₁ᵗ), v̂ = v/(1 − β₂ᵗ)).")
        for shifted in (t - 1, t + 1):
            m_hat = m_new / (1 - beta1 ** shifted)
            v_hat = v_new / (1 - beta2 ** shifted)
            if _close(got_w, w - lr * m_hat / (np.sqrt(v_hat) + eps)):
                raise Wrong(f"{call}: the bias correction uses t = {shifted} where this is "
                            f"step t = {t}: the moments after step t are corrected by "
                            f"1 − β₁ᵗ and 1 − β₂ᵗ with the same t.")
        old_m_hat, old_v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
        if _close(got_w, w - lr * old_m_hat / (np.sqrt(old_v_hat) + eps)):
            raise Wrong(f"{call}: the step uses the moments from *before* this gradient. "
                        f"Update m and v with g first, then correct and step.")
        raise Wrong(f"{call}: w is off by up to {np.max(np.abs(got_w - expected[0])):.3g}. "
                    f"Expected w − lr·m̂/(√v̂ + eps) with m̂ = m/(1 − β₁ᵗ), v̂ = v/(1 − β₂ᵗ), "
                    f"eps outside the square root.")
    return "moments, bias correction and step match dsml.train's Adam"


# --- 3.4 ----------------------------------------------------------------------------------

# (name, w, g, trust_coefficient, weight_decay): ordinary tensors, then the zero-norm rules.
def _lars_cases():
    rng = np.random.default_rng(3004)
    return [("a weight matrix", rng.standard_normal((4, 3)), 0.1 * rng.standard_normal((4, 3)),
             0.001, 0.0),
            ("a weight matrix with weight decay", rng.standard_normal((3, 3)),
             rng.standard_normal((3, 3)), 0.02, 0.1),
            ("a fresh bias (all zeros)", np.zeros(5), rng.standard_normal(5), 0.001, 1e-4),
            ("a weight with a zero gradient", rng.standard_normal(4), np.zeros(4), 0.001, 0.0),
            ("a vector with weight decay", rng.standard_normal(6), 0.5 * rng.standard_normal(6),
             0.01, 0.5)]


def lars_reference(w, g, trust_coefficient, weight_decay) -> float:
    """The local learning rate dsml.train's LARS uses for this tensor."""
    optimizer = LARS(1.0, weight_decay=weight_decay, momentum=0.0,
                     trust_coefficient=trust_coefficient)
    optimizer.step({"w": w.copy()}, {"w": g.copy()})
    return optimizer.trust["w"]


@checker("3.4", "LARS local learning rate", builds=("dsml.train.optim.LARS.update",))
def check_lars_local_lr(lars_local_lr):
    for name, w, g, tau, decay in _lars_cases():
        expected = lars_reference(w, g, tau, decay)
        call = (f"lars_local_lr(w, g, trust_coefficient={tau}, weight_decay={decay}) for "
                f"{name} (‖w‖ = {np.linalg.norm(w):.4g}, ‖g‖ = {np.linalg.norm(g):.4g})")
        with np.errstate(divide="ignore", invalid="ignore"):
            got = as_float(lars_local_lr(w.copy(), g.copy(), tau, decay), call)
        if np.isclose(got, expected, rtol=1e-9, atol=0.0):
            continue
        w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
        if w_norm == 0 or g_norm == 0:
            raise Wrong(f"{call} returned {got:.6g}, expected {expected:.6g}: when either norm "
                        f"is 0 the trust ratio means nothing (a zero bias would never move, a "
                        f"zero gradient would divide by 0), so the local rate is 1.")
        if np.isclose(got, tau * w_norm / g_norm, rtol=1e-9):
            raise Wrong(f"{call} returned {got:.6g} = τ‖w‖/‖g‖, expected {expected:.6g}: the "
                        f"update is g + λw, so the denominator is ‖g‖ + λ‖w‖ — weight decay "
                        f"belongs in it.")
        if np.isclose(got, 1.0 / expected, rtol=1e-9) or \
                np.isclose(got, tau * (g_norm + decay * w_norm) / w_norm, rtol=1e-9):
            raise Wrong(f"{call} returned {got:.6g}, expected {expected:.6g}: the ratio is "
                        f"upside down. A layer whose gradient is large relative to its "
                        f"weights should take a *smaller* step: τ‖w‖/(‖g‖ + λ‖w‖).")
        expect_close(got, expected, call, "Expected τ‖w‖/(‖g‖ + λ‖w‖), with norms over the "
                     "whole tensor (np.linalg.norm of the array), and 1 when either norm is 0.")
    return "τ‖w‖/(‖g‖ + λ‖w‖), and 1 when a norm is 0, as dsml.train's LARS"


# --- 3.5 ----------------------------------------------------------------------------------

# (batch size, micro-batch sizes): unequal pieces, equal pieces, one piece.
ACCUMULATION_CASES = [(23, [8, 8, 7]), (30, [10, 10, 10]), (9, [9]), (17, [1, 12, 4])]


@checker("3.5", "accumulating micro-batch gradients")
def check_accumulate_micro_grads(accumulate_micro_grads):
    rng = np.random.default_rng(3005)
    X = rng.standard_normal((40, 5))
    y = rng.integers(0, 3, size=40)
    model = MLP([5, 6, 3], activation="tanh", seed=3)
    for batch_size, sizes in ACCUMULATION_CASES:
        batch = rng.permutation(40)[:batch_size]
        _, expected = loss_and_grads(model, X[batch], y[batch])
        micro, start = [], 0
        for size in sizes:
            part = batch[start:start + size]
            micro.append({k: g.copy() for k, g in loss_and_grads(model, X[part], y[part])[1]
                          .items()})
            start += size
        call = f"accumulate_micro_grads(micro_grads of {len(sizes)} micro-batches, sizes={sizes})"
        got = accumulate_micro_grads(micro, list(sizes))
        if got is None:
            raise Wrong(f"{call} returned None; did you forget a `return`?")
        if not isinstance(got, dict) or set(got) != set(expected):
            keys = sorted(got) if isinstance(got, dict) else type(got).__name__
            raise Wrong(f"{call} returned {keys}; return a dict with the same names as the "
                        f"micro-batch gradients: {sorted(expected)}.")
        wrong = [k for k in expected
                 if not _close(_as_array(got[k], f"{call}: {k}", expected[k].shape),
                               expected[k])]
        if not wrong:
            continue
        k = wrong[0]
        plain_sum = sum(m[k] for m in micro)
        plain_mean = plain_sum / len(sizes)
        weighted_sum = sum(n * m[k] for n, m in zip(sizes, micro))
        if len(sizes) > 1 and _close(got[k], plain_sum):
            raise Wrong(f"{call}: {k} is the sum of the micro-batch means, {len(sizes)} times "
                        f"too large — the same as multiplying the learning rate by "
                        f"{len(sizes)}. The batch gradient is a mean: Σ nⱼ·gⱼ / Σ nⱼ.")
        if _close(got[k], weighted_sum):
            raise Wrong(f"{call}: {k} is Σ nⱼ·gⱼ, the gradient of the *summed* loss; divide by "
                        f"the batch size Σ nⱼ = {sum(sizes)} to get the batch's mean.")
        if _close(got[k], plain_mean):
            raise Wrong(f"{call}: {k} is the plain mean of the micro-batch means, which is "
                        f"right only when the micro-batches are equal; these have sizes "
                        f"{sizes}. Weight each mean by its size: Σ nⱼ·gⱼ / Σ nⱼ.")
        raise Wrong(f"{call}: {k} is off by up to {np.max(np.abs(got[k] - expected[k])):.3g} "
                    f"from the gradient of one pass over the whole batch; expected "
                    f"Σ nⱼ·gⱼ / Σ nⱼ for every parameter.")
    return "equal to one pass over the whole batch, for equal and unequal micro-batches"


# --- 3.6 ----------------------------------------------------------------------------------

# (p, global batch size): shards of unequal sizes, empty shards (B < p), one rank.
DP_CASES = [(3, 10), (4, 6), (5, 3), (2, 8), (1, 5)]
_DP_NETWORK = AlphaBeta(alpha=2e-5, beta=1e-9)     # large α: every extra message shows


def _dp_problem(seed: int):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((30, 4))
    y = rng.integers(0, 3, size=30)
    model = MLP([4, 5, 3], activation="relu", seed=seed)
    model.frozen = {"layer0.bias"}            # a frozen parameter has no gradient to send
    return X, y, model


def _dp_replica(model):
    return copy.deepcopy(model), make_optimizer("momentum", 0.1)


def _run_step(answer, p, X, y, batch, model):
    """Run the learner's step on p simulated ranks, each with its own replica; return the
    RunResult and the replicas."""
    replicas = [_dp_replica(model) for _ in range(p)]

    def program(comm):
        replica, optimizer = replicas[comm.rank]
        return (yield from answer(comm, X, y, batch.copy(), replica, optimizer))
    return run(program, p, engine="sim", network=_DP_NETWORK, trace=False), replicas


def _library_step_time(p, X, y, batch, model) -> float:
    replicas = [_dp_replica(model) for _ in range(p)]

    def program(comm):
        replica, optimizer = replicas[comm.rank]
        losses = yield from data_parallel_sgd(comm, replica, optimizer, X, y, [batch])
        return losses[0]
    return run(program, p, engine="sim", network=_DP_NETWORK, trace=False).time


@checker("3.6", "a data-parallel step with unequal shards")
def check_data_parallel_step(data_parallel_step):
    X, y, model = _dp_problem(3006)
    probe_model, probe_optimizer = _dp_replica(model)
    expect_rank_program(
        data_parallel_step(Comm(0, 2), X, y, np.arange(4), probe_model, probe_optimizer),
        "data_parallel_step(comm, X, y, batch, model, optimizer)",
        "total = yield from allreduce(comm, vector)")
    rng = np.random.default_rng(3106)
    for p, batch_size in DP_CASES:
        batch = rng.permutation(len(X))[:batch_size]
        shards = [stop - start for start, stop in (shard_bounds(batch_size, p, r)
                                                   for r in range(p))]
        context = (f"data_parallel_step on p={p} ranks, global batch of {batch_size} examples "
                   f"(shards of {shards})")
        reference, reference_optimizer = _dp_replica(model)
        expected_loss = train_single(reference, reference_optimizer, X, y, [batch])[0]
        try:
            result, replicas = _run_step(data_parallel_step, p, X, y, batch, model)
        except DeadlockError as deadlock:
            raise Wrong(f"{context}: your rank program deadlocked "
                        f"({str(deadlock).splitlines()[0].rstrip(':')}). Every rank, even one "
                        f"with an empty shard, must take part in the all-reduce.") from None
        except RankError as failure:
            if _not_implemented(failure):
                raise
            first = str(failure).splitlines()[0].rstrip(":")
            advice = ""
            if "equal division" in first:
                advice = (" np.split insists on equal shards; cut the batch with "
                          "shard_bounds(len(batch), p, rank), as np.array_split does.")
            elif 0 in shards:
                advice = (" An empty shard (B < p) has no gradient to compute: contribute "
                          "zeros of each parameter's shape, and 0 for its loss.")
            raise Wrong(f"{context}: your rank program failed: {first}.{advice}") from None
        for rank, got in enumerate(result.values):
            if got is None:
                raise Wrong(f"{context}: rank {rank} returned None; `return` the batch loss "
                            f"(a float) at the end of the rank program, after the step.")
        ranks = [replica.params for replica, _ in replicas]
        for name in reference.params:
            if any(not np.array_equal(ranks[0][name], ranks[r][name]) for r in range(p)):
                raise Wrong(f"{context}: after the step the ranks hold different {name}. Each "
                            f"rank must step with the gradient of the *whole* batch, which it "
                            f"gets by all-reducing the shard gradients — not with its own "
                            f"shard's gradient.")
        for name, expected in reference.params.items():
            if _close(ranks[0][name], expected):
                continue
            if name in reference.frozen:
                raise Wrong(f"{context}: the frozen parameter {name} changed; step only with "
                            f"the gradients loss_and_grads returns.")
            raise Wrong(f"{context}: the ranks agree, but {name} differs from one "
                        f"single-process step on the whole batch by up to "
                        f"{np.max(np.abs(ranks[0][name] - expected)):.3g}. The batch gradient "
                        f"is Σ over ranks of (shard size × shard mean gradient) / B: all-reduce "
                        f"the shard *sums* and divide by the global batch size B = "
                        f"{batch_size} — averaging the shard means is right only when the "
                        f"shards are equal.")
        for rank, got in enumerate(result.values):
            value = as_float(got, f"{context}: rank {rank}'s returned loss")
            if not np.isfinite(value) and 0 in shards:
                raise Wrong(f"{context}: rank {rank} returned the loss {value}: the mean loss "
                            f"of an empty shard is nan (0/0), and one nan in the all-reduce "
                            f"makes every sum nan. An empty shard has nothing to compute: "
                            f"contribute zeros of each parameter's shape, and 0 for its loss.")
            expect_close(value,
                         expected_loss, f"{context}: rank {rank}'s returned loss",
                         "Return the loss of the whole batch, the size-weighted mean of the "
                         "shard losses — all-reduce it with the gradients.", rtol=1e-9)
        library = _library_step_time(p, X, y, batch, model)
        if result.time > library * (1 + _TIME_RTOL):
            raise Wrong(f"{context}: the step is right, but it took {result.time * 1e6:.4g} µs "
                        f"of simulated time where one ring all-reduce of every gradient and "
                        f"the loss as one flat vector takes {library * 1e6:.4g} µs (α = "
                        f"{_DP_NETWORK.alpha:g} s per message). Every all-reduce pays its "
                        f"latency again: flatten the gradients (and the loss) into one vector "
                        f"and all-reduce it once.")
    return ("every rank ends with the single-process step's parameters, bit-identical across "
            "ranks, in one all-reduce's time")


# --- 3.7 ----------------------------------------------------------------------------------

# (base_lr, base_batch, batch, warmup_steps): a large integer ratio first, then ratios that are
# not integers, scaling *down* (the ramp then falls from base_lr to the smaller target), the
# same batch (nothing to ramp), and no warm-up at all.
WARMUP_CASES = [(0.05, 128, 1024, 10), (0.2, 256, 384, 6), (0.1, 64, 100, 5),
                (0.4, 512, 128, 8), (0.1, 256, 256, 4), (0.03, 32, 4096, 0)]


def warmup_reference(step, base_lr, base_batch, batch, warmup_steps) -> float:
    """Goyal et al.'s gradual warm-up to the linearly scaled rate: base_lr at step 0, the target
    base_lr·batch/base_batch from step warmup_steps on, a straight line in between."""
    target = base_lr * batch / base_batch
    if warmup_steps == 0:
        return target
    return base_lr + (target - base_lr) * min(1.0, step / warmup_steps)


def _warmup_steps_to_try(warmup_steps: int) -> list[int]:
    """Step 0, the end of the warm-up, well after it, the middle, and either side of the end."""
    w = warmup_steps
    return list(dict.fromkeys(s for s in (0, w, 3 * w + 7, w // 2, w - 1, w + 1, 1) if s >= 0))


def _near(a: float, b: float) -> bool:
    return bool(np.isclose(a, b, rtol=1e-9, atol=1e-15))


def _warmup_advice(scaled_lr, got, step, base_lr, base_batch, batch, w) -> str | None:
    """What a wrong rate most likely comes from, or None."""
    k = batch / base_batch
    target = base_lr * k
    if batch % base_batch and _near(got, warmup_reference(step, base_lr, base_batch,
                                                          base_batch * (batch // base_batch), w)):
        return (f"The ratio batch/base_batch = {k:g} was rounded down to {batch // base_batch} "
                f"(`//` is floor division): the rate scales by the exact ratio.")
    if w == 0 and not math.isfinite(got):
        return (f"With warmup_steps = 0 there is no warm-up: the rate is the target "
                f"base_lr·batch/base_batch = {target:g} from step 0 on — don't divide by "
                f"warmup_steps then.")
    if step >= w and _near(got, base_lr):
        return (f"After the warm-up the rate is the target base_lr·batch/base_batch = "
                f"{target:g}, not base_lr: the linear scaling rule multiplies the rate by "
                f"k = batch/base_batch = {k:g}.")
    if step >= w and _near(got, base_lr * math.sqrt(k)):
        return (f"That is base_lr·√k with k = batch/base_batch = {k:g}: square-root scaling, "
                f"a different rule (it keeps the variance of the update fixed). The linear "
                f"scaling rule multiplies the rate by k itself.")
    goyal = ("Goyal et al.'s gradual warm-up starts at base_lr, the rate the small batch trains "
             "well with, and adds the same amount each step until it reaches the target at "
             "step warmup_steps.")
    if w and _near(got, target * min(1.0, step / w)):
        return f"Your warm-up ramps up from 0, a common variant; {goyal}"
    if w and _near(got, target * min(1.0, (step + 1) / w)):
        return (f"Your warm-up ramps up from 0 to the target as section 7's loop does, "
                f"target·(step + 1)/warmup_steps — a common variant; {goyal}")
    if w and _near(got, warmup_reference(step + 1, base_lr, base_batch, batch, w)):
        return (f"Your rate is one step early: it is the rate of step {step + 1}, and reaches "
                f"the target at step warmup_steps − 1 = {w - 1}. Steps count from 0: step 0 "
                f"uses base_lr, and step warmup_steps = {w} is the first at the target — the "
                f"fraction of the ramp done is step/warmup_steps.")
    if w and step == w:
        try:
            after = as_float(scaled_lr(w + 1, base_lr, base_batch, batch, w), "")
        except Exception:
            after = None
        if after is not None and _near(after, target):
            return (f"Your rate is one step late: it reaches the target at step "
                    f"warmup_steps + 1 = {w + 1}. Step warmup_steps = {w} is the first at the "
                    f"target — the fraction of the ramp done is step/warmup_steps.")
    if w and step >= 1 and _near(got, warmup_reference(step - 1, base_lr, base_batch, batch, w)):
        return (f"Your rate is one step late: it is the rate of step {step - 1}. Steps count "
                f"from 0, and the fraction of the ramp done is step/warmup_steps.")
    return None


@checker("3.7", "the linear scaling rule with warm-up")
def check_scaled_lr(scaled_lr):
    for base_lr, base_batch, batch, w in WARMUP_CASES:
        target = base_lr * batch / base_batch
        for step in _warmup_steps_to_try(w):
            expected = warmup_reference(step, base_lr, base_batch, batch, w)
            call = (f"scaled_lr(step={step}, base_lr={base_lr}, base_batch={base_batch}, "
                    f"batch={batch}, warmup_steps={w})")
            try:
                with np.errstate(divide="ignore", invalid="ignore"):
                    got = as_float(scaled_lr(step, base_lr, base_batch, batch, w), call)
            except ZeroDivisionError:
                if w:
                    raise
                raise Wrong(f"{call} raised ZeroDivisionError. With warmup_steps = 0 there is "
                            f"no warm-up: the rate is the target base_lr·batch/base_batch = "
                            f"{target:g} from step 0 on — don't divide by warmup_steps "
                            f"then.") from None
            if _near(got, expected):
                continue
            advice = _warmup_advice(scaled_lr, got, step, base_lr, base_batch, batch, w)
            if advice is None:
                advice = (f"Expected base_lr + (target − base_lr)·min(1, step/warmup_steps) "
                          f"with target = base_lr·batch/base_batch = {target:g}"
                          + (" — the same line when the target is below base_lr: the rate then "
                             "falls during the warm-up." if target < base_lr else "."))
            raise Wrong(f"{call} returned {got:.6g}, expected {expected:.6g}. {advice}")
    return ("base_lr at step 0, a straight line to base_lr·batch/base_batch at step "
            "warmup_steps, and the target from then on")


# --- 3.8 ----------------------------------------------------------------------------------

# (p, b): p ranks of b examples each, global batch B = p·b.
NOISE_CASES = [(2, 6), (3, 4), (4, 5), (8, 3)]
_NOISE_NAMES = ("b_noise", "g_square", "trace_sigma")
# The statistical check: NOISE_TRIALS synthetic steps on p ranks of b examples each, with
# per-example gradients G + noise in d dimensions, |G|² = 0.25 and tr Σ = 8 (noise scale 32):
# noisy enough that about 30% of the single-step estimates of |G|² are negative, so clipping
# them at 0 or taking their absolute value shows as a bias (+25% and +50% on average). The mean
# estimate must be within NOISE_TOLERANCE (relative) of the truth; the reference's standard
# errors, from its known variance at this number of trials, are about 1.2% (|G|²) and 0.3%
# (tr Σ), so the tolerance is about four of them.
NOISE_TRIALS, NOISE_TOLERANCE = 20000, 0.05
NOISE_SYNTHETIC = dict(p=4, b=4, d=8, g_square=0.25, trace_sigma=8.0)


class _GivenBatches:
    """A stand-in for gradient_noise_scale's `rng` whose `choice` hands out the given batches in
    order, so that the library estimates from exactly the batches the ranks used."""

    def __init__(self, batches):
        self.batches = list(batches)

    def choice(self, n, size, replace=True):
        batch = self.batches.pop(0)
        if len(batch) != size or replace:
            raise RuntimeError(f"checker 3.8: gradient_noise_scale asked for {size} examples "
                               f"(replace={replace}), the script holds {len(batch)}")
        return batch


def _noise_estimates(g_small: float, g_big: float, b: int, B: int) -> tuple:
    """(b_noise, |G|², tr Σ) from mean squared norms at batch sizes b and B (for the hints)."""
    g_square = (B * g_big - b * g_small) / (B - b)
    trace = (g_small - g_big) / (1 / b - 1 / B)
    return trace / g_square, g_square, trace


def _sq_norm(grads: dict) -> float:
    return sum(float(np.sum(g * g)) for g in grads.values())


def _noise_problem():
    """An MLP and data whose mean gradient stands out of the noise at the batch sizes used
    (inputs with a non-zero mean, mostly one label), so every estimate here is positive."""
    rng = np.random.default_rng(3008)
    X = 1.0 + rng.standard_normal((64, 6))
    y = np.where(rng.random(64) < 0.8, 0, rng.integers(0, 3, 64))
    return X, y, MLP([6, 8, 3], activation="tanh", seed=8), rng


def noise_cases():
    """For each (p, b) of NOISE_CASES: (p, b, local squared norms, global squared norm, and the
    library's (b_noise, |G|², tr Σ) from the same batches)."""
    X, y, model, rng = _noise_problem()
    cases = []
    for p, b in NOISE_CASES:
        batch = rng.permutation(len(X))[:p * b]
        shards = [batch[r * b:(r + 1) * b] for r in range(p)]
        local = [_sq_norm(loss_and_grads(model, X[s], y[s])[1]) for s in shards]
        global_ = _sq_norm(loss_and_grads(model, X[batch], y[batch])[1])
        # p draws of the small batch (the ranks' shards), then p of the big one (the global
        # batch each time): the library's averages are then the mean local norm and |G_B|².
        truth = gradient_noise_scale(model, X, y, _GivenBatches(shards + [batch] * p),
                                     small=b, big=p * b, repeats=p)
        cases.append((p, b, local, global_, tuple(float(v) for v in truth)))
    return cases


def _noise_advice(got, local, global_, b, B) -> str | None:
    """Which plausible mistake `got` (three floats) matches, or None."""
    g_small = float(np.mean(local))
    right = _noise_estimates(g_small, global_, b, B)

    def matches(estimates):
        return all(_near(x, y) for x, y in zip(got, estimates))
    if matches(_noise_estimates(local[0], global_, b, B)):
        return ("You used only rank 0's |G_b|². Every rank measured a batch of b examples: "
                "|G_b|² is the mean of all p local values — p measurements for free, and a "
                "less noisy estimate.")
    if matches((right[2] / global_, right[1], right[2])):
        return ("|G|² and tr Σ are right, but your b_noise divides by |G_B|²: the global "
                "batch's squared norm still holds the noise tr Σ/B, so it overestimates |G|². "
                "Divide by the unbiased |G|² estimate instead.")
    if matches(_noise_estimates(g_small, global_, B, b)) or _near(got[2], -right[2]):
        return ("Your tr Σ has the wrong sign: b and B are swapped. The small batch b (one "
                "rank's) goes with |G_b|², the mean of the local values; a small batch is the "
                "noisier one, so |G_b|² > |G_B|² on average and 1/b − 1/B > 0.")
    if _near(got[1], global_) and not _near(right[1], global_):
        return ("Your |G|² is |G_B|², the global batch's squared norm, which still holds the "
                "noise tr Σ/B on average. The unbiased estimate combines both batch sizes so "
                "that the noise terms cancel.")
    if matches(_noise_estimates(float(np.mean(np.sqrt(local))) ** 2, global_, b, B)):
        return ("You averaged the norms (square roots) and squared the mean: that is smaller "
                "than the mean of the squared norms, and biased. Average the squared norms "
                "|G_local|² themselves.")
    return None


def _call_noise(noise_scale_from_dp, local, global_, b, B, call) -> tuple:
    got = _unpack(noise_scale_from_dp(list(local), global_, b, B), _NOISE_NAMES, call)
    return tuple(as_float(x, f"{call}: {name}") for x, name in zip(got, _NOISE_NAMES))


def noise_statistics(noise_scale_from_dp) -> tuple:
    """The mean over NOISE_TRIALS synthetic data-parallel steps of the answer's |G|² and tr Σ,
    and the call shown in hints."""
    means, _, call = _noise_trials(noise_scale_from_dp)
    return means, call


def _noise_trials(noise_scale_from_dp) -> tuple:
    """(mean |G|² and tr Σ, share of the steps whose |G|² came out negative, call)."""
    p, b, d = NOISE_SYNTHETIC["p"], NOISE_SYNTHETIC["b"], NOISE_SYNTHETIC["d"]
    rng = np.random.default_rng(3108)
    G = np.full(d, math.sqrt(NOISE_SYNTHETIC["g_square"] / d))
    sigma = np.linspace(0.5, 1.5, d)
    sigma *= math.sqrt(NOISE_SYNTHETIC["trace_sigma"] / np.sum(sigma ** 2))
    examples = G + sigma * rng.standard_normal((NOISE_TRIALS, p, b, d))
    local_means = examples.mean(axis=2)                        # each rank's mean gradient
    local_sq = np.sum(local_means ** 2, axis=2)
    global_sq = np.sum(local_means.mean(axis=1) ** 2, axis=1)  # the all-reduced mean
    call = f"noise_scale_from_dp(…, local_batch={b}, global_batch={p * b}) on p = {p} ranks"
    total, negative = np.zeros(2), 0
    for trial in range(NOISE_TRIALS):
        got = _call_noise(noise_scale_from_dp, local_sq[trial].tolist(),
                          float(global_sq[trial]), b, p * b, call)
        total += got[1:]
        negative += got[1] < 0
    return total / NOISE_TRIALS, negative / NOISE_TRIALS, call


@checker("3.8", "the gradient noise scale from a data-parallel step")
def check_noise_scale_from_dp(noise_scale_from_dp):
    for p, b, local, global_, truth in noise_cases():
        B = p * b
        call = (f"noise_scale_from_dp(local_sq_norms=[{', '.join(f'{x:.6g}' for x in local)}], "
                f"global_sq_norm={global_:.6g}, local_batch={b}, global_batch={B})")
        got = _call_noise(noise_scale_from_dp, local, global_, b, B, call)
        if all(_near(x, y) for x, y in zip(got, truth)):
            continue
        shown = ", ".join(f"{x:.6g}" for x in got)
        expected = ", ".join(f"{x:.6g}" for x in truth)
        advice = _noise_advice(got, local, global_, b, B)
        if advice is None:
            if not _near(got[2], truth[2]):
                advice = ("Check tr Σ: subtract the two equations E|G_n|² = |G|² + tr Σ/n "
                          "(n = b with the mean of the p local values, n = B with the global "
                          "one), so that |G|² drops out.")
            elif not _near(got[1], truth[1]):
                advice = ("Check |G|²: combine the two equations so that the noise terms "
                          "tr Σ/b and tr Σ/B cancel.")
            else:
                advice = ("|G|² and tr Σ are right: b_noise is their ratio, tr Σ / |G|².")
        raise Wrong(f"{call} returned ({shown}), expected ({expected}) as "
                    f"gradient_noise_scale computes from the same batches. {advice}")
    (mean_square, mean_trace), negative, call = _noise_trials(noise_scale_from_dp)
    true_square, true_trace = NOISE_SYNTHETIC["g_square"], NOISE_SYNTHETIC["trace_sigma"]
    if abs(mean_square - true_square) > NOISE_TOLERANCE * true_square and negative == 0 \
            and abs(mean_trace - true_trace) <= NOISE_TOLERANCE * true_trace:
        raise Wrong(f"{call}: over {NOISE_TRIALS:,} synthetic steps with known |G|² = "
                    f"{true_square:g} your |G|² was never negative and averages "
                    f"{mean_square:.4g}, {abs(mean_square - true_square) / true_square:.0%} off. "
                    f"On a noisy step the unbiased estimate of |G|² can come out below zero; "
                    f"clipping it (max with 0) or taking its absolute value pushes every such "
                    f"step up, and the average with it. Return the estimate as it comes.")
    for name, mean, true in (("tr Σ", mean_trace, true_trace), ("|G|²", mean_square, true_square)):
        if abs(mean - true) > NOISE_TOLERANCE * true:
            raise Wrong(f"{call}: over {NOISE_TRIALS:,} synthetic steps with known |G|² = "
                        f"{true_square:g} and tr Σ = {true_trace:g}, your {name} averages "
                        f"{mean:.4g}, {abs(mean - true) / true:.0%} off the truth {true:g}: the "
                        f"estimator is biased. E|G_b|² = |G|² + tr Σ/b at both batch sizes; "
                        f"solve the two equations for |G|² and tr Σ.")
    return ("agrees with gradient_noise_scale on the ranks' own batches, and |G|² and tr Σ are "
            f"unbiased over {NOISE_TRIALS:,} synthetic steps")


# --- 3.9 ----------------------------------------------------------------------------------

# (p, t_compute (s), nbytes, alpha (s), beta (s/byte)). nbytes is a multiple of 192 = lcm(3, 64)
# bytes, so the ring's blocks are equal and the simulator reproduces the closed form.
STRONG_CASES = [(8, 0.12, 192 * 2 ** 18, 5e-6, 4e-11),       # 48 MiB at 25 GB/s: both terms
                (2, 0.05, 192 * 2 ** 18, 3e-6, 1 / 300e9),
                (3, 0.03, 192 * 2 ** 14, 1.5e-6, 4e-11),
                (64, 0.01, 192 * 16, 30e-6, 8e-10),           # 3 KB: latency-bound
                (64, 0.5, 192 * 2 ** 20, 1e-6, 4e-11),        # 192 MiB: bandwidth-bound
                (1, 0.2, 192 * 2 ** 18, 5e-6, 4e-11)]         # one rank: no all-reduce


def strong_step_times(p, t_compute, nbytes, alpha, beta) -> tuple:
    """(T_1, T_p) of a data-parallel step timed on the simulator, as section 9 times it: the
    global batch's computation split p ways, then a ring all-reduce of nbytes, no overlap."""
    network = AlphaBeta(alpha, beta)

    def step(comm):
        yield comm.compute(t_compute / comm.size)
        if comm.size > 1:
            yield from allreduce(comm, SizeOnly(nbytes), algorithm="ring")
    return (run(step, 1, network=network, trace=False).time,
            run(step, p, network=network, trace=False).time)


def _strong_advice(got, p, t_compute, nbytes, alpha, beta, t1, tp) -> str | None:
    """Which plausible mistake `got` matches, or None."""
    if p == 1:
        return None
    latency, bandwidth = 2 * (p - 1) * alpha, 2 * (p - 1) / p * nbytes * beta
    if _near(got, t1 / (p * (t_compute / p + latency + 2 * nbytes * beta))):
        return ("Your all-reduce moves 2·nbytes·β per rank. In the ring each rank sends "
                "2(p − 1) blocks of nbytes/p, not whole vectors: 2(p − 1)/p · nbytes · β.")
    if _near(got, tp / t1) or _near(got, p * tp / t1):
        return ("Your ratio is upside down: efficiency is T_1/(p·T_p), the speed-up T_1/T_p "
                "shared among p ranks — 1 for perfect scaling, smaller as communication grows.")
    if _near(got, t1 / (t_compute + latency + bandwidth)):
        return ("The computation is not divided by p: that is the weak-scaling efficiency, "
                "where each rank keeps its own batch. In strong scaling the global batch is "
                "fixed and each of the p ranks computes 1/p of it: T_p = t_compute/p + the "
                "all-reduce.")
    if _near(got, t1 / tp):
        return ("That is the speed-up T_1/T_p; efficiency divides it by p: T_1/(p·T_p).")
    if _near(got, t1 / (t_compute + p * bandwidth)):
        return ("The α term is missing: the ring takes 2(p − 1) steps, and each step's message "
                "pays α — 2(p − 1)α of latency however small the gradient.")
    return None


@checker("3.9", "strong-scaling efficiency from the α–β model")
def check_strong_efficiency(strong_efficiency):
    for p, t_compute, nbytes, alpha, beta in STRONG_CASES:
        t1, tp = strong_step_times(p, t_compute, nbytes, alpha, beta)
        expected = t1 / (p * tp)
        call = (f"strong_efficiency(p={p}, t_compute={t_compute:g}, nbytes={nbytes}, "
                f"alpha={alpha:g}, beta={beta:.3g})")
        got = as_float(strong_efficiency(p, t_compute, nbytes, alpha, beta), call)
        if _near(got, expected):
            continue
        advice = _strong_advice(got, p, t_compute, nbytes, alpha, beta, t1, tp)
        if advice is None:
            advice = ("Build T_p from its parts: each rank's share of the computation, then "
                      "week 2's ring all-reduce of the gradient on p ranks — a latency for each "
                      "of its steps and the bytes each rank sends (on one rank there is "
                      "nothing to reduce). Then compare with T_1 shared among p ranks.")
        raise Wrong(f"{call} returned {got:.6g}, expected {expected:.6g} (simulated: T_1 = "
                    f"{t1:.6g} s, T_{p} = {tp:.6g} s). {advice}")
    return ("T_1/(p·T_p) matches the simulated ring all-reduce step, latency- and "
            "bandwidth-bound")


# --- 3.10 ---------------------------------------------------------------------------------

def _ddp_profile(seed: int, p: int, tensors: int) -> list:
    """A seeded backward pass: (name, nbytes, seconds) in the order gradients are produced.
    Sizes are multiples of 8p bytes, so every ring block is equal and the closed form exact."""
    rng = np.random.default_rng(seed)
    return [(f"t{i}", int(rng.integers(1, 2000)) * 8 * p, float(rng.uniform(0, 3e-4)))
            for i in range(tensors)]


# (seed, p, tensors, bucket cap (B), alpha (s), beta (s/B), forward (s)). The caps cover one
# bucket per gradient, a few buckets, and one bucket; the networks a link that keeps up with
# backward and one that does not.
DDP_CASES = [(1, 4, 12, 20_000, 2e-6, 1 / 25e9, 1e-3),
             (2, 8, 20, 0, 5e-6, 1 / 25e9, 2e-3),
             (3, 2, 9, 60_000, 1e-6, 1 / 1.25e9, 5e-4),       # 10 GbE: bandwidth-bound
             (4, 16, 15, 150_000, 3e-6, 1 / 300e9, 1e-3),
             (5, 3, 6, float("inf"), 2e-6, 1 / 25e9, 1e-3),
             (6, 4, 1, 10_000, 2e-6, 1 / 25e9, 1e-3)]


def ddp_simulated_time(gradients, bucket_cap, p, alpha, beta, forward) -> float:
    """The iteration time of one DDP step on the simulator: forward, then backward producing
    `gradients` while ddp_allreduce all-reduces its buckets on a second activity."""
    buckets = assign_buckets([(name, nbytes) for name, nbytes, _ in reversed(gradients)],
                             bucket_cap)

    def step(comm):
        yield comm.compute(forward)
        yield from ddp_allreduce(comm, ((name, SizeOnly(nbytes), seconds)
                                        for name, nbytes, seconds in gradients), buckets)
    return run(step, p, network=AlphaBeta(alpha, beta), trace=False).time


def _ddp_variants(gradients, bucket_cap, p, alpha, beta, forward) -> dict:
    """What plausible mistakes compute, keyed by the advice that names each."""
    buckets = assign_buckets([(n, b) for n, b, _ in reversed(gradients)], bucket_cap)
    nbytes = {n: b for n, b, _ in gradients}
    ready, first, clock = {}, {}, forward
    for name, _, seconds in gradients:
        first[name] = clock                  # when its computation started
        clock += seconds
        ready[name] = clock

    def ring(n, with_alpha=True, fraction=True):
        return (2 * (p - 1) * alpha if with_alpha else 0.0) + \
            2 * ((p - 1) / p if fraction else 1.0) * n * beta

    def queue(start_of, cost_of, order=buckets):
        end = forward
        for bucket in order:
            end = max(start_of(bucket), end) + cost_of(sum(nbytes[n] for n in bucket))
        return max(end, clock)

    def latest(bucket):
        return max(ready[n] for n in bucket)
    # assign_buckets given the gradients in backward order (it expects forward order and
    # reverses it itself): the first bucket then holds what backward produces last.
    backward_order = assign_buckets([(n, b) for n, b, _ in gradients], bucket_cap)
    return {
        "backward order": queue(latest, ring, order=backward_order),
        "no overlap": clock + sum(ring(sum(nbytes[n] for n in b)) for b in buckets),
        "no queue": max([clock] + [latest(b) + ring(sum(nbytes[n] for n in b)) for b in buckets]),
        "first gradient": queue(lambda b: min(first[n] for n in b), ring),
        "no alpha": queue(latest, lambda n: ring(n, with_alpha=False)),
        "no fraction": queue(latest, lambda n: ring(n, fraction=False)),
    }


_DDP_ADVICE = {
    "backward order": "Your buckets look filled in the wrong order: assign_buckets takes "
                      "(name, nbytes) in *forward* order and walks it backwards itself. Given the "
                      "gradients in backward order, its first bucket holds what backward produces "
                      "last, so no bucket is complete until backward is nearly over.",
    "no overlap": "That is the step without overlap: backward, then every bucket. A bucket's "
                  "all-reduce can start while backward goes on — when is it complete?",
    "no queue": "Each bucket's all-reduce started the moment it was ready, even while the one "
                "before it was still running. Buckets go one at a time, in order (one stream): "
                "a bucket waits for its last gradient *and* for the bucket before it.",
    "first gradient": "A bucket was started when its first gradient was being computed. It "
                      "can start only when its *last* gradient is out of backward.",
    "no alpha": "The latency term is missing: a ring all-reduce pays 2(p − 1)α per bucket — "
                "which is what makes many small buckets slow.",
    "no fraction": "Each ring all-reduce moves 2(p − 1)/p · n · β per rank, not 2·n·β.",
}


@checker("3.10", "DDP's iteration time from the α–β model")
def check_ddp_iteration_time(ddp_iteration_time):
    for seed, p, tensors, cap, alpha, beta, forward in DDP_CASES:
        gradients = _ddp_profile(seed, p, tensors)
        expected = ddp_simulated_time(gradients, cap, p, alpha, beta, forward)
        call = (f"ddp_iteration_time(<{tensors} gradients, {sum(b for _, b, _ in gradients):,} B "
                f"in all>, bucket_cap={cap:g}, p={p}, alpha={alpha:g}, beta={beta:.3g}, "
                f"forward_seconds={forward:g})")
        got = as_float(ddp_iteration_time(list(gradients), cap, p, alpha, beta, forward), call)
        if math.isclose(got, expected, rel_tol=_TIME_RTOL):
            continue
        matched = [_DDP_ADVICE[key] for key, value in
                   _ddp_variants(gradients, cap, p, alpha, beta, forward).items()
                   if math.isclose(got, value, rel_tol=_TIME_RTOL)]
        if len(matched) > 1:              # several mistakes give this number: say so
            advice = "Two mistakes give this number. Either: " + " Or: ".join(matched)
        elif matched:
            advice = matched[0]
        else:
            advice = ("Walk the buckets in order and ask of each: when is its last gradient "
                      "out, when is the bucket before it done, and what does week 2's ring "
                      "all-reduce of its bytes cost? The step ends when both backward and the "
                      "last bucket are done.")
        raise Wrong(f"{call} returned {got * 1e3:.6g} ms; the simulator takes "
                    f"{expected * 1e3:.6g} ms. {advice}")
    return ("matches the simulated DDP step exactly: one bucket per gradient, a few, one; "
            "links that keep up with backward and one that does not")


# --- 3.11 ---------------------------------------------------------------------------------

# (n, world_size, epoch, seed): p divides n, p does not (padding), n < p, one rank, a later epoch.
SAMPLER_CASES = [(10, 3, 0, 5), (12, 4, 2, 1), (2, 5, 1, 0), (9, 1, 0, 3), (1000, 8, 7, 11),
                 (23, 6, 4, 2)]


def _sampler_variants(n, world_size, rank, epoch, seed) -> dict:
    """What plausible mistakes give, keyed by the advice that names each."""
    order = np.random.default_rng(seed + epoch).permutation(n)
    total = -(-n // world_size) * world_size
    padded = np.resize(order, total)
    share = total // world_size
    return {
        "no padding": order[rank::world_size],
        "array_split": np.array_split(order, world_size)[rank],
        "blocks": padded[rank * share:(rank + 1) * share],
        "no epoch": np.resize(np.random.default_rng(seed).permutation(n), total)[rank::world_size],
        "drop": order[:(n // world_size) * world_size][rank::world_size],
    }


_SAMPLER_ADVICE = {
    "no padding": "Your shards differ in length when world_size does not divide n: the ranks "
                  "would take different numbers of steps, and the one with an extra batch "
                  "would wait in an all-reduce nobody joins (uneven inputs). Pad the "
                  "permutation, as DistributedSampler does — with which indices?",
    "array_split": "You cut the permutation into contiguous pieces of unequal length (as "
                   "np.array_split does): the shards are unequal, and DistributedSampler "
                   "strides through the (padded) permutation instead.",
    "blocks": "Your shards are contiguous blocks of the padded permutation; DistributedSampler "
              "gives rank r every world_size-th index starting at r.",
    "no epoch": "Every epoch gets the same order: the permutation must change with the epoch "
                "(seeded by seed + epoch, as set_epoch makes DistributedSampler do).",
    "drop": "You dropped the examples that do not fill a last round: that is drop_last=True. "
            "By default DistributedSampler keeps every example and pads instead.",
}


@checker("3.11", "a distributed sampler", builds=("dsml.data_parallel.distributed_indices",))
def check_sampler_indices(sampler_indices):
    for n, world_size, epoch, seed in SAMPLER_CASES:
        for rank in range(world_size):
            call = (f"sampler_indices(n={n}, world_size={world_size}, rank={rank}, "
                    f"epoch={epoch}, seed={seed})")
            got = np.asarray(sampler_indices(n, world_size, rank, epoch, seed))
            expected = distributed_indices(n, world_size, rank, epoch, seed)
            if got.shape == expected.shape and np.array_equal(got, expected):
                continue
            matched = [_SAMPLER_ADVICE[key] for key, value in
                       _sampler_variants(n, world_size, rank, epoch, seed).items()
                       if value.shape == got.shape and np.array_equal(value, got)]
            advice = " Or: ".join(matched) if matched else (
                "Take one permutation of range(n) from np.random.default_rng(seed + epoch), the "
                "same on every rank; make its length a multiple of world_size by repeating its "
                "first indices; then take this rank's share of it, as the statement describes.")
            raise Wrong(f"{call} returned {len(got)} indices, starting {got[:6].tolist()}; "
                        f"expected {len(expected)}. {advice}")
    return ("equal shards that cover the data every epoch, reshuffled per epoch, padded as "
            "DistributedSampler pads")
