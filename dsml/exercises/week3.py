"""Plumbing (hand-written): the checkers of week 3's exercises (data parallelism).

Each checker calls the learner's function on inputs different from the worked example in
the notebook and raises `Wrong` with a hint that says what was tried, what was expected,
what came back and what to reconsider. The truth is measured with the library: backward
passes against `dsml.train`'s MLP and central differences, optimizer steps against
`dsml.train.optim`'s Adam and LARS run on the same state, accumulated gradients against one
pass over the whole batch, and the data-parallel rank program on the simulator against
`train_single` (its values) and `data_parallel_sgd` (its simulated time).

This module imports from the lower layers only (`dsml.comm`, `dsml.net`, `dsml.train`,
`dsml.data_parallel`), never the top-level `dsml` package, which sits above it.
"""
from __future__ import annotations

import copy

import numpy as np

from dsml.comm.api import Comm, RankError
from dsml.comm.run import run
from dsml.data_parallel import data_parallel_sgd, shard_bounds, train_single
from dsml.exercises import (Wrong, _not_implemented, as_float, checker, expect_close,
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


@checker("3.2", "softmax cross-entropy gradient")
def check_softmax_cross_entropy_grad(softmax_cross_entropy_grad):
    rng = np.random.default_rng(3002)
    for batch, classes, scale in SOFTMAX_CASES:
        logits = scale * rng.standard_normal((batch, classes))
        y = rng.integers(0, classes, size=batch)
        _, expected = softmax_cross_entropy(logits, y)
        call = (f"softmax_cross_entropy_grad(logits of shape {logits.shape} with entries up to "
                f"{np.max(np.abs(logits)):.3g}, y={y.tolist()})")
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
                        f"one-hot labels: dL/dlogits = (softmax(logits) − onehot(y)) / B. The "
                        f"−1 at the label is what pushes the right class up.")
        raise Wrong(f"{call}: the gradient is off by up to {np.max(np.abs(got - expected)):.3g}; "
                    f"expected (softmax(logits) − onehot(y)) / B, row 0 = "
                    f"{np.round(expected[0], 4).tolist()}, got {np.round(got[0], 4).tolist()}.")
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


@checker("3.3", "one Adam step")
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


@checker("3.4", "LARS local learning rate")
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
