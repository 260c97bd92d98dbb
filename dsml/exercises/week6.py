"""Plumbing (hand-written): the checkers of week 6's exercises (failures, checkpoints, compression).

Each checker calls the learner's function on inputs different from the worked example in the
notebook and raises `Wrong` with a hint that says what was tried, what was expected, what came
back and what to reconsider. The references are written here, independently of the week's
modules: the per-GPU MTBF and Young's interval are formulas; the wall time of a job with
checkpoints is replayed failure by failure from explicit failure times; an atomic write is
attacked by a data source that fails half way and must leave the old file whole and no temporary
file behind; top-k, error feedback and QSGD are held against NumPy (QSGD statistically: a seeded
mean over many draws within a bound that the number of draws sets, and values on its grid); and
whether compression pays is week 2's ring all-reduce cost against the compressed one plus the
time to compress.

This module imports from the lower layers only (`dsml.collectives`), never the top-level `dsml`
package, which sits above it.
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np

from dsml.collectives.cost import cost
from dsml.exercises import Wrong, as_float, checker


# --- 6.1: a GPU's mean time between failures from a fleet's count -------------------------------

# (unexpected interruptions, days, GPUs): Llama 3's 419 in 54 days on 16,384 GPUs among them.
MTBF_CASES = [(419, 54, 16384), (100, 30, 1024), (7, 2, 64), (1, 1, 1), (35, 60, 992)]


def gpu_mtbf_reference(interruptions, days, gpus) -> float:
    """Hours: the fleet ran gpus × days × 24 GPU-hours and lost `interruptions` of them."""
    return gpus * days * 24 / interruptions


@checker("6.1", "one GPU's mean time between failures")
def check_gpu_mtbf_hours(gpu_mtbf_hours):
    for interruptions, days, gpus in MTBF_CASES:
        expected = gpu_mtbf_reference(interruptions, days, gpus)
        call = f"gpu_mtbf_hours(interruptions={interruptions}, days={days}, gpus={gpus})"
        got = as_float(gpu_mtbf_hours(interruptions, days, gpus), call)
        if math.isclose(got, expected, rel_tol=1e-9):
            continue
        job = days * 24 / interruptions
        if math.isclose(got, job, rel_tol=1e-9):
            advice = ("That is the job's MTBF. The job fails when any of its GPUs does: with N "
                      "GPUs failing independently, the job's MTBF is one GPU's divided by N.")
        elif math.isclose(got, expected / 24, rel_tol=1e-9):
            advice = "That is in days; the question asks for hours."
        elif math.isclose(got, gpus * days / interruptions * 60 * 24, rel_tol=1e-9):
            advice = "That is in minutes; the question asks for hours."
        else:
            advice = "GPU-hours run (GPUs × days × 24) divided by the interruptions."
        raise Wrong(f"{call} returned {got:.6g} h, expected {expected:.6g} h. {advice}")
    return "GPU-hours per failure, from a single GPU to Llama 3's fleet"


# --- 6.2: Young's interval ----------------------------------------------------------------------

YOUNG_CASES = [(60.0, 3600.0 * 24), (10.0, 3600.0), (300.0, 2.5 * 3600), (1.0, 1.0), (0.5, 1e6)]


@checker("6.2", "Young's checkpoint interval")
def check_young_checkpoint_interval(young_checkpoint_interval):
    for delta, mtbf in YOUNG_CASES:
        expected = math.sqrt(2 * delta * mtbf)
        call = f"young_checkpoint_interval(checkpoint_cost={delta:g}, mtbf={mtbf:g})"
        got = as_float(young_checkpoint_interval(delta, mtbf), call)
        if math.isclose(got, expected, rel_tol=1e-12):
            continue
        if math.isclose(got, math.sqrt(delta * mtbf), rel_tol=1e-9):
            advice = ("The factor 2 is missing: the waste δ/τ + τ/(2M) is smallest where "
                      "δ/τ² = 1/(2M).")
        elif math.isclose(got, 2 * delta * mtbf, rel_tol=1e-9):
            advice = "Take the square root: τ² = 2δM."
        elif math.isclose(got, math.sqrt(2 * delta / mtbf), rel_tol=1e-9):
            advice = ("The interval grows with the MTBF: rarer failures, rarer checkpoints. "
                      "τ = √(2δM).")
        else:
            advice = ("Minimise the waste per unit of work, δ/τ (checkpointing) + τ/(2M) (half "
                      "an interval lost per failure), over τ.")
        raise Wrong(f"{call} returned {got:.6g} s, expected {expected:.6g} s. {advice}")
    return "√(2δM) over five orders of magnitude"


# --- 6.3: the wall time of a job that checkpoints --------------------------------------------

def job_wall_time_reference(work, interval, checkpoint_cost, restart_cost, failures) -> float:
    """Replay the job: segments of `interval` seconds of work, each but the last followed by a
    checkpoint of `checkpoint_cost`; a failure (absolute wall times, sorted) loses the work
    since the last checkpoint completed, then `restart_cost` seconds pass (a failure during a
    restart starts it again) before work resumes."""
    now, saved, pending = 0.0, 0.0, list(failures)
    while saved < work:
        segment = min(interval, work - saved)
        last = saved + segment >= work
        end = now + segment + (0.0 if last else checkpoint_cost)
        if pending and pending[0] < end:               # fails during the segment or checkpoint
            now = pending.pop(0)
            while True:                                # restart, perhaps interrupted again
                back = now + restart_cost
                if pending and pending[0] < back:
                    now = pending.pop(0)
                    continue
                now = back
                break
            continue
        now, saved = end, saved + segment
    return now


def job_cases() -> list:
    """(work, interval, checkpoint cost, restart cost, failure times): no failure; failures in
    a segment, during a checkpoint and during a restart; a seeded exponential schedule."""
    rng = np.random.default_rng(6003)
    exponential = list(np.cumsum(rng.exponential(40.0, size=12)))
    return [(100.0, 30.0, 2.0, 5.0, []),
            (100.0, 30.0, 2.0, 5.0, [45.0]),
            (100.0, 30.0, 2.0, 5.0, [31.0]),          # during the first checkpoint
            (100.0, 30.0, 2.0, 5.0, [45.0, 47.0]),    # the second during the restart
            (50.0, 50.0, 1.0, 0.0, [10.0, 20.0]),     # one segment, no checkpoint at all
            (200.0, 25.0, 3.0, 4.0, exponential)]


@checker("6.3", "the wall time of a job that checkpoints")
def check_job_wall_time(job_wall_time):
    for work, interval, delta, restart, failures in job_cases():
        expected = job_wall_time_reference(work, interval, delta, restart, failures)
        shown = [round(f, 2) for f in failures]
        call = (f"job_wall_time(work={work:g}, interval={interval:g}, checkpoint_cost={delta:g}, "
                f"restart_cost={restart:g}, failures={shown})")
        got = as_float(job_wall_time(work, interval, delta, restart, list(failures)), call)
        if math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9):
            continue
        no_restart = job_wall_time_reference(work, interval, delta, 0.0, failures)
        with_final = expected + delta
        if failures and restart and math.isclose(got, no_restart, rel_tol=1e-9):
            advice = "Each failure also costs the restart: `restart_cost` seconds before work resumes."
        elif math.isclose(got, with_final, rel_tol=1e-9):
            advice = ("No checkpoint after the last segment: the job is done, there is nothing "
                      "left to protect.")
        elif not failures:
            advice = ("Without failures: the work, plus one checkpoint after every segment but "
                      "the last.")
        else:
            advice = ("A failure loses the work since the last *completed* checkpoint (a "
                      "checkpoint interrupted by a failure does not count); failures come at "
                      "absolute wall times, also during checkpoints and restarts.")
        raise Wrong(f"{call} returned {got:.6g} s, expected {expected:.6g} s. {advice}")
    return "failures in a segment, in a checkpoint, in a restart, and a seeded schedule"


# --- 6.4: an atomic write ---------------------------------------------------------------------

class _FailingSource:
    """An iterable of byte chunks that raises after `good` of them: a crash in mid-write."""

    def __init__(self, chunks, good):
        self.chunks, self.good = chunks, good

    def __iter__(self):
        for i, chunk in enumerate(self.chunks):
            if i == self.good:
                raise OSError("simulated crash while writing")
            yield chunk


@checker("6.4", "an atomic write")
def check_atomic_write(atomic_write):
    with tempfile.TemporaryDirectory(prefix="dsml-ex64-") as folder:
        folder = Path(folder)
        path = folder / "state.bin"
        new = [b"new-" * 1000, b"state" * 777, bytes(range(256)) * 9]
        atomic_write(path, iter(new))
        call = "atomic_write(path, chunks)"
        if not path.exists() or path.read_bytes() != b"".join(new):
            raise Wrong(f"{call} on a new path: the file should hold exactly the chunks, "
                        f"joined, once it returns.")
        old = path.read_bytes()
        crashed = None
        try:
            atomic_write(path, _FailingSource([b"x" * 5000, b"y" * 5000, b"z" * 5000], good=2))
        except OSError as error:
            crashed = error
        if crashed is None:
            raise Wrong(f"{call} with a source that fails half way returned normally; let the "
                        f"error propagate, so that the caller knows nothing was written.")
        if not path.exists() or path.read_bytes() != old:
            raise Wrong(f"{call} crashed half way and the file at `path` is no longer the old "
                        f"one: write to a temporary file in the same directory and replace "
                        f"`path` only when the new contents are complete (os.replace).")
        left = sorted(p.name for p in folder.iterdir() if p.name != path.name)
        if left:
            raise Wrong(f"{call} crashed half way and left {left} in the directory: remove the "
                        f"temporary file when the write fails.")
        atomic_write(path, iter([b"third"]))
        if path.read_bytes() != b"third" or [p.name for p in folder.iterdir()] != [path.name]:
            raise Wrong(f"{call} replacing an existing file: the file should hold the new "
                        f"contents and nothing else should be left in the directory.")
    return "whole file or old file, never half of one, and no temporary file left"


# --- 6.5: top-k ---------------------------------------------------------------------------------

TOPK_CASES = [(np.array([0.5, -3.0, 2.0, 0.1, -0.2]), 2), (np.linspace(-1, 1.1, 11), 3),
              (np.arange(6.0) - 2.5, 6), (np.array([4.0]), 1)]


def _topk_cases():
    rng = np.random.default_rng(6005)
    return TOPK_CASES + [(rng.normal(size=1000), 10), (rng.normal(size=257), 1)]


@checker("6.5", "top-k sparsification")
def check_top_k(top_k):
    for x, k in _topk_cases():
        call = f"top_k(x of length {x.size}, k={k})"
        got = top_k(x.copy(), k)
        try:
            indices, values = (np.asarray(part) for part in got)
        except (TypeError, ValueError):
            raise Wrong(f"{call} returned {got!r}; expected (indices, values)") from None
        want = set(np.argsort(-np.abs(x), kind="stable")[:k].tolist())
        if indices.shape != (k,) or values.shape != (k,):
            raise Wrong(f"{call} returned {indices.size} indices and {values.size} values; "
                        f"expected k = {k} of each.")
        if set(indices.tolist()) != want:
            by_value = set(np.argsort(-x, kind="stable")[:k].tolist())
            advice = ("Largest in magnitude: a gradient entry of −3 matters more than one of 2 "
                      "(use |x|)." if set(indices.tolist()) == by_value else
                      "Keep the k entries of largest |x|.")
            raise Wrong(f"{call} kept indices {sorted(indices.tolist())[:12]}, expected "
                        f"{sorted(want)[:12]}. {advice}")
        if not np.array_equal(values, x[indices]):
            raise Wrong(f"{call}: the values must be x at the kept indices, with their signs "
                        f"(x[indices]), so that the receiver can rebuild the sparse vector.")
    for k in (0, 7):
        try:
            top_k(np.ones(5), k)
        except ValueError:
            continue
        raise Wrong(f"top_k(np.ones(5), k={k}) returned; k must be in 1..n: raise ValueError "
                    f"naming k and n.")
    return "largest in magnitude, with their signs; k outside 1..n refused"


# --- 6.6: error feedback ----------------------------------------------------------------------

def _sign_scaled(v):
    return np.sign(v) * np.mean(np.abs(v))


def _keep_first_half(v):
    out = np.zeros_like(v)
    out[: v.size // 2] = v[: v.size // 2]
    return out


@checker("6.6", "one step of error feedback")
def check_error_feedback_step(error_feedback_step):
    rng = np.random.default_rng(6006)
    for compress in (_sign_scaled, _keep_first_half):
        residual = np.zeros(9)
        for step in range(4):
            grad = rng.normal(size=9)
            corrected = grad + residual
            want_sent = compress(corrected)
            want_residual = corrected - want_sent
            call = f"error_feedback_step(grad, residual, compress) (step {step})"
            got = error_feedback_step(grad.copy(), residual.copy(), compress)
            try:
                sent, new_residual = (np.asarray(part, dtype=float) for part in got)
            except (TypeError, ValueError):
                raise Wrong(f"{call} returned {got!r}; expected (sent, new residual)") from None
            if np.allclose(sent, compress(grad)) and step > 0 and not np.allclose(sent, want_sent):
                raise Wrong(f"{call}: what is sent ignores the residual. Compress grad + residual: "
                            f"what earlier steps did not send must be sent eventually.")
            if not np.allclose(sent, want_sent, rtol=1e-12, atol=1e-12):
                raise Wrong(f"{call}: sent {np.round(sent[:3], 4)}…, expected "
                            f"{np.round(want_sent[:3], 4)}…, compress(grad + residual).")
            if np.allclose(new_residual, grad - want_sent) and step > 0 \
                    and not np.allclose(new_residual, want_residual):
                raise Wrong(f"{call}: the new residual drops the old one. It is (grad + residual) "
                            f"− sent: everything not sent yet.")
            if not np.allclose(new_residual, want_residual, rtol=1e-12, atol=1e-12):
                raise Wrong(f"{call}: new residual {np.round(new_residual[:3], 4)}…, expected "
                            f"{np.round(want_residual[:3], 4)}…, (grad + residual) − sent.")
            residual = want_residual
    return "sent and residual over four steps, with a biased and a sparsifying compressor"


# --- 6.7: QSGD ------------------------------------------------------------------------------------

QSGD_DRAWS = 4000


@checker("6.7", "QSGD quantization")
def check_qsgd_quantize(qsgd_quantize):
    rng = np.random.default_rng(6007)
    for n, levels in ((6, 1), (10, 4), (50, 16)):
        x = rng.normal(size=n)
        norm = np.linalg.norm(x)
        call = f"qsgd_quantize(x of length {n}, levels={levels}, rng)"
        draws = np.array([np.asarray(qsgd_quantize(x.copy(), levels, np.random.default_rng(seed)),
                                     dtype=float) for seed in range(QSGD_DRAWS)])
        if draws.shape != (QSGD_DRAWS, n):
            raise Wrong(f"{call} returned shape {draws.shape[1:]}; expected ({n},), the "
                        f"dequantized vector.")
        grid = np.abs(draws) / norm * levels
        if not np.allclose(grid, np.round(grid), atol=1e-9):
            raise Wrong(f"{call} returned values off the grid ‖x‖·l/s (l = 0 … s) with the "
                        f"sign of x: scale by the 2-norm and round |x_i|/‖x‖·s up or down.")
        if np.any(np.sign(draws) * np.sign(x) < 0):
            raise Wrong(f"{call} flipped a sign: each entry keeps the sign of x_i.")
        spread = np.sqrt(draws.var(axis=0) / QSGD_DRAWS)
        bias = np.abs(draws.mean(axis=0) - x)
        if np.any(bias > 6 * spread + 1e-12):
            if np.all(draws.var(axis=0) < 1e-20):
                advice = ("It is deterministic: rounding to the nearest level is biased. Round "
                          "up with probability |x_i|/‖x‖·s − l, down otherwise.")
            else:
                advice = ("Round |x_i|/‖x‖·s up to l + 1 with probability |x_i|/‖x‖·s − l "
                          "(l its floor): then the mean is x.")
            worst = int(np.argmax(bias / (spread + 1e-30)))
            raise Wrong(f"{call}: over {QSGD_DRAWS} draws entry {worst} averages "
                        f"{draws[:, worst].mean():.4f}, but x has {x[worst]:.4f} — the "
                        f"quantizer must be unbiased. {advice}")
        variance = float(np.sum(draws.var(axis=0)))
        bound = min(n / levels**2, math.sqrt(n) / levels) * norm**2
        if variance > 1.2 * bound:
            raise Wrong(f"{call}: its variance {variance:.4g} exceeds QSGD's bound "
                        f"min(n/s², √n/s)·‖x‖² = {bound:.4g}.")
    return f"on the grid, sign-preserving, unbiased and within the variance bound ({QSGD_DRAWS} draws)"


# --- 6.8: when compression pays -----------------------------------------------------------------

# (bytes, ranks, α s, β s/B, compression ratio, compressor throughput B/s)
PAYS_CASES = [(100e6, 8, 5e-6, 1 / 1.25e9, 32.0, 2e9), (100e6, 8, 5e-6, 1 / 300e9, 32.0, 2e9),
              (1e3, 8, 30e-6, 1 / 1.25e9, 32.0, 1e8), (64e6, 4, 2e-6, 1 / 25e9, 4.0, 1e9),
              (64e6, 4, 2e-6, 1 / 10e9, 4.0, 20e9), (10e6, 64, 30e-6, 1 / 1.25e9, 1000.0, 5e8)]


def pays_reference(nbytes, p, alpha, beta, ratio, throughput) -> bool:
    plain = cost("allreduce", "ring", p, nbytes, alpha, beta)
    compressed = cost("allreduce", "ring", p, nbytes / ratio, alpha, beta) + nbytes / throughput
    return compressed < plain


@checker("6.8", "when compression pays")
def check_compression_pays(compression_pays):
    for case in PAYS_CASES:
        nbytes, p, alpha, beta, ratio, throughput = case
        expected = pays_reference(*case)
        call = (f"compression_pays(nbytes={nbytes:g}, p={p}, alpha={alpha:g}, beta={beta:g}, "
                f"ratio={ratio:g}, throughput={throughput:g})")
        got = compression_pays(*case)
        if not isinstance(got, (bool, np.bool_)):
            raise Wrong(f"{call} returned {got!r}; expected True or False")
        if bool(got) == expected:
            continue
        plain = cost("allreduce", "ring", p, nbytes, alpha, beta)
        free = cost("allreduce", "ring", p, nbytes / ratio, alpha, beta)
        if bool(got) == (free < plain) and expected is False:
            advice = (f"Compressing is not free: {nbytes / throughput * 1e3:.3g} ms to compress "
                      f"{nbytes:g} B at {throughput:g} B/s, against "
                      f"{(plain - free) * 1e3:.3g} ms saved on the wire.")
        else:
            advice = (f"Ring all-reduce: 2(p − 1)α + 2(p − 1)/p · n β; uncompressed "
                      f"{plain * 1e3:.3g} ms, compressed {free * 1e3:.3g} ms on the wire plus "
                      f"n / throughput to compress.")
        raise Wrong(f"{call} returned {got}, expected {expected}. {advice}")
    return "slow and fast networks, small and large messages"
