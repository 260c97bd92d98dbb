"""Plumbing (hand-written): tests for dsml.train.transformer — a pre-LayerNorm GPT-2 block in NumPy
with a hand-written backward pass (week 5, tensor parallelism).

Two independent references:
- central differences of L = Σ G ⊙ block(x) for every parameter entry and every input entry
  (float64; relative error < 1e-7), over several shapes (one head, one token, one example);
- PyTorch's autograd on the same block written with torch.nn.functional (layer_norm,
  scaled_dot_product_attention with is_causal, gelu with approximate="tanh"): output, input
  gradient and every parameter gradient to 1e-12 relative. Skipped when torch is not installed.
The pieces (GELU, LayerNorm, attention) are also checked on their own, and bad input fails with
an error that names the problem. Everything is seeded.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from dsml.train.transformer import (RECOMPUTE_MODES, TransformerBlock, block_param_shapes,
                                    recomputed_step,
                                    causal_attention_backward, causal_attention_forward, gelu,
                                    gelu_grad, layer_norm_backward, layer_norm_forward)

SEED = 11
SHAPES = [  # (batch, seq, hidden, heads)
    (2, 5, 8, 2),
    (1, 1, 4, 1),       # one example, one token, one head
    (3, 4, 6, 3),       # head width 2, odd sizes
    (1, 6, 12, 4),
]


def perturbed_block(hidden, heads, seed, dtype=np.float64):
    """A block whose every parameter is random (zero biases and unit LayerNorms hide bugs)."""
    block = TransformerBlock(hidden, heads, seed=seed, dtype=dtype)
    rng = np.random.default_rng(seed + 100)
    for value in block.params.values():
        value += (0.3 * rng.standard_normal(value.shape)).astype(dtype)
    return block


def numerical(block, x, upstream, eps=1e-6):
    """Central differences of Σ upstream ⊙ block(x) for every parameter entry and x."""
    def loss():
        return float(np.sum(upstream * block.forward(x)))
    grads = {}
    for name, value in list(block.params.items()) + [("x", x)]:
        g = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            saved = value[index]
            value[index] = saved + eps
            up = loss()
            value[index] = saved - eps
            down = loss()
            value[index] = saved
            g[index] = (up - down) / (2 * eps)
        grads[name] = g
    return grads


def relative(a, b):
    return np.linalg.norm(a - b) / max(np.linalg.norm(a) + np.linalg.norm(b), 1e-300)


# --- the pieces ------------------------------------------------------------------------------

def test_gelu_is_the_tanh_approximation_and_its_derivative_matches_finite_differences():
    x = np.linspace(-6, 6, 241)
    expected = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
                for v in x]
    assert np.allclose(gelu(x), expected, rtol=0, atol=1e-15)
    eps = 1e-6
    numeric = (gelu(x + eps) - gelu(x - eps)) / (2 * eps)
    assert np.max(np.abs(gelu_grad(x) - numeric)) < 1e-8
    assert gelu(np.array(0.0)) == 0.0 and abs(gelu(np.array(10.0)) - 10.0) < 1e-12


def test_layer_norm_normalises_each_row_and_its_backward_matches_finite_differences():
    rng = np.random.default_rng(SEED)
    x = 3.0 + 2.0 * rng.standard_normal((2, 3, 7))
    y, _ = layer_norm_forward(x, np.ones(7), np.zeros(7))
    assert np.allclose(y.mean(axis=-1), 0, atol=1e-12)
    assert np.allclose(y.var(axis=-1), 1 / (1 + 1e-5 / x.var(axis=-1)), atol=1e-12)
    weight, bias, upstream = (rng.standard_normal(7), rng.standard_normal(7),
                              rng.standard_normal((2, 3, 7)))
    y, cache = layer_norm_forward(x, weight, bias)
    dx, dweight, dbias = layer_norm_backward(upstream, cache)
    eps = 1e-6
    for target, analytic in ((x, dx), (weight, dweight), (bias, dbias)):
        numeric = np.zeros_like(target)
        for index in np.ndindex(target.shape):
            saved = target[index]
            target[index] = saved + eps
            up = np.sum(upstream * layer_norm_forward(x, weight, bias)[0])
            target[index] = saved - eps
            down = np.sum(upstream * layer_norm_forward(x, weight, bias)[0])
            target[index] = saved
            numeric[index] = (up - down) / (2 * eps)
        assert relative(analytic, numeric) < 1e-8


def test_attention_is_causal_each_position_sees_only_itself_and_the_past():
    rng = np.random.default_rng(SEED)
    qkv = rng.standard_normal((2, 6, 3 * 8))
    out, _ = causal_attention_forward(qkv, heads=2)
    changed = qkv.copy()
    changed[:, 4:] += 10.0 * rng.standard_normal(changed[:, 4:].shape)   # rewrite the future
    out_changed, _ = causal_attention_forward(changed, heads=2)
    assert np.array_equal(out[:, :4], out_changed[:, :4])
    assert not np.allclose(out[:, 4:], out_changed[:, 4:])
    # the first position attends only to itself: its output is its own V
    assert np.allclose(out[:, 0], qkv[:, 0, 16:], rtol=0, atol=1e-15)


def test_attention_backward_matches_finite_differences():
    rng = np.random.default_rng(SEED)
    qkv, upstream = rng.standard_normal((2, 5, 3 * 6)), rng.standard_normal((2, 5, 6))
    _, cache = causal_attention_forward(qkv, heads=3)
    analytic = causal_attention_backward(upstream, cache)
    eps, numeric = 1e-6, np.zeros_like(qkv)
    for index in np.ndindex(qkv.shape):
        saved = qkv[index]
        qkv[index] = saved + eps
        up = np.sum(upstream * causal_attention_forward(qkv, 3)[0])
        qkv[index] = saved - eps
        down = np.sum(upstream * causal_attention_forward(qkv, 3)[0])
        qkv[index] = saved
        numeric[index] = (up - down) / (2 * eps)
    assert relative(analytic, numeric) < 1e-8


# --- the block -------------------------------------------------------------------------------

@pytest.mark.parametrize("batch,seq,hidden,heads", SHAPES)
def test_block_backward_matches_finite_differences(batch, seq, hidden, heads):
    block = perturbed_block(hidden, heads, SEED)
    rng = np.random.default_rng(SEED + hidden)
    x, upstream = rng.standard_normal((batch, seq, hidden)), rng.standard_normal((batch, seq, hidden))
    block.forward(x)
    dx, grads = block.backward_with_input(upstream)
    numeric = numerical(block, x, upstream)
    analytic = dict(grads, x=dx)
    assert set(analytic) == set(numeric)
    for name in numeric:
        assert relative(analytic[name], numeric[name]) < 1e-7, name


def test_block_parameters_shapes_names_init_and_count():
    block = TransformerBlock(16, 4, seed=3)
    assert list(block.params) == list(block_param_shapes(16))
    assert {n: p.shape for n, p in block.params.items()} == block_param_shapes(16)
    assert all(p.dtype == np.float64 for p in block.params.values())
    assert block.n_params() == 12 * 16**2 + 13 * 16
    assert all(np.all(block.params[n] == 0) for n in block.params if n.endswith(".bias"))
    assert all(np.all(block.params[n] == 1) for n in ("ln1.weight", "ln2.weight"))
    weight = block.params["mlp.fc.weight"]
    assert 0.015 < weight.std() < 0.025                       # GPT-2's N(0, 0.02²)
    again = TransformerBlock(16, 4, seed=3)
    other = TransformerBlock(16, 4, seed=4)
    assert all(np.array_equal(block.params[n], again.params[n]) for n in block.params)
    assert not np.array_equal(block.params["attn.qkv.weight"], other.params["attn.qkv.weight"])


def test_frozen_parameters_get_no_gradient_and_the_others_are_unchanged():
    block = perturbed_block(8, 2, SEED)
    rng = np.random.default_rng(SEED)
    x, upstream = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 3, 8))
    block.forward(x)
    everything = block.backward(upstream)
    block.frozen = {"ln1.bias", "attn.qkv.weight"}
    block.forward(x)
    some = block.backward(upstream)
    assert list(some) == [n for n in block.params if n not in block.frozen]
    assert all(np.array_equal(some[n], everything[n]) for n in some)


def test_float32_block_agrees_with_float64():
    block64 = perturbed_block(8, 2, SEED)
    block32 = TransformerBlock(8, 2, dtype=np.float32)
    block32.params = {n: p.astype(np.float32) for n, p in block64.params.items()}
    rng = np.random.default_rng(SEED)
    x, upstream = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 4, 8))
    y32, y64 = block32.forward(x), block64.forward(x)
    assert y32.dtype == np.float32
    assert np.max(np.abs(y32 - y64)) < 1e-4
    g32, g64 = block32.backward(upstream), block64.backward(upstream)
    assert all(g32[n].dtype == np.float32 and relative(g32[n], g64[n]) < 1e-4 for n in g64)


# --- against PyTorch --------------------------------------------------------------------------

def torch_block(torch, params, x, heads):
    """The same block in PyTorch (functional), for autograd."""
    F = torch.nn.functional
    batch, seq, hidden = x.shape
    d = hidden // heads
    a = F.layer_norm(x, (hidden,), params["ln1.weight"], params["ln1.bias"], 1e-5)
    qkv = a @ params["attn.qkv.weight"] + params["attn.qkv.bias"]
    q, k, v = (part.reshape(batch, seq, heads, d).transpose(1, 2)
               for part in qkv.split(hidden, dim=-1))
    heads_out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    heads_out = heads_out.transpose(1, 2).reshape(batch, seq, hidden)
    a = x + heads_out @ params["attn.proj.weight"] + params["attn.proj.bias"]
    m = F.layer_norm(a, (hidden,), params["ln2.weight"], params["ln2.bias"], 1e-5)
    hidden4 = F.gelu(m @ params["mlp.fc.weight"] + params["mlp.fc.bias"], approximate="tanh")
    return a + hidden4 @ params["mlp.proj.weight"] + params["mlp.proj.bias"]


@pytest.mark.parametrize("batch,seq,hidden,heads", SHAPES + [(2, 9, 32, 8)])
def test_block_matches_pytorch_autograd(batch, seq, hidden, heads):
    torch = pytest.importorskip("torch")
    block = perturbed_block(hidden, heads, SEED + seq)
    rng = np.random.default_rng(SEED + seq)
    x, upstream = rng.standard_normal((batch, seq, hidden)), rng.standard_normal((batch, seq, hidden))
    y = block.forward(x)
    dx, grads = block.backward_with_input(upstream)
    params = {n: torch.tensor(p, dtype=torch.float64, requires_grad=True)
              for n, p in block.params.items()}
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    ty = torch_block(torch, params, tx, heads)
    ty.backward(torch.tensor(upstream, dtype=torch.float64))
    assert relative(y, ty.detach().numpy()) < 1e-12
    assert relative(dx, tx.grad.numpy()) < 1e-12
    for name in grads:
        assert relative(grads[name], params[name].grad.numpy()) < 1e-12, name


def test_gelu_matches_pytorch():
    torch = pytest.importorskip("torch")
    x = np.linspace(-8, 8, 401)
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    ty = torch.nn.functional.gelu(tx, approximate="tanh")
    ty.sum().backward()
    assert np.max(np.abs(gelu(x) - ty.detach().numpy())) < 1e-14
    assert np.max(np.abs(gelu_grad(x) - tx.grad.numpy())) < 1e-14


# --- bad input --------------------------------------------------------------------------------

def test_heads_must_divide_hidden_and_both_be_positive():
    with pytest.raises(ValueError, match=r"heads \(3\) must divide hidden \(8\)"):
        TransformerBlock(8, 3)
    with pytest.raises(ValueError, match="heads must be an integer ≥ 1, got 0"):
        TransformerBlock(8, 0)
    with pytest.raises(ValueError, match="hidden must be an integer ≥ 1, got -4"):
        TransformerBlock(-4, 2)


def test_wrong_input_shapes_and_backward_before_forward_are_errors():
    block = TransformerBlock(8, 2)
    with pytest.raises(RuntimeError, match="call forward before backward"):
        block.backward(np.zeros((1, 2, 8)))
    with pytest.raises(ValueError, match=r"expected x of shape \(batch, seq, 8\), got \(2, 3, 6\)"):
        block.forward(np.zeros((2, 3, 6)))
    with pytest.raises(ValueError, match=r"expected x of shape \(batch, seq, 8\), got \(3, 8\)"):
        block.forward(np.zeros((3, 8)))
    block.forward(np.zeros((2, 3, 8)))
    with pytest.raises(ValueError, match=r"dout must have the output's shape \(2, 3, 8\), "
                                         r"got \(2, 4, 8\)"):
        block.backward(np.zeros((2, 4, 8)))


@pytest.mark.parametrize("batch, seq, hidden, heads", SHAPES)
def test_recomputation_keeps_less_and_changes_nothing(batch, seq, hidden, heads):
    """Held bytes against Korthikanti et al.'s per-layer count with the dropout terms removed
    (16sbh + as²b elements, plus the LayerNorms' 2sb statistics), written out here; dx and the
    gradients bit-identical to keeping everything."""
    rng = np.random.default_rng(SEED)
    block = TransformerBlock(hidden, heads, seed=SEED)
    x = rng.normal(size=(batch, seq, hidden))
    dout = rng.normal(size=(batch, seq, hidden))
    runs = {mode: recomputed_step(block, x, dout, mode) for mode in RECOMPUTE_MODES}
    sbh, scores, stats = seq * batch * hidden, heads * seq * seq * batch, 2 * seq * batch
    assert runs["none"][2] == 8 * (16 * sbh + scores + stats)
    assert runs["selective"][2] == 8 * (16 * sbh + stats)
    assert runs["full"][2] == 8 * sbh
    for mode in ("selective", "full"):
        assert np.array_equal(runs[mode][0], runs["none"][0])
        for name, grad in runs["none"][1].items():
            assert np.array_equal(runs[mode][1][name], grad)
    with pytest.raises(ValueError, match="recompute must be one of"):
        recomputed_step(block, x, dout, "some")


# --- bf16 and fp16 on the block --------------------------------------------------------------

BF16_BITS = [  # (float32 bit pattern, the bf16 bit pattern round-to-nearest-even gives)
    (0x3F800000, 0x3F80),   # 1.0
    (0x3F800001, 0x3F80),   # just above 1: down
    (0x3F808000, 0x3F80),   # 1 + 2⁻⁸, an exact tie: to the even neighbour, 1.0
    (0x3F818000, 0x3F82),   # a tie whose lower neighbour is odd: up
    (0x3F808001, 0x3F81),   # just above a tie: up
    (0x3F817FFF, 0x3F81),   # just below a tie: down
    (0x40490FDB, 0x4049),   # π → 3.140625
    (0xC0490FDB, 0xC049),   # −π
    (0x00000000, 0x0000),   # +0
    (0x80000000, 0x8000),   # −0 keeps its sign
    (0x7F800000, 0x7F80),   # +inf
    (0xFF800000, 0xFF80),   # −inf
    (0x7F7FFFFF, 0x7F80),   # float32's largest rounds past bf16's largest: +inf
    (0x7F7F7FFF, 0x7F7F),   # bf16's largest, from just below
    (0x00800000, 0x0080),   # float32's smallest normal is a bf16 normal
    (0x00008000, 0x0000),   # a subnormal tie: to even, 0
    (0x00018000, 0x0002),   # a subnormal tie with an odd lower neighbour: up
    (0x00008001, 0x0001),   # bf16's smallest subnormal, 2⁻¹³³
    (0x00000001, 0x0000),   # float32's smallest subnormal flushes
]


def as_float32(bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


def test_round_to_bf16_gives_the_known_bit_patterns():
    from dsml.train.transformer import round_to_bf16
    inputs, expected = zip(*BF16_BITS)
    got = round_to_bf16(as_float32(list(inputs))).view(np.uint32)
    assert [hex(b >> 16) for b in got] == [hex(b) for b in expected]
    assert np.all(got & 0xFFFF == 0)


def test_round_to_bf16_keeps_nan_a_nan_even_a_signalling_one():
    from dsml.train.transformer import round_to_bf16
    # 0x7F800001 is a NaN whose payload sits in the low bits: clearing them must not make inf.
    assert np.all(np.isnan(round_to_bf16(as_float32([0x7FC00000, 0x7F800001, 0xFF800001]))))


def nearest_even_reference(x):
    """bf16 rounding without the bit trick: the two bf16 neighbours by truncation and by
    truncation plus one unit in the last place; the nearer in float64, a tie to the even one."""
    bits = x.view(np.uint32).astype(np.uint64)
    low = (bits & 0xFFFF0000).astype(np.uint32)
    high = (bits + 0x10000 & 0xFFFF0000).astype(np.uint32)
    lo, hi = low.view(np.float32).astype(np.float64), high.view(np.float32).astype(np.float64)
    xd = x.astype(np.float64)
    below, above = np.abs(xd - lo), np.abs(hi - xd)
    even_low = (low >> 16) % 2 == 0
    return np.where((below < above) | ((below == above) & even_low), low, high).astype(np.uint32)


def test_round_to_bf16_is_the_nearest_bf16_ties_to_even_across_exponents():
    from dsml.train.transformer import round_to_bf16
    rng = np.random.default_rng(SEED)
    bits = rng.integers(0, 2**32, size=20000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    finite = np.isfinite(x) & (np.abs(x) < np.float32(3.38e38))   # no overflow to inf here
    x = x[finite]
    assert np.array_equal(round_to_bf16(x).view(np.uint32), nearest_even_reference(x))


def test_round_to_bf16_matches_pytorch():
    torch = pytest.importorskip("torch")
    from dsml.train.transformer import round_to_bf16
    rng = np.random.default_rng(SEED)
    x = np.concatenate([rng.normal(size=5000) * 10.0 ** rng.integers(-40, 38, size=5000),
                        as_float32([b for b, _ in BF16_BITS])]).astype(np.float32)
    theirs = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    assert np.array_equal(round_to_bf16(x).view(np.uint32), theirs.view(np.uint32))


def test_round_to_fp16_is_numpy_half_precision():
    from dsml.train.transformer import round_to_fp16
    x = np.array([1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 2.0**-25, 2.0**-24, 1e-3])
    assert np.array_equal(round_to_fp16(x), x.astype(np.float16).astype(np.float32))
    assert round_to_fp16(x).dtype == np.float32


def test_low_precision_step_is_the_block_when_nothing_rounds_and_loses_what_the_format_cannot_hold():
    from dsml.train.transformer import (block_backward, block_forward, low_precision_step,
                                        round_to_bf16, round_to_fp16)
    batch, seq, hidden, heads = SHAPES[0]
    block = perturbed_block(hidden, heads, SEED)
    rng = np.random.default_rng(SEED)
    x, dy = rng.normal(size=(2, batch, seq, hidden))
    y_ref, cache = block_forward(block.params, heads, x)
    _, g_ref = block_backward(block.params, cache, dy)
    y, grads = low_precision_step(block.params, heads, x, dy, lambda a: np.asarray(a), 8.0)
    assert np.array_equal(y, y_ref)
    assert all(np.array_equal(grads[name], g_ref[name]) for name in g_ref)
    # bf16: errors of a few units of 2⁻⁸; fp16: of 2⁻¹¹ (a loss scale changes nothing here).
    for to_format, bound in ((round_to_bf16, 2**-5), (round_to_fp16, 2**-8)):
        y, grads = low_precision_step(block.params, heads, x, dy, to_format)
        assert relative(y, y_ref) < bound
        assert all(relative(grads[name], g_ref[name]) < bound for name in g_ref)
    # A gradient 10⁷ times smaller: fp16 flushes entries to zero, bf16 and fp16 with a
    # loss scale of 2¹⁰ do not.
    tiny = dy * 1e-7
    _, g_tiny = block_backward(block.params, cache, tiny)
    ref = np.concatenate([g.ravel() for g in g_tiny.values()])
    clear = np.abs(ref) > 1e-6 * np.abs(ref).max()

    def zeros(to_format, scale):
        _, grads = low_precision_step(block.params, heads, x, tiny, to_format, scale)
        return int(np.sum(np.concatenate([grads[k].ravel() for k in g_tiny])[clear] == 0))
    assert zeros(round_to_fp16, 1.0) > 0.05 * clear.sum()
    assert zeros(round_to_fp16, 1024.0) == 0
    assert zeros(round_to_bf16, 1.0) == 0
    with pytest.raises(ValueError, match="loss_scale must be > 0, got 0"):
        low_precision_step(block.params, heads, x, dy, round_to_bf16, 0)
