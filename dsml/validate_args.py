"""Plumbing (hand-written): the checks on arguments that every layer makes — a number of seconds,
a count, an array a reduction can add up — each raising an error that names the argument,
says what would be valid and shows what it got. It imports nothing of dsml (nor NumPy), so the
lowest layer may use it.

A value of the wrong type raises `ArgumentTypeError`, which is both a TypeError (what Python
raises for a wrong type) and a ValueError (what these checks raised before they were gathered
here, and what callers catch).
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

__all__ = ["ArgumentTypeError", "positive_number", "integer", "numeric_array",
           "sequence_of_arguments", "mapping_of_arguments", "shown"]


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (see the module's text for the two bases)."""


def shown(value) -> str:
    """`value` as an error message shows it: its type's name, then its repr (shortened)."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "…"
    return f"{type(value).__name__} {text}"


def positive_number(name: str, value, allow_zero: bool = False, allow_inf: bool = False,
                    unit: str = "") -> float:
    """`value` as a float: a real number (not a bool, a string or NaN) that is > 0, or ≥ 0 with
    `allow_zero`, and finite unless `allow_inf`. `unit` ("s", "bytes/s") goes into the message."""
    if type(value) is float and (value > 0 or allow_zero and value == 0) and value != math.inf:
        return value                                                # the common case, cheaply
    lower = "≥ 0" if allow_zero else "> 0"
    what = f"{'a' if allow_inf else 'a finite'} number {lower}{f' ({unit})' if unit else ''}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{name} must be {what}, got {value!r}")
    number = float(value)
    if not (number >= 0 if allow_zero else number > 0) or (number == math.inf and not allow_inf):
        raise ValueError(f"{name} must be {what}, got {value}")     # a number: NumPy's bare
    return number


def integer(name: str, value, minimum: int | None = None) -> int:
    """`value` as an int: an integer (not a bool, nor a float such as 2.0), ≥ `minimum` if
    given."""
    if type(value) is int and (minimum is None or value >= minimum):
        return value
    what = "an integer" + ("" if minimum is None else f" ≥ {minimum}")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(f"{name} must be {what}, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be {what}, got {value}")
    return int(value)


# dtype kinds a reduction can add, multiply and compare: bool, signed and unsigned integers,
# floating point, complex. Not strings (U, S), objects (O), dates (M, m) or records (V).
NUMERIC_KINDS = "biufc"


def numeric_array(name: str, x):
    """`x` unchanged if it has no dtype (a placeholder such as SizeOnly) or a numeric one, else a
    TypeError naming the dtype: NumPy "adds" strings by cutting them to the first one's width."""
    dtype = getattr(x, "dtype", None)
    if dtype is not None and dtype.kind not in NUMERIC_KINDS:
        raise TypeError(f"{name} must be an array of numbers (bool, int, uint, float or complex) "
                        f"to be reduced, got dtype {dtype}")
    return x


def sequence_of_arguments(name: str, value, of: str) -> tuple:
    """`value` as a tuple: a tuple or a list (of `of`), else an ArgumentTypeError."""
    if isinstance(value, (tuple, list)):
        return tuple(value)
    raise ArgumentTypeError(f"{name} must be a tuple or list of {of}, got {shown(value)}")


def mapping_of_arguments(name: str, value, of: str) -> dict:
    """`value` as a dict: None (no arguments) or a mapping with string keys (`of`), else an
    ArgumentTypeError."""
    if value is None:
        return {}
    if isinstance(value, Mapping) and all(isinstance(key, str) for key in value):
        return dict(value)
    raise ArgumentTypeError(f"{name} must be a dict of {of} (or None), got {shown(value)}")
