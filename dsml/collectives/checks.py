"""Plumbing (hand-written): checks on what a rank hands a reducing collective (reduce,
all-reduce, reduce-scatter) that the shape-and-dtype comparison in the messages cannot see.

NumPy adds booleans with a logical OR (`np.add(True, True)` is True), so op="sum" — and "mean",
which divides that sum — on a bool array would return an OR, not a count. Refused here, with
the two ways out named, rather than handed back as a plausible-looking wrong answer. So is
op="mean" on integers: the sum divided by p is a float64 array, not the integers handed in.

"avg", the name NCCL and torch.distributed give the mean (ncclAvg, ReduceOp.AVG), is accepted
as another spelling of "mean" (`op_name`); dsml prints "mean" (docs/conventions.md). Strings
or objects are refused too: NumPy's "sum" of strings is cut to the first one's width.
"""
from __future__ import annotations

import numpy as np

from dsml.validate_args import numeric_array

OP_ALIASES = {"avg": "mean"}


def op_name(op):
    """The library's name for `op`: "avg" -> "mean"; any other value unchanged (check_op judges
    it)."""
    return OP_ALIASES.get(op, op) if isinstance(op, str) else op


def check_reducible(x, op: str, what: str) -> None:
    """Raise ValueError if `op` on `x` would not mean what it says (see the module's text), and
    TypeError if `x` holds no numbers (NumPy "adds" strings by cutting them to one width)."""
    numeric_array(f"{what}: x", x)
    if isinstance(x, np.ndarray) and x.dtype.kind == "b" and op in ("sum", "mean"):
        raise ValueError(
            f"{what}: op={op!r} on a bool array would be a logical OR, not a count (NumPy adds "
            f"booleans with `or`); pass x.astype(np.int64) to count the True values, or use "
            f"op='max' for 'any rank True' and op='min' for 'every rank True'")
    if isinstance(x, np.ndarray) and x.dtype.kind in "iu" and op == "mean":
        raise ValueError(
            f"{what}: op='mean' on {'an' if x.dtype.kind == 'i' else 'a'} {x.dtype} array would "
            f"return float64 (the sum divided by the world size), not {x.dtype}; pass "
            f"x.astype(np.float64) for a float mean, or use op='sum' and divide the result "
            f"yourself")


# Ranks that pass different ops to one collective would combine with different ufuncs and
# hand back a blend. Each op therefore sends on its own tag: ranks that disagree never match
# a message, the engines report a deadlock at once, and the report names each side's op.
from dsml.collectives.buffers import COLLECTIVE_TAG  # noqa: E402
from dsml.comm.tags import TAG_GROUPS, TAG_MEANINGS  # noqa: E402

OP_TAGS = {"sum": COLLECTIVE_TAG, "mean": COLLECTIVE_TAG + 1, "prod": COLLECTIVE_TAG + 2,
           "max": COLLECTIVE_TAG + 3, "min": COLLECTIVE_TAG + 4}
# A report asks "did every rank pass the same op?" only when the ops it sees differ (or a
# message is left whose tag it cannot see): dsml.comm.tags.differing.
TAG_MEANINGS[COLLECTIVE_TAG] = "a collective with op='sum' or without an op"
TAG_GROUPS[COLLECTIVE_TAG] = ("op", "op='sum' (or none)")
for _op, _tag in OP_TAGS.items():
    if _tag != COLLECTIVE_TAG:
        TAG_MEANINGS[_tag] = f"a collective with op={_op!r}"
        TAG_GROUPS[_tag] = ("op", f"op={_op!r}")


class _OpTagged:
    """`comm` with the collectives' tag replaced by the op's own (see OP_TAGS)."""
    __slots__ = ("_comm", "_tag")

    def __init__(self, comm, tag: int):
        self._comm, self._tag = comm, tag

    def send(self, dst, payload, tag=0):
        return self._comm.send(dst, payload, self._tag if tag == COLLECTIVE_TAG else tag)

    def recv(self, src, tag=0):
        return self._comm.recv(src, self._tag if tag == COLLECTIVE_TAG else tag)

    def sendrecv(self, dst, payload, src, tag=0):
        return self._comm.sendrecv(dst, payload, src,
                                   self._tag if tag == COLLECTIVE_TAG else tag)

    def __getattr__(self, name):
        return getattr(self._comm, name)


def reducing(comm, x, op: str, what: str):
    """The checks a reducing collective makes before it starts: `check_reducible`, then the
    comm to use — `comm` itself for op "sum" (the default: no cost, the same messages as
    ever), else one that tags the collective's messages with the op's own tag."""
    check_reducible(x, op, what)
    tag = OP_TAGS[op]
    return comm if tag == COLLECTIVE_TAG else _OpTagged(comm, tag)
