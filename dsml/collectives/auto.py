"""Plumbing (hand-written): `algorithm="auto"` — the algorithm a collective runs when none is
named: the cheapest by week 2's α–β–γ cost model (`best_algorithm`), priced with the α, β, γ
of the engine the rank runs on (`dsml.comm.costs`), as MPI libraries and NCCL pick from their
own tuning.

Every rank computes the same choice — same p, same vector size, same engine — so all ranks run
the same algorithm without a message. The choice is cached per (collective, p, size, costs):
a lookup costs well under a microsecond, next to the ~10 µs of a small all-reduce on real
processes.

The selector is week 2's `best_algorithm`, which `dsml.collectives` hands this module when it is
imported (`choose`): cost.py imports the collectives' algorithm lists, so an import of it from
here would close a circle allreduce → auto → cost → allreduce. Importing any collective imports
the package first, so the selector is always there when a collective runs.
"""
from __future__ import annotations

from dsml.comm.api import SizeOnly
from dsml.comm.costs import costs_of

_chosen: dict = {}
_CACHE_SIZE = 4096
choose = None     # best_algorithm(collective, p, nbytes, alpha, beta, gamma), set by dsml.collectives


def auto_algorithm(comm, collective: str, x) -> str:
    """The algorithm `collective` runs for `x` on `comm` when asked for "auto"."""
    nbytes = x.nbytes if isinstance(x, SizeOnly) else getattr(x, "nbytes", 0)
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
