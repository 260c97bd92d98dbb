"""Generated from notebooks/week2_collective_communication.ipynb — do not edit; edit the notebook and run `make export`."""

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.collectives.buffers import COLLECTIVE_TAG, MismatchError, OPS, block_sizes, check_algorithm, check_op, check_root, combine, concat, copy, expect_block, expect_like, flat, length, mismatch_in, restore, split
from dsml.collectives.reduce_scatter import reduce_scatter_halving_blocks


# -- cell 23
import numpy as np

from dsml.collectives.checks import reducing

REDUCE_ALGORITHMS = ("naive", "binomial", "rabenseifner")


def reduce(comm, x, root: int = 0, op: str = "sum", algorithm: str = "binomial"):
    """The root returns the elementwise reduction of all ranks' `x`; other ranks return None."""
    check_algorithm("reduce", algorithm, REDUCE_ALGORITHMS)
    root = check_root(comm, root)
    ufunc = OPS[check_op(op)]
    comm = reducing(comm, x, op, "reduce")   # bool sums refused; one tag per op
    data = copy(flat(x))
    try:
        if comm.size > 1:
            if algorithm == "naive":
                data = yield from reduce_naive(comm, data, root, ufunc)
            elif algorithm == "binomial":
                data = yield from reduce_binomial(comm, data, root, ufunc)
            else:
                data = yield from reduce_rabenseifner(comm, data, root, ufunc)
    except MismatchError as error:
        raise mismatch_in("reduce", comm, x, error) from None
    return restore(data, x) if comm.rank == root else None


# -- cell 24
def reduce_naive(comm, data, root, ufunc):
    """Every rank sends its vector to the root, which adds them in rank order."""
    if comm.rank != root:
        yield comm.send(root, data, COLLECTIVE_TAG)
        return data
    for i in range(1, comm.size):
        src = (root + i) % comm.size
        got = expect_like((yield comm.recv(src, COLLECTIVE_TAG)), data, src, comm, "reduce")
        yield comm.combine(got.nbytes)
        data = combine(data, got, ufunc)
    return data


def reduce_binomial(comm, data, root, ufunc):
    """The broadcast tree run backwards: in round k a rank whose bit k is set sends its
    partial result to the rank 2^k below it and drops out."""
    p, vrank = comm.size, (comm.rank - root) % comm.size
    mask = 1
    while mask < p:
        if vrank & mask:
            yield comm.send((vrank - mask + root) % p, data, COLLECTIVE_TAG)
            break
        if vrank + mask < p:
            src = (vrank + mask + root) % p
            got = expect_like((yield comm.recv(src, COLLECTIVE_TAG)), data, src, comm, "reduce")
            yield comm.combine(got.nbytes)
            data = combine(data, got, ufunc)
        mask <<= 1
    return data


# -- cell 30
def reduce_rabenseifner(comm, data, root, ufunc):
    """Reduce-scatter by recursive halving, then a binomial gather of the blocks to the root."""
    p = comm.size
    sizes = block_sizes(length(data), p)
    mine = yield from reduce_scatter_halving_blocks(comm, split(data, sizes), ufunc)
    blocks = yield from gather_binomial_blocks(comm, mine, sizes, root)
    return concat(blocks) if comm.rank == root else data


def gather_binomial_blocks(comm, mine, sizes, root):
    """Binomial gather: the scatter tree run backwards. Rank r contributes block r; virtual
    rank v collects the blocks of its subtree [v, v + 2^k) before passing them up."""
    p, vrank = comm.size, (comm.rank - root) % comm.size
    held = [mine]                           # blocks of virtual ranks vrank, vrank + 1, …
    mask = 1
    while mask < p:
        if vrank & mask:
            yield comm.send((vrank - mask + root) % p, concat(held), COLLECTIVE_TAG)
            break
        if vrank + mask < p:
            child = vrank + mask
            count = min(mask, p - child)
            ids = [(child + i + root) % p for i in range(count)]
            src = (child + root) % p
            got = yield comm.recv(src, COLLECTIVE_TAG)
            got = expect_block(got, mine, sum(sizes[b] for b in ids), src, comm, "reduce")
            held.extend(split(got, [sizes[b] for b in ids]))
        mask <<= 1
    if vrank != 0:
        return None
    order = [(v + root) % p for v in range(p)]        # held[v] is the block of rank order[v]
    blocks = [None] * p
    for v, rank in enumerate(order):
        blocks[rank] = held[v]
    return blocks
