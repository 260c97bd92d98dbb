"""Plumbing (hand-written): dsml.collectives — broadcast, reduce, all-reduce, all-gather,
reduce-scatter and all-to-all as rank programs (`yield from` them), with their cost models.

Written and derived in notebooks/week2_collective_communication.ipynb; names follow
torch.distributed and MPI.

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
                                   busbw_factor, cost)
from dsml.collectives.hierarchical import Group, allreduce_hierarchical
from dsml.collectives.reduce import REDUCE_ALGORITHMS, reduce
from dsml.collectives.reduce_scatter import REDUCE_SCATTER_ALGORITHMS, reduce_scatter
from dsml.comm.spans import traced
from dsml.collectives import auto

# algorithm="auto" prices the algorithms with week 2's cost model (see auto.py)
auto.cost, auto.algorithms = cost, COLLECTIVE_ALGORITHMS

# One enclosing trace slice per call (dsml.comm.spans).
broadcast, reduce, allreduce = traced(broadcast), traced(reduce), traced(allreduce)
allgather, reduce_scatter, alltoall = traced(allgather), traced(reduce_scatter), traced(alltoall)
allreduce_hierarchical = traced(allreduce_hierarchical)

__all__ = ["broadcast", "reduce", "allreduce", "allgather", "reduce_scatter", "alltoall",
           "allreduce_hierarchical", "Group", "cost", "best_algorithm", "busbw_factor",
           "BUSBW_FACTORS", "COLLECTIVE_ALGORITHMS",
           "BROADCAST_ALGORITHMS", "REDUCE_ALGORITHMS", "ALLREDUCE_ALGORITHMS",
           "ALLGATHER_ALGORITHMS", "REDUCE_SCATTER_ALGORITHMS", "COLLECTIVE_TAG", "OPS"]
