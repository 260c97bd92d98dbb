"""Reference solutions of week 1's exercises (foundations and communication).

Each function has the name of the notebook stub it solves; `check("1.k", f)` passes for each.
Units: alpha, latency and L, o, g in seconds; beta and G in seconds per byte; bandwidths in
bytes per second; sizes in bytes.
"""
from __future__ import annotations

import math


def size_for_fraction(alpha: float, beta: float, fraction: float) -> float:
    """Exercise 1.1: the size n (bytes) at which n / (α + nβ) = f/β, for 0 < f < 1.

    nβ = f(α + nβ)  ⇒  n = f/(1 − f) · α/β; f = ½ gives Hockney's n½ = α/β.
    """
    return fraction / (1 - fraction) * alpha / beta


def pipelining_break_even(hops: int, chunks: int, alpha: float, beta: float) -> float:
    """Exercise 1.2: n* = kα / ((h − 1)β) bytes, for h ≥ 2 hops and k ≥ 2 chunks.

    (h + k − 1)(α + nβ/k) < h(α + nβ)  ⇔  (k − 1)α < (h − 1)(k − 1)nβ/k
    ⇔  n > n*.
    """
    return chunks * alpha / ((hops - 1) * beta)


def two_level_time(nbytes: float, intra_latency: float, intra_bandwidth: float,
                   inter_latency: float, inter_bandwidth: float) -> float:
    """Exercise 1.3: 2(α_i + n/B_i) + 2(α_o + n/B_o) s: rank → its machine's switch (intra),
    → core (inter), → the other machine's switch (inter), → rank (intra), each hop
    store-and-forward."""
    intra_hop = intra_latency + nbytes / intra_bandwidth
    inter_hop = inter_latency + nbytes / inter_bandwidth
    return 2 * intra_hop + 2 * inter_hop


def _pipelined_time(nbytes: float, hops: int, chunks: int, alpha: float, beta: float) -> float:
    return (hops + chunks - 1) * (alpha + nbytes * beta / chunks)


def optimal_chunks(nbytes: float, hops: int, alpha: float, beta: float) -> int:
    """Exercise 1.4: the integer k ≥ 1 minimising T(k) = (h + k − 1)(α + nβ/k).

    T(k) = (h − 1)α + nβ + kα + (h − 1)nβ/k is convex in k with its continuous minimum at
    k* = √((h − 1)nβ/α); the best integer is one of the two around k*.
    """
    continuous = math.sqrt((hops - 1) * nbytes * beta / alpha)
    candidates = {max(1, math.floor(continuous)), max(1, math.ceil(continuous))}
    return min(sorted(candidates),
               key=lambda k: _pipelined_time(nbytes, hops, k, alpha, beta))


def shifted_exchange_time(p: int, nbytes: float, alpha: float, beta: float) -> float:
    """Exercise 1.5: (p − 1)(α + nβ) s: p − 1 steps; in each, every rank sends one message
    and receives one, from distinct ranks, so no port carries two at once."""
    return (p - 1) * (alpha + nbytes * beta)


def loggp_time(nbytes: int, L: float, o: float, g: float, G: float) -> float:
    """Exercise 1.6: o + (n − 1)G + L + o s, one n-byte message in LogGP
    (Alexandrov, Ionescu, Schauser, Scheiman 1995). The gap g spaces consecutive
    messages and does not enter a single one."""
    return o + (nbytes - 1) * G + L + o


def ring_pass(comm, x, rounds: int):
    """Exercise 1.7: a rank program; each round pass x to the right, take the left's."""
    right = (comm.rank + 1) % comm.size
    left = (comm.rank - 1) % comm.size
    for _ in range(rounds):
        x = yield comm.sendrecv(right, x, left)
    return x


def predict_ring_pass_time(p: int, nbytes: float, rounds: int, overhead: float,
                           latency: float, bandwidth: float, chunks: int) -> float:
    """Exercise 1.8: rounds·(o + (k + 1)(ℓ + nβ/k)) s on star(p) with host overhead o, hop
    latency ℓ, k chunks and β = 1/bandwidth, for p ≥ 2 and k dividing n: each message pays o
    once, crosses 2 links (host → switch → host) pipelined in k chunks, and the p messages of
    a round use distinct directed links."""
    beta = 1 / bandwidth
    return rounds * (overhead + (chunks + 1) * (latency + nbytes * beta / chunks))


def torus_bisection_links(rows: int, cols: int) -> int:
    """Exercise 1.9: 2·min(rows, cols) links (rows, cols ≥ 3, the longer side even):
    cut straight across the longer dimension, severing each of the min(rows, cols) rings
    along it twice."""
    return 2 * min(rows, cols)
