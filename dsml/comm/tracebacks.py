"""Plumbing (hand-written): a failed rank's traceback starts at the rank's own code.

A rank program runs inside an engine, so the traceback of what it raised begins with the
engine's frames (the thread's or child's main function, `driver.drive`, the simulator's
`Process.resume`) before the first line the learner wrote. `user_traceback` formats an
exception — and every exception chained to it — without those leading frames; frames further
down (a collective of `dsml.collectives` the program called, say) stay, since the program
called them. `trim_leading` does the same to a live exception's `__traceback__`, for the
simulator, which chains the original to its `RankError`.
"""
from __future__ import annotations

import os
import traceback

# Where the engines live: frames from these files at the top of a traceback are the engine's.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # dsml/
_ENGINE_FILES = (os.path.join(_PACKAGE, "comm") + os.sep, os.path.join(_PACKAGE, "sim.py"),
                 os.path.join(_PACKAGE, "sim_support.py"))


def is_engine_frame(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_ENGINE_FILES)


def _trimmed(stack):
    """The frames from the first that is not the engine's (all of them if every one is)."""
    for index, frame in enumerate(stack):
        if not is_engine_frame(frame.filename):
            return traceback.StackSummary.from_list(stack[index:]) if index else stack
    return stack


def user_traceback(error: BaseException) -> str:
    """The formatted traceback of `error` and its chain, each without the engine's leading
    frames (see the module's text)."""
    formatted = traceback.TracebackException.from_exception(error)
    seen = set()
    pending = [formatted]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        current.stack = _trimmed(current.stack)
        pending += [chained for chained in (current.__cause__, current.__context__)
                    if chained is not None]
    return "".join(formatted.format())


def trim_leading(error: BaseException) -> BaseException:
    """Drop the engine's leading frames from `error.__traceback__` (in place); returns it."""
    tb = error.__traceback__
    first = tb
    while first is not None and is_engine_frame(first.tb_frame.f_code.co_filename):
        first = first.tb_next
    if first is not None and first is not tb:
        error.__traceback__ = first
    return error
