"""Generated from notebooks/week2_collective_communication.ipynb — do not edit; edit the notebook and run `make export`."""


# -- cell 7
import math
import numbers

import numpy as np

from dsml.comm.api import SizeOnly

# Collectives tag their messages so that they never match a rank program's own messages.
COLLECTIVE_TAG = 1 << 20


OPS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def check_op(op: str, allowed=tuple(OPS)) -> str:
    if op not in allowed:
        raise ValueError(f"unknown op {op!r}; choose one of {', '.join(allowed)}")
    return op


def check_algorithm(operation: str, algorithm: str, algorithms) -> str:
    if algorithm not in algorithms:
        raise ValueError(f"unknown {operation} algorithm {algorithm!r}; choose one of "
                         f"{', '.join(algorithms)}")
    return algorithm


def check_root(comm, root) -> int:
    if isinstance(root, bool) or not isinstance(root, numbers.Integral) \
            or not 0 <= root < comm.size:
        raise ValueError(f"root must be a rank in 0..{comm.size - 1}, got {root!r}")
    return int(root)


def is_power_of_two(p: int) -> bool:
    return p > 0 and p & (p - 1) == 0


def lg(p: int) -> int:
    """⌈log₂ p⌉: rounds of a binomial tree or of recursive doubling on p ranks."""
    return math.ceil(math.log2(p)) if p > 1 else 0


# -- cell 8
def flat(x):
    """A 1-D view of an array (placeholders are already 'flat')."""
    return x if isinstance(x, SizeOnly) else np.ascontiguousarray(x).reshape(-1)


def length(x) -> int:
    """Number of elements (bytes, for a placeholder)."""
    return x.nbytes if isinstance(x, SizeOnly) else x.size


def block_sizes(n: int, p: int) -> list[int]:
    """Sizes of the p blocks np.array_split makes of n elements (the first n % p get one more)."""
    # Two shared ints, not p: p² of them (32 MB at 1,024 ranks) made messages miss the cache.
    return [n // p + 1] * (n % p) + [n // p] * (p - n % p)


def split(x, sizes):
    """Cut a flat buffer into consecutive blocks of the given sizes."""
    if isinstance(x, SizeOnly):
        # Placeholders are immutable: equal sizes share one (a million fewer objects at scale).
        made = {}
        return [made.get(s) or made.setdefault(s, SizeOnly(s)) for s in sizes]
    blocks, start = [], 0
    for size in sizes:                 # plain slices (views): np.split costs ~7 µs a call
        blocks.append(x[start:start + size])
        start += size
    return blocks


def piece(x, start, stop):
    """Elements [start, stop) of a flat buffer."""
    return SizeOnly(int(stop - start)) if isinstance(x, SizeOnly) else x[int(start):int(stop)]


def concat(blocks):
    if blocks and isinstance(blocks[0], SizeOnly):
        return SizeOnly(sum(b.nbytes for b in blocks))
    return np.concatenate(blocks) if blocks else np.empty(0)


def copy(x):
    """A private copy (placeholders are immutable)."""
    return x if isinstance(x, SizeOnly) else x.copy()


def empty_block(template, size):
    """An empty buffer of `size` elements shaped like a flat block of `template`."""
    if isinstance(template, SizeOnly):
        return SizeOnly(size)
    return np.empty(size, dtype=template.dtype)


def restore(data, x):
    """`data` shaped like the caller's `x`, never sharing its memory."""
    if not isinstance(x, np.ndarray):
        return data
    if np.shares_memory(data, x):
        data = data.copy()
    return data if data.shape == x.shape else data.reshape(x.shape)


# -- cell 10
def combine(mine, theirs, ufunc, out=None):
    """The reduction itself, into a new array or into `out` (placeholders reduce to
    themselves). Neither input is changed."""
    if type(mine) is SizeOnly:
        return mine
    return ufunc(mine, theirs, out=out)


class MismatchError(ValueError):
    """Ranks passed buffers of different sizes or dtypes to one collective."""


def mismatch_in(operation: str, comm, x, error) -> MismatchError:
    """The error a collective raises on a mismatch: it names the collective, this rank and
    what it passed, and keeps the failed step's message (who sent what, what was expected)."""
    passed = f"shape {x.shape} {x.dtype}" if isinstance(x, np.ndarray) else repr(x)
    return MismatchError(f"{operation}: rank {comm.rank} passed {passed}, which does not "
                         f"match another rank's ({error})")


def expect_like(got, expected, src, comm, what: str):
    """Check that a block from `src` has the size and dtype this rank expects: every rank
    must pass arrays of the same shape and dtype. Checked on arrival, so it costs no time."""
    kind = type(got)
    if kind is type(expected):              # the common case, checked cheaply
        if kind is SizeOnly:
            if got.nbytes == expected.nbytes:
                return got
        elif got.shape == expected.shape and got.dtype == expected.dtype:
            return got
    if isinstance(expected, SizeOnly):
        same = isinstance(got, SizeOnly) and got.nbytes == expected.nbytes
        described = f"{getattr(got, 'nbytes', '?')} B"
        wanted = f"{expected.nbytes} B"
    else:
        same = (isinstance(got, np.ndarray) and got.shape == expected.shape
                and got.dtype == expected.dtype)
        described = (f"shape {got.shape} {got.dtype}" if isinstance(got, np.ndarray)
                     else type(got).__name__)
        wanted = f"shape {expected.shape} {expected.dtype}"
    if not same:
        raise MismatchError(f"{what}: rank {comm.rank} received {described} from rank {src}, "
                            f"expected {wanted}; every rank must pass arrays of the same "
                            f"shape and dtype")
    return got


def expect_block(got, like, count, src, comm, what: str):
    """expect_like for a block of `count` elements of the flat buffer `like`, without
    allocating an empty block to compare with (all-gather checks one per step)."""
    kind = type(got)
    if kind is type(like):
        if kind is SizeOnly:
            if got.nbytes == count:
                return got
        elif got.shape == (count,) and got.dtype == like.dtype:
            return got
    return expect_like(got, empty_block(like, count), src, comm, what)
