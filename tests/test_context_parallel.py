"""Ring attention (dsml.context_parallel, bonus notebook 5b): equal to full attention forward
and backward on random shapes, layouts and seeds; the bytes each rank sends; the timing-only
program simulates what the real one does; bad input is refused with a clear message."""
from __future__ import annotations

import math

import numpy as np
import pytest

import dsml
from dsml.context_parallel import (contiguous_layout, gather_sequence, ring_attention_forward,
                                   ring_attention_kv_bytes, ring_attention_step, ring_attention_timing, striped_layout,
                                   visible_pairs, zigzag_layout)
from dsml.net import AlphaBeta
from dsml.tensor_parallel import bytes_sent
from dsml.train.transformer import causal_attention_backward, causal_attention_forward

NET = AlphaBeta(alpha=2e-6, beta=1e-10)
LAYOUTS = {"contiguous": contiguous_layout, "striped": striped_layout, "zigzag": zigzag_layout}


def full_attention(q, k, v, dout, causal):
    """Output and (dq, dk, dv) of attention computed in one piece, independently of the module."""
    d, seq = q.shape[-1], q.shape[-2]
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(d)
    if causal:
        scores = np.where(np.tril(np.ones((seq, seq), dtype=bool)), scores, -np.inf)
    w = np.exp(scores - scores.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    dw = dout @ np.swapaxes(v, -1, -2)
    ds = w * (dw - (dw * w).sum(axis=-1, keepdims=True)) / math.sqrt(d)
    return w @ v, ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(w, -1, -2) @ dout


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_ring_attention_equals_full_attention(seed, causal, layout_name):
    rng = np.random.default_rng(seed)
    cp = int(rng.integers(1, 6))
    batch, heads, d = (int(x) for x in rng.integers(1, 4, size=3))
    seq = 2 * cp * int(rng.integers(1, 4))
    q, k, v, dout = (rng.standard_normal((batch, heads, seq, d)) for _ in range(4))
    layout = LAYOUTS[layout_name](seq, cp)
    result = dsml.run(ring_attention_step, cp, network=NET, args=(q, k, v, dout, layout, causal))
    want = full_attention(q, k, v, dout, causal)
    for name, expected in zip(("out", "dq", "dk", "dv"), want):
        got = gather_sequence([r[name] for r in result.values], layout)
        assert np.max(np.abs(got - expected)) <= 1e-12 * np.max(np.abs(expected)), name


def test_the_reference_matches_week5_causal_attention():
    rng = np.random.default_rng(3)
    q, k, v, dout = (rng.standard_normal((2, 3, 7, 4)) for _ in range(4))
    out, dq, dk, dv = full_attention(q, k, v, dout, True)

    def merged(x):
        return x.transpose(0, 2, 1, 3).reshape(2, 7, 12)
    week5, cache = causal_attention_forward(np.concatenate([merged(q), merged(k), merged(v)], -1), 3)
    grads = np.split(causal_attention_backward(merged(dout), cache), 3, axis=-1)
    assert np.allclose(merged(out), week5, rtol=1e-13, atol=1e-15)
    for ours, theirs in zip((dq, dk, dv), grads):
        assert np.allclose(merged(ours), theirs, rtol=1e-12, atol=1e-14)


def test_threads_give_the_same_bits_as_the_simulator():
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal((1, 2, 12, 3)) for _ in range(4)]
    layout = zigzag_layout(12, 3)
    sim = dsml.run(ring_attention_step, 3, network=NET, args=(*arrays, layout, True))
    threads = dsml.run(ring_attention_step, 3, engine="threads", args=(*arrays, layout, True))
    for a, b in zip(sim.values, threads.values):
        assert all(np.array_equal(a[name], b[name]) for name in ("out", "dq", "dk", "dv"))


@pytest.mark.parametrize("cp", [1, 2, 3, 5])
def test_bytes_per_rank(cp):
    batch, heads, d, seq = 2, 2, 3, 10 * cp
    rng = np.random.default_rng(cp)
    arrays = [rng.standard_normal((batch, heads, seq, d)) for _ in range(4)]
    result = dsml.run(ring_attention_step, cp, network=NET,
                      args=(*arrays, contiguous_layout(seq, cp), True))
    block = batch * (seq // cp) * heads * d * 8
    for rank in range(cp):
        end = result.values[rank]["forward_end"]
        assert bytes_sent(result.trace, rank, 0.0, end) == 2 * (cp - 1) * block
        assert bytes_sent(result.trace, rank, end) == (0 if cp == 1 else (4 * cp - 2) * block)


@pytest.mark.parametrize("causal", [False, True])
def test_timing_program_simulates_the_real_forward(causal):
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 16, 4)) for _ in range(3))
    layout = zigzag_layout(16, 4)

    def forward(comm):
        mine = layout[comm.rank]
        return (yield from ring_attention_forward(comm, q[..., mine, :], k[..., mine, :],
                                                  v[..., mine, :], layout, causal, 1e9))
    real = dsml.run(forward, 4, network=NET)
    skeleton = dsml.run(ring_attention_timing, 4, network=NET, args=(layout, 2, 4, 8, causal, 1e9))
    assert real.finish_times == skeleton.finish_times


def test_causal_contiguous_is_unbalanced_and_zigzag_is_balanced():
    seq, cp = 64, 4
    work = {name: [visible_pairs(p, np.arange(seq), True) for p in make(seq, cp)]
            for name, make in LAYOUTS.items()}
    assert len(set(work["zigzag"])) == 1
    assert work["contiguous"] == sorted(work["contiguous"]) and \
        work["contiguous"][-1] > 6 * work["contiguous"][0]
    assert sum(work["zigzag"]) == sum(work["contiguous"]) == seq * (seq + 1) // 2


@pytest.mark.parametrize("make, seq, cp, words", [
    (contiguous_layout, 10, 3, "multiple of 3"), (zigzag_layout, 12, 4, "multiple of 8"),
    (striped_layout, 8, 0, "cp must be an integer ≥ 1"), (zigzag_layout, 2.5, 1, "seq must be"),
    (contiguous_layout, 8, True, "cp must be"),
    (lambda seq, cp: ring_attention_kv_bytes(seq, 64, cp), 10, 4, "multiple of 4")])
def test_bad_splits_are_refused(make, seq, cp, words):
    with pytest.raises(ValueError, match=words):
        make(seq, cp)


@pytest.mark.parametrize("layout, cp, words", [
    ([np.arange(0, 4), np.arange(4, 8)], 4, "2 entries for cp = 4"),
    ([np.arange(0, 3), np.arange(3, 8)], 2, "as many as every other"),
    ([np.arange(0, 4), np.arange(3, 7)], 2, "exactly once")])
def test_bad_layouts_are_refused_by_the_rank_program(layout, cp, words):
    arrays = [np.zeros((1, 1, 8, 2)) for _ in range(4)]
    with pytest.raises(dsml.RankError, match=words):
        dsml.run(ring_attention_step, cp, network=NET, args=(*arrays, layout, True))


@pytest.mark.parametrize("causal", [False, True])
def test_ring_gradients_match_central_differences_of_the_ring_forward(causal):
    """Independent of any hand-written backward: the change of L = Σ dout ⊙ out, with out from
    the ring's own forward, along a random direction of q, k or v equals the inner product of
    the ring's gradient with that direction."""
    rng = np.random.default_rng(6)
    cp, seq = 3, 12
    q, k, v, dout = (rng.standard_normal((1, 2, seq, 3)) for _ in range(4))
    layout = zigzag_layout(seq, cp)

    def ring(q, k, v):
        result = dsml.run(ring_attention_step, cp, network=NET, args=(q, k, v, dout, layout, causal))
        return {name: gather_sequence([r[name] for r in result.values], layout)
                for name in ("out", "dq", "dk", "dv")}
    base, eps = ring(q, k, v), 1e-6
    for i, name in enumerate(("dq", "dk", "dv")):
        direction = rng.standard_normal(q.shape)
        losses = []
        for step in (eps, -eps):
            moved = [q, k, v]
            moved[i] = moved[i] + step * direction
            losses.append(float((ring(*moved)["out"] * dout).sum()))
        numeric = (losses[0] - losses[1]) / (2 * eps)
        assert abs(numeric - float((base[name] * direction).sum())) <= 1e-6 * abs(numeric), name
