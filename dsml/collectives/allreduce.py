"""Generated from notebooks/week2_collective_communication.ipynb — do not edit; edit the notebook and run `make export`."""

# imports repeated from earlier cells of the same notebook (added by the exporter)
from dsml.comm.api import SizeOnly

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.collectives.allgather import allgather_bruck_blocks, allgather_ring_blocks
from dsml.collectives.broadcast import broadcast_binomial, broadcast_naive
from dsml.collectives.buffers import COLLECTIVE_TAG, MismatchError, OPS, block_sizes, check_algorithm, check_op, combine, concat, empty_block, expect_block, expect_like, flat, is_power_of_two, length, mismatch_in, restore, split
from dsml.collectives.reduce import reduce_binomial, reduce_naive
from dsml.collectives.reduce_scatter import fold_in, fold_out, halving_masks, joined, real_rank, reduce_scatter_halving_blocks, reduce_scatter_ring_blocks


# -- cell 32
import numpy as np

from dsml.collectives.auto import auto_algorithm
from dsml.collectives.checks import op_name, reducing

ALLREDUCE_ALGORITHMS = ("naive", "ring", "recursive_doubling", "halving_doubling", "tree")
ALLREDUCE_OPS = tuple(OPS) + ("mean",)


def allreduce(comm, x, op: str = "sum", algorithm: str = "auto"):
    """Every rank returns the elementwise reduction of all ranks' `x` (same shape and dtype
    on every rank); op "mean" divides the sum by p. Every rank gets bit-identical results.
    "auto": the algorithm section 12's cost model finds cheapest with this engine's α, β, γ."""
    if algorithm == "auto":
        algorithm = auto_algorithm(comm, "allreduce", x)
    check_algorithm("allreduce", algorithm, ALLREDUCE_ALGORITHMS)
    op = check_op(op_name(op), ALLREDUCE_OPS)   # "avg" is another name for "mean"
    comm = reducing(comm, x, op, "allreduce")   # bool sums, int means refused; a tag per op
    ufunc = OPS["sum" if op == "mean" else op]
    data = flat(x)                       # only read: every algorithm writes its own buffers
    try:
        if comm.size > 1:
            if algorithm == "naive":
                data = yield from reduce_naive(comm, data, 0, ufunc)
                data = yield from broadcast_naive(comm, data, 0)
            elif algorithm == "tree":
                data = yield from reduce_binomial(comm, data, 0, ufunc)
                data = yield from broadcast_binomial(comm, data, 0)
            elif algorithm == "ring":
                # Sums and gathered blocks go straight into one new buffer, block by block:
                # no copy of x first, no new array per step, no concatenation at the end.
                sizes = block_sizes(length(data), comm.size)
                result = empty_block(data, length(data))
                into = split(result, sizes)
                mine = yield from reduce_scatter_ring_blocks(comm, split(data, sizes), ufunc,
                                                             into=into)
                yield from allgather_ring_blocks(comm, mine, comm.rank, sizes, into=into)
                data = result
            elif algorithm == "recursive_doubling":
                data = yield from allreduce_recursive_doubling(comm, data, ufunc)
            else:
                data = yield from allreduce_halving_doubling(comm, data, ufunc)
    except MismatchError as error:
        raise mismatch_in("allreduce", comm, x, error) from None
    if op == "mean" and not isinstance(data, SizeOnly):
        data = data / comm.size
    return restore(data, x)


# -- cell 33
def allreduce_recursive_doubling(comm, data, ufunc):
    """lg p rounds; in round i exchange the whole vector with rank r XOR 2^i and add.
    Other p: fold_in first, send the result back to the ranks that sat out."""
    p = comm.size
    blocks = [data]
    folds = not is_power_of_two(p)          # a power of two has nothing to fold
    new = (yield from fold_in(comm, blocks, ufunc, "allreduce")) if folds else comm.rank
    p2 = 1 << (p.bit_length() - 1)
    if new is not None:
        mask = 1
        while mask < p2:
            peer = real_rank(new ^ mask, p)
            got = yield comm.sendrecv(peer, blocks[0], peer, COLLECTIVE_TAG)
            got = expect_like(got, blocks[0], peer, comm, "allreduce")
            yield comm.combine(got.nbytes)
            # Lower rank's data first on both sides, so that the pair forms the same bits
            # (max(+0.0, −0.0) depends on the order of its operands).
            if comm.rank < peer:
                blocks[0] = combine(blocks[0], got, ufunc)
            else:
                blocks[0] = combine(got, blocks[0], ufunc)
            mask <<= 1
    return (yield from fold_out(comm, blocks[0], "allreduce")) if folds else blocks[0]


def allreduce_halving_doubling(comm, data, ufunc, order="far_first"):
    """Rabenseifner: reduce-scatter by recursive halving, then all-gather by recursive
    doubling — the bandwidth of the ring in only 2 lg p steps (p a power of two). `order`:
    halve with the partner p/2 away first ("far_first") or 1 away, as MPICH does."""
    p = comm.size
    sizes = block_sizes(length(data), p)
    # As the ring does (p a power of two): sums and gathered blocks go into one new buffer.
    result = empty_block(data, length(data)) if is_power_of_two(p) else None
    into = None if result is None else split(result, sizes)
    mine = yield from reduce_scatter_halving_blocks(comm, split(data, sizes), ufunc, order, into)
    if result is None:
        return concat((yield from allgather_bruck_blocks(comm, mine, sizes)))
    yield from allgather_doubling_blocks(comm, mine, sizes, order, into)
    return result


# -- cell 34
def allgather_doubling_blocks(comm, mine, sizes, order="far_first", into=None):
    """Recursive doubling all-gather for p a power of two: each round exchange all blocks
    gathered so far with rank r XOR mask, the halving's masks reversed (`into`: as the ring's)."""
    p, r = comm.size, comm.rank
    blocks = [None] * p
    blocks[r] = mine
    held = [r]                              # block ids this rank has, ascending
    for mask in reversed(halving_masks(p, order)):
        peer = r ^ mask
        theirs = sorted(i ^ mask for i in held)         # what the peer holds
        got = yield comm.sendrecv(peer, joined([blocks[i] for i in held]), peer, COLLECTIVE_TAG)
        got = expect_block(got, mine, sum(sizes[i] for i in theirs), peer, comm, "allgather")
        for i, block in zip(theirs, split(got, [sizes[i] for i in theirs])):
            if into is not None and type(block) is not SizeOnly:
                into[i][...] = block
                block = into[i]
            blocks[i] = block
        held = sorted(held + theirs)
    return blocks
