"""Plumbing (hand-written): the words for mistakes a learner makes in a rank program, shared by
every engine (the simulator's `SimEngine.handle` and the real engines' `driver.drive`), so a
mistake reads the same wherever it is made.

The commonest: calling a collective (itself a rank program, a generator function) without
`yield from`. `x = allreduce(comm, x)` only builds a generator and runs none of it; yielding
that generator, or returning it, is then the first thing an engine sees.
"""
from __future__ import annotations

import types

from dsml.comm.api import request_choices

YIELD_FROM = ("a collective or any other rank program is run inside yours with `yield from`: "
              "`x = yield from allreduce(comm, x)`, not `x = allreduce(comm, x)` (which only "
              "makes a generator and runs none of it) and not `yield allreduce(comm, x)`")


def _generator_name(value) -> str:
    return getattr(value, "__qualname__", None) or getattr(value, "__name__", "generator")


def not_a_request(request, choices: str | None = None) -> str:
    """Why a yielded value is refused (after "rank r "): use `yield from` for a generator,
    else the list of requests (`choices`, by default `api.request_choices()`: a notebook
    passes its own)."""
    if isinstance(request, types.GeneratorType):
        return (f"yielded a generator ({_generator_name(request)}), not a request; use "
                f"`yield from`: {YIELD_FROM}")
    if choices is None:
        choices = request_choices()
    return f"yielded {request!r}, which is not a request; yield one of {choices}"


def returned_generator(value) -> str | None:
    """Why a rank program's return value is refused (after "rank r "), or None if it is
    fine: a generator means a collective was called without `yield from`."""
    if isinstance(value, types.GeneratorType):
        return (f"returned a generator ({_generator_name(value)}) instead of a result; use "
                f"`yield from`: {YIELD_FROM}")
    return None
