"""Reference solutions of week 2's exercises (collective communication).

Each function has the name of the notebook stub it solves; `check("2.k", f)` passes for each.
Units: alpha in seconds; beta and gamma in seconds per byte; sizes in bytes; bandwidths in
bytes per second. Rank programs are generators, run with `dsml.run(program, p, ...)`.
"""
from __future__ import annotations

import math

import numpy as np

import dsml
from dsml.collectives import allreduce
from dsml.net import AlphaBeta


def ring_allgather(comm, x):
    """Exercise 2.1: every rank returns the concatenation of all ranks' x, in rank order.

    p − 1 steps; in step s rank r sends the block of rank (r − s) mod p to its right and
    receives the block of rank (r − s − 1) mod p from its left: (p − 1)(α + mβ) for m-byte
    blocks, each port carrying every foreign block exactly once.
    """
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    blocks = [None] * p
    blocks[r] = x
    for step in range(p - 1):
        blocks[(r - step - 1) % p] = yield comm.sendrecv(right, blocks[(r - step) % p], left)
    return np.concatenate(blocks)


def ring_bandwidth_time(p: int, nbytes: float, beta: float) -> float:
    """Exercise 2.2: 2(p − 1)/p · nβ s, the ring all-reduce's bandwidth term.

    Reduce-scatter and all-gather each take p − 1 steps in which every rank sends one block
    of n/p bytes; all ranks send at once, so the steps add: 2(p − 1) · (n/p)β.
    """
    return 2 * (p - 1) / p * nbytes * beta


def ring_reduce_scatter(comm, x):
    """Exercise 2.3: rank r returns block r of np.array_split(sum of all x, p).

    In step s rank r sends its running sum of block (r − s − 1) mod p to the right and adds
    the running sum of block (r − s − 2) mod p that arrives from the left; the last addition
    (step p − 2) completes block r on rank r. (p − 1) steps of about n/p bytes each.
    """
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    blocks = [block.copy() for block in np.array_split(x, p)]
    for step in range(p - 1):
        send_index, recv_index = (r - step - 1) % p, (r - step - 2) % p
        got = yield comm.sendrecv(right, blocks[send_index], left)
        blocks[recv_index] = blocks[recv_index] + got
    return blocks[r]


def allreduce_any_p(comm, x):
    """Exercise 2.4: the elementwise sum on every rank, for any p, in ⌊lg p⌋ + 2 rounds.

    With p = 2^m + q: ranks 0 … 2q − 1 pair up, each even rank hands its vector to the odd
    one and sits out; the 2^m ranks left (the odd ones of the pairs and ranks 2q … p − 1)
    run recursive doubling, exchanging with the partner whose index differs in one bit;
    finally each odd rank of a pair sends the sum back to its even partner.
    """
    p, r = comm.size, comm.rank
    core = 1 << (p.bit_length() - 1)          # 2^m, the largest power of two ≤ p
    extra = p - core                          # q folded pairs
    data = x.copy()
    if r < 2 * extra and r % 2 == 0:           # hand my vector over, wait for the result
        yield comm.send(r + 1, data)
        return (yield comm.recv(r + 1))
    if r < 2 * extra:
        data = data + (yield comm.recv(r - 1))
        index = r // 2
    else:
        index = r - extra

    def rank_of(i):                           # who plays index i among the 2^m ranks
        return 2 * i + 1 if i < extra else i + extra

    mask = 1
    while mask < core:
        partner = rank_of(index ^ mask)
        data = data + (yield comm.sendrecv(partner, data, partner))
        mask <<= 1
    if r < 2 * extra:
        yield comm.send(r - 1, data)
    return data


def folded_allreduce_time(p: int, nbytes: float, alpha: float, beta: float,
                          gamma: float) -> float:
    """Exercise 2.5: simulated time (s) of recursive doubling with folding, p ≥ 2.

    p a power of two: lg p (α + nβ + nγ). Otherwise, with m = ⌊lg p⌋: one fold exchange and
    its addition, m doubling rounds, one unfold exchange: (m + 2)(α + nβ) + (m + 1)nγ.
    """
    m = p.bit_length() - 1
    if p == 1 << m:
        return m * (alpha + nbytes * (beta + gamma))
    return (m + 2) * (alpha + nbytes * beta) + (m + 1) * nbytes * gamma


def ring_crossover_size(p: int, alpha: float, beta: float, gamma: float) -> float:
    """Exercise 2.6: the size n* (bytes) above which the ring all-reduce beats recursive
    doubling, for p a power of two ≥ 4.

    lg p(α + nβ + nγ) = 2(p − 1)α + 2(p − 1)/p·nβ + (p − 1)/p·nγ
    ⇒ n* = (2(p − 1) − lg p)α / (lg p(β + γ) − (p − 1)/p·(2β + γ)).
    """
    L = math.log2(p)
    return (2 * (p - 1) - L) * alpha / (L * (beta + gamma) - (p - 1) / p * (2 * beta + gamma))


def bus_bandwidth(collective: str, p: int, nbytes: float, seconds: float) -> float:
    """Exercise 2.7: busbw (B/s) as nccl-tests reports it: algbw = S/t times 2(p − 1)/p for
    all-reduce, (p − 1)/p for all-gather and reduce-scatter, 1 for broadcast."""
    factor = {"allreduce": 2 * (p - 1) / p, "allgather": (p - 1) / p,
              "reduce_scatter": (p - 1) / p, "broadcast": 1.0}[collective]
    return nbytes / seconds * factor


def pick_allreduce(p: int, nbytes: int, alpha: float, beta: float, gamma: float) -> str:
    """Exercise 2.8: the fastest of recursive doubling, ring and halving–doubling for an
    n-byte all-reduce on p ranks, found by timing each in the simulator."""
    network = AlphaBeta(alpha, beta, gamma)

    def simulated_time(algorithm):
        def program(comm):
            return (yield from allreduce(comm, dsml.SizeOnly(nbytes), algorithm=algorithm))
        return dsml.run(program, p, engine="sim", network=network, trace=False).time

    times = {name: simulated_time(name)
             for name in ("recursive_doubling", "ring", "halving_doubling")}
    return min(times, key=times.get)
