"""Plumbing (hand-written): `DeadlockError`, the one deadlock error of every engine.

`dsml.run` raises it on `sim`, `threads`, `processes` and `mpi` alike when every unfinished rank
waits for something no rank will do. It is the simulator's `dsml.sim.DeadlockError` (which words
the report: each waiting rank and what it waits for; `.waiting`), so code that catches that
still catches it, and a `RankError` whose `.rank` is the lowest waiting rank, so code that
catches a rank's failure catches a deadlock too. (The simulator used on its own, week 1's
`Simulator`, raises the base class: it knows no ranks.)
"""
from __future__ import annotations

import re

from dsml.comm.api import RankError
from dsml.comm.tags import differing
from dsml.sim import DeadlockError as SimDeadlock

_RANK = re.compile(r"rank (\d+)")


class DeadlockError(SimDeadlock, RankError):
    """Every unfinished rank waits for a message (or a join) that will never come. `waiting`:
    the waiting processes (`.name`, `.waiting_for.describe()`, `.sim.now`); `note`: more lines
    for the report; `rank`: the rank named first (default: the lowest waiting one)."""

    def __init__(self, waiting: list, note: str = "", rank: int | None = None, left=()):
        # `left`: (sender or None, tag) of messages that arrived and were never received.
        # When the tags waited on and left show ranks in different collective calls, the
        # report says so (dsml.comm.tags.differing).
        hint = differing([(lowest_rank([p]), getattr(p.waiting_for, "tag", None))
                          for p in waiting], left)
        if hint:
            note = f"{note}\n{hint}" if note else hint
        # The simulator's class words the message; RankError.__init__ would reword it.
        text = str(SimDeadlock(waiting, note))
        RuntimeError.__init__(self, text)
        self.waiting = waiting
        self.rank = lowest_rank(waiting) if rank is None else rank

    def __reduce__(self):
        return _rebuilt, (str(self), self.rank)


def _rebuilt(text: str, rank: int) -> DeadlockError:
    error = DeadlockError.__new__(DeadlockError)
    RuntimeError.__init__(error, text)
    error.waiting, error.rank = [], rank
    return error


def lowest_rank(waiting) -> int:
    """The lowest rank among waiting processes (a simulator process's pid is its rank; else
    the number in its name "rank r…"); -1 if none says."""
    ranks = []
    for process in waiting:
        pid = getattr(process, "pid", None)
        if isinstance(pid, int):
            ranks.append(pid)
        else:
            found = _RANK.match(str(getattr(process, "name", "")))
            if found:
                ranks.append(int(found.group(1)))
    return min(ranks, default=-1)
