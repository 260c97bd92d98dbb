"""Reference solutions of week 4's exercises (parameter servers and asynchrony).

Each function has the name of the notebook stub it solves; `check(id, f)` passes for each
(4.1–4.4 and 4.7 on parameter servers; 4.5 and 4.6 are `dsml.exercises.week4.SPARSE_STEP` and
`CONFLICT`). The sparse step updates w in place; the others are formulas.
"""
from __future__ import annotations

import math

import numpy as np


def sparse_logistic_step(w, idx, x, y, lr):
    """The sparse SGD step of logistic regression, in place: with z = x·w[idx] and
    σ(z) = 1/(1 + e^(−z)), the log-loss −y log σ(z) − (1 − y) log(1 − σ(z)) has gradient
    (σ(z) − y)·x on the coordinates idx and 0 elsewhere, so w[idx] −= lr·(σ(z) − y)·x."""
    z = x @ w[idx]
    w[idx] -= lr * (1.0 / (1.0 + np.exp(-z)) - y) * x


def conflict_probability(d, k):
    """The probability that two examples, each touching k distinct coordinates drawn uniformly
    from d, share at least one: 1 − C(d − k, k)/C(d, k) (C(d − k, k) = 0 when 2k > d)."""
    return 1.0 - math.comb(d - k, k) / math.comb(d, k)


def busiest_server_bytes(workers, servers, nbytes):
    """Exercise 4.1: every worker pushes each server its keys; the first nbytes mod servers
    servers own ⌈n/S⌉ keys (np.array_split), so the busiest receives W·⌈n/S⌉ bytes."""
    return workers * -(-nbytes // servers)


def staleness_from_log(events):
    """Exercise 4.2: the applies since the worker's latest read, for each apply in order."""
    applied, read_at, out = 0, {}, []
    for kind, worker in events:
        if kind == "read":
            read_at[worker] = applied
        else:
            out.append(applied - read_at[worker])
            applied += 1
    return out


def bsp_expected_step(seconds, speeds, straggle_prob, straggle_factor):
    """Exercise 4.3: E[max] over independent workers, from P(max ≤ x) = Π_w P(T_w ≤ x) at the
    finitely many values a step can take."""
    values = sorted({seconds * s * f for s in speeds for f in (1.0, straggle_factor)})
    total, below = 0.0, 0.0
    for x in values:
        cdf = 1.0
        for s in speeds:
            cdf *= ((1 - straggle_prob) * (seconds * s <= x)
                    + straggle_prob * (seconds * s * straggle_factor <= x))
        total += x * (cdf - below)
        below = cdf
    return total


def may_start(clocks, worker, bound):
    """Exercise 4.4: at most `bound` clocks ahead of the slowest worker."""
    return clocks[worker] - min(clocks) <= bound


def backup_expected_step(seconds, speeds, straggle_prob, straggle_factor, backups):
    """Exercise 4.7: a step with b backups ends at the (W − b)-th finish. Its distribution:
    P(step ≤ x) = P(at least W − b workers done by x), the tail of the number done — a sum of
    independent Bernoulli variables, built one worker at a time — at each value a step can take."""
    needed = len(speeds) - backups
    values = sorted({seconds * s * f for s in speeds for f in (1.0, straggle_factor)})
    total, below = 0.0, 0.0
    for x in values:
        done = np.zeros(len(speeds) + 1)
        done[0] = 1.0
        for s in speeds:
            q = ((1 - straggle_prob) * (seconds * s <= x)
                 + straggle_prob * (seconds * s * straggle_factor <= x))
            done[1:] = done[1:] * (1 - q) + done[:-1] * q
            done[0] *= 1 - q
        cdf = done[needed:].sum()
        total += x * (cdf - below)
        below = cdf
    return total
