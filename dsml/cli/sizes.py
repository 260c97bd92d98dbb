"""Plumbing (hand-written): the byte sizes of the `dsml` command line — parsed from 8, 64K,
4M or 1G (binary units, as nccl-tests), printed back the same way, and the range that -b, -e
and -f (or bench's -i) describe."""
from __future__ import annotations

import argparse
import re

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
# The most sizes a range may hold (an additive range of tiny steps: a typo, not hours of runs).
MAX_SIZES = 1000


def parse_size(text: str) -> int:
    """'8', '64K', '4M', '1G' -> bytes (binary units, as nccl-tests)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text.upper())
    if not match:
        raise argparse.ArgumentTypeError(f"size must look like 8, 64K, 4M or 1G, got {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


def size_range(begin: int, end: int, factor: int | None = None,
               step: int | None = None) -> list[int]:
    """The sizes from -b/--begin to -e/--end: each `factor` times the one before (-f), or, given
    `step` instead, `step` bytes more (-i, as nccl-tests' --stepbytes). An empty range, a
    factor below 2 or a step below 1 is refused, naming the flags."""
    if begin < 1:
        raise ValueError(f"-b/--begin must be at least 1 byte, got {begin}")
    if end < begin:
        raise ValueError(f"the range -b {typed(begin)} … -e {typed(end)} is empty: "
                         f"-b/--begin must be at most -e/--end")
    if step is not None:
        if step < 1:
            raise ValueError(f"-i/--step-bytes must be at least 1 byte, got {step}")
        count = (end - begin) // step + 1
        if count > MAX_SIZES:
            raise ValueError(f"-b {typed(begin)} … -e {typed(end)} in steps of -i {typed(step)} "
                             f"is {count:,} sizes; at most "
                             f"{MAX_SIZES:,}: give a larger -i/--step-bytes")
        return list(range(begin, end + 1, step))
    if factor < 2:
        raise ValueError(f"-f/--factor must be ≥ 2 (each size that many times the one before), "
                         f"got {factor}")
    sizes, n = [], begin
    while n <= end:
        sizes.append(n)
        n *= factor
    return sizes


def format_bytes(nbytes: int) -> str:
    """1024 -> '1K', 3 * 1024**2 -> '3M' (the units of -b and -e); other sizes in bytes."""
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return f"{nbytes} B"


def typed(nbytes: int) -> str:
    """A size as -b and -e take it: 1024 -> '1K', 3 -> '3' (for messages naming the flags)."""
    return format_bytes(nbytes).removesuffix(" B")
