"""Generated from notebooks/week2_collective_communication.ipynb — do not edit; edit the notebook and run `make export`."""

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.collectives.allgather import allgather_ring_blocks
from dsml.collectives.buffers import COLLECTIVE_TAG, MismatchError, block_sizes, check_algorithm, check_root, concat, expect_like, flat, length, mismatch_in, piece, restore, split


# -- cell 12
import numpy as np

BROADCAST_ALGORITHMS = ("naive", "binomial", "scatter_allgather", "chain")


def broadcast(comm, x, root: int = 0, algorithm: str = "binomial", chunks: int = 4):
    """Every rank returns the root's `x`. As with MPI_Bcast, every rank passes an array of
    the same shape and dtype (only the root's contents matter). `chunks`: pieces of the
    pipelined "chain", at most x's elements (as many as `cost` assumes, below that). Costs:
    see `cost("broadcast", algorithm, ...)`."""
    check_algorithm("broadcast", algorithm, BROADCAST_ALGORITHMS)
    root = check_root(comm, root)
    data = flat(x)
    try:
        if comm.size > 1:
            if algorithm == "naive":
                data = yield from broadcast_naive(comm, data, root)
            elif algorithm == "binomial":
                data = yield from broadcast_binomial(comm, data, root)
            elif algorithm == "scatter_allgather":
                data = yield from broadcast_scatter_allgather(comm, data, root)
            else:
                data = yield from broadcast_chain(comm, data, root, chunks)
    except MismatchError as error:
        raise mismatch_in("broadcast", comm, x, error) from None
    return restore(data, x)


# -- cell 13
def broadcast_naive(comm, data, root):
    """The root sends the whole vector to each other rank in turn."""
    if comm.rank == root:
        for i in range(1, comm.size):
            yield comm.send((root + i) % comm.size, data, COLLECTIVE_TAG)
        return data
    got = yield comm.recv(root, COLLECTIVE_TAG)
    return expect_like(got, data, root, comm, "broadcast")


def broadcast_binomial(comm, data, root):
    """A binomial tree: in round k every rank that has the data sends it 2^k ranks further,
    so the number of ranks holding it doubles each round: ⌈lg p⌉ rounds."""
    p, vrank = comm.size, (comm.rank - root) % comm.size     # the root is virtual rank 0
    mask = 1
    while mask < p:                       # receive once, from the rank that owns my subtree
        if vrank & mask:
            src = (vrank - mask + root) % p
            data = expect_like((yield comm.recv(src, COLLECTIVE_TAG)), data, src, comm,
                               "broadcast")
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:                       # then send to the roots of my sub-subtrees
        if vrank + mask < p:
            yield comm.send((vrank + mask + root) % p, data, COLLECTIVE_TAG)
        mask >>= 1
    return data


# -- cell 14
from dsml.validate_args import integer


def broadcast_chain(comm, data, root, chunks):
    """A pipeline root → 1 → 2 → … → p−1 in `chunks` pieces (at most one an element): every
    rank forwards piece i while it receives piece i + 1 (full duplex)."""
    # A piece holds at least one element: more pieces would be empty messages, each paying α.
    chunks = min(integer("chunks", chunks, 1), max(1, length(data)))
    p, vrank = comm.size, (comm.rank - root) % comm.size
    prev, nxt = (comm.rank - 1) % p, (comm.rank + 1) % p
    pieces = split(data, block_sizes(length(data), chunks))
    if vrank == 0:
        for part in pieces:
            yield comm.send(nxt, part, COLLECTIVE_TAG)
        return data
    got = []
    for i in range(chunks):
        if vrank == p - 1 or i == 0:
            incoming = yield comm.recv(prev, COLLECTIVE_TAG)
        else:                              # forward the previous piece, take the next
            incoming = yield comm.sendrecv(nxt, got[-1], prev, COLLECTIVE_TAG)
        got.append(expect_like(incoming, pieces[i], prev, comm, "broadcast"))
    if vrank != p - 1:
        yield comm.send(nxt, got[-1], COLLECTIVE_TAG)
    return concat(got)


# -- cell 21
def scatter_binomial(comm, data, root):
    """Binomial scatter: virtual rank v ends with block v of the p blocks (np.array_split
    sizes). Each round halves the range of blocks a sender still holds for others."""
    p, vrank = comm.size, (comm.rank - root) % comm.size
    sizes = block_sizes(length(data), p)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    held = data if vrank == 0 else None    # blocks [vrank, vrank + span) once received
    mask = 1
    while mask < p:
        if vrank & mask:
            src = (vrank - mask + root) % p
            span = min(mask, p - vrank)
            expected = piece(data, offsets[vrank], offsets[vrank + span])
            held = expect_like((yield comm.recv(src, COLLECTIVE_TAG)), expected, src, comm,
                               "broadcast")
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if vrank + mask < p:
            start = offsets[vrank + mask] - offsets[vrank]
            stop = offsets[min(vrank + 2 * mask, p)] - offsets[vrank]
            yield comm.send((vrank + mask + root) % p, piece(held, start, stop), COLLECTIVE_TAG)
        mask >>= 1
    return piece(held, 0, sizes[vrank]), sizes


def broadcast_scatter_allgather(comm, data, root):
    """Scatter the vector in p blocks down a binomial tree, then all-gather the blocks
    around a ring (van de Geijn): the root no longer sends n bytes lg p times."""
    mine, sizes = yield from scatter_binomial(comm, data, root)
    vrank = (comm.rank - root) % comm.size
    blocks = yield from allgather_ring_blocks(comm, mine, vrank, sizes, root)
    return expect_like(concat(blocks), data, root, comm, "broadcast")
