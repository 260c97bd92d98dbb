"""Plumbing (hand-written): tests for dsml.train — the NumPy training substrate of week 3.

Each piece is checked against an independent reference:
- the MLP's forward pass, losses and backprop against PyTorch autograd (float64, relative error
  below 1e-10) over 1–4-layer architectures, every activation and both losses, and against
  central differences (`numerical_gradient`);
- SGD, momentum and Adam against torch.optim, step by step, on the same parameters and gradients;
- LARS and LAMB, which PyTorch does not ship, against a reference written here from the papers'
  formulas (You, Gitman & Ginsburg 2017; You et al. 2019), including the zero-norm cases;
- the data sets for determinism under seeds, shapes, dtypes and ranges;
- bad input for errors that name the argument, the value and what would be valid.

Only the tests that take the `torch` fixture need PyTorch; without it they are skipped and the
rest still run. Everything is seeded: the same numbers on every machine.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsml.train import load_digits
from dsml.train.data import batch_indices, digits, gaussian_mixture, sparse_regression, teacher
from dsml.train.models import (MLP, accuracy, loss_and_grads, mean_squared_error,
                               numerical_gradient, softmax_cross_entropy)
from dsml.train.optim import OPTIMIZERS, make_optimizer

ACTIVATIONS = ["relu", "tanh", None]
LOSSES = ["cross_entropy", "mse"]
# 1 to 4 layers; widths of 1 and outputs of 1 are the awkward cases.
ARCHITECTURES = [(5, 3), (4, 7, 2), (2, 5, 1), (6, 1, 5, 3), (3, 8, 8, 4, 10)]
AUTOGRAD_TOLERANCE = 1e-10      # relative, float64: both sides do the same few dozen flops
NUMERICAL_TOLERANCE = 1e-6      # relative: central differences err by O(eps²) + O(ε/eps)
OPTIMIZER_TOLERANCE = 1e-10     # relative, after a few steps of the same formula

# --- helpers ----------------------------------------------------------------------------------

@pytest.fixture
def torch():
    """PyTorch, single-threaded (results are then reproducible); skips the test without it."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    return torch


def relative_error(actual, expected) -> float:
    """‖actual − expected‖ / ‖expected‖ (absolute error when expected is 0)."""
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, np.float64)
    scale = float(np.linalg.norm(expected))
    error = float(np.linalg.norm(actual - expected))
    return error / scale if scale > 0 else error


def assert_close(actual, expected, what: str, tolerance: float):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (
        f"{what}: shape {actual.shape}, expected {expected.shape}")
    assert np.all(np.isfinite(actual)), f"{what}: contains NaN or inf: {actual}"
    error = relative_error(actual, expected)
    assert error < tolerance, (
        f"{what}: relative error {error:.3g} ≥ {tolerance:g}\n got      {actual.ravel()[:6]}…"
        f"\n expected {expected.ravel()[:6]}…")


def layer_names(n_layers: int) -> list[str]:
    names = []
    for i in range(n_layers):
        names += [f"layer{i}.weight", f"layer{i}.bias"]
    return names


def random_inputs(sizes, loss: str, n: int, seed: int):
    """X (n, sizes[0]) and targets: class labels for cross-entropy, real (n, sizes[-1]) for MSE."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, sizes[0]))
    if loss == "cross_entropy":
        y = rng.integers(0, sizes[-1], size=n).astype(np.int64)
    else:
        y = rng.standard_normal((n, sizes[-1]))
    return X, y


def numpy_forward(params: dict, activation, X: np.ndarray) -> np.ndarray:
    """The MLP's forward pass written out: X @ W + b, the activation between layers only."""
    n_layers = len(params) // 2
    h = X
    for i in range(n_layers):
        h = h @ params[f"layer{i}.weight"] + params[f"layer{i}.bias"]
        if i < n_layers - 1:
            if activation == "relu":
                h = np.maximum(h, 0.0)
            elif activation == "tanh":
                h = np.tanh(h)
    return h


def torch_forward(torch, params: dict, activation, X: np.ndarray, frozen=frozenset()):
    """The same network in PyTorch: (output, leaf tensors by name); frozen ones need no grad."""
    leaves = {name: torch.tensor(value, dtype=torch.float64, requires_grad=name not in frozen)
              for name, value in params.items()}
    n_layers = len(params) // 2
    h = torch.tensor(X, dtype=torch.float64)
    for i in range(n_layers):
        h = h @ leaves[f"layer{i}.weight"] + leaves[f"layer{i}.bias"]
        if i < n_layers - 1:
            if activation == "relu":
                h = torch.relu(h)
            elif activation == "tanh":
                h = torch.tanh(h)
    return h, leaves


def torch_loss(torch, output, y, loss: str):
    if loss == "cross_entropy":
        return torch.nn.functional.cross_entropy(output, torch.tensor(y), reduction="mean")
    return torch.nn.functional.mse_loss(output, torch.tensor(y, dtype=torch.float64),
                                        reduction="mean")


def arch_id(sizes) -> str:
    return "-".join(map(str, sizes))


# --- the MLP ----------------------------------------------------------------------------------

@pytest.mark.parametrize("sizes", ARCHITECTURES, ids=arch_id)
def test_parameters_are_named_shaped_and_ordered_as_documented(sizes):
    model = MLP(list(sizes), activation="tanh", seed=3)
    names = layer_names(len(sizes) - 1)
    assert list(model.params) == names, "params must be in forward order: layer0.weight, " \
                                        "layer0.bias, layer1.weight, …"
    for i in range(len(sizes) - 1):
        assert model.params[f"layer{i}.weight"].shape == (sizes[i], sizes[i + 1])
        assert model.params[f"layer{i}.bias"].shape == (sizes[i + 1],)
    for name, value in model.params.items():
        assert value.dtype == np.float64, f"{name} is {value.dtype}, expected float64"
    expected = sum(sizes[i] * sizes[i + 1] + sizes[i + 1] for i in range(len(sizes) - 1))
    assert model.n_params() == expected
    assert model.frozen == set(), "no parameter is frozen by default"


def test_initialisation_is_seeded():
    a, b, c = MLP([4, 6, 3], seed=7), MLP([4, 6, 3], seed=7), MLP([4, 6, 3], seed=8)
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name],
                                      err_msg=f"{name}: same seed, different values")
    assert any(not np.array_equal(a.params[k], c.params[k]) for k in a.params), \
        "seeds 7 and 8 gave identical parameters"
    assert not np.all(a.params["layer0.weight"] == 0), "weights must not start at zero"


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("sizes", ARCHITECTURES, ids=arch_id)
def test_forward_is_affine_layers_with_the_activation_between_them(sizes, activation):
    # Runs without torch. A relu after the last layer would make some outputs 0 instead of < 0.
    model = MLP(list(sizes), activation=activation, seed=1)
    X, _ = random_inputs(sizes, "mse", n=9, seed=2)
    assert_close(model.forward(X), numpy_forward(model.params, activation, X),
                 f"forward of {sizes} with activation {activation}", AUTOGRAD_TOLERANCE)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("sizes", ARCHITECTURES, ids=arch_id)
def test_loss_and_grads_equal_torch_autograd(torch, sizes, activation, loss):
    model = MLP(list(sizes), activation=activation, seed=len(sizes))
    X, y = random_inputs(sizes, loss, n=7, seed=sum(sizes))
    value, grads = loss_and_grads(model, X, y, loss=loss)

    output, leaves = torch_forward(torch, model.params, activation, X)
    expected = torch_loss(torch, output, y, loss)
    expected.backward()
    assert_close(model.forward(X), output.detach().numpy(), "forward output",
                 AUTOGRAD_TOLERANCE)
    assert isinstance(value, float), f"the loss must be a Python float, got {type(value)}"
    assert_close(value, expected.item(), f"{loss} loss", AUTOGRAD_TOLERANCE)
    assert set(grads) == set(model.params), "one gradient per parameter, same names"
    for name, grad in grads.items():
        assert_close(grad, leaves[name].grad.numpy(), f"d{loss}/d{name}", AUTOGRAD_TOLERANCE)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("sizes", ARCHITECTURES, ids=arch_id)
def test_backward_of_any_upstream_gradient_equals_torch(torch, sizes, activation):
    # backward(dout) is the vector–Jacobian product for an arbitrary dout, not only a loss's.
    model = MLP(list(sizes), activation=activation, seed=4)
    rng = np.random.default_rng(5)
    X = rng.standard_normal((6, sizes[0]))
    dout = rng.standard_normal((6, sizes[-1]))
    model.forward(X)
    grads = model.backward(dout)
    output, leaves = torch_forward(torch, model.params, activation, X)
    output.backward(torch.tensor(dout))
    assert set(grads) == set(model.params)
    for name, grad in grads.items():
        assert_close(grad, leaves[name].grad.numpy(), f"backward: {name}", AUTOGRAD_TOLERANCE)


def test_a_single_example_batch_equals_torch(torch):
    model = MLP([3, 4, 2], activation="relu", seed=0)
    X, y = random_inputs((3, 4, 2), "cross_entropy", n=1, seed=0)
    value, grads = loss_and_grads(model, X, y)
    output, leaves = torch_forward(torch, model.params, "relu", X)
    expected = torch_loss(torch, output, y, "cross_entropy")
    expected.backward()
    assert_close(value, expected.item(), "loss, batch of 1", AUTOGRAD_TOLERANCE)
    for name, grad in grads.items():
        assert_close(grad, leaves[name].grad.numpy(), f"{name}, batch of 1", AUTOGRAD_TOLERANCE)


def test_frozen_parameters_get_no_gradient_and_the_rest_equal_torch(torch):
    # Freezing a middle layer must not stop the gradient flowing through it to layer 0.
    model = MLP([4, 6, 5, 3], activation="tanh", seed=2)
    frozen = {"layer1.weight", "layer1.bias", "layer2.bias"}
    model.frozen.update(frozen)
    X, y = random_inputs((4, 6, 5, 3), "cross_entropy", n=8, seed=3)
    value, grads = loss_and_grads(model, X, y)
    assert set(grads) == set(model.params) - frozen, (
        f"gradients for {sorted(grads)}, expected exactly the non-frozen "
        f"{sorted(set(model.params) - frozen)}")
    output, leaves = torch_forward(torch, model.params, "tanh", X, frozen=frozen)
    torch_loss(torch, output, y, "cross_entropy").backward()
    for name, grad in grads.items():
        assert_close(grad, leaves[name].grad.numpy(), f"{name} (others frozen)",
                     AUTOGRAD_TOLERANCE)


# --- central differences ----------------------------------------------------------------------

@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_backward_equals_numerical_gradient(activation, loss):
    sizes = (3, 4, 2)
    model = MLP(list(sizes), activation=activation, seed=11)
    X, y = random_inputs(sizes, loss, n=5, seed=12)
    before = {name: value.copy() for name, value in model.params.items()}
    _, grads = loss_and_grads(model, X, y, loss=loss)
    numerical = numerical_gradient(model, X, y, loss=loss)
    assert set(numerical) == set(grads) == set(model.params)
    for name in grads:
        error = relative_error(grads[name], numerical[name])
        assert error < NUMERICAL_TOLERANCE, (
            f"{name}: backprop and central differences differ by {error:.2g} (relative), "
            f"expected < {NUMERICAL_TOLERANCE:g}")
        np.testing.assert_array_equal(model.params[name], before[name],
                                      err_msg=f"numerical_gradient left {name} perturbed")


def test_numerical_gradient_skips_frozen_parameters():
    model = MLP([3, 4, 2], activation="tanh", seed=0)
    model.frozen.add("layer0.weight")
    X, y = random_inputs((3, 4, 2), "cross_entropy", n=4, seed=1)
    numerical = numerical_gradient(model, X, y)
    assert set(numerical) == {"layer0.bias", "layer1.weight", "layer1.bias"}
    _, grads = loss_and_grads(model, X, y)
    for name in grads:
        assert relative_error(grads[name], numerical[name]) < NUMERICAL_TOLERANCE, name


# --- losses and accuracy ----------------------------------------------------------------------

def test_softmax_cross_entropy_is_the_mean_negative_log_likelihood():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 4))
    y = np.array([0, 3, 1, 1, 2, 0], dtype=np.int64)
    loss, dlogits = softmax_cross_entropy(logits, y)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    assert loss == pytest.approx(-log_probs[np.arange(6), y].mean(), rel=1e-12)
    one_hot = np.eye(4)[y]
    assert_close(dlogits, (np.exp(log_probs) - one_hot) / 6, "dlogits = (softmax − onehot)/n",
                 1e-12)


def test_softmax_cross_entropy_is_stable_for_huge_logits():
    # exp(1000) overflows: a stable implementation subtracts the row maximum first.
    logits = np.array([[1000.0, 0.0], [0.0, 1000.0]])
    loss, dlogits = softmax_cross_entropy(logits, np.array([0, 0]))
    assert loss == pytest.approx(500.0, rel=1e-12), "losses 0 and 1000, mean 500"
    assert np.all(np.isfinite(dlogits))
    assert_close(dlogits, np.array([[0.0, 0.0], [-0.5, 0.5]]), "dlogits", 1e-12)


def test_losses_equal_torch(torch):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((5, 3)) * 30          # large logits too
    y = np.array([2, 0, 1, 2, 2], dtype=np.int64)
    t_logits = torch.tensor(logits, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(t_logits, torch.tensor(y))
    expected.backward()
    loss, dlogits = softmax_cross_entropy(logits, y)
    assert_close(loss, expected.item(), "cross-entropy", AUTOGRAD_TOLERANCE)
    assert_close(dlogits, t_logits.grad.numpy(), "d cross-entropy / d logits",
                 AUTOGRAD_TOLERANCE)

    pred, target = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    t_pred = torch.tensor(pred, requires_grad=True)
    expected = torch.nn.MSELoss()(t_pred, torch.tensor(target))
    expected.backward()
    loss, dpred = mean_squared_error(pred, target)
    assert_close(loss, expected.item(), "MSE", AUTOGRAD_TOLERANCE)
    assert_close(dpred, t_pred.grad.numpy(), "d MSE / d pred", AUTOGRAD_TOLERANCE)


def test_mean_squared_error_averages_over_every_element():
    pred = np.array([[1.0, 2.0], [3.0, 4.0]])
    target = np.array([[1.0, 0.0], [0.0, 4.0]])
    loss, dpred = mean_squared_error(pred, target)
    assert loss == pytest.approx((4.0 + 9.0) / 4), "mean over all 4 elements, not over rows"
    assert_close(dpred, 2 * (pred - target) / 4, "dpred = 2 (pred − target) / size", 1e-15)


def test_accuracy_is_the_fraction_of_rows_whose_largest_logit_is_the_label():
    logits = np.array([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 0.0, 5.0], [4.0, 0.0, 1.0]])
    assert accuracy(logits, np.array([0, 1, 2, 2])) == pytest.approx(0.75)
    assert accuracy(logits, np.array([0, 1, 2, 0])) == pytest.approx(1.0)
    assert isinstance(accuracy(logits, np.array([0, 1, 2, 0])), float)


# --- optimizers: torch.optim ------------------------------------------------------------------

PARAM_SHAPES = {"layer0.weight": (4, 3), "layer0.bias": (3,),
                "layer1.weight": (3, 2), "layer1.bias": (2,)}
STEPS = 5
# (our name, our hyper-parameters, torch class, torch keyword arguments)
TORCH_OPTIMIZERS = [
    ("sgd", {}, "SGD", {}),
    ("sgd", {"weight_decay": 0.05}, "SGD", {"weight_decay": 0.05}),
    ("momentum", {}, "SGD", {"momentum": 0.9}),          # the documented default μ = 0.9
    ("momentum", {"momentum": 0.7, "weight_decay": 0.05}, "SGD",
     {"momentum": 0.7, "weight_decay": 0.05}),
    ("adam", {}, "Adam", {}),                            # betas (0.9, 0.999), eps 1e-8
    ("adam", {"betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.05}, "Adam",
     {"betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.05}),
]
TORCH_IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in hyper.items()) or 'defaults'}"
             for name, hyper, _, _ in TORCH_OPTIMIZERS]


def random_params(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape) for name, shape in PARAM_SHAPES.items()}


def random_gradients(seed: int, steps: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{name: rng.standard_normal(shape) for name, shape in PARAM_SHAPES.items()}
            for _ in range(steps)]


def run_against_torch(torch, name, hyper, torch_class, torch_kwargs, gradients, lrs):
    """Step ours and torch's with the same gradients (a missing key = no gradient that step);
    after each step, every parameter must agree."""
    params = random_params(seed=1)
    leaves = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in params.items()}
    optimizer = make_optimizer(name, lrs[0], **hyper)
    reference = getattr(torch.optim, torch_class)(list(leaves.values()), lr=lrs[0],
                                                  foreach=False, **torch_kwargs)
    for step, (grads, lr) in enumerate(zip(gradients, lrs), start=1):
        optimizer.lr = lr
        for group in reference.param_groups:
            group["lr"] = lr
        for key, leaf in leaves.items():
            leaf.grad = torch.tensor(grads[key]) if key in grads else None
        before = {key: value.copy() for key, value in params.items()}
        optimizer.step(params, grads)
        reference.step()
        for key in params:
            if key not in grads:
                np.testing.assert_array_equal(
                    params[key], before[key],
                    err_msg=f"{name}, step {step}: {key} had no gradient but was changed")
            assert_close(params[key], leaves[key].detach().numpy(),
                         f"{name} {hyper}, step {step}, {key} vs torch.optim.{torch_class}",
                         OPTIMIZER_TOLERANCE)


@pytest.mark.parametrize("name,hyper,torch_class,torch_kwargs", TORCH_OPTIMIZERS, ids=TORCH_IDS)
def test_optimizer_equals_torch(torch, name, hyper, torch_class, torch_kwargs):
    # The learning rate changes at step 4: `.lr` is read on every step, as a schedule needs.
    lrs = [0.1, 0.1, 0.1, 0.03, 0.03]
    run_against_torch(torch, name, hyper, torch_class, torch_kwargs,
                      random_gradients(seed=2, steps=STEPS), lrs)


@pytest.mark.parametrize("name,hyper,torch_class,torch_kwargs", TORCH_OPTIMIZERS, ids=TORCH_IDS)
def test_a_parameter_without_gradient_is_skipped_as_in_torch(torch, name, hyper, torch_class,
                                                             torch_kwargs):
    # torch keeps state per parameter: one skipped at a step keeps its momentum and (Adam) its
    # own step count t, so its bias correction lags the others'.
    gradients = random_gradients(seed=3, steps=STEPS)
    del gradients[1]["layer0.bias"]
    del gradients[2]["layer0.bias"]
    del gradients[0]["layer1.weight"]          # no gradient on the very first step
    run_against_torch(torch, name, hyper, torch_class, torch_kwargs, gradients, [0.1] * STEPS)


# --- optimizers: LARS and LAMB against the papers' formulas -----------------------------------

class ReferenceLARS:
    """LARS (You, Gitman & Ginsburg 2017), per parameter tensor:
    local = η‖w‖ / (‖g‖ + wd‖w‖) (1 if ‖w‖ or ‖g‖ is 0); v ← μv + local·(g + wd·w); w ← w − lr·v.
    """

    def __init__(self, lr, momentum=0.9, weight_decay=0.0, trust_coefficient=0.001):
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.trust_coefficient = trust_coefficient
        self.velocity = {}

    def step(self, params, grads):
        for name, g in grads.items():
            w = params[name]
            w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
            if w_norm == 0 or g_norm == 0:
                local = 1.0
            else:
                local = self.trust_coefficient * w_norm / (g_norm + self.weight_decay * w_norm)
            v = self.momentum * self.velocity.get(name, 0.0) + local * (g + self.weight_decay * w)
            self.velocity[name] = v
            params[name] = w - self.lr * v


class ReferenceLAMB:
    """LAMB (You et al. 2019), per parameter tensor with its own step count t:
    Adam moments of g with bias correction; r = m̂/(√v̂ + ε) + wd·w;
    trust = ‖w‖/‖r‖ (1 if either is 0); w ← w − lr·trust·r."""

    def __init__(self, lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.m, self.v, self.t = {}, {}, {}

    def step(self, params, grads):
        beta1, beta2 = self.betas
        for name, g in grads.items():
            w = params[name]
            t = self.t.get(name, 0) + 1
            m = beta1 * self.m.get(name, 0.0) + (1 - beta1) * g
            v = beta2 * self.v.get(name, 0.0) + (1 - beta2) * g * g
            self.t[name], self.m[name], self.v[name] = t, m, v
            m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
            r = m_hat / (np.sqrt(v_hat) + self.eps) + self.weight_decay * w
            w_norm, r_norm = np.linalg.norm(w), np.linalg.norm(r)
            trust = 1.0 if w_norm == 0 or r_norm == 0 else w_norm / r_norm
            params[name] = w - self.lr * trust * r


REFERENCES = {"lars": ReferenceLARS, "lamb": ReferenceLAMB}
LAYERWISE_CASES = [
    ("lars", 0.5, {}),
    ("lars", 0.5, {"momentum": 0.8, "weight_decay": 0.01, "trust_coefficient": 0.02}),
    ("lamb", 0.01, {}),
    ("lamb", 0.01, {"betas": (0.8, 0.99), "eps": 1e-5, "weight_decay": 0.01}),
]
LAYERWISE_IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in hyper.items()) or 'defaults'}"
                 for name, _, hyper in LAYERWISE_CASES]


def run_against_reference(name, lr, hyper, params, gradients):
    expected = {key: value.copy() for key, value in params.items()}
    optimizer = make_optimizer(name, lr, **hyper)
    reference = REFERENCES[name](lr, **hyper)
    for step, grads in enumerate(gradients, start=1):
        optimizer.step(params, grads)
        reference.step(expected, grads)
        for key in params:
            assert_close(params[key], expected[key],
                         f"{name} {hyper}, step {step}, {key} vs the paper's formula",
                         OPTIMIZER_TOLERANCE)


@pytest.mark.parametrize("name,lr,hyper", LAYERWISE_CASES, ids=LAYERWISE_IDS)
def test_layerwise_optimizer_equals_the_papers_formulas(name, lr, hyper):
    # The zero-norm cases: layer0.bias starts at 0 (‖w‖ = 0, as biases often do), layer1.bias
    # gets a zero gradient at step 3 (‖g‖ = 0).
    params = random_params(seed=4)
    params["layer0.bias"] = np.zeros(PARAM_SHAPES["layer0.bias"])
    gradients = random_gradients(seed=5, steps=STEPS)
    gradients[2]["layer1.bias"] = np.zeros(PARAM_SHAPES["layer1.bias"])
    run_against_reference(name, lr, hyper, params, gradients)


@pytest.mark.parametrize("name,lr,hyper", LAYERWISE_CASES, ids=LAYERWISE_IDS)
def test_layerwise_optimizer_skips_a_parameter_without_gradient(name, lr, hyper):
    # layer1.weight gets no gradient at step 2 and layer0.bias none at step 1: each keeps its
    # own state, and (LAMB) its own step count for the bias correction.
    gradients = random_gradients(seed=6, steps=STEPS)
    del gradients[1]["layer1.weight"]
    del gradients[0]["layer0.bias"]
    run_against_reference(name, lr, hyper, random_params(seed=7), gradients)


def test_lars_moves_a_zero_parameter_by_the_plain_gradient():
    # ‖w‖ = 0 would make the local rate 0 and freeze the tensor for ever: the rule says 1.
    params = {"b": np.zeros(3)}
    make_optimizer("lars", 0.1).step(params, {"b": np.array([1.0, 2.0, 3.0])})
    assert_close(params["b"], [-0.1, -0.2, -0.3], "zero w, first LARS step = −lr·g", 1e-15)


def test_lars_with_a_zero_gradient_applies_only_weight_decay():
    params = {"w": np.array([3.0, 4.0])}
    make_optimizer("lars", 0.1).step(params, {"w": np.zeros(2)})
    np.testing.assert_array_equal(params["w"], [3.0, 4.0], err_msg="g = 0, wd = 0: no move")
    make_optimizer("lars", 0.1, weight_decay=0.5).step(params, {"w": np.zeros(2)})
    assert_close(params["w"], [3.0 - 0.1 * 0.5 * 3.0, 4.0 - 0.1 * 0.5 * 4.0],
                 "g = 0: local = 1, v = wd·w", 1e-15)


def test_lamb_handles_zero_norms_without_nan():
    # ‖w‖ = 0: trust 1, and the first step is −lr·g/(|g| + ε), about −lr·sign(g).
    params = {"b": np.zeros(2)}
    g = np.array([1.0, -2.0])
    make_optimizer("lamb", 0.01).step(params, {"b": g})
    assert_close(params["b"], -0.01 * g / (np.abs(g) + 1e-6), "zero w, first LAMB step", 1e-12)
    # ‖r‖ = 0 (zero gradient, no weight decay): ‖w‖/‖r‖ = inf, inf·0 = NaN unless trust = 1.
    params = {"w": np.array([3.0, 4.0])}
    make_optimizer("lamb", 0.01).step(params, {"w": np.zeros(2)})
    np.testing.assert_array_equal(params["w"], [3.0, 4.0],
                                  err_msg="a zero gradient must leave w as it is, not NaN")


# --- optimizers: contract ---------------------------------------------------------------------

@pytest.mark.parametrize("name", OPTIMIZERS)
def test_frozen_parameters_are_never_changed_by_a_step(name):
    model = MLP([4, 5, 3], activation="relu", seed=0)
    model.frozen.update({"layer0.weight", "layer1.bias"})
    X, y = random_inputs((4, 5, 3), "cross_entropy", n=10, seed=1)
    arrays = dict(model.params)                   # the array objects, to check in-place updates
    before = {key: value.copy() for key, value in model.params.items()}
    optimizer = make_optimizer(name, 0.1)
    for _ in range(3):
        _, grads = loss_and_grads(model, X, y)
        optimizer.step(model.params, grads)
    for key in model.params:
        assert model.params[key] is arrays[key], f"{name}: {key} was replaced, not updated in place"
        if key in model.frozen:
            np.testing.assert_array_equal(model.params[key], before[key],
                                          err_msg=f"{name} changed frozen {key}")
        else:
            assert not np.array_equal(model.params[key], before[key]), \
                f"{name}: trainable {key} did not move in 3 steps"


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_step_leaves_the_gradients_unchanged(name):
    # As in torch: weight decay is added to a copy, never to the caller's gradient.
    params = random_params(seed=6)
    grads = random_gradients(seed=7, steps=1)[0]
    copies = {key: value.copy() for key, value in grads.items()}
    optimizer = make_optimizer(name, 0.1, weight_decay=0.1)
    optimizer.step(params, grads)
    optimizer.step(params, grads)
    for key in grads:
        np.testing.assert_array_equal(grads[key], copies[key],
                                      err_msg=f"{name}.step modified the gradient of {key}")


def test_optimizers_are_the_documented_five():
    assert tuple(OPTIMIZERS) == ("sgd", "momentum", "adam", "lars", "lamb")


def test_an_unknown_optimizer_is_named_with_the_valid_ones():
    with pytest.raises(ValueError) as error:
        make_optimizer("adagrad", 0.1)
    message = str(error.value)
    assert "adagrad" in message, f"the message must name the bad value: {message!r}"
    for name in OPTIMIZERS:
        assert name in message, f"the message must list {name!r}: {message!r}"


# --- data -------------------------------------------------------------------------------------

def assert_identical(first, second, what):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b, err_msg=f"{what}: same seed, different arrays")


def assert_some_differ(first, second, what):
    assert any(np.shape(a) != np.shape(b) or not np.array_equal(a, b)
               for a, b in zip(first, second)), f"{what}: different seeds, identical arrays"


def rows_sorted(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Rows of [X | y] in lexicographic order: equal multisets of examples give equal arrays."""
    table = np.column_stack([X, y])
    return table[np.lexsort(table.T[::-1])]


@pytest.mark.parametrize("test_fraction", [0.25, 0.1, 0.5])
def test_digits_is_a_split_of_all_1797_images_scaled_to_0_1(test_fraction):
    X_train, y_train, X_test, y_test = digits(test_fraction=test_fraction, seed=0)
    assert X_train.shape == (len(y_train), 64) and X_test.shape == (len(y_test), 64)
    assert X_train.dtype == X_test.dtype == np.float64
    assert y_train.dtype == y_test.dtype == np.int64
    assert len(y_train) + len(y_test) == 1797
    assert abs(len(y_test) - test_fraction * 1797) <= 1, (
        f"{len(y_test)} test images for test_fraction={test_fraction}, expected about "
        f"{test_fraction * 1797:.1f}")
    both = np.vstack([X_train, X_test])
    assert both.min() == 0.0 and both.max() == 1.0, "pixels 0..16 scaled by 1/16"
    images, labels = load_digits()
    # Every image lands in exactly one half, with its own label: same multiset of (x, y).
    np.testing.assert_array_equal(
        rows_sorted(both, np.concatenate([y_train, y_test])),
        rows_sorted(images.reshape(1797, 64) / 16.0, labels),
        err_msg="train ∪ test must be the 1,797 digits, each once, pixels/16, labels kept")


def test_digits_split_is_seeded():
    assert_identical(digits(seed=1), digits(seed=1), "digits")
    assert_some_differ(digits(seed=1), digits(seed=2), "digits")


@pytest.mark.parametrize("classes,dim", [(3, 2), (5, 7), (1, 2)])
def test_gaussian_mixture_shapes_types_and_labels(classes, dim):
    X, y = gaussian_mixture(300, classes=classes, dim=dim, spread=0.5, seed=0)
    assert X.shape == (300, dim) and X.dtype == np.float64
    assert y.shape == (300,) and y.dtype == np.int64
    assert np.all(np.isfinite(X))
    assert set(np.unique(y)) == set(range(classes)), "300 points, every class present"


def test_gaussian_mixture_is_seeded():
    assert_identical(gaussian_mixture(50, seed=3), gaussian_mixture(50, seed=3), "mixture")
    assert_some_differ(gaussian_mixture(50, seed=3), gaussian_mixture(50, seed=4), "mixture")


@pytest.mark.parametrize("sizes", [(10, 32, 1), (3, 8, 8, 2), (4, 2)], ids=arch_id)
def test_teacher_shapes_and_types(sizes):
    X, Y = teacher(40, sizes=sizes, noise=0.1, seed=0)
    assert X.shape == (40, sizes[0]) and X.dtype == np.float64
    assert Y.shape == (40, sizes[-1]) and Y.dtype == np.float64
    assert np.all(np.isfinite(X)) and np.all(np.isfinite(Y))
    assert np.std(Y) > 0


def test_teacher_is_seeded():
    assert_identical(teacher(30, seed=5), teacher(30, seed=5), "teacher")
    assert_some_differ(teacher(30, seed=5), teacher(30, seed=6), "teacher")


@pytest.mark.parametrize("nonzero", [0, 1, 5, 100])
def test_sparse_regression_has_exactly_nonzero_weights(nonzero):
    X, y, w_true = sparse_regression(60, d=100, nonzero=nonzero, noise=0.1, seed=0)
    assert X.shape == (60, 100) and y.shape == (60,) and w_true.shape == (100,)
    assert X.dtype == y.dtype == w_true.dtype == np.float64
    assert np.count_nonzero(w_true) == nonzero


def test_sparse_regression_is_linear_plus_noise_of_the_given_size():
    X, y, w_true = sparse_regression(50, d=20, nonzero=3, noise=0.0, seed=1)
    assert_close(y, X @ w_true, "noise=0: y = X w_true", 1e-12)
    X, y, w_true = sparse_regression(4000, d=20, nonzero=3, noise=0.3, seed=1)
    residual = np.std(y - X @ w_true)
    assert residual == pytest.approx(0.3, rel=0.1), \
        f"the residual y − X w_true has std {residual:.3f}, expected the noise 0.3"


def test_sparse_regression_is_seeded():
    assert_identical(sparse_regression(30, seed=2), sparse_regression(30, seed=2), "sparse")
    assert_some_differ(sparse_regression(30, seed=2), sparse_regression(30, seed=3), "sparse")


def assert_batches_partition(batches, n, batch_size):
    sizes = [len(batch) for batch in batches]
    expected = [batch_size] * (n // batch_size) + ([n % batch_size] if n % batch_size else [])
    assert sizes == expected, f"batch sizes {sizes} for n={n}, batch_size={batch_size}, " \
                              f"expected {expected}"
    for batch in batches:
        assert np.issubdtype(np.asarray(batch).dtype, np.integer), "indices must be integers"
    flat = np.concatenate(batches) if batches else np.array([], dtype=np.int64)
    assert sorted(flat.tolist()) == list(range(n)), "each index 0..n−1 exactly once"


@pytest.mark.parametrize("n,batch_size", [(10, 3), (12, 4), (5, 10), (1, 1), (7, 7), (0, 4)])
def test_batch_indices_cover_each_index_once(n, batch_size):
    assert_batches_partition(batch_indices(n, batch_size, seed=0), n, batch_size)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.integers(1, 300), st.integers(1, 64), st.integers(0, 2**31))
def test_batch_indices_always_partition(n, batch_size, seed):
    assert_batches_partition(batch_indices(n, batch_size, seed), n, batch_size)


def test_batch_indices_are_a_seeded_shuffle():
    first, again = batch_indices(50, 8, seed=1), batch_indices(50, 8, seed=1)
    assert_identical(first, again, "batch_indices")
    other = np.concatenate(batch_indices(50, 8, seed=2))
    assert not np.array_equal(np.concatenate(first), other), "seeds 1 and 2, same order"
    assert not np.array_equal(np.concatenate(first), np.arange(50)), "not shuffled"


# --- bad input --------------------------------------------------------------------------------

def test_labels_of_the_wrong_length_are_named():
    with pytest.raises(ValueError) as error:
        softmax_cross_entropy(np.zeros((9, 3)), np.zeros(6, dtype=np.int64))
    message = str(error.value)
    assert "6" in message and "9" in message, \
        f"the message must give both lengths (6 labels, 9 rows): {message!r}"


@pytest.mark.parametrize("bad", [11, 7, -3])
def test_labels_out_of_range_are_named(bad):
    y = np.array([0, 1, bad, 2], dtype=np.int64)
    with pytest.raises(ValueError) as error:
        softmax_cross_entropy(np.zeros((4, 7)), y)
    message = str(error.value)
    assert str(bad) in message, f"the message must name the bad label {bad}: {message!r}"


@pytest.mark.parametrize("sizes", [[], [5]])
def test_an_mlp_needs_at_least_two_sizes(sizes):
    with pytest.raises(ValueError, match="sizes"):
        MLP(sizes)


def test_an_unknown_activation_is_named():
    with pytest.raises(ValueError) as error:
        MLP([3, 4, 2], activation="sigmoid")
    message = str(error.value)
    assert "sigmoid" in message, f"the message must name the bad value: {message!r}"
    assert "relu" in message and "tanh" in message, \
        f"the message must list the valid activations: {message!r}"


def test_numerical_gradient_names_an_unknown_loss():
    model = MLP([2, 3], seed=0)
    with pytest.raises(ValueError, match="unknown loss 'hinge'"):
        numerical_gradient(model, np.zeros((1, 2)), np.zeros(1, dtype=np.int64), loss="hinge")


def test_numerical_gradient_leaves_the_forward_cache_of_the_real_weights():
    rng = np.random.default_rng(5)
    model = MLP([3, 4, 2], activation="tanh", seed=1)
    X, y = rng.standard_normal((5, 3)), rng.integers(0, 2, size=5)
    _, fresh = loss_and_grads(model, X, y)
    numerical_gradient(model, X, y)
    _, dlogits = softmax_cross_entropy(model.forward(X), y)
    again = model.backward(dlogits)
    assert all(np.array_equal(fresh[k], again[k]) for k in fresh)


def test_teacher_classes_is_seeded_and_splits_one_teacher():
    from dsml.train.data import teacher_classes
    X, y, Xt, yt = teacher_classes(500, 200, dim=7, classes=4, seed=2)
    assert X.shape == (500, 7) and Xt.shape == (200, 7) and y.dtype == np.int64
    assert set(np.unique(np.concatenate([y, yt]))) <= set(range(4))
    again = teacher_classes(500, 200, dim=7, classes=4, seed=2)
    assert all(np.array_equal(a, b) for a, b in zip((X, y, Xt, yt), again))
    other = teacher_classes(500, 200, dim=7, classes=4, seed=3)
    assert not np.array_equal(other[0], X)
    # the test set is labelled by the same teacher: a larger draw starts with the same examples
    bigger = teacher_classes(700, 0, dim=7, classes=4, seed=2)
    assert np.array_equal(bigger[0][500:], Xt) and np.array_equal(bigger[1][500:], yt)


@pytest.mark.parametrize("args", [(-1, 0), (10, -1), (10, 0, 0), (10, 0, 5, 1)])
def test_teacher_classes_names_bad_sizes(args):
    from dsml.train.data import teacher_classes
    with pytest.raises(ValueError, match="need n_train"):
        teacher_classes(*args)
