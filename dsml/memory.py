"""Generated from notebooks/week5_model_and_pipeline_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.zero import zero_memory_formula


# -- cell 156
import numbers
from dataclasses import dataclass

GB = 1e9          # the course's gigabyte: 10⁹ bytes, the unit of the ZeRO paper's figures

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
POSITIONS = ("learned", "rotary")


def _check_count(name: str, value) -> int:
    """`value` if it is an integer ≥ 1 (a size, a number of layers or ranks), else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer ≥ 1, got {value!r}")
    return int(value)


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def _check_config(config, sizes=None) -> None:
    """TransformerConfig's argument checks: a ValueError naming the field, value and rule.
    With `sizes` (field names), only that those are integers ≥ 1."""
    for field_name in sizes or ("layers", "hidden", "heads", "vocab", "seq_len", "kv_heads",
                                "ffn_hidden"):
        _check_count(field_name, getattr(config, field_name))
    if sizes:
        return
    if config.hidden % config.heads:
        raise ValueError(f"hidden must be divisible by heads: hidden={config.hidden}, "
                         f"heads={config.heads}")
    if config.heads % config.kv_heads:
        raise ValueError(f"heads must be divisible by kv_heads (each key/value head serves a "
                         f"whole group of query heads): heads={config.heads}, "
                         f"kv_heads={config.kv_heads}")
    _check_choice("norm", config.norm, NORMS)
    _check_choice("mlp", config.mlp, MLPS)
    _check_choice("positions", config.positions, POSITIONS)
    if config.positions == "rotary" and config.head_dim % 2:
        raise ValueError(f"rotary positions rotate pairs of coordinates: head_dim = "
                         f"hidden / heads must be even, got {config.head_dim}")


# -- cell 157
@dataclass(frozen=True)
class TransformerConfig:
    """The shapes of a decoder-only transformer, GPT-style or Llama-style.

    layers            l, transformer blocks
    hidden            h, model width
    heads             a, query heads; head_dim = h / a
    vocab             V, vocabulary size
    seq_len           s, maximum sequence length (rows of a learned position table)
    kv_heads          key/value heads (grouped-query attention when fewer than heads); default a
    ffn_hidden        f, width of the MLP; default 4h
    norm              "layernorm" (weight and bias) or "rmsnorm" (weight only)
    mlp               "gelu" (h×f then f×h) or "swiglu" (gate h×f, up h×f, down f×h)
    bias              a bias on every linear layer (the output head never has one, as in
                      GPT-2 and Llama)
    tied_embeddings   the output head reuses the token embedding matrix
    positions         "learned" (an s×h table) or "rotary" (no parameters)

    `breakdown()` and `num_params()` are exact counts derived from these shapes."""
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    norm: str = "layernorm"
    mlp: str = "gelu"
    bias: bool = True
    tied_embeddings: bool = True
    positions: str = "learned"
    name: str = "custom"

    def __post_init__(self):
        _check_config(self, ("layers", "hidden", "heads", "vocab", "seq_len"))
        if self.kv_heads is None:  # frozen: defaults go through object.__setattr__
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        _check_config(self)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: kv_heads × head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def mlp_in_matrices(self) -> int:
        """h×f matrices at the MLP's input: 1 for GELU, 2 (gate and up) for SwiGLU."""
        return 2 if self.mlp == "swiglu" else 1

    @property
    def norm_params(self) -> int:
        """Parameters of one norm: weight and bias (LayerNorm) or weight only (RMSNorm)."""
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden


# -- cell 158
from dsml.utils import add_to_class


@add_to_class(TransformerConfig)
@classmethod
def gpt_style(cls, layers: int, hidden: int, heads: int, vocab: int, seq_len: int,
              name: str = "custom") -> "TransformerConfig":
    """GPT-2's recipe: learned positions, LayerNorm, GELU MLP of width 4h, biases, tied head."""
    return cls(layers, hidden, heads, vocab, seq_len, name=name)


@add_to_class(TransformerConfig)
@classmethod
def llama_style(cls, layers: int, hidden: int, heads: int, vocab: int, seq_len: int,
                ffn_hidden: int, kv_heads: int | None = None,
                name: str = "custom") -> "TransformerConfig":
    """Llama's recipe: rotary positions, RMSNorm, SwiGLU MLP, no biases, untied head."""
    return cls(layers, hidden, heads, vocab, seq_len, kv_heads=kv_heads,
               ffn_hidden=ffn_hidden, norm="rmsnorm", mlp="swiglu", bias=False,
               tied_embeddings=False, positions="rotary", name=name)


# -- cell 159
@add_to_class(TransformerConfig)
def layer_breakdown(self) -> dict[str, int]:
    """Parameters of one transformer block: attention, mlp, norms (its two)."""
    h, kv, f = self.hidden, self.kv_dim, self.ffn_hidden
    attention = h * h + h * kv + h * kv + h * h          # W_q, W_k, W_v, W_o
    mlp = self.mlp_in_matrices * h * f + f * h            # input matrices, output matrix
    if self.bias:
        attention += h + kv + kv + h
        mlp += self.mlp_in_matrices * f + h
    return {"attention": attention, "mlp": mlp, "norms": 2 * self.norm_params}


@add_to_class(TransformerConfig)
def breakdown(self) -> dict[str, int]:
    """Exact parameter count by part: embeddings (tokens, learned positions), attention and
    mlp (all layers), norms (all layers plus the final norm), head (0 when tied)."""
    layer = self.layer_breakdown()
    embeddings = self.vocab * self.hidden
    if self.positions == "learned":
        embeddings += self.seq_len * self.hidden
    return {
        "embeddings": embeddings,
        "attention": self.layers * layer["attention"],
        "mlp": self.layers * layer["mlp"],
        "norms": self.layers * layer["norms"] + self.norm_params,
        "head": 0 if self.tied_embeddings else self.vocab * self.hidden,
    }


@add_to_class(TransformerConfig)
def num_params(self) -> int:
    """The exact number of parameters (the sum of `breakdown()`)."""
    return sum(self.breakdown().values())


# -- cell 160
def narayanan_params(config: TransformerConfig) -> float:
    """Narayanan et al. 2021 (eq. 2), an approximation for GPT-style models:
    P ≈ 12lh²(1 + 13/(12h) + (V + s)/(12lh))."""
    l, h, V, s = config.layers, config.hidden, config.vocab, config.seq_len
    return 12 * l * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


# -- cell 162
PRESETS = {
    "gpt2": TransformerConfig.gpt_style(12, 768, 12, 50257, 1024, name="gpt2"),
    "gpt2-medium": TransformerConfig.gpt_style(24, 1024, 16, 50257, 1024, name="gpt2-medium"),
    "gpt2-large": TransformerConfig.gpt_style(36, 1280, 20, 50257, 1024, name="gpt2-large"),
    "gpt2-xl": TransformerConfig.gpt_style(48, 1600, 25, 50257, 1024, name="gpt2-xl"),
    "llama2-7b": TransformerConfig.llama_style(32, 4096, 32, 32000, 4096, ffn_hidden=11008,
                                               name="llama2-7b"),
    "llama2-13b": TransformerConfig.llama_style(40, 5120, 40, 32000, 4096, ffn_hidden=13824,
                                                name="llama2-13b"),
    "llama2-70b": TransformerConfig.llama_style(80, 8192, 64, 32000, 4096, ffn_hidden=28672,
                                                kv_heads=8, name="llama2-70b"),
}


def preset(name: str) -> TransformerConfig:
    """The configuration of a published model: one of PRESETS' names."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid names: {', '.join(PRESETS)}")
    return PRESETS[name]


# -- cell 167
import numpy as np


def parameter_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Name → shape of every parameter tensor, written out as a forward pass uses them (weights
    stored (in, out), so a linear layer is x @ W + b). Names follow GPT-2's: wte, wpe,
    h.{i}.ln_1.weight, h.{i}.attn.q.weight, …, ln_f.weight, lm_head.weight."""
    h, kv, f = config.hidden, config.kv_heads * (config.hidden // config.heads), config.ffn_hidden
    shapes = {}

    def linear(name, fan_in, fan_out):
        shapes[f"{name}.weight"] = (fan_in, fan_out)
        if config.bias:
            shapes[f"{name}.bias"] = (fan_out,)

    def norm(name):
        shapes[f"{name}.weight"] = (h,)
        if config.norm == "layernorm":
            shapes[f"{name}.bias"] = (h,)

    shapes["wte"] = (config.vocab, h)
    if config.positions == "learned":
        shapes["wpe"] = (config.seq_len, h)
    for i in range(config.layers):
        norm(f"h.{i}.ln_1")
        linear(f"h.{i}.attn.q", h, h)
        linear(f"h.{i}.attn.k", h, kv)
        linear(f"h.{i}.attn.v", h, kv)
        linear(f"h.{i}.attn.o", h, h)
        norm(f"h.{i}.ln_2")
        if config.mlp == "gelu":
            linear(f"h.{i}.mlp.fc", h, f)
            linear(f"h.{i}.mlp.proj", f, h)
        else:
            linear(f"h.{i}.mlp.gate", h, f)
            linear(f"h.{i}.mlp.up", h, f)
            linear(f"h.{i}.mlp.down", f, h)
    norm("ln_f")
    if not config.tied_embeddings:
        shapes["lm_head.weight"] = (h, config.vocab)     # the head has no bias
    return shapes


# -- cell 168
def build_numpy_model(config: TransformerConfig, dtype=np.float16, seed: int = 0,
                      max_bytes: float = 2**30) -> dict[str, np.ndarray]:
    """Allocate every parameter of `config` (`parameter_shapes`) as a NumPy array of `dtype`:
    matrices N(0, 0.02²), norm weights ones, biases zeros. Refuses models over `max_bytes`
    (1 GiB by default: this is for small models). The memory accountant never reads these arrays:
    the sum of their nbytes is the measurement it is checked against."""
    shapes = parameter_shapes(config)
    wanted = np.dtype(dtype).itemsize * sum(int(np.prod(shape)) for shape in shapes.values())
    if wanted > max_bytes:
        raise ValueError(f"{config.name} would allocate {wanted:,} bytes, more than max_bytes="
                         f"{max_bytes:,.0f}; build small models, or raise max_bytes")
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in shapes.items():
        if name.endswith(".bias"):
            params[name] = np.zeros(shape, dtype=dtype)
        elif len(shape) == 1:                           # a norm's weight
            params[name] = np.ones(shape, dtype=dtype)
        else:
            params[name] = (0.02 * rng.standard_normal(shape)).astype(dtype)
    return params


def measured_bytes(params: dict[str, np.ndarray]) -> int:
    """Bytes actually allocated for a dictionary of arrays: the sum of their nbytes."""
    return sum(array.nbytes for array in params.values())


def _rotary(x: np.ndarray) -> np.ndarray:
    """Rotary position embedding of x (heads, n, d): each pair (x_j, x_{j+d/2}) at position t
    turned by the angle t·10000^(−2j/d) (the 'rotate half' layout of Llama's code)."""
    n, d = x.shape[1], x.shape[2]
    angles = np.arange(n)[:, None] * 10000.0 ** (-np.arange(d // 2) * 2.0 / d)[None, :]
    cos, sin = np.cos(angles), np.sin(angles)
    first, second = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)


# -- cell 169
def numpy_forward(config: TransformerConfig, params: dict[str, np.ndarray],
                  tokens) -> np.ndarray:
    """Logits of shape (n, V) for one sequence of n ≤ seq_len token ids, computed in float32
    from `params` (as `build_numpy_model` names them): causal attention with grouped key/value
    heads, GELU or SwiGLU MLP, LayerNorm or RMSNorm, learned or rotary positions."""
    tokens = np.asarray(tokens)
    n, a, kv_heads, d = len(tokens), config.heads, config.kv_heads, config.hidden // config.heads
    if not 1 <= n <= config.seq_len:
        raise ValueError(f"tokens must hold 1..seq_len={config.seq_len} ids, got {n}")

    def get(name):
        return params[name].astype(np.float32)

    def linear(x, name):
        y = x @ get(f"{name}.weight")
        return y + get(f"{name}.bias") if config.bias else y

    def norm(x, name):
        if config.norm == "layernorm":
            centred = x - x.mean(axis=-1, keepdims=True)
            scaled = centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + 1e-5)
            return scaled * get(f"{name}.weight") + get(f"{name}.bias")
        return x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + 1e-5) * get(f"{name}.weight")

    x = get("wte")[tokens]
    if config.positions == "learned":
        x = x + get("wpe")[:n]
    future = np.triu(np.ones((n, n), dtype=bool), k=1)
    for i in range(config.layers):
        y = norm(x, f"h.{i}.ln_1")
        q = linear(y, f"h.{i}.attn.q").reshape(n, a, d).transpose(1, 0, 2)
        k = linear(y, f"h.{i}.attn.k").reshape(n, kv_heads, d).transpose(1, 0, 2)
        v = linear(y, f"h.{i}.attn.v").reshape(n, kv_heads, d).transpose(1, 0, 2)
        if config.positions == "rotary":
            q, k = _rotary(q), _rotary(k)
        # Grouped-query attention: each key/value head serves a/kv_heads query heads.
        k, v = np.repeat(k, a // kv_heads, axis=0), np.repeat(v, a // kv_heads, axis=0)
        scores = np.where(future, -np.inf, q @ k.transpose(0, 2, 1) / np.sqrt(d))
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        x = x + linear((weights @ v).transpose(1, 0, 2).reshape(n, a * d), f"h.{i}.attn.o")
        y = norm(x, f"h.{i}.ln_2")
        if config.mlp == "gelu":
            u = linear(y, f"h.{i}.mlp.fc")
            u = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u**3)))
            x = x + linear(u, f"h.{i}.mlp.proj")
        else:
            gate = linear(y, f"h.{i}.mlp.gate")
            x = x + linear(gate / (1 + np.exp(-gate)) * linear(y, f"h.{i}.mlp.up"),
                           f"h.{i}.mlp.down")
    x = norm(x, "ln_f")
    head = get("wte").T if config.tied_embeddings else get("lm_head.weight")
    return x @ head


# -- cell 171
COLUMN_PARALLEL = ("attn.q", "attn.k", "attn.v", "mlp.fc", "mlp.gate", "mlp.up")
ROW_PARALLEL = ("attn.o", "mlp.proj", "mlp.down")


def check_split(config: TransformerConfig, tp: int, pp: int) -> None:
    """Raise ValueError unless tp divides heads, kv_heads and ffn_hidden, and pp divides layers."""
    _check_count("tp", tp)
    _check_count("pp", pp)
    for field_name in ("heads", "kv_heads", "ffn_hidden"):
        value = getattr(config, field_name)
        if value % tp:
            raise ValueError(f"tp must divide {field_name}: tp={tp}, {field_name}={value}")
    if config.layers % pp:
        raise ValueError(f"pp must divide layers (each stage holds layers/pp whole blocks): "
                         f"pp={pp}, layers={config.layers}")


def _vocab_shard(matrix: np.ndarray, axis: int, tp: int, tp_rank: int) -> np.ndarray:
    """This rank's slice of a vocabulary-sized axis, zero-padded to a multiple of tp."""
    vocab = matrix.shape[axis]
    rows = -(-vocab // tp)                                  # ceil(V / tp)
    pad = [(0, 0)] * matrix.ndim
    pad[axis] = (0, rows * tp - vocab)
    padded = np.pad(matrix, pad)
    return np.take(padded, np.arange(tp_rank * rows, (tp_rank + 1) * rows), axis=axis)


# -- cell 172
def shard_numpy_model(config: TransformerConfig, params: dict[str, np.ndarray], tp: int = 1,
                      tp_rank: int = 0, pp: int = 1, stage: int = 0) -> dict[str, np.ndarray]:
    """The arrays held by tensor-parallel rank `tp_rank` of pipeline stage `stage` (copies):
    - the stage holds layers [stage·l/pp, (stage+1)·l/pp); stage 0 also the embeddings, the last
      stage the final norm and the head — with tied embeddings and pp > 1 a copy of the token
      embedding, as Megatron-LM keeps one there to compute the logits;
    - column-parallel weights (q, k, v, fc, gate, up) and their biases are cut into tp equal parts
      along the output axis, row-parallel weights (o, proj, down) along the input axis; their
      biases and every norm are replicated;
    - the token embedding and an untied head are cut along the vocabulary, zero-padded to a
      multiple of tp; the learned position table is replicated."""
    check_split(config, tp, pp)
    if not 0 <= tp_rank < tp or not 0 <= stage < pp:
        raise ValueError(f"need 0 ≤ tp_rank < tp and 0 ≤ stage < pp, got tp_rank={tp_rank}, "
                         f"tp={tp}, stage={stage}, pp={pp}")
    per_stage = config.layers // pp
    mine = range(stage * per_stage, (stage + 1) * per_stage)
    first, last = stage == 0, stage == pp - 1
    held = {}
    for name, array in params.items():
        if name.startswith("h."):
            _, index, rest = name.split(".", 2)
            if int(index) not in mine:
                continue
            module, kind = rest.rsplit(".", 1)
            if module in COLUMN_PARALLEL:
                held[name] = np.split(array, tp, axis=-1)[tp_rank].copy()
            elif module in ROW_PARALLEL and kind == "weight":
                held[name] = np.split(array, tp, axis=0)[tp_rank].copy()
            else:
                held[name] = array.copy()
        elif name == "wte" and first:
            held[name] = _vocab_shard(array, 0, tp, tp_rank)
        elif name == "wpe" and first:
            held[name] = array.copy()
        elif name.startswith("ln_f") and last:
            held[name] = array.copy()
        elif name == "lm_head.weight" and last:
            held[name] = _vocab_shard(array, 1, tp, tp_rank)
    if config.tied_embeddings and last and pp > 1:
        held["wte (copy for the head)"] = _vocab_shard(params["wte"], 0, tp, tp_rank)
    return held


# -- cell 174
def _layer_params_per_tp_rank(config: TransformerConfig, tp: int) -> int:
    """Parameters of one block on one of tp tensor-parallel ranks: the matrices and the
    column-parallel biases split t ways, row-parallel biases and norms whole."""
    h, kv, f, t = config.hidden, config.kv_dim, config.ffn_hidden, tp
    n_in = config.mlp_in_matrices
    count = (h * h + 2 * h * kv + h * h) // t + (n_in + 1) * h * f // t + 2 * config.norm_params
    if config.bias:
        count += (h + 2 * kv) // t + h          # q, k, v biases split; o's bias whole
        count += n_in * f // t + h              # fc (gate, up) biases split; proj's whole
    return count


def params_per_rank(config: TransformerConfig, tp: int = 1, pp: int = 1, stage: int = 0) -> int:
    """Exact parameters held by one rank of pipeline stage `stage` (0-based) under tp-way tensor
    and pp-way pipeline parallelism (the split that `shard_numpy_model` performs):
    l/p blocks of `_layer_params_per_tp_rank`; stage 0 adds ⌈V/t⌉·h token embeddings (+ s·h
    learned positions); the last stage the final norm and ⌈V/t⌉·h for the head (untied, or the
    tied embedding's copy when p > 1). With t = p = 1 it is `config.num_params()`."""
    check_split(config, tp, pp)
    if not 0 <= stage < pp:
        raise ValueError(f"stage must be in 0..pp−1 = 0..{pp - 1}, got {stage}")
    vocab_rows = -(-config.vocab // tp)          # ceil(V / t): the padded vocabulary shard
    count = (config.layers // pp) * _layer_params_per_tp_rank(config, tp)
    if stage == 0:
        count += vocab_rows * config.hidden
        if config.positions == "learned":
            count += config.seq_len * config.hidden
    if stage == pp - 1:
        count += config.norm_params
        if not config.tied_embeddings or pp > 1:
            count += vocab_rows * config.hidden
    return count


# -- cell 176
@dataclass(frozen=True)
class BytesPerParameter:
    """Bytes of training state per parameter: weight, gradient, optimizer state (K)."""
    params: int
    grads: int
    optimizer: int


PRECISIONS = {
    # fp16 weights and gradients; fp32 master weights, Adam momentum and variance (ZeRO's K = 12);
    # fp16's 5 exponent bits need a loss scale so that small gradients do not flush to zero
    "mixed": BytesPerParameter(params=2, grads=2, optimizer=12),
    # bf16 keeps fp32's 8 exponent bits (7 of mantissa): no loss scale, the same bytes
    "bf16": BytesPerParameter(params=2, grads=2, optimizer=12),
    # fp32 weights and gradients; Adam momentum and variance
    "fp32": BytesPerParameter(params=4, grads=4, optimizer=8),
}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes held by one rank, by kind. `stage` is the pipeline stage it describes."""
    params: float
    grads: float
    optimizer: float
    activations: float = 0.0
    buffers: float = 0.0
    stage: int = 0

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers

    def in_gb(self) -> dict[str, float]:
        """Every part and the total in GB (10⁹ bytes)."""
        parts = ("params", "grads", "optimizer", "activations", "buffers", "total")
        return {part: getattr(self, part) / GB for part in parts}


# -- cell 177
def zero_model_state_bytes(num_params: float, dp: int, zero_stage: int,
                           precision: str = "mixed") -> MemoryBreakdown:
    """Bytes of parameters, gradients and optimizer state on each of N_d = dp data-parallel ranks
    for Ψ = num_params parameters (Rajbhandari et al. 2020, Figure 1), with 2, 2, K the
    precision's bytes per weight, gradient and optimizer state (mixed: K = 12):
      stage 0 (plain DP)   (2 + 2 + K)Ψ
      stage 1 (P_os)       4Ψ + KΨ/N_d
      stage 2 (P_os+g)     2Ψ + (2 + K)Ψ/N_d
      stage 3 (P_os+g+p)   (2 + 2 + K)Ψ/N_d
    Shards are exactly Ψ/N_d (real shards are padded to ⌈Ψ/N_d⌉; the formula ignores that).
    The arithmetic is section 3's `zero_memory_formula`; this adds the precision presets."""
    if isinstance(num_params, bool) or not isinstance(num_params, numbers.Real) \
            or not num_params > 0 or num_params != int(num_params):
        raise ValueError(f"num_params must be > 0 and a whole count, got {num_params!r}")
    _check_count("dp", dp)
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    _check_choice("precision", precision, tuple(PRECISIONS))
    per = PRECISIONS[precision]
    parts = zero_memory_formula(zero_stage, int(num_params), dp, per.params, per.grads,
                                per.optimizer)
    return MemoryBreakdown(parts["params"], parts["grads"], parts["optimizer"])


def zero_model_states(n_params: float, dp: int, stage: int) -> float:
    """Bytes of model states per rank — weights, gradients and optimizer state, mixed-precision
    Adam — at ZeRO `stage` on dp ranks: the total of `zero_model_state_bytes`."""
    return zero_model_state_bytes(n_params, dp, stage).total


# -- cell 179
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "gpipe")


def activation_bytes_per_layer(config: TransformerConfig, micro_batch: int, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none",
                               seq_len: int | None = None) -> float:
    """Bytes of 16-bit activations one transformer layer keeps for the backward pass, for one
    micro-batch, on one tensor-parallel rank (Korthikanti et al. 2022, Table 2), with s = seq_len
    (default config.seq_len), b = micro_batch, h hidden, a heads, t = tp:
      tensor parallel          sbh(10 + 24/t + 5as/(ht))    (t = 1: sbh(34 + 5as/h))
      + sequence parallel      sbh(34/t + 5as/(ht))
      selective recomputation  the 5as/(ht) term dropped
      full recomputation       2sbh: only the layer's input is kept
    The constants are GPT's (a 4h GELU MLP, as many key/value heads as query heads); for a
    Llama-style config they are an approximation."""
    _check_count("micro_batch", micro_batch)
    _check_count("tp", tp)
    _check_choice("recompute", recompute, RECOMPUTE)
    s = config.seq_len if seq_len is None else _check_count("seq_len", seq_len)
    b, h, a, t = micro_batch, config.hidden, config.heads, tp
    if recompute == "full":
        return 2.0 * s * b * h
    if sequence_parallel:
        linear_part = s * b * h * 34 / t
    else:
        linear_part = s * b * h * (10 + 24 / t)
    attention_matrices = 5 * a * s * s * b / t          # = sbh · 5as/(ht)
    if recompute == "selective":
        return linear_part
    return linear_part + attention_matrices


def inflight_microbatches(pp: int, stage: int, microbatches: int,
                          schedule: str = "1f1b", chunks: int = 1) -> float:
    """Micro-batches whose activations stage `stage` (0-based) of a pp-stage pipeline holds at
    its peak: 1F1B min(pp − stage, m), GPipe all m (REFERENCES.md, Pipelines). With v = chunks
    > 1 (the interleaved 1F1B schedule) a stage runs 2(pp − stage − 1) + (v − 1)·pp warm-up
    forwards of one chunk (1/v of its layers) each before its first backward (Megatron-LM's
    interleaved schedule), so it holds that many chunk-forwards plus one: in whole micro-batches
    of the stage, (2(pp − stage − 1) + (v − 1)·pp + 1)/v, at most m."""
    _check_count("pp", pp)
    _check_count("microbatches", microbatches)
    _check_count("chunks", chunks)
    _check_choice("schedule", schedule, SCHEDULES)
    if not 0 <= stage < pp:
        raise ValueError(f"stage must be in 0..pp−1 = 0..{pp - 1}, got {stage}")
    if schedule == "gpipe":
        return microbatches
    if chunks == 1:
        return min(pp - stage, microbatches)
    chunk_forwards = 2 * (pp - stage - 1) + (chunks - 1) * pp + 1
    return min(chunk_forwards, microbatches * chunks) / chunks


# -- cell 181
DDP_BUCKET_BYTES = 25 * 2**20       # PyTorch DDP's default bucket cap


def _check_layout(layout) -> None:
    """Layout's argument checks: a ValueError naming the field, its value and the rule."""
    for field_name in ("dp", "tp", "pp", "micro_batch", "microbatches", "chunks"):
        _check_count(field_name, getattr(layout, field_name))
    if layout.zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be 0, 1, 2 or 3, got {layout.zero!r}")
    _check_choice("recompute", layout.recompute, RECOMPUTE)
    _check_choice("precision", layout.precision, tuple(PRECISIONS))
    _check_choice("schedule", layout.schedule, SCHEDULES)
    if layout.zero >= 2 and layout.pp > 1:
        raise ValueError(
            f"zero={layout.zero} with pp={layout.pp} is refused: ZeRO-{layout.zero} shards "
            f"the gradients, but each pipeline stage accumulates them over m micro-batches, so "
            f"every micro-batch would have to reduce-scatter them"
            + (" and re-gather the weights" if layout.zero == 3 else "")
            + " (DeepSpeed refuses ZeRO-2/3 with pipeline parallelism); use zero ≤ 1 with "
              "pp > 1")
    if layout.chunks > 1:
        if layout.pp == 1 or layout.schedule != "1f1b":
            raise ValueError(f"chunks={layout.chunks} (the interleaved schedule) needs pp > 1 "
                             f"and schedule '1f1b', got pp={layout.pp}, "
                             f"schedule={layout.schedule!r}")
        if layout.microbatches % layout.pp:
            raise ValueError(f"the interleaved schedule needs microbatches a multiple of "
                             f"pp={layout.pp}, got {layout.microbatches}")


# -- cell 182
@dataclass(frozen=True)
class Layout:
    """How a model is trained on dp × tp × pp devices.

    dp, tp, pp          data-, tensor- and pipeline-parallel sizes
    zero                ZeRO stage 0–3 over the dp ranks
    micro_batch         sequences per micro-batch, b
    microbatches        micro-batches per step per pipeline, m (global batch = dp·b·m)
    recompute           "none", "selective" or "full" activation recomputation
    sequence_parallel   Megatron's sequence parallelism (changes nothing when tp = 1)
    precision           "mixed" (fp16 weights and activations with a loss scale, fp32 Adam),
                        "bf16" (the same bytes, no loss scale) or "fp32"
    schedule            pipeline schedule, "1f1b" or "gpipe" (micro-batches in flight)
    chunks              v, model chunks per pipeline stage: v > 1 is Megatron-LM's interleaved
                        1F1B schedule (needs pp > 1, schedule "1f1b", layers/pp divisible by v
                        — checked against a config by `check_chunks` — and m a multiple of pp)

    ZeRO-2 and ZeRO-3 are refused with pp > 1: a pipeline stage accumulates its gradients over
    m micro-batches, so sharded gradients would have to be reduce-scattered after every
    micro-batch's backward on every stage, and ZeRO-3 would re-gather the weights for every
    micro-batch's forward and backward — DeepSpeed refuses the combination for that reason
    and pairs pipelines with ZeRO-1 only."""
    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    micro_batch: int = 1
    microbatches: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    precision: str = "mixed"
    schedule: str = "1f1b"
    chunks: int = 1

    def __post_init__(self):
        _check_layout(self)

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def global_batch(self) -> int:
        """Sequences per step: dp · micro_batch · microbatches."""
        return self.dp * self.micro_batch * self.microbatches

    def label(self) -> str:
        extras = [] if self.recompute == "none" else [f"{self.recompute} recompute"]
        if self.chunks > 1:
            extras.append(f"interleaved v{self.chunks}")
        if self.sequence_parallel and self.tp > 1:
            extras.append("SP")
        return (f"dp{self.dp}·tp{self.tp}·pp{self.pp} ZeRO-{self.zero} b{self.micro_batch}"
                + "".join(f", {extra}" for extra in extras))


# -- cell 183
def check_chunks(config: TransformerConfig, layout: Layout) -> None:
    """Raise ValueError unless the layout splits the config: `check_split`, and v = chunks
    dividing each stage's layers/pp blocks."""
    check_split(config, layout.tp, layout.pp)
    if (config.layers // layout.pp) % layout.chunks:
        raise ValueError(f"chunks must divide the layers per stage: chunks={layout.chunks}, "
                         f"layers/pp = {config.layers // layout.pp}")


def buffer_bytes(config: TransformerConfig, layout: Layout, grads_bytes: float,
                 bucket_bytes: float = DDP_BUCKET_BYTES) -> float:
    """Temporary communication buffers on one rank (an assumption, not a paper's formula):
    with dp > 1 one gradient bucket, min(bucket_bytes, this rank's gradient bytes); with ZeRO-3
    also the all-gathered 16-bit weights of two blocks of this tensor-parallel rank."""
    if layout.dp == 1:
        return 0.0
    total = min(float(bucket_bytes), grads_bytes)
    if layout.zero == 3:
        block = _layer_params_per_tp_rank(config, layout.tp)
        total += 2 * block * PRECISIONS[layout.precision].params
    return total


def stage_memory(config: TransformerConfig, layout: Layout, stage: int,
                 bucket_bytes: float = DDP_BUCKET_BYTES) -> MemoryBreakdown:
    """Bytes held by a rank of pipeline stage `stage`: ZeRO-sharded model state of its
    `params_per_rank`, Korthikanti activations of its l/p layers times the micro-batches in
    flight (doubled for fp32 activations), and `buffer_bytes`."""
    check_split(config, layout.tp, layout.pp)
    psi = params_per_rank(config, layout.tp, layout.pp, stage)
    state = zero_model_state_bytes(psi, layout.dp, layout.zero, layout.precision)
    per_layer = activation_bytes_per_layer(config, layout.micro_batch, layout.tp,
                                           layout.sequence_parallel, layout.recompute)
    if layout.precision == "fp32":
        per_layer *= 2      # 4-byte activations (the 1-byte dropout masks double too: approximate)
    check_chunks(config, layout)
    in_flight = inflight_microbatches(layout.pp, stage, layout.microbatches, layout.schedule,
                                      layout.chunks)
    activations = per_layer * (config.layers // layout.pp) * in_flight
    buffers = buffer_bytes(config, layout, state.grads, bucket_bytes)
    return MemoryBreakdown(state.params, state.grads, state.optimizer, activations, buffers,
                           stage)


def memory_per_rank(config: TransformerConfig, layout: Layout,
                    bucket_bytes: float = DDP_BUCKET_BYTES) -> MemoryBreakdown:
    """The accountant: bytes on the most loaded rank of `layout` (the stage whose total is the
    largest; its `stage` field says which). All numbers in bytes; `.in_gb()` for GB = 10⁹ B."""
    stages = [stage_memory(config, layout, stage, bucket_bytes) for stage in range(layout.pp)]
    return max(stages, key=lambda breakdown: breakdown.total)


# -- cell 185
from dsml.net.presets import DEVICES, LINKS


def forward_flops_per_sequence(config: TransformerConfig, seq_len: int | None = None) -> float:
    """FLOPs of one forward pass over one sequence of s tokens, counting only matrix products and
    a multiply-add as 2 (Narayanan et al. 2021's counting): per layer 2s × (weights of its
    matrices) + 4s²h (scores QKᵀ and attention over V), plus 2shV for the output head."""
    s = config.seq_len if seq_len is None else _check_count("seq_len", seq_len)
    h, kv, f = config.hidden, config.kv_dim, config.ffn_hidden
    matrix_weights = 2 * h * h + 2 * h * kv + (config.mlp_in_matrices + 1) * h * f
    per_layer = 2 * s * matrix_weights + 4 * s * s * h
    return float(config.layers * per_layer + 2 * s * h * config.vocab)


def training_flops(config: TransformerConfig, sequences: int, recompute: str = "none",
                   seq_len: int | None = None) -> float:
    """FLOPs of one training step over `sequences` sequences: the backward pass costs twice the
    forward, so 3 × forward; full recomputation runs the layers' forward once more (not the
    head's), selective recomputation only the attention part 4s²h per layer. For a GPT-style
    config with full recomputation this is Narayanan et al. 2021, eq. 3:
    96Bslh²(1 + s/(6h) + V/(16lh))."""
    _check_count("sequences", sequences)
    _check_choice("recompute", recompute, RECOMPUTE)
    s = config.seq_len if seq_len is None else _check_count("seq_len", seq_len)
    forward = forward_flops_per_sequence(config, s)
    extra = 0.0
    if recompute == "full":
        extra = forward - 2 * s * config.hidden * config.vocab
    elif recompute == "selective":
        extra = config.layers * 4 * s * s * config.hidden
    return sequences * (3 * forward + extra)


# -- cell 187
# The step model's constants, each with its source. The peak FLOP/s and the links are week 3's
# presets (dsml.net.presets: A100 312 TFLOP/s dense fp16/bf16, NVLink 3 and InfiniBand HDR).
A100_HBM_BANDWIDTH = 2.039e12   # B/s: NVIDIA A100 datasheet (2021), 80 GB SXM4, HBM2e
KERNEL_SECONDS = 5e-6           # s: a floor on any kernel (launch and tail); an assumption of
#                                 the order CUDA launch overheads are measured at (a few µs)
GEMM_EFFICIENCY = 0.641         # a large fp16 matrix product's fraction of peak: FITTED, the
#                                 model's one fitted constant, on one row of Megatron-LM's
#                                 Table 1 (section 4, Reproduce)
ACTIVATION_BYTES = 2            # 16-bit activations (mixed precision)
MASK_BYTES = 1                  # a dropout mask element (PyTorch keeps it as 1 byte)
BACKWARD_TRAFFIC = 2            # an element-wise op's backward reads its saved input and the
#                                 incoming gradient and writes a gradient: ~2× its forward bytes
#                                 (an assumption, not a measurement; docs/measurements.md says how
#                                 much Table 1's predictions move with it)
LOSS_BYTES = 12                 # per logit: forward reads 16-bit, writes fp32 (2 + 4); backward
#                                 reads fp32, writes 16-bit (4 + 2) — Megatron's fp32 loss
ADAM_BYTES = 28                 # per parameter an Adam step reads and writes: fp32 master,
#                                 momentum, variance (3 × 4 read + 3 × 4 written), the 16-bit
#                                 gradient read and the 16-bit weight written (2 + 2)


def matmul_seconds(rows: int, inner: int, cols: int, batch: int = 1,
                   device_flops: float = DEVICES["a100"].flops,
                   memory_bandwidth: float = A100_HBM_BANDWIDTH,
                   gemm_efficiency: float = GEMM_EFFICIENCY) -> float:
    """Seconds of `batch` products (rows × inner) @ (inner × cols) in 16-bit, by the roofline
    (Williams et al. 2009): the slower of the arithmetic, 2·batch·rows·inner·cols FLOPs at
    gemm_efficiency × peak, and the memory traffic, reading both operands and writing the result
    once (2 bytes each) at the HBM bandwidth; never less than KERNEL_SECONDS. Large products
    are compute-bound; thin ones (a head dimension of 64–160 against s = 2,048) are
    memory-bound, and tiny ones cost the kernel floor."""
    for name, value in (("rows", rows), ("inner", inner), ("cols", cols), ("batch", batch)):
        _check_count(name, value)
    return _matmul_seconds(rows, inner, cols, batch, device_flops, memory_bandwidth,
                           gemm_efficiency)


def _matmul_seconds(rows, inner, cols, batch, device_flops, memory_bandwidth, gemm_efficiency):
    """`matmul_seconds` without the argument checks (the step model calls it ~30 times)."""
    arithmetic = 2.0 * batch * rows * inner * cols / (gemm_efficiency * device_flops)
    traffic = ACTIVATION_BYTES * batch * (rows * inner + inner * cols + rows * cols)
    return max(arithmetic, traffic / memory_bandwidth, KERNEL_SECONDS)


def achieved_fraction(rows: int, inner: int, cols: int, batch: int = 1,
                      device_flops: float = DEVICES["a100"].flops, **kernel) -> float:
    """The fraction of peak FLOP/s `matmul_seconds` predicts for a product of this shape."""
    seconds = matmul_seconds(rows, inner, cols, batch, device_flops, **kernel)
    return 2.0 * batch * rows * inner * cols / (seconds * device_flops)


# -- cell 188
def layer_matmuls(config: TransformerConfig, micro_batch: int, tp: int = 1) -> dict:
    """The matrix products of one transformer layer's forward for one micro-batch on one
    tensor-parallel rank, name → (batch, rows, inner, cols): the T = b·s tokens through the
    rank's columns of the QKV and MLP-input weights and its rows of the output projection and
    MLP-output weights (Megatron's split), and attention's two batched products over the
    rank's b·a/t heads (scores QKᵀ, then the weights times V), the full s × s as in 2021."""
    s, b, h, t = config.seq_len, micro_batch, config.hidden, tp
    tokens, heads = s * b, b * config.heads // t
    return {"qkv": (1, tokens, h, (h + 2 * config.kv_dim) // t),
            "scores": (heads, s, config.head_dim, s),
            "attend": (heads, s, s, config.head_dim),
            "projection": (1, tokens, h // t, h),
            "mlp in": (1, tokens, h, config.mlp_in_matrices * config.ffn_hidden // t),
            "mlp out": (1, tokens, config.ffn_hidden // t, h)}


def layer_elementwise_bytes(config: TransformerConfig, micro_batch: int, tp: int = 1,
                            sequence_parallel: bool = False) -> dict:
    """HBM bytes of one layer's memory-bound (element-wise) kernels in the forward pass, for
    one micro-batch on one tensor-parallel rank, with Megatron-LM 2021's fused kernels
    (N = s·b·h elements, divided by t where sequence parallelism splits them; S = b·a·s²/t
    attention scores; F = s·b·f/t MLP elements):
      2 LayerNorms          read and write N each                      2 · 2·2N
      scale-mask-softmax    read and write S                           2·2S
      attention dropout     read and write S, write a mask             (2·2 + 1)S
      2 bias-dropout-adds   read x and the residual, write, mask       2 · (3·2 + 1)N
      bias-activation       read the MLP input(s), write the output    (inputs + 1)·2F
    These are GPT's kernels, dropout included; for a Llama-style config (RMSNorm, usually no
    dropout) they are an overestimate by the masks and dropout passes."""
    s, b, h, t = config.seq_len, micro_batch, config.hidden, tp
    rows = s * b * h / (t if sequence_parallel else 1)
    scores = b * config.heads * s * s / t
    ffn = s * b * config.ffn_hidden / t
    a, mask = ACTIVATION_BYTES, MASK_BYTES
    return {"layernorms": 2 * 2 * a * rows,
            "softmax": 2 * a * scores,
            "attention dropout": (2 * a + mask) * scores,
            "bias-dropout-add": 2 * (3 * a + mask) * rows,
            "activation": (config.mlp_in_matrices + 1) * a * ffn}


# -- cell 190
def ring_seconds(kind: str, nbytes: float, ranks: int, alpha: float, bandwidth: float) -> float:
    """α–β time of a ring collective over `ranks` ranks on `nbytes` (the whole buffer): an
    all-reduce 2(k−1)α + 2(k−1)/k·n/B, a reduce-scatter or all-gather half that; 0 for k = 1."""
    if ranks == 1:
        return 0.0
    steps = {"allreduce": 2, "reduce_scatter": 1, "all_gather": 1}[kind]
    return steps * ((ranks - 1) * alpha + (ranks - 1) / ranks * nbytes / bandwidth)


def stage_microbatch_seconds(config: TransformerConfig, layout: Layout, stage: int,
                             hw: dict) -> dict:
    """Seconds one micro-batch costs pipeline stage `stage` of `layout`, by part:
    forward     its l/p layers' matrix products (`matmul_seconds`) and element-wise kernels
                (`layer_elementwise_bytes` at the HBM bandwidth); the last stage adds the
                output head's product and the loss over its V/t logits
    backward    twice the products and BACKWARD_TRAFFIC × the element-wise bytes, plus the
                recomputation: full reruns the layers' forward, selective the attention core
    tensor      ring all-reduces of the 16-bit activations 2·s·b·h per layer: 2 forward, 2
                backward, 2 more in a full recomputation; one more on the first stage (the
                vocabulary-parallel embedding) and on the last (the head's input gradient)
    pipeline    2v point-to-point transfers of the activation 2·s·b·h (one in, one out per
                chunk): Megatron's scatter-gather sends 1/t of it per tensor rank over the
                link between stages, then all-gathers it over NVLink"""
    t, p, v, b = layout.tp, layout.pp, layout.chunks, layout.micro_batch
    tokens = config.seq_len * b
    kernel = (hw["device_flops"], hw["memory_bandwidth"], hw["gemm_efficiency"])
    products = {name: _matmul_seconds(rows, inner, cols, batch, *kernel)
                for name, (batch, rows, inner, cols) in layer_matmuls(config, b, t).items()}
    traffic = layer_elementwise_bytes(config, b, t, layout.sequence_parallel)
    layer_forward = sum(products.values()) + sum(traffic.values()) / hw["memory_bandwidth"]
    layer_backward = (2 * sum(products.values())
                      + BACKWARD_TRAFFIC * sum(traffic.values()) / hw["memory_bandwidth"])
    if layout.recompute == "full":
        layer_backward += layer_forward
    elif layout.recompute == "selective":
        core = ("softmax", "attention dropout")
        layer_backward += (products["scores"] + products["attend"]
                           + sum(traffic[k] for k in core) / hw["memory_bandwidth"])
    layers = config.layers // p
    forward, backward = layers * layer_forward, layers * layer_backward
    if stage == p - 1:
        head = _matmul_seconds(tokens, config.hidden, -(-config.vocab // t), 1, *kernel)
        loss = LOSS_BYTES * tokens * config.vocab / t / hw["memory_bandwidth"] / 2
        forward, backward = forward + head + loss, backward + 2 * head + loss
    tp_intra = t <= hw["devices_per_node"]
    tp_link = ((hw["intra_node_alpha"], hw["intra_node_bandwidth"]) if tp_intra
               else (hw["inter_node_alpha"], hw["inter_node_bandwidth"]))
    activation = ACTIVATION_BYTES * tokens * config.hidden
    allreduces = layers * (6 if layout.recompute == "full" else 4) + (stage == 0) + (stage == p - 1)
    tensor = allreduces * ring_seconds("allreduce", activation, t, *tp_link)
    pipeline = 0.0
    if p > 1:
        pp_intra = t * layout.dp * p <= hw["devices_per_node"]
        alpha, bandwidth = ((hw["intra_node_alpha"], hw["intra_node_bandwidth"]) if pp_intra
                            else (hw["inter_node_alpha"], hw["inter_node_bandwidth"]))
        send = alpha + activation / t / bandwidth
        send += ring_seconds("all_gather", activation, t, *tp_link)
        pipeline = 2 * v * send
    return {"forward": forward, "backward": backward, "tensor": tensor, "pipeline": pipeline}


# -- cell 192
@dataclass(frozen=True)
class StepEstimate:
    """The step model's seconds per step, by term, and MFU (model FLOPs per second as a
    fraction of the devices' peak). The terms add up to `seconds`."""
    seconds: float
    compute_seconds: float
    bubble_seconds: float
    tensor_comm_seconds: float
    data_comm_seconds: float
    mfu: float
    pipeline_comm_seconds: float = 0.0
    optimizer_seconds: float = 0.0


def data_parallel_seconds(config, layout, slowest, hw, psi=None) -> float:
    """Exposed seconds of the data-parallel traffic (see `estimate_step`) of psi parameters per
    rank (default: the larger of the first and last stages' `params_per_rank`)."""
    d, t, p, m = layout.dp, layout.tp, layout.pp, layout.microbatches
    if d == 1:
        return 0.0
    intra = t * d <= hw["devices_per_node"]
    link = ((hw["intra_node_alpha"], hw["intra_node_bandwidth"]) if intra
            else (hw["inter_node_alpha"], hw["inter_node_bandwidth"]))
    if psi is None:
        psi = max(params_per_rank(config, t, p, 0), params_per_rank(config, t, p, p - 1))
    per = PRECISIONS[layout.precision]
    grads, weights = per.grads * psi, per.params * psi
    bucket = min(float(DDP_BUCKET_BYTES), grads)
    buckets = -(-grads // DDP_BUCKET_BYTES)
    forward, backward = slowest["forward"], slowest["backward"]

    def ring(kind, nbytes, pieces=1):       # one ring collective per piece: α paid per piece
        steps = 2 if kind == "allreduce" else 1
        return ring_seconds(kind, nbytes, d, *link) + (pieces - 1) * steps * (d - 1) * link[0]

    if p > 1:                   # ZeRO 0-1: one all-reduce after the pipeline's flush
        return ring("allreduce", grads)     # (Megatron 2021's local DDP, a contiguous buffer)
    if layout.zero == 0:
        return max(ring("allreduce", grads, buckets) - backward, ring("allreduce", bucket))
    if layout.zero <= 2:        # the gradients reduce-scattered in the backward (ZeRO-1 once,
        #                         in the last micro-batch's; ZeRO-2 in every micro-batch's), then
        #                         the updated 16-bit weights all-gathered after the optimizer
        #                         step, where no backward is left to hide it
        scatter = ring("reduce_scatter", grads, buckets)
        exposed = max(scatter - backward, ring("reduce_scatter", bucket))
        return (m if layout.zero == 2 else 1) * exposed + ring("all_gather", weights)
    units = config.layers      # one all-gather per block, the next prefetched during this one
    gather = ring("all_gather", weights, units)       # ZeRO-3: per micro-batch
    scatter = ring("reduce_scatter", grads, units)
    exposed = (max(gather - forward, gather / units)
               + max(gather + scatter - backward, (gather + scatter) / units))
    return m * exposed          # no gather after the step: the next forward gathers


# -- cell 193
def estimate_step(config: TransformerConfig, layout: Layout,
                  device_flops: float = DEVICES["a100"].flops,
                  intra_node_bandwidth: float = LINKS["nvlink3"].bandwidth,
                  inter_node_bandwidth: float = LINKS["ib_hdr"].bandwidth,
                  devices_per_node: int = 8,
                  memory_bandwidth: float = A100_HBM_BANDWIDTH,
                  gemm_efficiency: float = GEMM_EFFICIENCY,
                  intra_node_alpha: float = LINKS["nvlink3"].alpha,
                  inter_node_alpha: float = LINKS["ib_hdr"].alpha) -> StepEstimate:
    """Seconds of one training step of `layout`. Ranks are placed tp innermost, then dp, then
    pp; a group inside one node of `devices_per_node` uses the intra-node link, else the
    inter-node one (each GPU its own NIC, as on Selene).
    pipeline   the slowest stage's `stage_microbatch_seconds` (compute, tensor-parallel and
               point-to-point traffic, none overlapped — Megatron 2021 overlaps none of them)
               m times, plus the bubble (p − 1)/v of it (Narayanan et al. 2021)
    data       the gradients' data-parallel traffic, ring collectives of 16-bit values (α paid
               once per DDP bucket or per FSDP block):
               ZeRO 0, one all-reduce per step, overlapped with the last micro-batch's
               backward when pp = 1 (PyTorch DDP's buckets: only the last bucket is exposed);
               ZeRO 0–1 with pp > 1, one all-reduce after the flush; ZeRO-1 (pp = 1), a
               reduce-scatter overlapped with the last micro-batch's backward, ZeRO-2 one in
               every micro-batch's backward, each plus the weights' all-gather after the
               optimizer step (exposed: no backward is left to hide it); ZeRO-3, per micro-batch
               an all-gather of the weights overlapped with its forward and one more plus a
               reduce-scatter overlapped with its backward (FSDP's prefetch: one block's
               share at least is exposed each time)
    optimizer  an Adam step over this rank's (ZeRO-sharded) parameters, ADAM_BYTES each at
               the HBM bandwidth
    mfu = 3 × forward FLOPs × global batch / (devices · device_flops · seconds).
    Limits: products are costed as 16-bit whatever `layout.precision` (an fp32 layout's
    arithmetic is far slower than this says), and the embedding lookup, the gradient-norm
    clipping and any host-side gaps are left out."""
    check_chunks(config, layout)
    hw = dict(device_flops=device_flops, memory_bandwidth=memory_bandwidth,
              gemm_efficiency=gemm_efficiency, devices_per_node=devices_per_node,
              intra_node_bandwidth=intra_node_bandwidth, inter_node_bandwidth=inter_node_bandwidth,
              intra_node_alpha=intra_node_alpha, inter_node_alpha=inter_node_alpha)
    p, m, v = layout.pp, layout.microbatches, layout.chunks
    stages = {stage: stage_microbatch_seconds(config, layout, stage, hw) for stage in {0, p - 1}}
    slowest = max(stages.values(), key=lambda parts: sum(parts.values()))
    per_microbatch = sum(slowest.values())
    compute = m * (slowest["forward"] + slowest["backward"])
    tensor, pipeline = m * slowest["tensor"], m * slowest["pipeline"]
    bubble = (p - 1) / v * per_microbatch
    data = data_parallel_seconds(config, layout, slowest, hw)
    psi = max(params_per_rank(config, layout.tp, p, 0),
              params_per_rank(config, layout.tp, p, p - 1))
    optimizer = ADAM_BYTES * psi / (layout.dp if layout.zero >= 1 else 1) / memory_bandwidth
    seconds = compute + tensor + pipeline + bubble + data + optimizer
    model_flops = 3 * forward_flops_per_sequence(config) * layout.global_batch
    mfu = model_flops / (layout.devices * device_flops * seconds)
    return StepEstimate(seconds, compute, bubble, tensor, data, mfu, pipeline, optimizer)


# -- cell 195
@dataclass(frozen=True)
class LayoutResult:
    """One layout of the search: its memory (the binding rank), its step estimate, and whether
    it fits the device."""
    layout: Layout
    memory: MemoryBreakdown
    step: StepEstimate
    fits: bool


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


# -- cell 196
def search_layouts(config: TransformerConfig, devices: int, global_batch: int,
                   device_bytes: float, micro_batches=(1, 2, 4, 8), zero_stages=(0, 1, 2, 3),
                   recompute=RECOMPUTE, precision: str = "mixed", schedule: str = "1f1b",
                   only_fitting: bool = True, bucket_bytes: float = DDP_BUCKET_BYTES,
                   **hardware) -> list[LayoutResult]:
    """Every layout dp·tp·pp = devices (tp dividing heads, kv_heads and ffn_hidden; pp dividing
    layers; dp·micro_batch dividing global_batch), for each micro-batch size, ZeRO stage (stages
    above 0 only with dp > 1, above 1 only with pp = 1), recomputation and, with tp > 1, with
    and without sequence parallelism; scored by `memory_per_rank` and `estimate_step`
    (`hardware`: its keyword arguments). Returns those whose bytes fit in device_bytes (all if only_fitting is False),
    fastest first."""
    _check_count("devices", devices)
    _check_count("global_batch", global_batch)
    if not device_bytes > 0:
        raise ValueError(f"device_bytes must be > 0, got {device_bytes!r}")
    for stage in zero_stages:
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stages must hold stages 0–3, got {stage!r}")
    for micro_batch in micro_batches:
        _check_count("micro_batches", micro_batch)
    for choice in recompute:
        _check_choice("recompute", choice, RECOMPUTE)
    _check_choice("precision", precision, tuple(PRECISIONS))
    _check_choice("schedule", schedule, SCHEDULES)
    results = []
    for tp in _divisors(devices):
        if config.heads % tp or config.kv_heads % tp or config.ffn_hidden % tp:
            continue
        for pp in _divisors(devices // tp):
            if config.layers % pp:
                continue
            dp = devices // (tp * pp)
            for micro_batch in micro_batches:
                if global_batch % (dp * micro_batch):
                    continue
                microbatches = global_batch // (dp * micro_batch)
                for zero in zero_stages:
                    if zero > 0 and dp == 1:
                        continue        # ZeRO shards over data-parallel ranks: nothing to shard
                    if zero >= 2 and pp > 1:
                        continue        # refused by Layout: see its docstring
                    for choice in recompute:
                        for sequence_parallel in ((False, True) if tp > 1 else (False,)):
                            layout = Layout(dp, tp, pp, zero, micro_batch, microbatches, choice,
                                            sequence_parallel, precision, schedule)
                            memory = memory_per_rank(config, layout, bucket_bytes)
                            fits = memory.total <= device_bytes
                            if fits or not only_fitting:
                                step = estimate_step(config, layout, **hardware)
                                results.append(LayoutResult(layout, memory, step, fits))
    results.sort(key=lambda result: (result.step.seconds, result.memory.total))
    return results


# -- cell 197
def pareto_frontier(results: list[LayoutResult]) -> list[LayoutResult]:
    """The layouts no other beats on both memory and MFU: sorted by bytes per rank, each with a
    higher MFU than every layout that needs less memory."""
    frontier, best_mfu = [], -1.0
    for result in sorted(results, key=lambda r: (r.memory.total, -r.step.mfu)):
        if result.step.mfu > best_mfu:
            frontier.append(result)
            best_mfu = result.step.mfu
    return frontier


# -- cell 236
# Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
# Megatron-LM", SC21), Table 1: GPT models, V = 51,200, s = 2,048, full recomputation, fp16, on
# Selene's A100 80 GB nodes. Columns: name, heads a, hidden h, layers l, tensor size t, pipeline
# size p, GPUs, batch B, achieved TFLOP/s per GPU. The micro-batch b and the chunks per stage v
# are the authors' own run scripts (NVIDIA/Megatron-LM, examples/academic_paper_scripts/sc21/
# run_table_1.sh: --micro-batch-size; v = layers per stage divided by
# --num-layers-per-virtual-pipeline-stage).
# Every column but a, b and v was checked against the table as Megatron-LM's README printed
# it in April 2021 (images/cases_april2021.png: hidden, layers, t·p, GPUs, batch, TFLOP/s).
MEGATRON_TABLE1 = (
    # name     a      h    l  t   p  GPUs     B  TFLOP/s  b  v
    ("1.7B",  24,  2304,  24, 1,  1,   32,  512, 137,   16, 1),
    ("3.6B",  32,  3072,  30, 2,  1,   64,  512, 138,   16, 1),
    ("7.5B",  32,  4096,  36, 4,  1,  128,  512, 142,   16, 1),
    ("18.4B", 48,  6144,  40, 8,  1,  256, 1024, 135,    8, 1),
    ("39.1B", 64,  8192,  48, 8,  2,  512, 1536, 138,    4, 1),
    ("76.1B", 80, 10240,  60, 8,  4, 1024, 1792, 140,    2, 3),
    ("145.6B", 96, 12288, 80, 8,  8, 1536, 2304, 148,    2, 2),
    ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155,   1, 2),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163,  1, 3),
    ("1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 163, 1, 1),
)
MEGATRON_VOCAB, MEGATRON_SEQ = 51200, 2048


@dataclass(frozen=True)
class PublishedRun:
    """One row of a published throughput table beside the step model's prediction."""
    name: str
    config: TransformerConfig
    layout: Layout
    published_tflops: float
    predicted_tflops: float


def megatron_table1(**hardware) -> list[PublishedRun]:
    """Megatron-LM's Table 1, row by row, with `estimate_step`'s prediction: the paper's FLOPs
    per step (its eq. 3, `training_flops` with full recomputation) over GPUs × predicted
    seconds, in TFLOP/s per GPU. `hardware`: estimate_step's keyword arguments."""
    rows = []
    for name, heads, hidden, layers, t, p, gpus, batch, tflops, b, v in MEGATRON_TABLE1:
        config = TransformerConfig.gpt_style(layers, hidden, heads, MEGATRON_VOCAB, MEGATRON_SEQ,
                                             name=f"GPT {name}")
        dp = gpus // (t * p)
        layout = Layout(dp=dp, tp=t, pp=p, zero=0, micro_batch=b,
                        microbatches=batch // (dp * b), recompute="full", chunks=v)
        seconds = estimate_step(config, layout, **hardware).seconds
        predicted = training_flops(config, batch, "full") / (gpus * seconds) / 1e12
        rows.append(PublishedRun(name, config, layout, tflops, predicted))
    return rows
