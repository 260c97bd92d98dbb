"""Generated from notebooks/week5c_expert_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 5
import itertools
import math
import numbers
from dataclasses import dataclass, replace

import numpy as np

from dsml.model_config import TransformerConfig


def _count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer ≥ {minimum}, got {value!r}")
    return int(value)


def _check_factor(capacity_factor) -> float:
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, numbers.Real) \
            or not 0 < capacity_factor < math.inf:
        raise ValueError(f"capacity_factor must be a finite number > 0, got {capacity_factor!r}")
    return float(capacity_factor)


@dataclass(frozen=True)
class MoE:
    """A mixture-of-experts variant of a TransformerConfig: every layer's MLP becomes
    `experts` copies of it (each of width config.ffn_hidden) behind a router (an h × E linear
    map), each token going to `k` of them, with `capacity_factor` slots per fair share."""
    experts: int
    k: int = 1
    capacity_factor: float = 1.25

    def __post_init__(self):
        _count("experts", self.experts)
        if _count("k", self.k) > self.experts:
            raise ValueError(f"k must be at most experts={self.experts}, got {self.k}")
        _check_factor(self.capacity_factor)


def expert_mlp_params(config: TransformerConfig) -> int:
    """Parameters of one expert of one layer: the config's MLP (its h×f input matrices, its
    f×h output, and their biases if the config has biases)."""
    h, f, ins = config.hidden, config.ffn_hidden, config.mlp_in_matrices
    return (ins + 1) * h * f + (ins * f + h if config.bias else 0)


def moe_params(config: TransformerConfig, moe: MoE) -> dict:
    """Exact parameter counts of the MoE model: "total" (every expert and the routers) and
    "active" (what one token uses: k experts per layer, the routers and everything else)."""
    dense = config.num_params()
    expert, router = expert_mlp_params(config), config.hidden * moe.experts
    total = dense + config.layers * ((moe.experts - 1) * expert + router)
    active = dense + config.layers * ((moe.k - 1) * expert + router)
    return {"total": total, "active": active}


# -- cell 9
def expected_overflow(tokens: int, probabilities, capacity: int) -> tuple[float, float]:
    """Top-1 routing where each of `tokens` tokens picks expert e with probability π_e,
    independently: expert e is asked X_e ~ Binomial(tokens, π_e) times and drops
    (X_e − capacity)⁺ of them. Returns (the expected dropped count Σ_e E[(X_e − C)⁺], an upper
    bound on its variance Σ_e Var[(X_e − C)⁺]: the counts of a multinomial are negatively
    associated, so the covariances of these increasing functions of them are ≤ 0 — Joag-Dev
    and Proschan 1983)."""
    tokens, capacity = _count("tokens", tokens), _count("capacity", capacity, 0)
    probabilities = np.asarray(probabilities, dtype=float)
    if probabilities.ndim != 1 or np.any(probabilities < 0) or \
            not math.isclose(probabilities.sum(), 1.0, rel_tol=1e-9):
        raise ValueError(f"probabilities must be a 1-D array of numbers ≥ 0 summing to 1, got "
                         f"{probabilities!r}")
    x = np.arange(tokens + 1)
    log_comb = np.array([math.lgamma(tokens + 1) - math.lgamma(i + 1)
                         - math.lgamma(tokens - i + 1) for i in x])
    over = np.maximum(x - capacity, 0)
    mean = variance = 0.0
    for p in probabilities:
        if p in (0.0, 1.0):
            pmf = (x == (tokens if p == 1.0 else 0)).astype(float)
        else:
            pmf = np.exp(log_comb + x * math.log(p) + (tokens - x) * math.log1p(-p))
        m = float(pmf @ over)
        mean, variance = mean + m, variance + float(pmf @ over**2) - m * m
    return mean, variance


# -- cell 13
from dsml.train.transformer import gelu, gelu_grad


def expert_capacity(tokens: int, experts: int, k: int, capacity_factor: float) -> int:
    """Slots per expert for one group of `tokens` tokens (Switch Transformer, Fedus et al.
    2022, section 2.2; GShard's per-group capacity): ⌈capacity_factor · tokens · k / experts⌉,
    the fair share of the tokens·k assignments scaled by the capacity factor."""
    tokens, experts, k = _count("tokens", tokens), _count("experts", experts), _count("k", k)
    if k > experts:
        raise ValueError(f"k must be at most experts={experts}, got {k}")
    return math.ceil(_check_factor(capacity_factor) * tokens * k / experts)


def init_moe(hidden: int, ffn: int, experts: int, seed: int = 0, std: float = 0.02) -> dict:
    """A mixture-of-experts MLP's parameters: a router (hidden, E) and E two-layer GeLU MLPs
    stacked on a leading expert axis — w1 (E, hidden, ffn), b1 (E, ffn), w2 (E, ffn, hidden),
    b2 (E, hidden). Everything N(0, std²), biases too (so that a gradient check sees them)."""
    hidden, ffn, experts = _count("hidden", hidden), _count("ffn", ffn), _count("experts", experts)
    rng = np.random.default_rng(seed)
    return {"router": std * rng.standard_normal((hidden, experts)),
            "w1": std * rng.standard_normal((experts, hidden, ffn)),
            "b1": std * rng.standard_normal((experts, ffn)),
            "w2": std * rng.standard_normal((experts, ffn, hidden)),
            "b2": std * rng.standard_normal((experts, hidden))}


# -- cell 14
def softmax(logits):
    """Softmax over the last axis (shifted by the row maximum so exp never overflows)."""
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def route(probs, k: int, capacity: int):
    """Top-k routing with a capacity. probs (T, E) are the router's softmax. Each token picks its
    k most probable experts; its gate for each is that probability (Switch's gate for k = 1;
    GShard renormalises the two gates of top-2, we do not). Slots are handed out choice by
    choice — every token's first choice in token order, then the second choices (GShard) — and
    an assignment beyond `capacity` slots of its expert is dropped (slot −1; the token's
    output from that expert is zero, as a dropped token rides the residual connection).
    Returns (expert (T, k) ints, slot (T, k) ints, gate (T, k))."""
    tokens, experts = probs.shape
    if _count("k", k) > experts:
        raise ValueError(f"k must be at most the number of experts {experts}, got {k}")
    _count("capacity", capacity, 0)
    expert = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    gate = np.take_along_axis(probs, expert, axis=1)
    slot = np.empty_like(expert)
    used = np.zeros(experts, dtype=int)
    for choice in range(k):
        onehot = np.eye(experts, dtype=int)[expert[:, choice]]       # (T, E)
        position = used + np.cumsum(onehot, axis=0) - 1               # slot if kept
        mine = position[np.arange(tokens), expert[:, choice]]
        slot[:, choice] = np.where(mine < capacity, mine, -1)
        used = np.minimum(used + onehot.sum(axis=0), capacity)
    return expert, slot, gate


def dispatch(x, expert, slot, experts: int, capacity: int):
    """The dispatch buffer (E, capacity, h): token t's row in slot `slot` of each expert it was
    routed to; empty slots stay zero (the buffer has a fixed size, as GShard's)."""
    buffer = np.zeros((experts, capacity, x.shape[-1]), dtype=x.dtype)
    kept = slot >= 0
    tokens = np.nonzero(kept)[0]
    buffer[expert[kept], slot[kept]] = x[tokens]
    return buffer


def combine(out, expert, slot, gate):
    """y (T, h) = Σ over a token's kept assignments of gate · the expert's output row."""
    kept = slot >= 0
    y = np.zeros((expert.shape[0], out.shape[-1]), dtype=out.dtype)
    rows = out[expert.clip(0), slot.clip(0)] * (gate * kept)[..., None]     # (T, k, h)
    return y + rows.sum(axis=1)


# -- cell 15
def experts_forward(w1, b1, w2, b2, buffer):
    """Each expert's MLP, GeLU(x·w1 + b1)·w2 + b2, on its own rows of the buffer (E', C, h);
    returns the output buffer and what the backward needs."""
    pre = buffer @ w1 + b1[:, None, :]
    return gelu(pre) @ w2 + b2[:, None, :], (buffer, pre)


def experts_backward(w1, w2, cache, dout):
    """Gradients of experts_forward: (dbuffer, {w1, b1, w2, b2})."""
    buffer, pre = cache
    hidden = gelu(pre)
    dhidden = dout @ w2.transpose(0, 2, 1)
    dpre = dhidden * gelu_grad(pre)
    grads = {"w1": buffer.transpose(0, 2, 1) @ dpre, "b1": dpre.sum(axis=1),
             "w2": hidden.transpose(0, 2, 1) @ dout, "b2": dout.sum(axis=1)}
    return dpre @ w1.transpose(0, 2, 1), grads


def combine_backward(dy, out, expert, slot, gate):
    """Gradients of `combine`: (dout buffer (E', C, h), dgate (T, k))."""
    kept = slot >= 0
    dgate = np.einsum("th,tkh->tk", dy, out[expert.clip(0), slot.clip(0)]) * kept
    dout = np.zeros_like(out)
    tokens, choices = np.nonzero(kept)
    np.add.at(dout, (expert[kept], slot[kept]), gate[kept][:, None] * dy[tokens])
    return dout, dgate


def router_backward(x, probs, expert, dgate, router):
    """Gradients through the gate: dgate (T, k) scattered onto the chosen experts' softmax
    probabilities, then through the softmax and the router's linear map: (dx, drouter)."""
    dprobs = np.zeros_like(probs)
    np.put_along_axis(dprobs, expert, dgate, axis=1)
    dlogits = probs * (dprobs - (dprobs * probs).sum(axis=1, keepdims=True))
    return dlogits @ router.T, x.T @ dlogits


def undispatch(dbuffer, expert, slot):
    """The backward of `dispatch`: each token's gradient is the sum of its kept slots' rows."""
    kept = slot >= 0
    rows = dbuffer[expert.clip(0), slot.clip(0)] * kept[..., None]
    return rows.sum(axis=1)


# -- cell 16
def moe_forward(params: dict, x, k: int = 1, capacity_factor: float = 1.25):
    """The mixture-of-experts MLP on one group of tokens x (T, h), unsharded: router softmax,
    top-k routing with capacity ⌈factor·T·k/E⌉, dispatch, the E experts, combine.
    Returns (y (T, h), cache for moe_backward)."""
    x = np.asarray(x)
    hidden, experts = params["router"].shape
    if x.ndim != 2 or x.shape[1] != hidden:
        raise ValueError(f"x must be (tokens, hidden={hidden}), got shape {x.shape}")
    capacity = expert_capacity(x.shape[0], experts, k, capacity_factor)
    probs = softmax(x @ params["router"])
    expert, slot, gate = route(probs, k, capacity)
    buffer = dispatch(x, expert, slot, experts, capacity)
    out, expert_cache = experts_forward(params["w1"], params["b1"], params["w2"], params["b2"],
                                        buffer)
    cache = (x, probs, expert, slot, gate, out, expert_cache)
    return combine(out, expert, slot, gate), cache


def moe_backward(params: dict, cache, dy):
    """dL/dx and dL/dparams of moe_forward for dL/dy (T, h): (dx, grads dict)."""
    x, probs, expert, slot, gate, out, expert_cache = cache
    dout, dgate = combine_backward(dy, out, expert, slot, gate)
    dbuffer, grads = experts_backward(params["w1"], params["w2"], expert_cache, dout)
    dx_router, grads["router"] = router_backward(x, probs, expert, dgate, params["router"])
    return dx_router + undispatch(dbuffer, expert, slot), grads


def routing_stats(expert, slot, experts: int) -> dict:
    """What a routing did: tokens each expert was asked to take (before the capacity), the
    dropped assignments, and the load imbalance max/mean of the requests."""
    requested = np.bincount(expert.ravel(), minlength=experts)
    return {"requested": requested, "dropped": int((slot < 0).sum()),
            "dropped_fraction": float((slot < 0).mean()),
            "imbalance": float(requested.max() / requested.mean())}


# -- cell 21
from dsml.collectives.alltoall import alltoall


def owned_experts(experts: int, ep: int, rank: int) -> slice:
    """The experts rank `rank` of `ep` holds: a contiguous E/ep of them (ep must divide E)."""
    experts, ep = _count("experts", experts), _count("ep", ep)
    if experts % ep:
        raise ValueError(f"ep must divide the number of experts {experts}, got ep={ep}")
    per = experts // ep
    return slice(rank * per, (rank + 1) * per)




def expert_parallel_moe(comm, params: dict, x, dy, k: int = 1, capacity_factor: float = 1.25):
    """Rank program: one mixture-of-experts MLP forward and backward with the experts sharded
    over comm.size = ep ranks (GShard's expert parallelism). Each rank holds its own tokens x
    (T, h) — its group — the router, and E/ep experts. Forward: route locally, dispatch buffer
    (E, C, h), all-to-all its expert blocks to their owners, run the local experts on the
    slots every rank sent, all-to-all the results back, combine. Backward: the same two
    all-to-alls in reverse order carry the output and input gradients.
    Returns (y, dx, this rank's expert gradients, this rank's router gradient — the router is
    replicated, so its gradient still has to be summed over ranks as data parallelism does)."""
    ep, rank = comm.size, comm.rank
    experts = params["router"].shape[1]
    mine = owned_experts(experts, ep, rank)
    local = {name: params[name][mine] for name in ("w1", "b1", "w2", "b2")}
    capacity = expert_capacity(x.shape[0], experts, k, capacity_factor)
    probs = softmax(x @ params["router"])
    expert, slot, gate = route(probs, k, capacity)
    buffer = dispatch(x, expert, slot, experts, capacity)
    per = experts // ep
    received = yield from alltoall(comm, [buffer[r * per:(r + 1) * per] for r in range(ep)])
    sizes = [block.shape[1] for block in received]          # each source rank's capacity
    cuts = np.cumsum(sizes)[:-1]
    out, cache = experts_forward(local["w1"], local["b1"], local["w2"], local["b2"],
                                 np.concatenate(received, axis=1))
    back = yield from alltoall(comm, np.split(out, cuts, axis=1))
    out_all = np.concatenate(back, axis=0)                  # (E, C, h): every expert's rows
    y = combine(out_all, expert, slot, gate)
    # backward: the output gradient travels to the experts, the input gradient comes back
    dout, dgate = combine_backward(dy, out_all, expert, slot, gate)
    received = yield from alltoall(comm, [dout[r * per:(r + 1) * per] for r in range(ep)])
    dbuffer, grads = experts_backward(local["w1"], local["w2"], cache,
                                      np.concatenate(received, axis=1))
    back = yield from alltoall(comm, np.split(dbuffer, cuts, axis=1))
    dx_router, drouter = router_backward(x, probs, expert, dgate, params["router"])
    dx = dx_router + undispatch(np.concatenate(back, axis=0), expert, slot)
    return y, dx, grads, drouter


def alltoall_bytes_per_rank(tokens: int, hidden: int, experts: int, k: int,
                            capacity_factor: float, ep: int, itemsize: int = 8) -> int:
    """Bytes one rank sends in one all-to-all of its dispatch buffer: the (ep − 1)/ep of its
    E·C·h buffer that belongs to other ranks' experts, C = expert_capacity(...)."""
    capacity = expert_capacity(tokens, experts, k, capacity_factor)
    owned_experts(experts, ep, 0)
    return (ep - 1) * (experts // ep) * capacity * hidden * itemsize


# -- cell 29
from dsml.comm.api import SizeOnly
from dsml.comm.run import run


def _sized_alltoall(comm, block_bytes: int):
    yield from alltoall(comm, [SizeOnly(block_bytes)] * comm.size)


def simulated_alltoall(network, ranks: int, block_bytes: int) -> tuple[float, int]:
    """Run one pairwise all-to-all of `block_bytes` per pair of ranks on `network` (payloads
    without data): (simulated seconds, bytes rank 0 sent, read from the trace)."""
    result = run(_sized_alltoall, _count("ranks", ranks, 2), network=network,
                 args=(_count("block_bytes", block_bytes, 0),))
    sent = sum(r.nbytes for r in result.trace.of_rank(0) if r.op in ("send", "sendrecv"))
    return result.time, sent


def alltoall_lower_bound(ranks: int, block_bytes: float, host_bandwidth: float,
                         group: int, group_uplink: float) -> float:
    """The fewest seconds any all-to-all can take when every rank sends block_bytes to every
    other (latency left out): the larger of a rank's injection, (p − 1)·B over its own link,
    and a group's exit, g·(p − g)·B over the bandwidth leaving a group of g ranks (a leaf
    switch's uplinks to the spines, or a node's link to the core)."""
    injection = (ranks - 1) * block_bytes / host_bandwidth
    exit_ = group * (ranks - group) * block_bytes / group_uplink
    return max(injection, exit_)


# -- cell 35
from dsml.memory import PRECISIONS, Layout, memory_per_rank, params_per_rank, zero_model_state_bytes
from dsml.step_model import (A100_HBM_BANDWIDTH, ACTIVATION_BYTES, BACKWARD_TRAFFIC,
                             GEMM_EFFICIENCY, MASK_BYTES, StepEstimate, estimate_step,
                             forward_flops_per_sequence, matmul_seconds, stage_microbatch_seconds,
                             data_parallel_seconds)
from dsml.context_parallel import ring_attention_kv_bytes
from dsml.net.presets import DEVICES, LINKS


@dataclass(frozen=True)
class ParallelLayout:
    """Week 5's Layout (dp, tp, pp, ZeRO, micro-batches, recomputation, sequence parallelism)
    plus cp, context-parallel ranks that split every sequence into cp chunks (ring attention),
    and ep, expert-parallel ranks that split each layer's experts. Devices = dp·tp·pp·cp; the
    ep ranks are drawn from the dp·cp ranks (DeepSpeed-MoE's and Megatron's choice), so ep must
    divide dp·cp. Ranks are placed tp innermost, then cp, then dp, then pp."""
    base: Layout
    cp: int = 1
    ep: int = 1

    def __post_init__(self):
        _count("cp", self.cp)
        _count("ep", self.ep)
        if (self.base.dp * self.cp) % self.ep:
            raise ValueError(f"ep must divide dp·cp = {self.base.dp * self.cp} (the experts are "
                             f"sharded over data- and context-parallel ranks), got ep={self.ep}")

    @property
    def devices(self) -> int:
        return self.base.devices * self.cp

    def label(self) -> str:
        b = self.base
        extras = [f"{b.recompute} recompute"] if b.recompute != "none" else []
        extras += ["SP"] if b.sequence_parallel and b.tp > 1 else []
        return (f"dp{b.dp}·tp{b.tp}·pp{b.pp}·cp{self.cp}·ep{self.ep} ZeRO-{b.zero} "
                f"b{b.micro_batch}" + "".join(f", {extra}" for extra in extras))


def moe_alltoall_bytes(config: TransformerConfig, moe: MoE, micro_batch: int, cp: int,
                       ep: int, tp: int = 1) -> float:
    """Bytes one rank sends in one all-to-all of a MoE layer: its b·s/cp tokens (a 1/tp share
    of them with tensor parallelism), each to k experts, in buffers scaled by the capacity
    factor, of which (ep − 1)/ep go to other ranks."""
    tokens = micro_batch * config.seq_len / cp / tp
    buffer = moe.capacity_factor * moe.k * tokens * config.hidden * ACTIVATION_BYTES
    return (ep - 1) / ep * buffer


# -- cell 36
HARDWARE = dict(device_flops=DEVICES["a100"].flops, devices_per_node=8,
                memory_bandwidth=A100_HBM_BANDWIDTH, gemm_efficiency=GEMM_EFFICIENCY,
                intra_node_bandwidth=LINKS["nvlink3"].bandwidth,
                inter_node_bandwidth=LINKS["ib_hdr"].bandwidth,
                intra_node_alpha=LINKS["nvlink3"].alpha, inter_node_alpha=LINKS["ib_hdr"].alpha)


def _link(group: int, hw: dict) -> tuple[float, float]:
    """(α, bandwidth) of a group of `group` consecutive-stride ranks: inside a node or not."""
    if group <= hw["devices_per_node"]:
        return hw["intra_node_alpha"], hw["intra_node_bandwidth"]
    return hw["inter_node_alpha"], hw["inter_node_bandwidth"]


def attention_core_seconds(config: TransformerConfig, micro_batch: int, tp: int, queries: int,
                           keys: int, hw: dict) -> tuple[float, float]:
    """Forward seconds of one layer's attention core, week 5's way (its matrix products by the
    roofline, the softmax and dropout over the scores at the HBM bandwidth, no fused
    attention kernel), for `queries` query positions against `keys` key positions on the
    b·a/t heads of one tensor-parallel rank: (products, score traffic)."""
    heads = micro_batch * config.heads // tp
    kernel = {name: hw[name] for name in ("device_flops", "memory_bandwidth", "gemm_efficiency")}
    products = (matmul_seconds(queries, config.head_dim, keys, heads, **kernel)
                + matmul_seconds(queries, keys, config.head_dim, heads, **kernel))
    scores = heads * queries * keys * (2 * ACTIVATION_BYTES + 2 * ACTIVATION_BYTES + MASK_BYTES)
    return products, scores / hw["memory_bandwidth"]


def inner_problem(config: TransformerConfig, layout: ParallelLayout, moe: MoE | None = None):
    """The week 5 problem this layout reduces to: each of the dp·cp ranks of a data-and-context
    group sees sequences of s/cp tokens (so cp acts on weights and gradients like more data
    parallelism), and a MoE layer's MLP computes like a dense MLP k times as wide.
    Returns (config, Layout) for week 5's estimate_step and memory_per_rank."""
    if config.seq_len % layout.cp:
        raise ValueError(f"cp must divide the sequence length {config.seq_len}, got cp={layout.cp}")
    if moe is not None and moe.experts % layout.ep:
        raise ValueError(f"ep must divide the {moe.experts} experts, got ep={layout.ep}")
    if moe is None and layout.ep > 1:
        raise ValueError(f"ep={layout.ep} needs a MoE model (moe=None is dense)")
    width = config.ffn_hidden * (moe.k if moe else 1)
    inner = replace(config, seq_len=config.seq_len // layout.cp, ffn_hidden=width)
    return inner, replace(layout.base, dp=layout.base.dp * layout.cp)


def parallel_memory(config: TransformerConfig, layout: ParallelLayout, moe: MoE | None = None):
    """Bytes on the most loaded rank: week 5's accountant on the inner problem, with the
    experts' model state corrected from k experts sharded over dp·cp ranks to E/ep experts
    sharded (ZeRO) over the dp·cp/ep ranks that hold the same experts."""
    inner, base = inner_problem(config, layout, moe)
    held = memory_per_rank(inner, base).total
    if moe is None:
        return held
    per_stage = config.layers // base.pp * expert_mlp_params(config) // base.tp
    real = zero_model_state_bytes(per_stage * (moe.experts // layout.ep),
                                  base.dp // layout.ep, base.zero, base.precision).total
    counted = zero_model_state_bytes(per_stage * moe.k, base.dp, base.zero, base.precision).total
    return held + real - counted


# -- cell 37
@dataclass(frozen=True)
class ParallelEstimate:
    """Seconds of one step and its parts beyond week 5's: `base` is estimate_step on the inner
    problem; `attention` the attention work cp adds back (a chunk's queries meet all s keys);
    `ring` the K/V transfers not hidden behind attention; `alltoall` the MoE all-to-alls;
    `data` the data-parallel traffic, replacing the base's (`expert_data_seconds`), of which
    `expert_data` is the experts' share, over their own data-parallel group."""
    seconds: float
    base: StepEstimate
    attention: float
    ring: float
    alltoall: float
    data: float
    expert_data: float
    mfu: float


def expert_data_seconds(config: TransformerConfig, layout: ParallelLayout, moe: MoE,
                        hw: dict) -> tuple[float, float]:
    """(dense, experts): exposed seconds of a MoE layout's data-parallel traffic by week 5's
    own rule (`data_parallel_seconds`: its overlap with the backward, its collective for each
    ZeRO stage), applied twice: to the dense weights (the inner problem's Ψ less its k
    experts) over all dp·cp ranks, and to the E/ep experts a rank holds over the dp·cp/ep
    ranks that hold the same ones, on the link their span needs (stride t·ep, span t·dp·cp).
    Each group hides behind the whole backward as if alone; in truth the two share it and the
    link, so this is optimistic when both are large."""
    inner, base = inner_problem(config, layout, moe)
    t, p = base.tp, base.pp
    stages = [stage_microbatch_seconds(inner, base, stage, hw) for stage in {0, p - 1}]
    slowest = max(stages, key=lambda parts: sum(parts.values()))
    expert = config.layers // p * expert_mlp_params(config) // t
    psi = max(params_per_rank(inner, t, p, 0), params_per_rank(inner, t, p, p - 1))
    dense = data_parallel_seconds(inner, base, slowest, hw, psi=psi - moe.k * expert)
    alpha, bandwidth = _link(t * base.dp, hw)
    span = {**hw, "intra_node_alpha": alpha, "intra_node_bandwidth": bandwidth}
    experts = data_parallel_seconds(inner, replace(base, dp=base.dp // layout.ep), slowest,
                                     span, psi=expert * (moe.experts // layout.ep))
    return dense, experts


# -- cell 38
def estimate_parallel_step(config: TransformerConfig, layout: ParallelLayout,
                           moe: MoE | None = None, **hardware) -> ParallelEstimate:
    """Week 5's step model extended with cp and ep (costs per micro-batch, paid m + (p − 1)/v
    times, as the pipeline's bubble stretches every micro-batch's work):
    cp  a chunk's queries meet all s keys: the base charges the attention core for s/cp keys,
        so cp − 1 more key blocks' worth is added (`attention_core_seconds`, forward, backward
        and recomputation as week 5 charges them); ring attention's cp − 1 K/V hops per
        layer, each overlapped with one block's attention (only the excess shows: 5b's
        criterion, with the block costed week 5's way), twice the bytes and the compute in
        the backward;
    ep  four all-to-alls per MoE layer per micro-batch (dispatch and combine, forward and
        backward; six with full recomputation), not overlapped; the data-parallel traffic
        (`expert_data_seconds`, week 5's rule) replaces the base's, which moved k experts
        over all dp·cp ranks. The experts compute the k·T real assignments, but the
        all-to-all moves the c·k·T padded slots (the padding's compute is left out).
    Left out: the router, the token buffers' memory, uneven expert loads; the all-to-all
    costs (ep − 1)·α + bytes/bandwidth (full bisection)."""
    hw = {**HARDWARE, **hardware}
    inner, base = inner_problem(config, layout, moe)
    step = estimate_step(inner, base, **hw)
    b, t, cp, ep = base.micro_batch, base.tp, layout.cp, layout.ep
    s, layers = config.seq_len, config.layers // base.pp
    repeat = base.microbatches + (base.pp - 1) / base.chunks
    products, traffic = attention_core_seconds(config, b, t, s // cp, s // cp, hw)
    block = products + traffic                      # one ring step's attention, forward
    passes = block + 2 * products + BACKWARD_TRAFFIC * traffic
    passes += block * (base.recompute != "none")    # both recomputations rerun the core
    attention = repeat * layers * (cp - 1) * passes
    alpha, bandwidth = _link(t * cp, hw)
    hop = alpha + ring_attention_kv_bytes(s, config.kv_dim, cp, b, tp=t) / max(cp - 1, 1) / bandwidth
    exposed = max(hop - block, 0) + max(2 * hop - 2 * block, 0)
    exposed += max(hop - block, 0) * (base.recompute != "none")
    ring = repeat * layers * (cp - 1) * exposed
    alltoall, data, expert_data = 0.0, step.data_comm_seconds, 0.0
    if moe is not None and ep > 1:
        alpha, bandwidth = _link(t * ep, hw)
        one = (ep - 1) * alpha + moe_alltoall_bytes(config, moe, b, cp, ep, t) / bandwidth
        alltoall = repeat * layers * (6 if base.recompute == "full" else 4) * one
    if moe is not None:
        dense, expert_data = expert_data_seconds(config, layout, moe, hw)
        data = dense + expert_data
    seconds = step.seconds - step.data_comm_seconds + data + attention + ring + alltoall
    active = replace(config, ffn_hidden=config.ffn_hidden * (moe.k if moe else 1))
    flops = 3 * forward_flops_per_sequence(active) * layout.base.global_batch
    return ParallelEstimate(seconds, step, attention, ring, alltoall, data, expert_data,
                            flops / (layout.devices * hw["device_flops"] * seconds))


# -- cell 39
@dataclass(frozen=True)
class ParallelResult:
    """One layout of the search: the layout, the bytes on its most loaded rank, its step."""
    layout: ParallelLayout
    bytes: float
    step: ParallelEstimate


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def search_parallel_layouts(config: TransformerConfig, devices: int, global_batch: int,
                            device_bytes: float, moe: MoE | None = None,
                            micro_batches=(1, 2, 4), cps=None, recompute=("selective", "full"),
                            **hardware) -> list[ParallelResult]:
    """Every layout dp·tp·pp·cp = devices with ep dividing dp·cp and the experts (ep = 1 for a
    dense model), tp dividing the heads and the MLP width (sequence parallelism on when
    tp > 1), pp dividing the layers, cp dividing s (only those in `cps` if given), ZeRO 0 or 1
    (and 2, 3 when pp = 1), each micro-batch size that divides the batch and each recomputation
    choice. Returns those that fit in device_bytes, fastest first."""
    _count("devices", devices)
    _count("global_batch", global_batch)
    if not device_bytes > 0:
        raise ValueError(f"device_bytes must be > 0, got {device_bytes!r}")
    results = []
    for tp in _divisors(devices):
        if config.heads % tp or config.kv_heads % tp or config.ffn_hidden % tp or tp > 8:
            continue
        for cp in _divisors(devices // tp):
            if config.seq_len % cp or (cps is not None and cp not in cps):
                continue
            for pp in _divisors(devices // (tp * cp)):
                if config.layers % pp:
                    continue
                dp = devices // (tp * cp * pp)
                eps = [e for e in _divisors(dp * cp) if moe and moe.experts % e == 0] or [1]
                for ep, b, zero, choice in itertools.product(
                        eps, micro_batches, (0, 1, 2, 3), recompute):
                    if global_batch % (dp * b) or (zero >= 2 and pp > 1) or \
                            (zero and dp * cp == 1):
                        continue
                    base = Layout(dp, tp, pp, zero, b, global_batch // (dp * b), choice, tp > 1)
                    layout = ParallelLayout(base, cp, ep)
                    held = parallel_memory(config, layout, moe)
                    if held <= device_bytes:
                        results.append(ParallelResult(
                            layout, held, estimate_parallel_step(config, layout, moe, **hardware)))
    results.sort(key=lambda r: (r.step.seconds, r.bytes))
    return results
