"""Generated from notebooks/week5_model_and_pipeline_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 9
import math

import numpy as np

LAYER_NORM_EPS = 1e-5                 # torch.nn.LayerNorm's and GPT-2's default
_GELU_SCALE = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


def gelu(x):
    """GELU with GPT-2's tanh approximation (Hendrycks & Gimpel 2016), elementwise:
    0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))."""
    return 0.5 * x * (1.0 + np.tanh(_GELU_SCALE * (x + _GELU_CUBIC * x**3)))


def gelu_grad(x):
    """d gelu(x) / dx, elementwise (the product rule on the formula of `gelu`)."""
    t = np.tanh(_GELU_SCALE * (x + _GELU_CUBIC * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _GELU_SCALE * (1.0 + 3 * _GELU_CUBIC * x * x)


def layer_norm_forward(x, weight, bias, eps: float = LAYER_NORM_EPS):
    """LayerNorm over the last axis (Ba et al. 2016): (x − mean)/√(var + eps)·weight + bias,
    with the biased variance as torch computes it. x (..., h); weight, bias (h,).
    Returns (y, cache for layer_norm_backward)."""
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    inv_std = 1.0 / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)
    normed = centred * inv_std
    return normed * weight + bias, (normed, inv_std, weight)


def layer_norm_backward(dy, cache):
    """(dx, dweight, dbias) of layer_norm_forward, given dL/dy of shape (..., h)."""
    normed, inv_std, weight = cache
    outer = tuple(range(dy.ndim - 1))          # every axis but the features
    dweight = (dy * normed).sum(axis=outer)
    dbias = dy.sum(axis=outer)
    dnormed = dy * weight
    # normed = (x − μ)/σ: its Jacobian removes the mean of dnormed and its component along normed.
    dx = inv_std * (dnormed - dnormed.mean(axis=-1, keepdims=True)
                    - normed * (dnormed * normed).mean(axis=-1, keepdims=True))
    return dx, dweight, dbias


# -- cell 10
def linear_forward(x, weight, bias=None):
    """x (..., in) @ weight (in, out) + bias (out,) → (..., out)."""
    y = x @ weight
    return y if bias is None else y + bias


def linear_backward(dy, x, weight):
    """(dx, dweight, dbias) of linear_forward: dx = dy·Wᵀ, dW = xᵀ·dy, db = Σ dy over rows."""
    rows_x = x.reshape(-1, x.shape[-1])
    rows_dy = dy.reshape(-1, dy.shape[-1])
    return dy @ weight.T, rows_x.T @ rows_dy, rows_dy.sum(axis=0)


def attention_weights(q, k):
    """Causal softmax(q·kᵀ/√d) over the keys: q, k (b, heads, s, d) → weights (b, heads, s, s),
    position i attending to positions ≤ i."""
    seq, d = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    future = np.triu(np.ones((seq, seq), dtype=bool), k=1)
    scores = np.where(future, -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)     # exp never overflows
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights


def causal_attention_forward(qkv, heads: int):
    """Causal multi-head attention (Vaswani et al. 2017; GPT-2's masking) on projected inputs.

    qkv (b, s, 3·heads·d) laid out as GPT-2's c_attn output: [Q | K | V], each of heads·d columns,
    head j in columns j·d … (j+1)·d − 1 of its part. Position i attends to positions ≤ i with
    weights softmax(q·kᵀ/√d). Returns (out (b, s, heads·d), cache for the backward)."""
    batch, seq, three_width = qkv.shape
    width = three_width // 3
    d = width // heads

    def per_head(part):          # (b, s, heads·d) → (b, heads, s, d)
        return qkv[..., part * width:(part + 1) * width].reshape(batch, seq, heads, d) \
            .transpose(0, 2, 1, 3)

    q, k, v = per_head(0), per_head(1), per_head(2)
    weights = attention_weights(q, k)
    out = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, seq, width)
    return out, (q, k, v, weights)


# -- cell 11
def causal_attention_backward(dout, cache):
    """dL/dqkv (b, s, 3·heads·d) of causal_attention_forward, given dL/dout (b, s, heads·d)."""
    q, k, v, weights = cache
    batch, heads, seq, d = q.shape
    dhead = dout.reshape(batch, seq, heads, d).transpose(0, 2, 1, 3)
    dweights = dhead @ v.transpose(0, 1, 3, 2)
    dv = weights.transpose(0, 1, 3, 2) @ dhead
    # softmax backward, row by row: dscore = w ⊙ (dw − Σ w·dw); masked entries have w = 0.
    dscores = weights * (dweights - (dweights * weights).sum(axis=-1, keepdims=True))
    dscores /= math.sqrt(d)
    dq = dscores @ k
    dk = dscores.transpose(0, 1, 3, 2) @ q

    def merged(g):               # (b, heads, s, d) → (b, s, heads·d)
        return g.transpose(0, 2, 1, 3).reshape(batch, seq, heads * d)

    return np.concatenate([merged(dq), merged(dk), merged(dv)], axis=-1)


def block_param_shapes(hidden: int) -> dict:
    """Name → shape of every parameter of a block of width `hidden`, in forward order.
    Weights are (in, out), as in dsml.train.MLP; the MLP is 4·hidden wide (GPT-2)."""
    h = hidden
    return {"ln1.weight": (h,), "ln1.bias": (h,),
            "attn.qkv.weight": (h, 3 * h), "attn.qkv.bias": (3 * h,),
            "attn.proj.weight": (h, h), "attn.proj.bias": (h,),
            "ln2.weight": (h,), "ln2.bias": (h,),
            "mlp.fc.weight": (h, 4 * h), "mlp.fc.bias": (4 * h,),
            "mlp.proj.weight": (4 * h, h), "mlp.proj.bias": (h,)}


def check_block_shape(hidden: int, heads: int) -> None:
    """A block needs hidden ≥ 1 and heads dividing hidden (each head has hidden/heads columns)."""
    for name, value in (("hidden", hidden), ("heads", heads)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be an integer ≥ 1, got {value!r}")
    if hidden % heads:
        raise ValueError(f"heads ({heads}) must divide hidden ({hidden}): each head gets "
                         f"hidden/heads columns of Q, K and V")


# -- cell 12
def init_block_params(hidden: int, seed: int = 0, dtype=np.float64, std: float = 0.02) -> dict:
    """A block's parameters drawn as GPT-2 draws them: weights N(0, std²), biases 0, LayerNorm
    weights 1 (names and shapes from block_param_shapes)."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in block_param_shapes(hidden).items():
        if name.endswith(".bias"):
            value = np.zeros(shape)
        elif name.startswith("ln"):
            value = np.ones(shape)
        else:
            value = std * rng.standard_normal(shape)
        params[name] = value.astype(dtype)
    return params


def block_forward(p: dict, heads: int, x):
    """The block's output for x (b, s, h) with parameters p, and what its backward needs."""
    ln1, ln1_cache = layer_norm_forward(x, p["ln1.weight"], p["ln1.bias"])
    qkv = linear_forward(ln1, p["attn.qkv.weight"], p["attn.qkv.bias"])
    heads_out, attention_cache = causal_attention_forward(qkv, heads)
    a = x + linear_forward(heads_out, p["attn.proj.weight"], p["attn.proj.bias"])
    ln2, ln2_cache = layer_norm_forward(a, p["ln2.weight"], p["ln2.bias"])
    pre = linear_forward(ln2, p["mlp.fc.weight"], p["mlp.fc.bias"])
    hidden4 = gelu(pre)
    y = a + linear_forward(hidden4, p["mlp.proj.weight"], p["mlp.proj.bias"])
    return y, (ln1_cache, ln1, attention_cache, heads_out, ln2_cache, ln2, pre, hidden4)


def block_backward(p: dict, cache, dy):
    """(dL/dx, every parameter's gradient) of block_forward, given dL/dy and its cache."""
    ln1_cache, ln1, attention_cache, heads_out, ln2_cache, ln2, pre, hidden4 = cache
    g = {}
    # MLP branch: y = a + proj(gelu(fc(ln2(a))))
    dhidden4, g["mlp.proj.weight"], g["mlp.proj.bias"] = linear_backward(
        dy, hidden4, p["mlp.proj.weight"])
    dpre = dhidden4 * gelu_grad(pre)
    dln2, g["mlp.fc.weight"], g["mlp.fc.bias"] = linear_backward(dpre, ln2, p["mlp.fc.weight"])
    dln2_in, g["ln2.weight"], g["ln2.bias"] = layer_norm_backward(dln2, ln2_cache)
    da = dy + dln2_in                                  # the residual adds the two paths
    # attention branch: a = x + proj(attention(qkv(ln1(x))))
    dheads, g["attn.proj.weight"], g["attn.proj.bias"] = linear_backward(
        da, heads_out, p["attn.proj.weight"])
    dqkv = causal_attention_backward(dheads, attention_cache)
    dln1, g["attn.qkv.weight"], g["attn.qkv.bias"] = linear_backward(
        dqkv, ln1, p["attn.qkv.weight"])
    dln1_in, g["ln1.weight"], g["ln1.bias"] = layer_norm_backward(dln1, ln1_cache)
    return da + dln1_in, g


# -- cell 13
class TransformerBlock:
    """One pre-LayerNorm GPT-2 block with explicit forward and backward passes:

        a = x + Attn(LN1(x)),   y = a + MLP(LN2(a)),   MLP(m) = GELU(m·W_fc + b_fc)·W_proj + b_proj

    Attn is causal multi-head self-attention with a fused QKV projection and an output
    projection, both with biases. x and y are (batch, seq, hidden). Parameters live in
    `self.params` (names from block_param_shapes, dtype `dtype`, float64 by default), drawn with
    `seed` as GPT-2 does: weights N(0, std²), biases 0, LayerNorm weight 1. Names in
    `self.frozen` get no gradient, as in dsml.train.MLP."""

    def __init__(self, hidden: int, heads: int, seed: int = 0, dtype=np.float64,
                 std: float = 0.02):
        check_block_shape(hidden, heads)
        self.hidden, self.heads, self.dtype = int(hidden), int(heads), np.dtype(dtype)
        self.params = init_block_params(self.hidden, seed, self.dtype, std)
        self.frozen = set()
        self._cache = None

    def n_params(self) -> int:
        return sum(p.size for p in self.params.values())

    def forward(self, x):
        """The block's output (b, s, hidden) for x (b, s, hidden); keeps what backward needs."""
        x = np.asarray(x, dtype=self.dtype)
        if x.ndim != 3 or x.shape[-1] != self.hidden:
            raise ValueError(f"expected x of shape (batch, seq, {self.hidden}), got {x.shape}")
        y, self._cache = block_forward(self.params, self.heads, x)
        return y

    def backward_with_input(self, dout):
        """(dL/dx, gradients of the non-frozen parameters) given dL/dy of the last forward."""
        if self._cache is None:
            raise RuntimeError("call forward before backward")
        shape = self._cache[1].shape                   # LN1's output: the block's shape
        dy = np.asarray(dout, dtype=self.dtype)
        if dy.shape != shape:
            raise ValueError(f"dout must have the output's shape {shape}, got {dy.shape}")
        dx, g = block_backward(self.params, self._cache, dy)
        return dx, {name: g[name] for name in self.params if name not in self.frozen}

    def backward(self, dout):
        """Gradients of the non-frozen parameters (forward order), as dsml.train models give."""
        return self.backward_with_input(dout)[1]


# -- cell 218
RECOMPUTE_MODES = ("none", "selective", "full")


def held_bytes(arrays) -> int:
    """Bytes of the distinct buffers behind `arrays`: a view counts once, with its base."""
    buffers = {}
    for array in arrays:
        base = array
        while isinstance(base.base, np.ndarray):
            base = base.base
        buffers[id(base)] = base.nbytes
    return sum(buffers.values())


def arrays_in(kept, params) -> list:
    """The arrays inside `kept` (arrays and nested tuples of them), the arrays of `params`
    (a dict of parameters) left out."""
    skip = {id(value) for value in params.values()}
    flat, stack = [], list(kept)
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):
            stack.extend(item)
        elif isinstance(item, np.ndarray) and id(item) not in skip:
            flat.append(item)
    return flat


def _activations(block) -> list:
    """The arrays a block's cache keeps between forward and backward, parameters left out."""
    return arrays_in([block._cache], block.params)


def recomputed_step(block, x, dout, recompute: str = "none"):
    """Forward then backward of `block`, keeping between them only what `recompute` says:
    none       the whole cache
    selective  all but attention's b·a·s² softmax weights, rebuilt from the kept q and k
               before the backward (Korthikanti et al. 2022's selective recomputation)
    full       only the input x; the forward runs again before the backward
    Returns (dx, parameter gradients, bytes of activations held between the two passes)."""
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    x = np.asarray(x, dtype=block.dtype)
    block.forward(x)
    if recompute == "full":
        block._cache, held = None, x.nbytes
        block.forward(x)
    elif recompute == "selective":
        ln1_cache, ln1, (q, k, v, _), *rest = block._cache
        block._cache = (ln1_cache, ln1, (q, k, v, None), *rest)
        held = held_bytes(_activations(block))
        block._cache = (ln1_cache, ln1, (q, k, v, attention_weights(q, k)), *rest)
    else:
        held = held_bytes(_activations(block))
    dx, grads = block.backward_with_input(dout)
    return dx, grads, held


# -- cell 221
def round_to_bf16(x):
    """x rounded to bfloat16, returned as float32 (whose low 16 bits are then zero):
    round to nearest, ties to even, on the upper 16 bits of the float32 bit pattern.
    Infinities stay infinite, NaN stays NaN, values past bf16's largest overflow to ±inf."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    lowest_kept = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits + np.uint32(0x7FFF) + lowest_kept) & np.uint32(0xFFFF0000)
    quiet_nan = (bits | np.uint32(0x00400000)) & np.uint32(0xFFFF0000)   # keep NaN a NaN
    return np.where(np.isnan(x), quiet_nan, rounded).view(np.float32)


def round_to_fp16(x):
    """x rounded to IEEE half precision (NumPy's float16), returned as float32."""
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def _rounded(item, to_format):
    """Every array inside `item` (nested tuples of arrays and other values) rounded."""
    if isinstance(item, tuple):
        return tuple(_rounded(part, to_format) for part in item)
    return to_format(item) if isinstance(item, np.ndarray) else item


def low_precision_step(params: dict, heads: int, x, dy, to_format, loss_scale: float = 1.0):
    """The block's forward and backward in a 16-bit format emulated by `to_format`
    (round_to_bf16 or round_to_fp16): weights, input, the output, every kept activation, the
    scaled upstream gradient dy·loss_scale and every weight gradient are rounded to it; the
    arithmetic in between runs in float32. Returns (y, gradients as float64 with the loss scale
    divided out) — a gradient flushed to zero by the format stays zero."""
    if not loss_scale > 0:
        raise ValueError(f"loss_scale must be > 0, got {loss_scale!r}")
    low = {name: to_format(value) for name, value in params.items()}
    y, cache = block_forward(low, heads, to_format(x))
    cache = _rounded(cache, to_format)
    _, grads = block_backward(low, cache, to_format(np.asarray(dy) * loss_scale))
    return to_format(y), {name: to_format(g).astype(np.float64) / loss_scale
                          for name, g in grads.items()}
