"""Plumbing (hand-written): gather, scatter and barrier as rank programs (`yield from` them),
with their closed-form α–β costs.

Names and argument orders follow the other collectives (and MPI_Gather, MPI_Scatter,
MPI_Barrier; torch.distributed's gather, scatter, barrier):

- `gather(comm, x, root=0, algorithm="binomial")`: the root returns the concatenation (along
  axis 0, in rank order) of every rank's `x`, as `allgather` does; the other ranks return None.
- `scatter(comm, x, root=0, algorithm="binomial")`: rank r returns block r of the root's `x`
  cut into p equal blocks along axis 0. As with `broadcast`, every rank passes an array of the
  same shape and dtype (only the root's contents matter), so a rank can check what arrives.
- `barrier(comm, algorithm="dissemination")`: no rank returns before every rank has called it.

Algorithms: "binomial" (a binomial tree over the ranks renumbered from the root: ⌈lg p⌉ rounds,
the root's port carries every other rank's block once) and "naive" (the root exchanges one
message with each rank in turn; MPI libraries call it linear). The barrier is the dissemination
algorithm (Hensgen, Finkel & Manber 1988): in round k rank r sends an empty message to
r + 2^k and receives one from r − 2^k (mod p); after ⌈lg p⌉ rounds every rank has heard,
directly or not, from every other.

Costs (`rooted_cost`, single-port full-duplex α–β, as `dsml.collectives.cost`; n is the root's
whole buffer, p blocks of n/p): gather and scatter "naive" (p − 1)(α + nβ/p), "binomial"
⌈lg p⌉α + (p − 1)/p·nβ — exact for every p, since the root's k-th message carries
min(2^k, p − 2^k) blocks and these add up to p − 1 —, barrier ⌈lg p⌉α.
"""
from __future__ import annotations

import numpy as np

from dsml.collectives.buffers import (COLLECTIVE_TAG, MismatchError, check_algorithm,
                                      check_root, concat, expect_block, flat, length, lg,
                                      mismatch_in, split)
from dsml.comm.api import SizeOnly

GATHER_ALGORITHMS = ("binomial", "naive")
SCATTER_ALGORITHMS = ("binomial", "naive")
BARRIER_ALGORITHMS = ("dissemination",)
ROOTED_ALGORITHMS = {"gather": GATHER_ALGORITHMS, "scatter": SCATTER_ALGORITHMS,
                     "barrier": BARRIER_ALGORITHMS}

_EMPTY = np.empty(0, dtype=np.uint8)       # a barrier's message: zero bytes


def gather(comm, x, root: int = 0, algorithm: str = "binomial"):
    """The root returns every rank's `x` concatenated along axis 0 in rank order (shape
    (p·x.shape[0], …), as `allgather`); the others return None. Every rank passes an array of
    the same shape and dtype. Costs: `rooted_cost("gather", algorithm, …)`."""
    check_algorithm("gather", algorithm, GATHER_ALGORITHMS)
    root = check_root(comm, root)
    mine = flat(x)
    try:
        if algorithm == "binomial":
            blocks = yield from _gather_binomial(comm, mine, root)
        else:
            blocks = yield from _gather_naive(comm, mine, root)
    except MismatchError as error:
        raise mismatch_in("gather", comm, x, error) from None
    if blocks is None:
        return None
    out = concat(blocks)                   # a new array, also for p = 1
    if isinstance(x, np.ndarray) and x.ndim:
        out = out.reshape((comm.size * x.shape[0],) + x.shape[1:])
    return out


def _gather_naive(comm, mine, root):
    """Every rank sends its block to the root, which receives them in rank order."""
    if comm.rank != root:
        yield comm.send(root, mine, COLLECTIVE_TAG)
        return None
    blocks = [None] * comm.size
    blocks[root] = mine
    for src in range(comm.size):
        if src != root:
            got = yield comm.recv(src, COLLECTIVE_TAG)
            blocks[src] = expect_block(got, mine, length(mine), src, comm, "gather")
    return blocks


def _gather_binomial(comm, mine, root):
    """Binomial tree on ranks renumbered from the root (v = rank − root mod p): in round k a
    rank whose v has bit k set sends everything it holds (the blocks of v … v + 2^k − 1, fewer
    at the end) to v − 2^k and is done; the others receive from v + 2^k if there is one."""
    p = comm.size
    v = (comm.rank - root) % p
    held = [mine]                          # blocks of v, v + 1, … in order
    distance = 1
    while distance < p:
        if v & distance:
            yield comm.send((comm.rank - distance) % p, concat(held), COLLECTIVE_TAG)
            return None
        if v + distance < p:
            src = (comm.rank + distance) % p
            count = min(distance, p - v - distance)
            got = yield comm.recv(src, COLLECTIVE_TAG)
            got = expect_block(got, mine, count * length(mine), src, comm, "gather")
            held += split(got, [length(mine)] * count)
        distance *= 2
    # The root holds the blocks of v = 0 … p − 1, i.e. of ranks root, root + 1, …: rotate.
    return [held[(r - root) % p] for r in range(p)]


def scatter(comm, x, root: int = 0, algorithm: str = "binomial"):
    """Rank r returns block r of the root's `x` cut into p equal blocks along axis 0 (shape
    (x.shape[0] / p, …)). Every rank passes an array of the same shape and dtype, whose first
    axis p divides. Costs: `rooted_cost("scatter", algorithm, …)`."""
    check_algorithm("scatter", algorithm, SCATTER_ALGORITHMS)
    root = check_root(comm, root)
    rows = length(x) if isinstance(x, SizeOnly) else (x.shape[0] if np.ndim(x) else None)
    if rows is None or rows % comm.size:
        described = "a 0-d array" if rows is None else f"{rows} along axis 0"
        raise ValueError(f"scatter: x must cut into {comm.size} equal blocks along axis 0 "
                         f"(one per rank), got {described}")
    data = flat(x)
    block = length(data) // comm.size
    try:
        if algorithm == "binomial":
            mine = yield from _scatter_binomial(comm, data, root, block)
        else:
            mine = yield from _scatter_naive(comm, data, root, block)
    except MismatchError as error:
        raise mismatch_in("scatter", comm, x, error) from None
    if isinstance(mine, np.ndarray):
        if np.shares_memory(mine, data):
            mine = mine.copy()             # the root's own block: never the caller's memory
        if isinstance(x, np.ndarray):
            mine = mine.reshape((x.shape[0] // comm.size,) + x.shape[1:])
    return mine


def _scatter_naive(comm, data, root, block):
    """The root sends each rank its block, in rank order."""
    blocks = split(data, [block] * comm.size)
    if comm.rank == root:
        for dst in range(comm.size):
            if dst != root:
                yield comm.send(dst, blocks[dst], COLLECTIVE_TAG)
        return blocks[root]
    got = yield comm.recv(root, COLLECTIVE_TAG)
    return expect_block(got, data, block, root, comm, "scatter")


def _scatter_binomial(comm, data, root, block):
    """Gather's tree run backwards: rank v (renumbered from the root) receives the blocks of
    v … v + s − 1 from v − 2^k, where 2^k is v's lowest set bit (the root holds them all),
    then hands on the upper part to v + 2^j for j = k − 1, …, 0, the largest first."""
    p = comm.size
    v = (comm.rank - root) % p
    if v == 0:
        held = data
        if root and not isinstance(data, SizeOnly):     # rank order -> order of v
            held = np.concatenate((data[root * block:], data[:root * block]))
        top = 1 << lg(p)
    else:
        top = v & -v                       # v's lowest set bit: the round it receives in
        count = min(top, p - v)
        src = (comm.rank - top) % p
        got = yield comm.recv(src, COLLECTIVE_TAG)
        held = expect_block(got, data, count * block, src, comm, "scatter")
    distance = top // 2
    while distance:
        if v + distance < p:
            count = min(distance, p - v - distance)
            part = split(held, [distance * block, count * block])[1] if \
                not isinstance(held, SizeOnly) else SizeOnly(count * block)
            yield comm.send((comm.rank + distance) % p, part, COLLECTIVE_TAG)
        distance //= 2
    return held[:block] if not isinstance(held, SizeOnly) else SizeOnly(block)


def barrier(comm, algorithm: str = "dissemination"):
    """No rank returns before every rank has called it: ⌈lg p⌉ rounds of empty messages
    (see the module's text). Returns None. Cost: ⌈lg p⌉α."""
    check_algorithm("barrier", algorithm, BARRIER_ALGORITHMS)
    p, rank = comm.size, comm.rank
    distance = 1
    while distance < p:
        yield comm.sendrecv((rank + distance) % p, _EMPTY, (rank - distance) % p,
                            COLLECTIVE_TAG)
        distance *= 2
    return None


def rooted_cost(op: str, algorithm: str, p: int, nbytes: float, alpha: float,
                beta: float) -> float:
    """Closed-form time (s) of gather, scatter or barrier under the α–β model (single-port,
    full-duplex, as `dsml.collectives.cost`). `nbytes`: the root's whole buffer (p blocks;
    ignored by the barrier). Exact on `AlphaBeta` for every p (see the module's text)."""
    if op not in ROOTED_ALGORITHMS:
        raise ValueError(f"unknown op {op!r}; choose one of {', '.join(ROOTED_ALGORITHMS)}")
    check_algorithm(op, algorithm, ROOTED_ALGORITHMS[op])
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"p must be an integer ≥ 1, got {p!r}")
    for name, value in (("nbytes", nbytes), ("alpha", alpha), ("beta", beta)):
        if not (value >= 0 and np.isfinite(value)):
            raise ValueError(f"{name} must be a finite number ≥ 0, got {value}")
    if p == 1:
        return 0.0
    n, L = nbytes, lg(p)
    table = {
        ("gather", "naive"): (p - 1) * (alpha + n / p * beta),
        ("gather", "binomial"): L * alpha + (p - 1) / p * n * beta,
        ("scatter", "naive"): (p - 1) * (alpha + n / p * beta),
        ("scatter", "binomial"): L * alpha + (p - 1) / p * n * beta,
        ("barrier", "dissemination"): L * alpha,
    }
    return table[(op, algorithm)]
