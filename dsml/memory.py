"""Generated from notebooks/week5_model_and_pipeline_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""

# imports repeated from earlier cells of the same notebook (added by the exporter)
from dataclasses import dataclass
import numbers

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.model_config import TransformerConfig, _check_choice, _check_count
from dsml.zero import zero_memory_formula


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
GB = 1e9          # the course's gigabyte: 10⁹ bytes, the unit of the ZeRO paper's figures


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
