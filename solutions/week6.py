"""Reference solutions of week 6's exercises (failures, checkpoints, compression).

Each function has the name of the notebook stub it solves; `check(id, f)` passes for each.
"""
from __future__ import annotations

import math
import os
import tempfile

import numpy as np

from dsml.collectives.cost import cost


def gpu_mtbf_hours(interruptions, days, gpus):
    """Exercise 6.1: the fleet ran gpus × days × 24 GPU-hours per `interruptions` failures."""
    return gpus * days * 24 / interruptions


def young_checkpoint_interval(checkpoint_cost, mtbf):
    """Exercise 6.2: the waste δ/τ + τ/(2M) is smallest at τ = √(2δM)."""
    return math.sqrt(2 * checkpoint_cost * mtbf)


def job_wall_time(work, interval, checkpoint_cost, restart_cost, failures):
    """Exercise 6.3: replay the job segment by segment; a failure sends it back to the last
    completed checkpoint after a restart (which a failure may interrupt too)."""
    now, saved = 0.0, 0.0
    failures = list(failures)
    while saved < work:
        segment = min(interval, work - saved)
        end = now + segment + (0.0 if saved + segment >= work else checkpoint_cost)
        if failures and failures[0] < end:
            now = failures.pop(0) + restart_cost
            while failures and failures[0] < now:
                now = failures.pop(0) + restart_cost
            continue
        now, saved = end, saved + segment
    return now


def atomic_write(path, chunks):
    """Exercise 6.4: write to a temporary file in the same directory, flush and fsync it, then
    os.replace it onto `path`; on any error remove the temporary file and re-raise."""
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        with os.fdopen(handle, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def top_k(x, k):
    """Exercise 6.5: the k entries of largest magnitude: (indices, values with their signs)."""
    if not 1 <= k <= x.size:
        raise ValueError(f"k must be in 1..n = 1..{x.size}, got {k}")
    indices = np.argpartition(-np.abs(x), k - 1)[:k]
    return indices, x[indices]


def error_feedback_step(grad, residual, compress):
    """Exercise 6.6: send compress(grad + residual); keep what was not sent."""
    corrected = grad + residual
    sent = compress(corrected)
    return sent, corrected - sent


def qsgd_quantize(x, levels, rng):
    """Exercise 6.7: |x_i|/‖x‖·s rounded up with probability equal to its fractional part,
    down otherwise; times ‖x‖·sign(x_i)/s. Unbiased."""
    norm = np.linalg.norm(x)
    if norm == 0:
        return np.zeros_like(x)
    scaled = np.abs(x) / norm * levels
    lower = np.floor(scaled)
    level = lower + (rng.random(x.shape) < scaled - lower)
    return norm * np.sign(x) * level / levels


def compression_pays(nbytes, p, alpha, beta, ratio, throughput):
    """Exercise 6.8: compressed ring all-reduce plus the time to compress, against plain."""
    plain = cost("allreduce", "ring", p, nbytes, alpha, beta)
    compressed = cost("allreduce", "ring", p, nbytes / ratio, alpha, beta) + nbytes / throughput
    return bool(compressed < plain)


def reshard_plan(n, old_world, new_world, new_rank):
    """Exercise 6.9: cut [0, n) for both world sizes as np.array_split does; the new rank reads,
    from each old shard that overlaps its range, the overlap as offsets inside that shard."""
    def bounds(p, rank):
        base, extra = divmod(n, p)
        start = rank * base + min(rank, extra)
        return start, start + base + (1 if rank < extra else 0)
    start, stop = bounds(new_world, new_rank)
    plan = []
    for old in range(old_world):
        low, high = bounds(old_world, old)
        if max(low, start) < min(high, stop):
            plan.append((old, max(low, start) - low, min(high, stop) - low))
    return plan


def choose_timeout(period, stall_probability, stall_mean, beats, target):
    """Exercise 6.10: each of the B gaps may exceed T with probability p = 1 − (1 − target)^(1/B);
    a gap exceeds T when a stall (probability q) exceeds T − h: q·e^{−(T − h)/m} = p. Never
    below the period."""
    if not 0 < target < 1:
        raise ValueError(f"target must be a rate strictly between 0 and 1, got {target}")
    allowed = 1 - (1 - target) ** (1 / beats)
    return max(period, period + stall_mean * math.log(stall_probability / allowed))
