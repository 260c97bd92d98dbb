"""Generated from notebooks/week5_model_and_pipeline_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""

# imports repeated from earlier cells of the same notebook (added by the exporter)
from dataclasses import dataclass

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.memory import DDP_BUCKET_BYTES, Layout, PRECISIONS, RECOMPUTE, check_chunks, params_per_rank
from dsml.model_config import TransformerConfig, _check_choice, _check_count


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
