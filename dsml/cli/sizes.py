"""Plumbing (hand-written): the byte sizes of the `dsml` command line — parsed from 8, 64K,
4M or 1G (binary units, as nccl-tests), printed back the same way, and the geometric range
that -b, -e and -f describe."""
from __future__ import annotations

import argparse
import re

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_size(text: str) -> int:
    """'8', '64K', '4M', '1G' -> bytes (binary units, as nccl-tests)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text.upper())
    if not match:
        raise argparse.ArgumentTypeError(f"size must look like 8, 64K, 4M or 1G, got {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


def size_range(begin: int, end: int, factor: int) -> list[int]:
    if factor < 2:
        raise ValueError(f"factor must be ≥ 2, got {factor}")
    if begin < 1 or end < begin:
        raise ValueError(f"need 1 ≤ begin ≤ end, got begin={begin}, end={end}")
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
