"""Gradient accumulation (dsml.data_parallel.accumulated_grads): micro-batches give the gradient
of the whole batch — a size-weighted mean, not a sum — and activation memory follows the
micro-batch size."""
from __future__ import annotations

import numpy as np
import pytest

from dsml.data_parallel import accumulated_grads, activation_bytes
from dsml.train import MLP, loss_and_grads


@pytest.fixture
def problem():
    rng = np.random.default_rng(11)
    X = rng.standard_normal((50, 6))
    y = rng.integers(0, 4, size=50)
    return X, y


@pytest.mark.parametrize("micro", [1, 3, 7, 16, 37, 50, 80])
@pytest.mark.parametrize("activation,loss", [("relu", "cross_entropy"), ("tanh", "mse")])
def test_micro_batches_give_the_batch_gradient(problem, micro, activation, loss):
    X, y = problem
    model = MLP([6, 9, 4], activation=activation, seed=2)
    target = y if loss == "cross_entropy" else np.eye(4)[y]
    batch = np.arange(3, 40)                       # 37 examples: uneven micro-batches
    value, full = loss_and_grads(model, X[batch], target[batch], loss)
    got_value, got = accumulated_grads(model, X, target, batch, micro, loss)
    assert got_value == pytest.approx(value, rel=1e-12)
    assert set(got) == set(full)
    for name in full:
        np.testing.assert_allclose(got[name], full[name], rtol=1e-11, atol=1e-14)


def test_frozen_parameters_get_no_accumulated_gradient(problem):
    X, y = problem
    model = MLP([6, 5, 4], seed=0)
    model.frozen = {"layer1.weight"}
    _, grads = accumulated_grads(model, X, y, np.arange(20), 6)
    assert "layer1.weight" not in grads and "layer0.weight" in grads


def test_summing_micro_batch_means_is_k_times_too_large(problem):
    X, y = problem
    model = MLP([6, 5, 4], seed=0)
    batch = np.arange(40)
    _, mean = accumulated_grads(model, X, y, batch, 10)
    summed = {k: sum(loss_and_grads(model, X[p], y[p])[1][k] for p in np.split(batch, 4))
              for k in mean}
    for k in mean:
        np.testing.assert_allclose(summed[k], 4 * mean[k], rtol=1e-12)


def test_activation_memory_is_proportional_to_the_micro_batch(problem):
    X, _ = problem
    model = MLP([6, 9, 7, 4], seed=0)
    assert activation_bytes(model) == 0                    # nothing kept before a forward pass
    sizes = {}
    for m in (1, 2, 5, 10):
        model.forward(X[:m])
        sizes[m] = activation_bytes(model)
    assert sizes[1] == 8 * (6 + 9 + 7 + 9 + 7 + 4)         # inputs and pre-activations, float64
    assert all(sizes[m] == m * sizes[1] for m in sizes)


@pytest.mark.parametrize("micro,batch", [(0, np.arange(4)), (2, np.arange(0))])
def test_bad_micro_batches_are_named(problem, micro, batch):
    X, y = problem
    with pytest.raises(ValueError, match="micro_batch"):
        accumulated_grads(MLP([6, 4]), X, y, batch, micro)


# --- the gradient noise scale (dsml.data_parallel.gradient_noise_scale) ------------------------

def test_noise_scale_is_positive_and_reproducible():
    from dsml.data_parallel import gradient_noise_scale
    from dsml.train.data import teacher_classes
    X, y, _, _ = teacher_classes(2000, 0, dim=8, classes=5, seed=4)
    model = MLP([8, 16, 5], seed=0)
    first = gradient_noise_scale(model, X, y, np.random.default_rng(1), small=16, big=512)
    again = gradient_noise_scale(model, X, y, np.random.default_rng(1), small=16, big=512)
    assert first == again
    scale, g_square, trace = first
    assert g_square > 0 and trace > 0 and scale == pytest.approx(trace / g_square)


def test_noise_scale_grows_when_the_gradient_shrinks():
    """Near a minimum |G|² falls while the per-example noise does not: the scale grows."""
    from dsml.data_parallel import gradient_noise_scale
    from dsml.train import make_optimizer
    from dsml.train.data import teacher_classes
    X, y, _, _ = teacher_classes(4000, 0, dim=8, classes=5, seed=4)
    model = MLP([8, 32, 5], seed=0)
    before = gradient_noise_scale(model, X, y, np.random.default_rng(2), small=16, big=1024)[0]
    opt = make_optimizer("adam", 0.01)
    for step in range(300):
        batch = np.random.default_rng(step).choice(len(X), 128, replace=False)
        opt.step(model.params, loss_and_grads(model, X[batch], y[batch])[1])
    after = gradient_noise_scale(model, X, y, np.random.default_rng(2), small=16, big=1024)[0]
    assert after > 2 * before, (before, after)


@pytest.mark.parametrize("small,big", [(0, 10), (10, 10), (20, 10), (10, 10_000)])
def test_noise_scale_names_bad_batch_sizes(small, big):
    from dsml.data_parallel import gradient_noise_scale
    X = np.zeros((100, 3))
    with pytest.raises(ValueError, match="small"):
        gradient_noise_scale(MLP([3, 2]), X, np.zeros(100, dtype=np.int64),
                             np.random.default_rng(0), small=small, big=big)
