"""Generated from notebooks/week2_collective_communication.ipynb — do not edit; edit the notebook and run `make export`."""

# names defined in earlier cells of the same notebook (added by the exporter)
from dsml.collectives.buffers import COLLECTIVE_TAG, copy


# -- cell 36
def alltoall(comm, blocks):
    """Pairwise exchange: `blocks[j]` goes to rank j; returns the list whose entry j came
    from rank j. In step s rank r sends to r + s and receives from r − s: p − 1 steps, no
    rank ever receives two messages at once (the MoE token shuffle)."""
    p, r = comm.size, comm.rank
    if len(blocks) != p:
        raise ValueError(f"alltoall: rank {r} passed {len(blocks)} blocks, expected one per "
                         f"rank ({p})")
    out = [None] * p
    out[r] = copy(blocks[r])
    for step in range(1, p):
        dst, src = (r + step) % p, (r - step) % p
        out[src] = yield comm.sendrecv(dst, blocks[dst], src, COLLECTIVE_TAG)
    return out
