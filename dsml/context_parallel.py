"""Generated from notebooks/week5b_context_parallelism.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 5
import math
import numbers

import numpy as np

from dsml.comm import SizeOnly
from dsml.step_model import ACTIVATION_BYTES


def check_split(seq: int, cp: int, parts_per_rank: int = 1) -> None:
    """A sequence of `seq` positions splits into cp·parts_per_rank equal chunks, none empty."""
    for name, value in (("seq", seq), ("cp", cp)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be an integer ≥ 1, got {value!r}")
    chunks = cp * parts_per_rank
    if seq % chunks:
        raise ValueError(f"seq ({seq}) must be a multiple of {chunks} (cp = {cp} ranks × "
                         f"{parts_per_rank} chunk(s) each), so that every rank holds as many "
                         f"positions as every other")


def contiguous_layout(seq: int, cp: int) -> list:
    """Rank r holds positions r·s/cp … (r+1)·s/cp − 1: a list of cp index arrays."""
    check_split(seq, cp)
    return list(np.arange(seq).reshape(cp, seq // cp))


def zigzag_layout(seq: int, cp: int) -> list:
    """Cut the sequence into 2·cp chunks; rank r holds chunk r and chunk 2·cp − 1 − r, so every
    rank has one early and one late chunk (Megatron-LM's causal load balancing)."""
    check_split(seq, cp, 2)
    chunks = np.arange(seq).reshape(2 * cp, seq // (2 * cp))
    return [np.concatenate([chunks[r], chunks[2 * cp - 1 - r]]) for r in range(cp)]


def striped_layout(seq: int, cp: int) -> list:
    """Rank r holds positions r, r + cp, r + 2·cp, …: every rank samples the whole sequence
    (Brandon et al. 2023, "striped attention")."""
    check_split(seq, cp)
    return [np.arange(r, seq, cp) for r in range(cp)]


# -- cell 6
def check_layout(layout, seq: int, cp: int) -> None:
    """A layout gives each of cp ranks the same number of positions, each of 0 … seq − 1 once."""
    if len(layout) != cp:
        raise ValueError(f"layout has {len(layout)} entries for cp = {cp} ranks: one per rank")
    if len({len(positions) for positions in layout}) != 1:
        raise ValueError(f"layout gives the ranks {[len(p) for p in layout]} positions: the ring "
                         f"passes equal blocks, so every rank must hold as many as every other")
    held = np.sort(np.concatenate(layout))
    if not np.array_equal(held, np.arange(seq)):
        raise ValueError(f"layout must hold each position 0 … {seq - 1} exactly once")


def visible_pairs(q_positions, k_positions, causal: bool) -> int:
    """How many (query, key) pairs attention computes: all of them, or with a causal mask only
    those whose key position is ≤ the query's."""
    if not causal:
        return len(q_positions) * len(k_positions)
    keys = np.sort(k_positions)
    return int(np.searchsorted(keys, q_positions, side="right").sum())


# -- cell 9
def block_scores(q, k, q_positions, k_positions, causal: bool):
    """q·kᵀ/√d for one block of queries against one block of keys, (…, nq, nk); with a causal
    mask the pairs whose key comes after the query are −∞."""
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        scores = np.where(q_positions[:, None] >= k_positions[None, :], scores, -np.inf)
    return scores


def empty_state(q):
    """The online softmax before any key: running max −∞, running sum 0, running output 0."""
    rows = q.shape[:-1]
    return np.full(rows, -np.inf), np.zeros(rows), np.zeros(q.shape)


def online_update(state, q, k, v, q_positions, k_positions, causal: bool):
    """Fold one K/V block into the running (max m, sum l, unnormalised output o) of softmax
    attention (Milakov & Gimelshein 2018; FlashAttention): rescale what was kept by
    exp(m_old − m_new) and add the new block's exp(scores − m_new)."""
    m, l, o = state
    scores = block_scores(q, k, q_positions, k_positions, causal)
    m_new = np.maximum(m, scores.max(axis=-1))
    shift = np.where(np.isfinite(m_new), m_new, 0.0)    # a row with no key yet stays empty
    p = np.exp(scores - shift[..., None])
    keep = np.exp(m - shift)
    return m_new, l * keep + p.sum(axis=-1), o * keep[..., None] + p @ v


def finish(state):
    """(output, log-sum-exp of each query's scores) from the final running state."""
    m, l, o = state
    return o / l[..., None], m + np.log(l)


# -- cell 12
FORWARD_FLOPS_PER_PAIR = 4     # × d: q·k (2d) and p·v (2d), a multiply-add counted as 2
BACKWARD_FLOPS_PER_PAIR = 10   # × d: q·k again (2d), then dV, dP, dQ and dK (2d each)


def pass_along(comm, payload, right: int, left: int):
    """Rank program piece: send `payload` to the right neighbour and return what the left one
    sent. Spawned as a second activity, it runs while the rank computes."""
    got = yield comm.sendrecv(right, payload, left)
    return got


def spend(comm, flops: float, flop_rate):
    """Charge flops / flop_rate seconds of simulated compute (nothing when flop_rate is None)."""
    if flop_rate is not None:
        yield comm.compute(flops / flop_rate)


def ring_attention_forward(comm, q, k, v, layout, causal: bool = True, flop_rate=None):
    """Rank program: this rank's share of softmax attention with the sequence split by `layout`
    (layout[r] = the positions rank r holds). q, k, v are the rank's own (…, s/cp, d) blocks.
    The K/V blocks travel once around the ring; each step's transfer runs beside the step's
    compute. Returns (output, log-sum-exp), both for this rank's positions only."""
    rank, cp = comm.rank, comm.size
    right, left = (rank + 1) % cp, (rank - 1) % cp
    mine, kv, state = layout[rank], np.stack([k, v]), empty_state(q)
    rows_per_pair = q[..., 0, 0].size                   # batch × heads
    for step in range(cp):
        owner = (rank - step) % cp                      # whose K/V block this rank now holds
        if step < cp - 1:                               # start passing it on at once
            transfer = yield comm.spawn(pass_along(comm, kv, right, left))
        pairs = visible_pairs(mine, layout[owner], causal)
        if pairs:                                       # a wholly masked block costs nothing
            state = online_update(state, q, kv[0], kv[1], mine, layout[owner], causal)
            yield from spend(comm, FORWARD_FLOPS_PER_PAIR * q.shape[-1] * pairs * rows_per_pair,
                             flop_rate)
        if step < cp - 1:
            kv = yield comm.join(transfer)
    return finish(state)


# -- cell 14
def block_backward(q, k, v, dout, lse, delta, q_positions, k_positions, causal: bool):
    """(dq, dk, dv) of one query block against one K/V block, from the forward's log-sum-exp
    (so the softmax is rebuilt block by block: P = exp(scores − lse)) and
    delta = Σ dout ⊙ out per query."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    p = np.exp(block_scores(q, k, q_positions, k_positions, causal) - lse[..., None])
    dv = np.swapaxes(p, -1, -2) @ dout
    dscores = p * (dout @ np.swapaxes(v, -1, -2) - delta[..., None])
    return dscores @ k * scale, np.swapaxes(dscores, -1, -2) @ q * scale, dv


def ring_attention_backward(comm, q, k, v, out, lse, dout, layout, causal: bool = True,
                            flop_rate=None):
    """Rank program: (dq, dk, dv) of this rank's blocks. dQ stays here; K/V travel around the
    ring as in the forward, and their gradients dK/dV travel with them, each rank adding its
    share, until one last step brings them home to the block's owner."""
    rank, cp = comm.rank, comm.size
    right, left = (rank + 1) % cp, (rank - 1) % cp
    mine, kv = layout[rank], np.stack([k, v])
    delta = (dout * out).sum(axis=-1)
    dq, dkv = np.zeros(q.shape), np.zeros(kv.shape)
    rows_per_pair = q[..., 0, 0].size
    for step in range(cp):
        owner = (rank - step) % cp
        if step < cp - 1:
            transfer = yield comm.spawn(pass_along(comm, kv, right, left))
        pairs = visible_pairs(mine, layout[owner], causal)
        if pairs:
            dq_part, dk_part, dv_part = block_backward(q, kv[0], kv[1], dout, lse, delta,
                                                       mine, layout[owner], causal)
            dq += dq_part
            dkv += np.stack([dk_part, dv_part])
            yield from spend(comm, BACKWARD_FLOPS_PER_PAIR * q.shape[-1] * pairs * rows_per_pair,
                             flop_rate)
        if step < cp - 1:
            kv = yield comm.join(transfer)
        if cp > 1:                                      # the gradients follow their block
            dkv = yield comm.sendrecv(right, dkv, left)
    return dq, dkv[0], dkv[1]


# -- cell 16
def ring_attention_step(comm, q, k, v, dout, layout, causal: bool = True, flop_rate=None):
    """Rank program: forward and backward of ring attention on this rank's share. q, k, v, dout
    are the whole (…, seq, d) arrays; the rank keeps the positions layout[rank] of each.
    Returns a dict of its output, log-sum-exp, gradients and the time its forward ended."""
    check_layout(layout, q.shape[-2], comm.size)
    mine = layout[comm.rank]
    q, k, v, dout = (x[..., mine, :] for x in (q, k, v, dout))
    out, lse = yield from ring_attention_forward(comm, q, k, v, layout, causal, flop_rate)
    forward_end = yield comm.now()
    dq, dk, dv = yield from ring_attention_backward(comm, q, k, v, out, lse, dout, layout,
                                                    causal, flop_rate)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv, "forward_end": forward_end}


def gather_sequence(parts, layout):
    """Put each rank's (…, s/cp, d) part back at its positions: the whole (…, seq, d) array."""
    seq = sum(len(positions) for positions in layout)
    whole = np.zeros(parts[0].shape[:-2] + (seq,) + parts[0].shape[-1:])
    for part, positions in zip(parts, layout):
        whole[..., positions, :] = part
    return whole


def ring_attention_timing(comm, layout, rows: int, d: int, itemsize: int, causal: bool,
                          flop_rate: float):
    """Rank program: the forward's schedule without its arithmetic, for sizes too large to
    compute here: the same transfers (as size-only payloads) and the same compute charges."""
    rank, cp = comm.rank, comm.size
    right, left = (rank + 1) % cp, (rank - 1) % cp
    for step in range(cp):
        owner = (rank - step) % cp
        if step < cp - 1:
            block = SizeOnly(2 * rows * len(layout[owner]) * d * itemsize)
            transfer = yield comm.spawn(pass_along(comm, block, right, left))
        pairs = visible_pairs(layout[rank], layout[owner], causal)
        if pairs:
            yield from spend(comm, FORWARD_FLOPS_PER_PAIR * d * pairs * rows, flop_rate)
        if step < cp - 1:
            yield comm.join(transfer)


# -- cell 21
def ring_attention_kv_bytes(seq: int, kv_dim: int, cp: int, micro_batch: int = 1,
                            itemsize: int = ACTIVATION_BYTES, tp: int = 1) -> float:
    """Bytes one rank sends per layer in ring attention's forward (Liu et al. 2023): its K and
    V blocks, (s/cp)·h_kv each per sequence, passed cp − 1 times round the ring:
    2·(cp − 1)·(s/cp)·h_kv·itemsize·b/tp. h_kv = kv_dim = kv_heads·head_dim is the width of the
    key (and value) projection: h without grouped-query attention, h_kv/tp per rank with
    tensor parallelism. Checked against the ring's trace in this notebook; week 5c's layout
    search uses it."""
    check_split(seq, cp)
    return 2 * (cp - 1) * (seq / cp) * kv_dim * itemsize * micro_batch / tp
