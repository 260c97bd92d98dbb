"""Generated from notebooks/week1_foundations_and_communication.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 9
import numpy as np


def half_performance_size(alpha: float, beta: float) -> float:
    """n½ = α/β bytes: the message size at which half the peak bandwidth 1/β is reached."""
    return alpha / beta


def effective_bandwidth(nbytes, alpha: float, beta: float):
    """n / (α + nβ) bytes/s: the bandwidth a stream of n-byte messages achieves."""
    nbytes = np.asarray(nbytes, dtype=float)
    return nbytes / (alpha + nbytes * beta)


# -- cell 72
def fit_alpha_beta(sizes, times) -> tuple[float, float]:
    """Least-squares fit of T(n) = α + nβ to measured one-way times.

    sizes in bytes, times in seconds; returns (alpha s, beta s/byte). Each point is
    weighted by 1/T, so that a 1 µs error on a tiny message counts as much as a 1 ms error
    on a large one (relative error), otherwise the largest messages decide α alone.
    """
    sizes = np.asarray(sizes, dtype=float)
    times = np.asarray(times, dtype=float)
    if sizes.shape != times.shape or sizes.ndim != 1 or len(sizes) < 2:
        raise ValueError(f"need two 1-D arrays of equal length ≥ 2, got shapes "
                         f"{sizes.shape} and {times.shape}")
    if np.any(times <= 0):
        raise ValueError("times must be > 0 seconds")
    weights = 1.0 / times
    design = np.column_stack([np.ones_like(sizes), sizes]) * weights[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, times * weights, rcond=None)
    if alpha < 0 or beta < 0:
        # Noisy timings can tip the fit below zero, which no network does. The least-squares
        # optimum with α, β ≥ 0 then lies on an edge: one of them 0, the other fitted alone.
        target = times * weights
        edges = [(0.0, target @ design[:, 1] / (design[:, 1] @ design[:, 1])),
                 (target @ design[:, 0] / (design[:, 0] @ design[:, 0]), 0.0)]
        alpha, beta = min(edges, key=lambda ab: np.sum((design @ np.array(ab) - target)**2))
    return float(alpha), float(beta)
