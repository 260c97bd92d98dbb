"""Generated from notebooks/week3_data_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 109
import numpy as np

ACTIVATIONS = ("relu", "tanh", None)


class MLP:
    """A multi-layer perceptron with explicit forward and backward passes.

    `sizes` = [inputs, hidden…, outputs]; layer i maps sizes[i] → sizes[i+1] as X @ W + b, with
    `activation` ("relu", "tanh" or None) between layers and none after the last. Parameters are
    `self.params[f"layer{i}.weight"]` and `…bias`, initialised with a seed (He for ReLU, Glorot
    otherwise). Names in `self.frozen` get no gradient."""

    def __init__(self, sizes, activation="relu", seed: int = 0):
        sizes = [int(s) for s in sizes]
        if len(sizes) < 2 or min(sizes) < 1:
            raise ValueError(f"sizes must list ≥ 2 positive layer widths, got {sizes}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of "
                             f"{', '.join(map(str, ACTIVATIONS))}")
        self.sizes, self.activation = sizes, activation
        rng = np.random.default_rng(seed)
        self.params = {}
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            scale = np.sqrt(2.0 / fan_in) if activation == "relu" else np.sqrt(1.0 / fan_in)
            self.params[f"layer{i}.weight"] = scale * rng.standard_normal((fan_in, fan_out))
            self.params[f"layer{i}.bias"] = np.zeros(fan_out)
        self.frozen = set()
        self._cache = None

    @property
    def layers(self) -> int:
        return len(self.sizes) - 1

    def n_params(self) -> int:
        return sum(p.size for p in self.params.values())

    def forward(self, X):
        """The output (B, sizes[-1]) for inputs X (B, sizes[0]); keeps what backward needs."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.sizes[0]:
            raise ValueError(f"expected inputs of shape (batch, {self.sizes[0]}), got {X.shape}")
        inputs, pre = [], []
        h = X
        for i in range(self.layers):
            inputs.append(h)
            z = h @ self.params[f"layer{i}.weight"] + self.params[f"layer{i}.bias"]
            pre.append(z)
            h = z if i == self.layers - 1 else activate(z, self.activation)
        self._cache = (inputs, pre)
        return h


# -- cell 111
from dsml.utils import add_to_class


@add_to_class(MLP)
def backward(self, dout):
    """Gradients of the loss for every parameter not in `frozen`, given dL/d(output)."""
    grads = dict(self.backward_layers(dout))
    return {name: grads[name] for name in self.params if name in grads}   # forward order


@add_to_class(MLP)
def backward_layers(self, dout):
    """The same gradients, one at a time as backward computes them, last layer first:
    (name, gradient) pairs from a generator (section 10 all-reduces them as they come)."""
    if self._cache is None:
        raise RuntimeError("call forward before backward")
    inputs, pre = self._cache
    g = np.asarray(dout, dtype=np.float64)
    for i in reversed(range(self.layers)):
        if i < self.layers - 1:
            g = g * activation_derivative(pre[i], self.activation)
        weight, bias = f"layer{i}.weight", f"layer{i}.bias"
        if weight not in self.frozen:
            yield weight, inputs[i].T @ g
        if bias not in self.frozen:
            yield bias, g.sum(axis=0)
        if i > 0:
            g = g @ self.params[weight].T


def activate(z, activation):
    """A hidden layer's nonlinearity: "relu", "tanh", or anything else for none (week 5's
    pipeline stages and ZeRO shards run the same layers with it)."""
    if activation == "relu":
        return np.maximum(z, 0.0)
    if activation == "tanh":
        return np.tanh(z)
    return z


def activation_derivative(z, activation):
    """d activate(z) / dz, elementwise, at the pre-activation z."""
    if activation == "relu":
        return (z > 0).astype(z.dtype)
    if activation == "tanh":
        return 1.0 - np.tanh(z) ** 2
    return np.ones_like(z)


# -- cell 112
def softmax_cross_entropy(logits, y):
    """Mean cross-entropy of integer labels y under softmax(logits), and its gradient."""
    logits = np.asarray(logits, dtype=np.float64)
    y = np.asarray(y)
    if logits.ndim != 2 or y.shape != (logits.shape[0],):
        raise ValueError(f"need logits (batch, classes) and one label per row, got logits "
                         f"{logits.shape} and labels {y.shape}")
    if len(y) and (y.min() < 0 or y.max() >= logits.shape[1]):
        raise ValueError(f"labels must be in 0..{logits.shape[1] - 1}, got {y.min()}..{y.max()}")
    shifted = logits - logits.max(axis=1, keepdims=True)      # exp never overflows
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    batch = len(y)
    loss = -log_probs[np.arange(batch), y].mean()
    dlogits = np.exp(log_probs)
    dlogits[np.arange(batch), y] -= 1.0
    return float(loss), dlogits / batch


def mean_squared_error(pred, target):
    """Mean over all elements of (pred − target)², and its gradient."""
    pred, target = np.asarray(pred, dtype=np.float64), np.asarray(target, dtype=np.float64)
    if pred.shape != target.shape:
        raise ValueError(f"pred {pred.shape} and target {target.shape} differ in shape")
    diff = pred - target
    return float(np.mean(diff ** 2)), 2.0 * diff / diff.size


LOSSES = {"cross_entropy": softmax_cross_entropy, "mse": mean_squared_error}


def loss_and_grads(model, X, y, loss: str = "cross_entropy"):
    """(loss, gradients) of `model` on the batch (X, y)."""
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; choose one of {', '.join(LOSSES)}")
    value, dout = LOSSES[loss](model.forward(X), y)
    return value, model.backward(dout)


def accuracy(logits, y) -> float:
    """Fraction of rows whose largest logit is at the label."""
    return float(np.mean(np.argmax(logits, axis=1) == np.asarray(y)))


# -- cell 113
def numerical_gradient(model, X, y, loss: str = "cross_entropy", eps: float = 1e-6):
    """Central differences (L(w + ε) − L(w − ε)) / 2ε, one parameter entry at a time — slow,
    and only for checking backward on small models. Leaves the model as it found it."""
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; choose one of {', '.join(LOSSES)}")
    grads = {}
    for name, param in model.params.items():
        if name in model.frozen:
            continue
        g = np.zeros_like(param)
        for index in np.ndindex(param.shape):
            saved = param[index]
            param[index] = saved + eps
            up = LOSSES[loss](model.forward(X), y)[0]
            param[index] = saved - eps
            down = LOSSES[loss](model.forward(X), y)[0]
            param[index] = saved
            g[index] = (up - down) / (2 * eps)
        grads[name] = g
    model.forward(X)                 # the cached activations are those of the real weights again
    return grads
