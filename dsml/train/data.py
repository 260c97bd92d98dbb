"""Generated from notebooks/week3_data_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 5
import numpy as np

from dsml.train.shipped import load_digits


def _rng(seed) -> np.random.Generator:
    return np.random.default_rng(seed)


def digits(test_fraction: float = 0.25, seed: int = 0):
    """The shipped digits as (X_train, y_train, X_test, y_test): X float64 of shape (n, 64) with
    pixels scaled to [0, 1], y int64 labels 0..9, split by a seeded shuffle."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    images, labels = load_digits()
    X = images.reshape(len(images), -1).astype(np.float64) / 16.0
    order = _rng(seed).permutation(len(X))
    n_test = int(round(test_fraction * len(X)))
    test, train = order[:n_test], order[n_test:]
    return X[train], labels[train], X[test], labels[test]


def gaussian_mixture(n: int, classes: int = 3, dim: int = 2, spread: float = 1.0, seed: int = 0):
    """n points in `classes` Gaussian blobs (standard deviation `spread`) whose centres sit on a
    circle of radius 3 in the first two coordinates: (X float64 (n, dim), y int64 (n,))."""
    if dim < 2 or classes < 1 or n < 0:
        raise ValueError(f"need n ≥ 0, classes ≥ 1 and dim ≥ 2, got n={n}, classes={classes}, "
                         f"dim={dim}")
    rng = _rng(seed)
    y = rng.integers(0, classes, size=n)
    angles = 2 * np.pi * np.arange(classes) / classes
    centres = np.zeros((classes, dim))
    centres[:, 0], centres[:, 1] = 3 * np.cos(angles), 3 * np.sin(angles)
    X = centres[y] + spread * rng.standard_normal((n, dim))
    return X, y.astype(np.int64)


def teacher(n: int, sizes=(10, 32, 1), noise: float = 0.1, seed: int = 0):
    """Regression targets from a random tanh network (the 'teacher') plus Gaussian noise:
    (X float64 (n, sizes[0]), Y float64 (n, sizes[-1])). A student with the same shape can fit
    it down to the noise."""
    rng = _rng(seed)
    X = rng.standard_normal((n, sizes[0]))
    h = X
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        h = h @ (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in))
        if i < len(sizes) - 2:
            h = np.tanh(h)
    return X, h + noise * rng.standard_normal(h.shape)


# -- cell 6
def teacher_classes(n_train: int, n_test: int = 0, dim: int = 20, classes: int = 10,
                    seed: int = 0):
    """A classification problem with as many examples as wanted: inputs N(0, I), labels the
    arg-max of a random tanh network's outputs (the teacher, fixed by `seed`). Returns
    (X_train, y_train, X_test, y_test); X float64 (n, dim), y int64."""
    if n_train < 0 or n_test < 0 or dim < 1 or classes < 2:
        raise ValueError(f"need n_train, n_test ≥ 0, dim ≥ 1, classes ≥ 2; got {n_train}, "
                         f"{n_test}, {dim}, {classes}")
    rng = _rng(seed)
    w1 = rng.standard_normal((dim, 64)) / np.sqrt(dim)
    w2 = rng.standard_normal((64, classes)) / np.sqrt(64)
    X = rng.standard_normal((n_train + n_test, dim))
    y = np.argmax(np.tanh(X @ w1) @ w2, axis=1).astype(np.int64)
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def sparse_regression(n: int, d: int = 100, nonzero: int = 5, noise: float = 0.1, seed: int = 0):
    """y = X w + noise with only `nonzero` of the d weights non-zero (week 4's sparse updates):
    (X (n, d), y (n,), w_true (d,))."""
    if not 0 <= nonzero <= d:
        raise ValueError(f"nonzero must be in 0..d={d}, got {nonzero}")
    rng = _rng(seed)
    w = np.zeros(d)
    w[rng.choice(d, size=nonzero, replace=False)] = rng.choice([-1.0, 1.0], size=nonzero) * \
        rng.uniform(1.0, 3.0, size=nonzero)
    X = rng.standard_normal((n, d))
    return X, X @ w + noise * rng.standard_normal(n), w


def batch_indices(n: int, batch_size: int, seed: int):
    """A seeded shuffle of range(n) cut into mini-batches of `batch_size` (the last may be
    smaller): one epoch's worth, each example exactly once."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
    order = _rng(seed).permutation(n)
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]
