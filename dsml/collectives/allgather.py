"""Generated from notebooks/week2_collective_communication.ipynb — do not edit; edit the notebook and run `make export`."""

# imports repeated from earlier cells of the same notebook (added by the exporter)
from dsml.comm.api import SizeOnly

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.collectives.buffers import COLLECTIVE_TAG, MismatchError, check_algorithm, concat, expect_block, flat, length, mismatch_in, split


# -- cell 18
import numpy as np

ALLGATHER_ALGORITHMS = ("ring", "recursive_doubling")


def allgather(comm, x, algorithm: str = "ring"):
    """Every rank returns the concatenation (along axis 0, in rank order) of all ranks' `x`,
    which must share shape and dtype (like torch's all_gather_into_tensor)."""
    check_algorithm("allgather", algorithm, ALLGATHER_ALGORITHMS)
    mine = flat(x)
    sizes = [length(mine)] * comm.size
    try:
        if algorithm == "ring":
            blocks = yield from allgather_ring_blocks(comm, mine, comm.rank, sizes)
        else:
            blocks = yield from allgather_bruck_blocks(comm, mine, sizes)
    except MismatchError as error:
        raise mismatch_in("allgather", comm, x, error) from None
    out = concat(blocks)
    if isinstance(x, np.ndarray):
        out = out.reshape((comm.size * x.shape[0],) + x.shape[1:]) if x.ndim else out
    return out


# -- cell 19
def allgather_ring_blocks(comm, mine, index, sizes, root=0, into=None):
    """Ring all-gather of blocks: the rank at ring position `index` (ring position of rank r
    is (r − root) mod p) starts with block `index`; in step s it passes on the block it got
    in step s − 1. After p − 1 steps every rank has all p blocks. `into`, if given, is a list
    of p arrays to copy each block into as it arrives (the all-reduce gathers in place)."""
    p = comm.size
    right, left = (comm.rank + 1) % p, (comm.rank - 1) % p
    blocks = [None] * p
    blocks[index] = mine
    for step in range(p - 1):
        send_index, recv_index = (index - step) % p, (index - step - 1) % p
        got = yield comm.sendrecv(right, blocks[send_index], left, COLLECTIVE_TAG)
        got = expect_block(got, mine, sizes[recv_index], left, comm, "allgather")
        if into is not None and type(got) is not SizeOnly:
            into[recv_index][...] = got
            got = into[recv_index]
        blocks[recv_index] = got
    return blocks


def allgather_bruck_blocks(comm, mine, sizes):
    """All-gather in ⌈lg p⌉ rounds for any p (Bruck et al.): in round k send everything
    gathered so far (up to 2^k blocks) to rank r − 2^k and receive as much from r + 2^k.
    With p a power of two this is recursive doubling, step for step in cost."""
    p, rank = comm.size, comm.rank
    have = [mine]                          # blocks of ranks rank, rank+1, … (mod p), in order
    distance = 1
    while distance < p:
        count = min(distance, p - distance)
        dst, src = (rank - distance) % p, (rank + distance) % p
        outgoing = concat(have[:count])
        incoming_sizes = [sizes[(src + i) % p] for i in range(count)]
        got = yield comm.sendrecv(dst, outgoing, src, COLLECTIVE_TAG)
        got = expect_block(got, mine, sum(incoming_sizes), src, comm, "allgather")
        have.extend(split(got, incoming_sizes))
        distance *= 2
    # have[i] is the block of rank (rank + i) mod p: rotate into rank order.
    return [have[(r - rank) % p] for r in range(p)]
