"""Plumbing (hand-written): checks on what a rank hands a reducing collective (reduce,
all-reduce, reduce-scatter) that the shape-and-dtype comparison in the messages cannot see.

NumPy adds booleans with a logical OR (`np.add(True, True)` is True), so op="sum" — and "mean",
which divides that sum — on a bool array would return an OR, not a count. Refused here, with
the two ways out named, rather than handed back as a plausible-looking wrong answer.
"""
from __future__ import annotations

import numpy as np


def check_reducible(x, op: str, what: str) -> None:
    """Raise ValueError if `op` on `x` would not mean what it says (see the module's text)."""
    if isinstance(x, np.ndarray) and x.dtype == np.bool_ and op in ("sum", "mean"):
        raise ValueError(
            f"{what}: op={op!r} on a bool array would be a logical OR, not a count (NumPy adds "
            f"booleans with `or`); pass x.astype(np.int64) to count the True values, or use "
            f"op='max' for 'any rank True' and op='min' for 'every rank True'")
