"""Plumbing (hand-written): the messages for a rank program's common mistakes, shared by every
engine (the simulator's `SimEngine.handle` and `run`, with the messages left unreceived in its
mailboxes, and the real engines' `driver.drive`).

The most common one: a collective (a generator function such as week 2's `allreduce`) called
like a function. `yield allreduce(comm, x)` hands the engine a generator instead of a request,
and `x = allreduce(comm, x)` does not run it at all — `x` is then a generator object, which
the rank may return. Both get a message that says to use `yield from`.
"""
from __future__ import annotations

import inspect
import types

from dsml.comm.api import RankError, request_choices
from dsml.comm.tags import tag_words

USE_YIELD_FROM = "call a collective with `yield from`, e.g. `x = yield from allreduce(comm, x)`"


def generator_name(gen) -> str:
    return getattr(gen, "__qualname__", None) or getattr(gen, "__name__", "?")


def not_a_request(request, choices: str | None = None) -> str:
    """What to say (after "rank r ") when a rank program yielded something that is no request;
    `choices` lists the valid requests (by default `api.request_choices()`: a notebook passes
    its own)."""
    if isinstance(request, types.GeneratorType):
        return (f"yielded a generator ({generator_name(request)}(...)), not a request; "
                f"{USE_YIELD_FROM}")
    # A collective of dsml.collectives is a function that returns the generator (`spans.traced`,
    # `__wrapped__` its generator function).
    if inspect.isgeneratorfunction(request) or inspect.isgeneratorfunction(
            getattr(request, "__wrapped__", None)):
        return (f"yielded the generator function {generator_name(request)} itself, not a "
                f"request; {USE_YIELD_FROM}")
    if choices is None:
        choices = request_choices()
    return f"yielded {request!r}, which is not a request; yield one of {choices}"


def returned_generator(value) -> str | None:
    """What to say (after "rank r ") when a rank program returned `value`, if it is a generator
    — a collective that was called without `yield from` and so never ran; else None."""
    if not isinstance(value, types.GeneratorType):
        return None
    return (f"returned a generator ({generator_name(value)}(...)) that never ran: a collective "
            f"called without `yield from`? {USE_YIELD_FROM}")


def check_returned(processes) -> None:
    """Raise RankError for the first rank whose program returned a generator."""
    for process in processes:
        message = returned_generator(process.value)
        if message:
            raise RankError(process.pid, message)


def unreceived(mailbox) -> list:
    """(src, dst, tag, count) of the messages in the simulator's mailboxes
    (`mailbox[dst][(src, tag)]` -> payloads) that no receive has taken."""
    return [(src, dst, tag, len(box)) for dst, boxes in enumerate(mailbox)
            for (src, tag), box in sorted(boxes.items()) if box]


def describe_messages(messages) -> str:
    """The lines that list (src, dst, tag, count) messages nobody received."""
    return "\n  ".join(f"rank {src} -> rank {dst} ({tag_words(tag)}): {n} message(s)"
                       for src, dst, tag, n in messages)
