"""Plumbing (hand-written): `algorithm="auto"` — the algorithm a collective runs when none is
named: the cheapest by week 2's α–β–γ cost model (`best_algorithm`), priced with the α, β, γ
of the engine the rank runs on (`dsml.comm.costs`), as MPI libraries and NCCL pick from their
own tuning.

Every rank computes the same choice — same p, same vector size, same engine — so all ranks run
the same algorithm without a message. The choice is cached per (collective, p, size, costs):
a lookup costs well under a microsecond, next to the ~10 µs of a small all-reduce on real
processes.

The prices are week 2's closed forms (`cost`), which `dsml.collectives` hands this module when
it is imported: cost.py imports the collectives' algorithm lists, so an import of it from here
would close a circle allreduce → auto → cost → allreduce. Importing any collective imports the
package first, so they are always there when a collective runs. One correction: for p not a
power of two, week 2's formulas round lg p up, while recursive doubling and halving–doubling
really run on the largest power of two p₂ ≤ p after a fold — the first 2(p − p₂) ranks pair up,
one hands its whole vector to the other, which adds it (α + nβ + nγ), and gets the result back
at the end (α + nβ). Without that term auto chose halving–doubling at p = 6 for 4 MiB where the
ring takes half the time; with it, auto's choice is the simulator's fastest for p = 2 … 12
(tests/test_auto_algorithm.py).
"""
from __future__ import annotations

import numpy as np

from dsml.comm.api import SizeOnly
from dsml.comm.costs import costs_of

_chosen: dict = {}
_CACHE_SIZE = 4096
cost = None       # week 2's cost(collective, algorithm, p, nbytes, α, β, γ), set by dsml.collectives
algorithms = None  # week 2's COLLECTIVE_ALGORITHMS, set by dsml.collectives


def price(collective: str, algorithm: str, p: int, nbytes: float, alpha: float, beta: float,
          gamma: float) -> float:
    """Week 2's closed form, with the fold of recursive doubling and halving–doubling when p
    is not a power of two (see the module's text)."""
    folded = collective == "allreduce" and algorithm in ("recursive_doubling",
                                                         "halving_doubling")
    if not folded or p & (p - 1) == 0:
        return cost(collective, algorithm, p, nbytes, alpha, beta, gamma)
    p2 = 1 << (p.bit_length() - 1)
    n = nbytes
    fold = (alpha + n * beta + n * gamma) + (alpha + n * beta)
    return fold + cost(collective, algorithm, p2, nbytes, alpha, beta, gamma)


def choose(collective: str, p: int, nbytes: float, alpha: float, beta: float,
           gamma: float) -> str:
    """The cheapest algorithm by `price` (ties: the first listed, as best_algorithm)."""
    times = {a: price(collective, a, p, nbytes, alpha, beta, gamma)
             for a in algorithms[collective]}
    return min(times, key=times.get)


def auto_algorithm(comm, collective: str, x) -> str:
    """The algorithm `collective` runs for `x` on `comm` when asked for "auto"."""
    nbytes = x.nbytes if isinstance(x, (SizeOnly, np.ndarray)) else np.asarray(x).nbytes
    costs = costs_of(comm)
    key = (collective, comm.size, nbytes, costs)
    algorithm = _chosen.get(key)
    if algorithm is None:
        if collective == "allgather":     # the cost model's size is the gathered total
            nbytes *= comm.size
        algorithm = choose(collective, comm.size, nbytes, *costs)
        if len(_chosen) >= _CACHE_SIZE:
            _chosen.clear()
        _chosen[key] = algorithm
    return algorithm
