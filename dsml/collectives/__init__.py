"""Plumbing (hand-written): dsml.collectives — broadcast, reduce, all-reduce, all-gather,
reduce-scatter, all-to-all, gather, scatter and barrier as rank programs (`yield from` them),
with their cost models.

Written and derived in notebooks/week2_collective_communication.ipynb, except gather, scatter
and barrier (hand-written, `dsml.collectives.rooted`); names follow torch.distributed and MPI.
`cost` answers for all of them.

The collectives exported here record one enclosing trace slice per call, named after the
collective (`dsml.comm.spans.traced`); the notebook's own definitions, and the functions of the
submodules (`dsml.collectives.allreduce.allreduce`, …), do not.
"""
from dsml.collectives.allgather import ALLGATHER_ALGORITHMS, allgather
from dsml.collectives.allreduce import ALLREDUCE_ALGORITHMS, allreduce
from dsml.collectives.alltoall import alltoall
from dsml.collectives.broadcast import BROADCAST_ALGORITHMS, broadcast
from dsml.collectives.buffers import COLLECTIVE_TAG, OPS
from dsml.collectives.cost import (BUSBW_FACTORS, COLLECTIVE_ALGORITHMS, best_algorithm,
                                   busbw_factor)
from dsml.collectives.cost import cost as _cost
from dsml.collectives.hierarchical import Group, allreduce_hierarchical
from dsml.collectives.reduce import REDUCE_ALGORITHMS, reduce
from dsml.collectives.reduce_scatter import REDUCE_SCATTER_ALGORITHMS, reduce_scatter
from dsml.collectives.rooted import (BARRIER_ALGORITHMS, GATHER_ALGORITHMS, ROOTED_ALGORITHMS,
                                     SCATTER_ALGORITHMS, barrier, gather, rooted_cost, scatter)
from dsml.comm.spans import traced
from dsml.collectives import auto

# algorithm="auto" prices the algorithms with week 2's cost model (see auto.py)
auto.cost, auto.algorithms = _cost, COLLECTIVE_ALGORITHMS

from dsml.collectives.signatures import signer

# One enclosing trace slice per call (dsml.comm.spans), and the call's signature on its
# messages' tag, so that ranks in different calls are told so (dsml.collectives.signatures).
broadcast, reduce, allreduce, allgather, reduce_scatter, alltoall, allreduce_hierarchical, \
    gather, scatter, barrier = (
        traced(f, sign=signer(f.__name__))
        for f in (broadcast, reduce, allreduce, allgather, reduce_scatter, alltoall,
                  allreduce_hierarchical, gather, scatter, barrier))


def cost(op: str, algorithm: str, p: int, nbytes: float, alpha: float, beta: float,
         gamma: float = 0.0, chunks: int = 4) -> float:
    """Closed-form time (s) of a collective under the α–β–γ model: week 2's
    `dsml.collectives.cost.cost`, and `rooted_cost` for gather, scatter and barrier."""
    if op in ROOTED_ALGORITHMS:
        return rooted_cost(op, algorithm, p, nbytes, alpha, beta)
    return _cost(op, algorithm, p, nbytes, alpha, beta, gamma, chunks)


__all__ = ["broadcast", "reduce", "allreduce", "allgather", "reduce_scatter", "alltoall",
           "allreduce_hierarchical", "gather", "scatter", "barrier", "Group", "cost",
           "rooted_cost", "best_algorithm", "busbw_factor", "GATHER_ALGORITHMS",
           "SCATTER_ALGORITHMS", "BARRIER_ALGORITHMS", "ROOTED_ALGORITHMS",
           "BUSBW_FACTORS", "COLLECTIVE_ALGORITHMS",
           "BROADCAST_ALGORITHMS", "REDUCE_ALGORITHMS", "ALLREDUCE_ALGORITHMS",
           "ALLGATHER_ALGORITHMS", "REDUCE_SCATTER_ALGORITHMS", "COLLECTIVE_TAG", "OPS"]
