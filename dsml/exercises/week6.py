"""Plumbing (hand-written): the checkers of week 6's exercises (failures, checkpoints, compression).

Each checker calls the learner's function on inputs different from the worked example in the
notebook and raises `Wrong` with a hint that says what was tried, what was expected, what came
back and what to reconsider. The references are written here, independently of the week's
modules: the per-GPU MTBF and Young's interval are formulas; the wall time of a job with
checkpoints is replayed failure by failure from explicit failure times; an atomic write is
attacked by a data source that fails half way and must leave the old file whole and no temporary
file behind; top-k, error feedback and QSGD are held against NumPy (QSGD statistically: a seeded
mean over many draws within a tolerance set by their number and QSGD's known per-entry variance
p(1 − p)(‖x‖/s)², on vectors with no entry near a whole level, and values on its grid); and
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
from dsml.exercises import Wrong, as_float, checker, fresh_rng


# --- 6.1: a GPU's mean time between failures from a fleet's count -------------------------------

# (unexpected interruptions, days, GPUs): Llama 3's 419 in 54 days on 16,384 GPUs among them.
MTBF_CASES = [(419, 54, 16384), (100, 30, 1024), (7, 2, 64), (1, 1, 1), (35, 60, 992)]


def gpu_mtbf_reference(interruptions, days, gpus) -> float:
    """Hours: the fleet ran gpus × days × 24 GPU-hours and lost `interruptions` of them."""
    return gpus * days * 24 / interruptions


@checker("6.1", "one GPU's mean time between failures",
         builds=("dsml.fault.interruption_statistics",))
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

# The waste δ/τ + τ/(2M) is flat at its minimum: a numerical minimiser finds τ only to about the
# square root of the float64 precision (~1.5e-8), so that is the tolerance a right answer meets.
YOUNG_RTOL = 1e-7


def _distinct(got: float, expected: float) -> tuple[str, str]:
    """`got` and `expected` printed with just enough significant digits to tell them apart (a
    hint never says "returned 3219.94 s, expected 3219.94 s")."""
    for digits in range(6, 18):
        shown = (f"{got:.{digits}g}", f"{expected:.{digits}g}")
        if shown[0] != shown[1]:
            return shown
    return shown


def fresh_young_cases(rng, count: int = 3) -> list:
    """`count` (δ, M) pairs drawn from `rng`: δ from 0.5 s to 10 min and M from 1 h to 100 days,
    log-uniform, each rounded to 4 significant digits so that the hint shows them exactly."""
    def draw(low, high):
        return float(f"{math.exp(rng.uniform(math.log(low), math.log(high))):.4g}")
    return [(draw(0.5, 600.0), draw(3600.0, 100 * 86400.0)) for _ in range(count)]


@checker("6.2", "Young's checkpoint interval", builds=("dsml.fault.young_interval",))
def check_young_checkpoint_interval(young_checkpoint_interval):
    cases = [(case, False) for case in YOUNG_CASES]
    cases += [(case, True) for case in fresh_young_cases(fresh_rng())]
    for (delta, mtbf), fresh in cases:
        expected = math.sqrt(2 * delta * mtbf)
        call = f"young_checkpoint_interval(checkpoint_cost={delta:g}, mtbf={mtbf:g})"
        got = as_float(young_checkpoint_interval(delta, mtbf), call)
        if math.isclose(got, expected, rel_tol=YOUNG_RTOL):
            continue
        if math.isclose(got, math.sqrt(delta * mtbf), rel_tol=1e-6):
            advice = ("The factor 2 is missing: the waste δ/τ + τ/(2M) is smallest where "
                      "its derivative in τ is zero.")
        elif math.isclose(got, 2 * delta * mtbf, rel_tol=1e-6):
            advice = "That is τ², not τ: take the square root."
        elif math.isclose(got, math.sqrt(2 * delta / mtbf), rel_tol=1e-6):
            advice = ("The interval grows with the MTBF: rarer failures, rarer checkpoints. "
                      "Check which of δ and M is in the numerator.")
        elif math.isclose(got, expected, rel_tol=1e-3):
            advice = (f"Close, but not within the relative tolerance {YOUNG_RTOL:g}: if you "
                      f"minimise numerically, tighten the search's tolerance.")
        else:
            advice = ("Minimise the waste per unit of work, δ/τ (checkpointing) + τ/(2M) (half "
                      "an interval lost per failure), over τ.")
        shown_got, shown_expected = _distinct(got, expected)
        if fresh:      # say the inputs, so the learner can rerun them; not the answer
            raise Wrong(f"{call} returned {shown_got} s, not the interval that minimises the "
                        f"waste (a case drawn afresh for this check: call your function with "
                        f"these inputs to reproduce it). {advice}")
        raise Wrong(f"{call} returned {shown_got} s, expected {shown_expected} s. {advice}")
    return "√(2δM) over five orders of magnitude, fixed and fresh cases"


# --- 6.3: the wall time of a job that checkpoints --------------------------------------------

def job_wall_time_reference(work, interval, checkpoint_cost, restart_cost, failures) -> float:
    """Replay the job: segments of `interval` seconds of work, each but the last followed by a
    checkpoint of `checkpoint_cost`; a failure (absolute wall times, sorted) loses the work
    since the last checkpoint completed, then `restart_cost` seconds pass (a failure during a
    restart starts it again) before work resumes."""
    return _replay(work, interval, checkpoint_cost, restart_cost, failures)


def _replay(work, interval, checkpoint_cost, restart_cost, failures, *, final_checkpoint=False,
            saved_before_checkpoint=False, restart_shielded=False, from_the_start=False) -> float:
    """The replay, and with one flag set, a plausible mistake: a checkpoint after the last
    segment too; a segment counted as saved before its checkpoint completed; failures during a
    restart ignored; every failure sending the job back to its start."""
    now, saved, pending = 0.0, 0.0, list(failures)
    while saved < work:
        segment = min(interval, work - saved)
        last = saved + segment >= work
        end = now + segment + (0.0 if last and not final_checkpoint else checkpoint_cost)
        at_risk_until = now + segment if saved_before_checkpoint else end
        if pending and pending[0] < at_risk_until:     # fails during the segment or checkpoint
            now = pending.pop(0)
            while True:                                # restart, perhaps interrupted again
                back = now + restart_cost
                if pending and pending[0] < back:
                    if restart_shielded:
                        pending.pop(0)
                        continue
                    now = pending.pop(0)
                    continue
                now = back
                break
            if from_the_start:
                saved = 0.0
            continue
        now, saved = end, saved + segment
    return now


# Each plausible mistake of 6.3, as the flag of `_replay` that makes it, and its hint.
JOB_MISTAKES = [
    ({"final_checkpoint": True}, "a checkpoint after the last segment — the job is done then, "
                                 "there is nothing left to protect"),
    ({"saved_before_checkpoint": True}, "a segment counted as saved before its checkpoint "
                                        "completed — a crash during a checkpoint loses that "
                                        "segment too"),
    ({"restart_shielded": True}, "crashes during a restart ignored — such a crash starts the "
                                 "restart over"),
    ({"from_the_start": True}, "every crash sending the job back to its start — it resumes "
                               "from the last completed checkpoint"),
]


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
        matches = [hint for flags, hint in JOB_MISTAKES
                   if math.isclose(got, _replay(work, interval, delta, restart, failures, **flags),
                                   rel_tol=1e-9)]
        if failures and restart and math.isclose(
                got, job_wall_time_reference(work, interval, delta, 0.0, failures), rel_tol=1e-9):
            matches.append("the restarts left out — each crash also costs `restart_cost` "
                           "seconds before work resumes")
        if len(matches) == 1:
            advice = f"That is what the job takes with {matches[0]}."
        elif matches:
            advice = ("That is what the job takes with one of these mistakes: "
                      + "; or ".join(matches) + ".")
        elif not failures:
            advice = ("There are no crashes here: count the work and the checkpoints between "
                      "segments.")
        else:
            advice = ("Walk through the events in time order: segment end, checkpoint end, "
                      "crash, restart end. Crashes come at absolute wall times.")
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


@checker("6.4", "an atomic write", builds=("dsml.checkpoint.write_atomically",))
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


def _topk_advice(x, k, indices) -> str:
    """Names the mistake that keeps these indices, when one does."""
    kept = set(indices.tolist())
    if kept == set(np.argsort(-x, kind="stable")[:k].tolist()):
        return ("Those are the k largest *values*: a gradient entry of −3 matters more than "
                "one of 2, so rank by magnitude.")
    if kept == set(np.argsort(np.abs(x), kind="stable")[:k].tolist()):
        return "Those are the k *smallest* magnitudes: keep the largest."
    if kept == set(np.argsort(x, kind="stable")[:k].tolist()):
        return "Those are the k smallest values: rank by magnitude, largest first."
    return "Keep the k entries of largest |x|."


@checker("6.5", "top-k sparsification", builds=("dsml.compression.TopK.compress",))
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
            off = (" (one off: check the end of your slice)"
                   if abs(indices.size - k) == 1 and indices.size == values.size else "")
            raise Wrong(f"{call} returned {indices.size} indices and {values.size} values; "
                        f"expected k = {k} of each{off}.")
        if set(indices.tolist()) != want:
            raise Wrong(f"{call} kept indices {sorted(indices.tolist())[:12]}, expected "
                        f"{sorted(want)[:12]}. {_topk_advice(x, k, indices)}")
        if np.array_equal(values, x[indices]):
            continue
        if np.array_equal(values, np.abs(x[indices])):
            advice = ("The values lost their signs (|x| was used to choose the entries, but "
                      "the receiver needs x itself).")
        elif np.array_equal(np.sort(values), np.sort(x[indices])):
            advice = ("The right values, in another order than the indices: values[j] must "
                      "be x[indices[j]].")
        else:
            advice = "The values must be x at the kept indices, with their signs."
        raise Wrong(f"{call}: {advice} The receiver rebuilds the sparse vector from both.")
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
# Entries whose scaled magnitude |x_i|/‖x‖·s lies within this of a whole number are avoided: the
# level drawn is then almost never the other one, so the mean of a few thousand draws is far
# from normal and a right answer could be rejected.
QSGD_MARGIN = 0.1
# A right answer's mean lies this many of its known standard errors from x (per entry); with at
# most 50 entries a right answer fails with probability below 1e-5.
QSGD_SIGMAS = 5.0


def qsgd_vector(n: int, levels: int, rng) -> np.ndarray:
    """A vector of n normal entries, signs mixed, none of whose scaled magnitudes is within
    QSGD_MARGIN of a whole number (redrawn until so; seeded, so always the same vector)."""
    while True:
        x = rng.normal(size=n)
        scaled = np.abs(x) / np.linalg.norm(x) * levels
        fraction = scaled - np.floor(scaled)
        if np.all((fraction > QSGD_MARGIN) & (fraction < 1 - QSGD_MARGIN)):
            return x


def qsgd_moments(x, levels) -> tuple[np.ndarray, np.ndarray]:
    """Per entry, the known variance of an unbiased QSGD draw, p(1 − p)(‖x‖/s)² with p the
    fractional part of |x_i|/‖x‖·s, and the variance of a sample variance of one such draw
    (a scaled Bernoulli variable: p(1 − p)(1 − 3p + 3p²) c⁴ − p²(1 − p)² c⁴, c = ‖x‖/s)."""
    unit = np.linalg.norm(x) / levels
    scaled = np.abs(x) / np.linalg.norm(x) * levels
    p = scaled - np.floor(scaled)
    variance = p * (1 - p) * unit**2
    fourth = p * (1 - p) * (1 - 3 * p + 3 * p**2) * unit**4
    return variance, fourth - variance**2


@checker("6.7", "QSGD quantization",
         builds=("dsml.compression.qsgd", "dsml.compression._qsgd_levels"))
def check_qsgd_quantize(qsgd_quantize):
    rng = np.random.default_rng(6007)
    for n, levels in ((6, 1), (10, 4), (50, 16)):
        x = qsgd_vector(n, levels, rng)
        norm = np.linalg.norm(x)
        call = f"qsgd_quantize(x of length {n}, levels={levels}, rng)"
        draws = np.array([np.asarray(qsgd_quantize(x.copy(), levels, np.random.default_rng(seed)),
                                     dtype=float) for seed in range(QSGD_DRAWS)])
        if draws.shape != (QSGD_DRAWS, n):
            raise Wrong(f"{call} returned shape {draws.shape[1:]}; expected ({n},), the "
                        f"dequantized vector.")
        grid = np.abs(draws) / norm * levels
        if not np.all(np.isfinite(draws)) or not np.allclose(grid, np.round(grid), atol=1e-9):
            raise Wrong(f"{call} returned values off the grid ‖x‖₂·l/s (l = 0 … s) with the "
                        f"sign of x: is the scale the 2-norm, and is the level a whole number?")
        if np.any(np.sign(draws) * np.sign(x) < 0):
            raise Wrong(f"{call} flipped a sign: each entry keeps the sign of x_i.")
        variance, variance_of_variance = qsgd_moments(x, levels)
        standard_error = np.sqrt(variance / QSGD_DRAWS)
        deviation = np.abs(draws.mean(axis=0) - x) / standard_error
        if np.any(deviation > QSGD_SIGMAS):
            if np.all(draws == draws[0]):
                advice = ("It is deterministic, and rounding to one fixed level is biased: "
                          "draw the level at random.")
            else:
                advice = ("It is random but biased: check the probability of rounding up "
                          "(with it the mean is x).")
            worst = int(np.argmax(deviation))
            raise Wrong(f"{call}: over {QSGD_DRAWS} draws entry {worst} averages "
                        f"{draws[:, worst].mean():.4f}, but x has {x[worst]:.4f} "
                        f"({deviation[worst]:.0f} standard errors away) — the quantizer must "
                        f"be unbiased. {advice}")
        total = float(np.sum(draws.var(axis=0)))
        known = float(np.sum(variance))
        spread = math.sqrt(float(np.sum(variance_of_variance)) / QSGD_DRAWS)
        if total > known + QSGD_SIGMAS * spread:
            raise Wrong(f"{call}: unbiased, but its variance {total:.4g} is above the "
                        f"{known:.4g} of rounding to the two nearest levels: choose between "
                        f"the levels just below and just above |x_i|/‖x‖·s.")
    zero = np.zeros(5)
    call = "qsgd_quantize(np.zeros(5), levels=4, rng)"
    got = np.asarray(qsgd_quantize(zero.copy(), 4, np.random.default_rng(0)), dtype=float)
    if got.shape != (5,) or not np.all(got == 0):
        raise Wrong(f"{call} returned {np.round(got, 4)}; expected five zeros (‖x‖ = 0: there "
                    f"is nothing to scale, and nothing to divide by).")
    return (f"on the grid, sign-preserving, unbiased and with QSGD's variance "
            f"({QSGD_DRAWS} draws); x = 0 gives 0")


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


# --- 6.9: re-sharding a checkpoint onto another world size ---------------------------------------

# (n, old world, new world, new rank): the first case tells the mistakes apart; then more ranks
# than entries (empty shards), growing, the same world, one old rank, a new rank with nothing.
RESHARD_CASES = [(10, 4, 3, 1), (1000, 8, 6, 2), (1000, 6, 8, 7), (5, 8, 3, 2), (7, 1, 3, 0),
                 (37, 5, 5, 3), (5, 3, 8, 6), (101, 7, 4, 3)]


def _array_split_bounds(n, p):
    """[start, stop) of each of p shards of n, cut as np.array_split cuts (first n mod p longer)."""
    base, extra = divmod(n, p)
    starts = [r * base + min(r, extra) for r in range(p + 1)]
    return list(zip(starts[:-1], starts[1:]))


def _chunk_bounds(n, p):
    """The cut of torch.chunk: ⌈n/p⌉ each, the last ones shorter (or empty)."""
    size = -(-n // p)
    return [(min(r * size, n), min((r + 1) * size, n)) for r in range(p)]


def _floor_bounds(n, p):
    """n // p each, the remainder on the last rank."""
    base = n // p
    return [(r * base, (r + 1) * base if r < p - 1 else n) for r in range(p)]


def reshard_reference(n, old_world, new_world, new_rank, *, cut=_array_split_bounds,
                      local=True, keep_empty=False, inclusive=False) -> list:
    """The pieces new rank `new_rank` reads, as (old rank, start, stop) inside the old shard;
    the keyword arguments make the plausible mistakes (another cut, global offsets, empty pieces
    kept, an inclusive stop)."""
    start, stop = cut(n, new_world)[new_rank]
    pieces = []
    for old, (low, high) in enumerate(cut(n, old_world)):
        first, last = max(low, start), min(high, stop)
        if first >= last and not (keep_empty and low <= stop and high >= start):
            continue
        offset = low if local else 0
        pieces.append((old, first - offset, last - offset - (1 if inclusive else 0)))
    return pieces


RESHARD_MISTAKES = [
    ({"local": False}, "offsets in the whole vector: start and stop are offsets *inside* the "
                       "old rank's shard (subtract where that shard begins)"),
    ({"cut": _chunk_bounds}, "shards of ⌈n/p⌉ entries (torch.chunk's cut): here the first n mod "
                             "p shards are one longer than the rest"),
    ({"cut": _floor_bounds}, "shards of n // p with the remainder on the last rank: here the "
                             "first n mod p shards are one longer than the rest"),
    ({"keep_empty": True}, "empty pieces kept: leave out old shards that share no entry with "
                           "the new range"),
    ({"inclusive": True}, "an inclusive stop: stop is one past the last entry, as in a slice"),
]


def _as_plan(got, call) -> list:
    try:
        plan = [tuple(int(v) for v in piece) for piece in got]
    except (TypeError, ValueError):
        raise Wrong(f"{call} returned {got!r}; expected a list of (old_rank, start, stop)") \
            from None
    if any(len(piece) != 3 for piece in plan):
        raise Wrong(f"{call} returned {got!r}; each piece is three numbers (old_rank, start, "
                    f"stop)")
    return plan


@checker("6.9", "re-sharding a checkpoint onto another world size")
def check_reshard_plan(reshard_plan):
    for n, old_world, new_world, new_rank in RESHARD_CASES:
        call = (f"reshard_plan(n={n}, old_world={old_world}, new_world={new_world}, "
                f"new_rank={new_rank})")
        got = reshard_plan(n, old_world, new_world, new_rank)
        if got is None:
            raise Wrong(f"{call} returned None; did you forget a `return`?")
        plan = _as_plan(got, call)
        expected = reshard_reference(n, old_world, new_world, new_rank)
        if plan == expected:
            continue
        matches = [hint for flags, hint in RESHARD_MISTAKES
                   if plan == reshard_reference(n, old_world, new_world, new_rank, **flags)]
        if sorted(plan) == expected:
            advice = "The right pieces in another order: list them in the order of the vector."
        elif matches:
            advice = "It looks like " + "; or ".join(matches) + "."
        else:
            advice = ("Cut [0, n) for both world sizes the same way, find the old shards that "
                      "overlap the new rank's range, and give each overlap inside its shard.")
        raise Wrong(f"{call} returned {plan}. {advice}")
    return "shrinking, growing, empty shards and an unchanged world size"


# --- 6.10: a timeout for a target false-suspicion rate --------------------------------------------

# (period s, stall probability q, stall mean s, heartbeats B, target rate)
TIMEOUT_CASES = [(0.01, 0.05, 0.02, 50, 0.01), (1.0, 0.2, 3.0, 1000, 0.05),
                 (0.5, 0.001, 0.1, 10, 0.5), (0.01, 0.05, 0.02, 1, 0.05),
                 (2.0, 0.3, 0.5, 200, 1e-4), (0.1, 1.0, 0.05, 20, 0.1)]
TIMEOUT_RTOL = 1e-7          # a bisection or a root finder meets this; so does the closed form


def timeout_reference(period, q, stall_mean, beats, target, *, per_beat=False, period_left_out=False,
                      floor=True) -> float:
    """The smallest timeout T (s) with P(a live worker is suspected at least once in `beats`
    heartbeats) ≤ target, when a gap is period + Exp(stall_mean) with probability q and
    period otherwise: 1 − (1 − q e^{−(T − h)/m})^B = target; never below the period (a
    timeout shorter than the period suspects everyone). The keywords make the mistakes."""
    allowed = target if per_beat else 1 - (1 - target) ** (1 / beats)
    timeout = (0.0 if period_left_out else period) + stall_mean * math.log(q / allowed)
    return max(period, timeout) if floor else timeout


TIMEOUT_MISTAKES = [
    ({"per_beat": True}, "the target used for one heartbeat: a worker has B chances to be "
                         "suspected, so each gap may exceed T with a smaller probability"),
    ({"period_left_out": True}, "the period left out: a gap is the period plus the stall, so "
                                "the stall must exceed T minus the period"),
    ({"floor": False}, "a timeout below the period: then every gap exceeds it and every "
                       "worker is suspected"),
]


@checker("6.10", "a timeout for a target false-suspicion rate")
def check_choose_timeout(choose_timeout):
    for case in TIMEOUT_CASES:
        period, q, mean, beats, target = case
        call = (f"choose_timeout(period={period:g}, stall_probability={q:g}, stall_mean={mean:g}, "
                f"beats={beats}, target={target:g})")
        got = as_float(choose_timeout(*case), call)
        expected = timeout_reference(*case)
        if math.isclose(got, expected, rel_tol=TIMEOUT_RTOL):
            continue
        matches = [hint for flags, hint in TIMEOUT_MISTAKES
                   if math.isclose(got, timeout_reference(*case, **flags), rel_tol=1e-6)]
        if matches:
            advice = "It looks like " + "; or ".join(matches) + "."
        elif got > expected:
            advice = ("Longer than needed: the rate falls as the timeout grows, and the "
                      "smallest timeout that meets the target is asked for.")
        else:
            advice = ("Too short: with it more workers than the target are suspected. Write the "
                      "chance that one gap exceeds T, then that none of B gaps does.")
        shown_got, shown_expected = _distinct(got, expected)
        raise Wrong(f"{call} returned {shown_got} s, expected {shown_expected} s. {advice}")
    for target in (0.0, 1.0, -0.1):
        try:
            choose_timeout(0.01, 0.05, 0.02, 50, target)
        except ValueError:
            continue
        raise Wrong(f"choose_timeout(..., target={target:g}) returned; a target rate must lie "
                    f"strictly between 0 and 1: raise ValueError naming target.")
    return "from a rare short stall to stalls on every heartbeat"
