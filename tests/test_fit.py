"""Tests for dsml.net.fit: the α–β fit recovers exact data, never returns a negative
parameter however noisy the timings, and then returns the constrained least-squares optimum."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsml.net.fit import effective_bandwidth, fit_alpha_beta, half_performance_size

SIZES = [4**k for k in range(12)]


def weighted_residual(sizes, times, alpha, beta):
    sizes, times = np.asarray(sizes, float), np.asarray(times, float)
    return float(np.sum(((alpha + sizes * beta - times) / times) ** 2))


@pytest.mark.parametrize("alpha,beta", [(35e-6, 6e-10), (2e-6, 1e-10), (1e-3, 1e-8)])
def test_exact_data_is_recovered(alpha, beta):
    times = [alpha + n * beta for n in SIZES]
    got_alpha, got_beta = fit_alpha_beta(SIZES, times)
    assert got_alpha == pytest.approx(alpha, rel=1e-9)
    assert got_beta == pytest.approx(beta, rel=1e-9)


def test_noise_that_tips_alpha_negative_gives_alpha_zero():
    # A small message that happened to be fast: the unconstrained line crosses below 0.
    sizes, times = [1, 1000, 10000], [5e-6, 1e-7, 1e-5]
    design = np.column_stack([np.ones(3), sizes]) / np.array(times)[:, None]
    (free_alpha, _), *_ = np.linalg.lstsq(design, np.ones(3), rcond=None)
    assert free_alpha < 0                                 # the case this test is about
    alpha, beta = fit_alpha_beta(sizes, times)
    assert alpha == 0.0 and beta > 0


def test_noise_that_tips_beta_negative_gives_beta_zero():
    sizes, times = [1, 1000, 10000], [5e-6, 1e-6, 1e-6]
    alpha, beta = fit_alpha_beta(sizes, times)
    assert beta == 0.0 and alpha > 0


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.floats(1e-7, 1e-2), min_size=4, max_size=4))
def test_fit_is_the_best_nonnegative_line(times):
    sizes = [1, 100, 10_000, 1_000_000]
    alpha, beta = fit_alpha_beta(sizes, times)
    assert alpha >= 0 and beta >= 0
    best = weighted_residual(sizes, times, alpha, beta)
    # No non-negative line on a coarse grid around the answer does better.
    for a in np.linspace(0, 2 * max(alpha, 1e-6), 21):
        for b in np.linspace(0, 2 * max(beta, 1e-11), 21):
            assert best <= weighted_residual(sizes, times, a, b) * (1 + 1e-9) + 1e-15


@pytest.mark.parametrize("sizes,times,match", [
    ([1, 2], [1e-6], "equal length"),
    ([1], [1e-6], "≥ 2"),
    ([1, 2], [1e-6, 0.0], "> 0"),
])
def test_bad_input_is_named(sizes, times, match):
    with pytest.raises(ValueError, match=match):
        fit_alpha_beta(sizes, times)


def test_half_performance_size_halves_the_peak():
    alpha, beta = 10e-6, 4e-11
    n_half = half_performance_size(alpha, beta)
    assert float(effective_bandwidth(n_half, alpha, beta)) == pytest.approx(0.5 / beta)
