"""Generated from notebooks/week2_collective_communication.ipynb — do not edit; edit the notebook and run `make export`."""

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.collectives.allgather import allgather_ring_blocks
from dsml.collectives.allreduce import allreduce
from dsml.collectives.broadcast import broadcast
from dsml.collectives.buffers import block_sizes, check_algorithm, concat, flat, length, restore
from dsml.collectives.reduce import reduce
from dsml.collectives.reduce_scatter import reduce_scatter


# -- cell 61
import numpy as np


class Group:
    """A communicator over a subset of ranks (like MPI_Comm_split): group rank i is world
    rank members[i]. Every collective works on it unchanged."""

    def __init__(self, comm, members):
        members = list(members)
        if comm.rank not in members:
            raise ValueError(f"rank {comm.rank} is not in the group {members}")
        self.comm, self.members = comm, members
        self.rank, self.size = members.index(comm.rank), len(members)

    def send(self, dst, payload, tag=0):
        return self.comm.send(self.members[dst], payload, tag)

    def recv(self, src, tag=0):
        return self.comm.recv(self.members[src], tag)

    def sendrecv(self, dst, payload, src, tag=0):
        return self.comm.sendrecv(self.members[dst], payload, self.members[src], tag)

    def combine(self, nbytes):
        return self.comm.combine(nbytes)

    def compute(self, seconds):
        return self.comm.compute(seconds)


HIERARCHICAL_SCHEMES = ("sharded", "leader")


def allreduce_hierarchical(comm, x, per_node: int, op: str = "sum", scheme: str = "sharded"):
    """All-reduce on machines of `per_node` consecutive ranks.

    "sharded": reduce-scatter inside each machine, ring all-reduce of each shard across
    machines (one group per local rank), all-gather inside — fewest bytes on the slow links.
    "leader": reduce to each machine's first rank, recursive-doubling all-reduce among those
    leaders, broadcast inside — fewest slow-link rounds (what MPICH's SMP-aware path does).
    """
    check_algorithm("hierarchical all-reduce", scheme, HIERARCHICAL_SCHEMES)
    if comm.size % per_node:
        raise ValueError(f"world size {comm.size} is not a multiple of per_node={per_node}")
    node, local = divmod(comm.rank, per_node)
    inside = Group(comm, range(node * per_node, (node + 1) * per_node))
    if scheme == "leader":
        data = yield from reduce(inside, x, root=0, op=op, algorithm="binomial")
        if local == 0:
            leaders = Group(comm, range(0, comm.size, per_node))
            data = yield from allreduce(leaders, data, op=op, algorithm="recursive_doubling")
        return (yield from broadcast(inside, data if local == 0 else x, root=0))
    across = Group(comm, range(local, comm.size, per_node))
    shard = yield from reduce_scatter(inside, flat(x), op=op, algorithm="ring")
    shard = yield from allreduce(across, shard, op=op, algorithm="ring")
    gathered = yield from allgather_ring_blocks(inside, shard, inside.rank,
                                                block_sizes(length(flat(x)), per_node))
    return restore(concat(gathered), x)
