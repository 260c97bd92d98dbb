"""Generated from notebooks/week2_collective_communication.ipynb — do not edit; edit the notebook and run `make export`."""

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.collectives.buffers import COLLECTIVE_TAG, MismatchError, OPS, block_sizes, check_algorithm, check_op, combine, concat, expect_block, expect_like, flat, length, mismatch_in, split


# -- cell 26
import numpy as np

from dsml.collectives.checks import reducing

REDUCE_SCATTER_ALGORITHMS = ("ring", "recursive_halving")


def reduce_scatter(comm, x, op: str = "sum", algorithm: str = "ring"):
    """Reduce `x` elementwise over all ranks and return this rank's block of the result,
    blocks cut as np.array_split(result, p) cuts them (along axis 0)."""
    check_algorithm("reduce_scatter", algorithm, REDUCE_SCATTER_ALGORITHMS)
    ufunc = OPS[check_op(op)]
    comm = reducing(comm, x, op, "reduce_scatter")   # bool sums refused; one tag per op
    data = flat(x)
    row = int(np.prod(x.shape[1:])) if isinstance(x, np.ndarray) and x.ndim > 1 else 1
    rows = x.shape[0] if isinstance(x, np.ndarray) and x.ndim else length(data)
    sizes = [s * row for s in block_sizes(rows, comm.size)]
    blocks = split(data, sizes)            # views of x: the algorithms only read them
    try:
        if algorithm == "ring":
            mine = yield from reduce_scatter_ring_blocks(comm, blocks, ufunc)
        else:
            mine = yield from reduce_scatter_halving_blocks(comm, blocks, ufunc)
    except MismatchError as error:
        raise mismatch_in("reduce_scatter", comm, x, error) from None
    if isinstance(mine, np.ndarray) and np.shares_memory(mine, data):
        mine = mine.copy()                 # p = 1: never hand back the caller's memory
    if isinstance(x, np.ndarray) and x.ndim > 1:
        mine = mine.reshape((-1,) + x.shape[1:])
    return mine


def reduce_scatter_ring_blocks(comm, blocks, ufunc, into=None):
    """Ring reduce-scatter: in step s rank r passes its running sum of block (r − s − 1) to
    the right and adds the running sum of block (r − s − 2) it receives from the left. After
    p − 1 steps block r has collected every rank's contribution — on rank r. `blocks` are
    only read; each sum goes into a new array, or into `into[i]` if a list of p buffers is
    given (each block is summed at most once per rank, so one buffer per block suffices)."""
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    sums = list(blocks)                   # the running sum of each block, as this rank has it
    for step in range(p - 1):
        send_index, recv_index = (r - step - 1) % p, (r - step - 2) % p
        got = yield comm.sendrecv(right, sums[send_index], left, COLLECTIVE_TAG)
        mine = sums[recv_index]
        got = expect_like(got, mine, left, comm, "reduce_scatter")
        yield comm.combine(got.nbytes)
        sums[recv_index] = combine(mine, got, ufunc, None if into is None else into[recv_index])
    return sums[r]


# -- cell 27
def fold_in(comm, blocks, ufunc, what):
    """For p not a power of two, fold the first 2·rem ranks in pairs (rem = p − 2^⌊lg p⌋):
    the even one hands all its data to the odd one, which adds it and stays in. Returns this
    rank's index among the 2^⌊lg p⌋ ranks that go on, or None if it sits out."""
    p, r = comm.size, comm.rank
    p2 = 1 << (p.bit_length() - 1)
    rem = p - p2
    if r < 2 * rem:
        if r % 2 == 0:
            yield comm.send(r + 1, concat(blocks), COLLECTIVE_TAG)
            return None
        got = yield comm.recv(r - 1, COLLECTIVE_TAG)
        got = expect_like(got, concat(blocks), r - 1, comm, what)
        yield comm.combine(got.nbytes)
        theirs = split(got, [length(b) for b in blocks])
        blocks[:] = [combine(b, t, ufunc) for b, t in zip(blocks, theirs)]
        return r // 2
    return r - rem


def fold_out(comm, data, what):
    """Undo fold_in: each odd rank of a folded pair sends the result to its even partner."""
    p, r = comm.size, comm.rank
    rem = p - (1 << (p.bit_length() - 1))
    if r < 2 * rem:
        if r % 2 == 1:
            yield comm.send(r - 1, data, COLLECTIVE_TAG)
        else:
            got = yield comm.recv(r + 1, COLLECTIVE_TAG)
            data = expect_like(got, data, r + 1, comm, what)
    return data


def real_rank(new_rank, p):
    """The rank that plays `new_rank` among the 2^⌊lg p⌋ ranks left after fold_in."""
    rem = p - (1 << (p.bit_length() - 1))
    return 2 * new_rank + 1 if new_rank < rem else new_rank + rem


def owners(new_rank, p):
    """The ranks whose blocks the rank playing `new_rank` is responsible for after fold_in."""
    r = real_rank(new_rank, p)
    rem = p - (1 << (p.bit_length() - 1))
    return [r - 1, r] if new_rank < rem else [r]


# -- cell 28
HALVING_ORDERS = ("far_first", "near_first")


def halving_masks(p2, order="far_first"):
    """Recursive halving's partner distances on p2 (a power of two) ranks, round by round:
    p2/2, …, 2, 1 ("far_first") or 1, 2, …, p2/2 ("near_first", MPICH's order)."""
    if order not in HALVING_ORDERS:
        raise ValueError(f"order must be one of {HALVING_ORDERS}, got {order!r}")
    masks = [1 << i for i in range(p2.bit_length() - 1)]
    return masks[::-1] if order == "far_first" else masks


def joined(blocks):
    """Blocks to send as one message: a lone block as it is (no copy), else concatenated."""
    return blocks[0] if len(blocks) == 1 else concat(blocks)


def reduce_scatter_halving_blocks(comm, blocks, ufunc, order="far_first", into=None):
    """Recursive halving: with 2^k ranks, in each round exchange half of the blocks still in
    play with the partner r XOR mask (masks from `halving_masks`) — keep your half, send
    theirs, add what comes back — so the data shrinks by half each round. Other p: fold_in
    first, hand out blocks after. Sums go into new arrays, or into `into[b]` (as the ring's)."""
    p, r = comm.size, comm.rank
    masks = halving_masks(1 << (p.bit_length() - 1), order)
    new = yield from fold_in(comm, blocks, ufunc, "reduce_scatter")
    p2 = 1 << (p.bit_length() - 1)
    if new is not None:
        # Group the p blocks by which of the p2 ranks will own them. Halving keeps the half
        # that the first round's bit picks, so near-first ends at the bit-reversed position.
        k = len(masks)
        flip = (lambda v: v) if order == "far_first" else (
            lambda v: int(format(v, f"0{k}b")[::-1], 2) if k else v)
        groups = [owners(flip(v), p) for v in range(p2)]
        lo, hi = 0, p2                      # the range of groups still in play
        for mask in masks:
            partner = new ^ mask
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if new < partner else ((mid, hi), (lo, mid))
            send_ids = [b for g in range(*give) for b in groups[g]]
            keep_ids = [b for g in range(*keep) for b in groups[g]]
            peer = real_rank(partner, p)
            got = yield comm.sendrecv(peer, joined([blocks[b] for b in send_ids]), peer,
                                      COLLECTIVE_TAG)
            counts = [length(blocks[b]) for b in keep_ids]
            got = expect_block(got, blocks[r], sum(counts), peer, comm, "reduce_scatter")
            yield comm.combine(got.nbytes)
            for b, t in zip(keep_ids, split(got, counts)):
                blocks[b] = combine(blocks[b], t, ufunc, None if into is None else into[b])
            lo, hi = keep
    # Unfold: the odd rank of a folded pair gives its partner the partner's block.
    rem = p - p2
    if r < 2 * rem:
        if r % 2 == 1:
            yield comm.send(r - 1, blocks[r - 1], COLLECTIVE_TAG)
        else:
            got = yield comm.recv(r + 1, COLLECTIVE_TAG)
            blocks[r] = expect_like(got, blocks[r], r + 1, comm, "reduce_scatter")
    return blocks[r]
