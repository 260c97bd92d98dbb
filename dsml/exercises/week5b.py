"""Plumbing (hand-written): the checkers of bonus week 5b's exercises (context parallelism).

Each checker calls the learner's function on inputs different from the worked example in the
notebook and raises `Wrong` with a hint naming the mistake it detected. The bytes of ring
attention are measured: the checker runs the notebook's `ring_attention_step`
(`dsml.context_parallel`) on the simulator and reads what rank 0 sent from the trace. The merge
of two partial softmax results is held against a one-shot softmax over the union of the keys,
and the zig-zag split against its definition (chunk r and chunk 2cp − 1 − r of 2cp).

This module imports from the lower layers only (`dsml.comm`, `dsml.net`,
`dsml.context_parallel`), never the top-level `dsml` package, which sits above it.
"""
from __future__ import annotations

import math

import numpy as np

from dsml.comm.run import run
from dsml.context_parallel import contiguous_layout, ring_attention_step
from dsml.exercises import Wrong, as_float, checker, fresh_rng
from dsml.net.alphabeta import AlphaBeta


# --- 5b.1: merge two partial attention results ------------------------------------------------

def _partial(scores, values):
    """(normalised output, log-sum-exp) of softmax attention over one set of keys; a query
    with no key (every score −∞) gets output 0 and lse −∞."""
    top = scores.max(axis=-1)
    shift = np.where(np.isfinite(top), top, 0.0)
    weights = np.exp(scores - shift[:, None])
    total = weights.sum(axis=-1)
    safe = np.where(total > 0, total, 1.0)
    out = np.where(total[:, None] > 0, (weights @ values) / safe[:, None], 0.0)
    with np.errstate(divide="ignore"):
        return out, np.where(total > 0, shift + np.log(safe), -np.inf)


def merge_cases():
    """(name, scores_a, scores_b, values_a, values_b): the first case has moderate, unequal
    log-sum-exps so that averaging, picking the larger half and a wrong lse all give different
    numbers; then scores beyond exp's range; then a query whose second half saw no key."""
    rng = np.random.default_rng(51)
    cases = []
    for name, scale, masked in (("moderate scores", 1.5, False), ("scores near 900", 1.0, False),
                                ("a half that saw no key", 1.5, True)):
        scores_a = scale * rng.standard_normal((3, 4))
        scores_b = scale * rng.standard_normal((3, 5)) + 1.0
        if name == "scores near 900":
            scores_a, scores_b = scores_a + 900.0, scores_b + 903.0
        if masked:
            scores_b[1] = -np.inf
        cases.append((name, scores_a, scores_b, rng.standard_normal((4, 2)),
                      rng.standard_normal((5, 2))))
    return cases


@checker("5b.1", "merge two partial attention results")
def check_merge_partials(merge_partials):
    for name, scores_a, scores_b, values_a, values_b in merge_cases():
        out_a, lse_a = _partial(scores_a, values_a)
        out_b, lse_b = _partial(scores_b, values_b)
        want_out, want_lse = _partial(np.concatenate([scores_a, scores_b], axis=1),
                                      np.concatenate([values_a, values_b]))
        answer = merge_partials(out_a.copy(), lse_a.copy(), out_b.copy(), lse_b.copy())
        if not isinstance(answer, (tuple, list)) or len(answer) != 2:
            raise Wrong(f"merge_partials returned {type(answer).__name__}; expected a pair "
                        f"(out, lse)")
        out, lse = (np.asarray(x, dtype=float) for x in answer)
        if out.shape != want_out.shape or lse.shape != want_lse.shape:
            raise Wrong(f"case '{name}': expected out of shape {want_out.shape} and lse of shape "
                        f"{want_lse.shape}, got {out.shape} and {lse.shape}")
        if not np.isfinite(out).all() or np.isnan(lse).any():
            raise Wrong(f"case '{name}': the result holds inf or nan. Perhaps an exponential "
                        f"of a large log-sum-exp overflowed, or −∞ − (−∞) appeared: work "
                        f"relative to the larger of the two lse values.")
        if np.allclose(out, want_out, rtol=1e-10, atol=1e-12):
            if np.allclose(lse, want_lse, rtol=1e-10, atol=1e-12):
                continue
            if np.allclose(lse, np.maximum(lse_a, lse_b)):
                raise Wrong(f"case '{name}': out is right but lse is the larger of the two; "
                            f"the merged denominator holds both halves' mass, so it exceeds "
                            f"either one.")
            raise Wrong(f"case '{name}': out is right but lse is not the log of the sum of "
                        f"both halves' denominators.")
        if np.allclose(out, (out_a + out_b) / 2):
            raise Wrong(f"case '{name}': that is the plain average of the two outputs. Each "
                        f"half should count in proportion to its share of the softmax's "
                        f"denominator, which its lse gives.")
        raise Wrong(f"case '{name}': out differs from attention over all the keys by up to "
                    f"{np.abs(out - want_out).max():.3g}. Weigh each half's output by its "
                    f"share of the total denominator.")
    return "exact, also beyond exp's range and with an empty half"


# --- 5b.2: the zig-zag split ------------------------------------------------------------------

ZIGZAG_CASES = [(36, 3, 1), (36, 3, 0), (36, 3, 2), (16, 4, 3), (10, 5, 4), (8, 1, 0)]


def _zigzag(seq, cp, rank):
    chunk = seq // (2 * cp)
    first, second = rank, 2 * cp - 1 - rank
    return list(range(first * chunk, (first + 1) * chunk)) + \
        list(range(second * chunk, (second + 1) * chunk))


@checker("5b.2", "the zig-zag split", builds=("dsml.context_parallel.zigzag_layout",))
def check_zigzag_positions(zigzag_positions):
    fresh = fresh_rng()       # two more cases, drawn afresh for every check
    cases = [(case, "") for case in ZIGZAG_CASES]
    for _ in range(2):
        cp = int(fresh.integers(2, 9))
        cases.append(((2 * cp * int(fresh.integers(1, 7)), cp, int(fresh.integers(cp))),
                      " (a case drawn afresh for this check)"))
    for (seq, cp, rank), drawn in cases:
        call = f"zigzag_positions(seq={seq}, cp={cp}, rank={rank}){drawn}"
        got = zigzag_positions(seq, cp, rank)
        try:
            got = sorted(int(p) for p in np.asarray(got).ravel())
        except (TypeError, ValueError):
            raise Wrong(f"{call} returned {got!r}; expected a list or array of integers")
        want = sorted(_zigzag(seq, cp, rank))
        if got == want:
            continue
        if len(got) != seq // cp:
            raise Wrong(f"{call} returned {len(got)} positions; every rank holds the same "
                        f"number of positions, seq/cp.")
        if got == list(range(rank * seq // cp, (rank + 1) * seq // cp)):
            raise Wrong(f"{call} returned one contiguous run: that is the plain split, under "
                        f"which the last rank's queries see far more keys than the first's.")
        if got == list(range(rank, seq, cp)):
            raise Wrong(f"{call} returned every cp-th position: that is the striped split. "
                        f"Zig-zag cuts the sequence into twice as many chunks as ranks.")
        raise Wrong(f"{call} returned {got[:4]}…: not the two chunks of the zig-zag split. "
                    f"Which chunk mirrors chunk {rank} when there are {2 * cp} chunks?")
    return None


# --- 5b.3: the bytes of ring attention --------------------------------------------------------

# (batch, seq, hidden, cp, itemsize): the first case has 4-byte elements, so that counting
# elements (÷ 4), counting only K (÷ 2) and forgetting a pass give different numbers.
BYTES_CASES = [(1, 12, 4, 3, 4), (2, 16, 6, 4, 2), (1, 10, 3, 5, 8), (3, 8, 2, 1, 2),
               (1, 14, 2, 7, 2)]


def measured_ring_bytes(batch, seq, hidden, cp, itemsize):
    """Bytes rank 0 sends in one forward and backward of ring_attention_step, read from the
    simulator's trace (float64 arrays of one head, scaled to `itemsize`)."""
    rng = np.random.default_rng(seq + cp)
    arrays = [rng.standard_normal((batch, 1, seq, hidden)) for _ in range(4)]
    result = run(ring_attention_step, cp, network=AlphaBeta(1e-6, 1e-9),
                 args=(*arrays, contiguous_layout(seq, cp), True))
    sent = sum(r.nbytes for r in result.trace.of_rank(0) if r.op in ("send", "sendrecv"))
    return sent * itemsize // 8


@checker("5b.3", "the bytes of one ring attention layer",
         builds=("dsml.context_parallel.ring_attention_kv_bytes",
                 "dsml.context_parallel.ring_attention_forward",
                 "dsml.context_parallel.ring_attention_backward"))
def check_ring_attention_bytes(ring_attention_bytes):
    for batch, seq, hidden, cp, itemsize in BYTES_CASES:
        expected = measured_ring_bytes(batch, seq, hidden, cp, itemsize)
        call = (f"ring_attention_bytes(batch={batch}, seq={seq}, hidden={hidden}, cp={cp}, "
                f"itemsize={itemsize})")
        got = as_float(ring_attention_bytes(batch, seq, hidden, cp, itemsize), call)
        if math.isclose(got, expected, rel_tol=1e-12, abs_tol=1e-9):
            continue
        block = batch * (seq // cp) * hidden * itemsize          # one K (or V) block
        if cp == 1:
            advice = "With one rank there is no neighbour: nothing is sent."
        elif math.isclose(got, 2 * (cp - 1) * block):
            advice = "That is the forward alone; the backward sends too."
        elif math.isclose(got, 4 * (cp - 1) * block):
            advice = ("K and V go around twice, but the gradients dK and dV must travel too, "
                      "all the way back to the rank that owns the block.")
        elif math.isclose(got, 6 * (cp - 1) * block):
            advice = ("K, V, dK and dV each make cp − 1 hops here. After the last step, where "
                      "are the gradients of a block, and where must they end up?")
        elif math.isclose(got * itemsize, expected):
            advice = "Count bytes, not elements: multiply by the itemsize."
        elif math.isclose(2 * got, expected):
            advice = ("Half the bytes: perhaps only K counted, or only one of the two passes "
                      "of the gradients; K and V always travel together.")
        else:
            advice = ("Count what one rank passes to its neighbour at each step of the forward "
                      "and of the backward, and how many steps each takes.")
        raise Wrong(f"{call} returned {got:,.0f} B, expected {expected:,} B. {advice}")
    return None
