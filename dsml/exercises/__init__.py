"""Plumbing (hand-written): the exercise harness that grades a learner's answers on the spot.

In a notebook::

    from dsml.exercises import check
    check("1.1", size_for_fraction)

prints exactly one line and returns None:

    ✓ Exercise 1.1 (size for a fraction of the peak): correct
    ✗ Exercise 1.1 (size for a fraction of the peak): <a hint: what was tried, expected, returned>
    · Exercise 1.1 (size for a fraction of the peak): not attempted yet

`grade(...)` does the same without printing and returns the `Grade` (for tests).

Checkers live in one module per week (`dsml.exercises.week1`, ...), imported lazily by the
week prefix of the id, and register themselves with `@checker("1.1", "title")`. The
parameter names of a checker are the names of the answers it grades (the learner's
functions), which are also the names of the reference solutions in `solutions/weekN.py`.
A checker calls the learner's code on its own inputs and raises `Wrong(hint)` on a wrong
answer; it may return a short note that is appended to "correct". This package sits on the
layer above the engines: it and its week modules import `dsml.sim`, `dsml.net` and
`dsml.comm` directly, never the top-level `dsml` package.

"Not attempted" means the learner's code raised NotImplementedError (the untouched stub),
or an answer passed to check is None or `...`. Any other exception from the learner's code,
a deadlock, or a failed rank program is reported as ✗, never raised, so a notebook always
runs top to bottom.

Exercises that must be built. An exercise often asks the learner to write what the library
already has (2.1's ring all-gather is `dsml.collectives.allgather`). A checker names those
library functions (`@checker(..., builds=("dsml.collectives.allgather.allgather", ...))`);
while it runs, every name bound to one of them in a `dsml` module or in the learner's own
module (a notebook's `__main__`) is replaced by a stand-in. Called from the learner's code (a
frame of the answer's module between the stand-in and the harness), the stand-in raises
`BuildItYourself` and the grade is ✗ "exercise 2.1 asks you to build this yourself"; called by
the checker or by other library code, it runs the real function, so the checker's own
references still work. An answer that is one of those functions (or a `functools.partial` of
one) is refused the same way. The names are restored when the check ends, however it ends.

Fresh cases. A checker keeps its first, fixed case (chosen so that different mistakes give
different numbers) and draws further cases from `fresh_rng()`, seeded anew for every check, so
a table of answers remembered from earlier hints does not pass. A hint about a fresh case says
its inputs, so the learner can reproduce it, and never its expected value. Tests fix the
seeds with `fresh_seed(base)`.

Time limit: each checker has one (`@checker(..., time_limit=s)`, DEFAULT_TIME_LIMIT if not
given). An answer still running when it expires — an endless loop, a wait that never ends —
is stopped and graded ✗ "did not finish within N s". In the main thread (where a notebook
runs its cells) the limit is a SIGALRM timer whose handler raises inside the running code;
elsewhere (another thread, or a platform without SIGALRM) a trace function checks the clock
on every line, which is slower but stops the same loops. Code stuck inside one long call
into C (a huge NumPy operation) is stopped when that call returns.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import numbers
import pkgutil
import re
import secrets
import signal
import sys
import threading
import time
import types
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["check", "grade", "checker", "Grade", "Wrong", "known_ids", "checkers",
           "PASSED", "FAILED", "NOT_ATTEMPTED", "expect_close", "as_float", "expect_rank_program",
           "DEFAULT_TIME_LIMIT", "OutOfTime", "time_limit", "BuildItYourself", "fresh_rng",
           "fresh_seed"]

PASSED, FAILED, NOT_ATTEMPTED = "passed", "failed", "not attempted"
DEFAULT_TIME_LIMIT = 30.0    # s a checker gives the learner's answers (see the docstring)
ALARM_REPEAT = 2.0           # s between further alarms, if the first one's exception was lost
_SYMBOL = {PASSED: "✓", FAILED: "✗", NOT_ATTEMPTED: "·"}
# A week is a number, or a number and a letter for a bonus notebook after it ("5b.1").
_ID_PATTERN = re.compile(r"^(\d+[a-z]?)\.(\d+)$")


class Wrong(Exception):
    """Raised by a checker when the answer is wrong; the argument is the hint shown."""

    def __init__(self, hint: str):
        self.hint = hint
        super().__init__(hint)


@dataclass(frozen=True)
class Grade:
    """The outcome of one check: status is "passed", "failed" or "not attempted"."""
    exercise_id: str
    title: str
    status: str
    message: str

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def line(self) -> str:
        """The one line `check` prints."""
        return f"{_SYMBOL[self.status]} Exercise {self.exercise_id} ({self.title}): {self.message}"

    def __str__(self) -> str:
        return self.line()


@dataclass(frozen=True)
class Checker:
    """A registered checker: its id, title, the function, and the answer names it takes."""
    exercise_id: str
    title: str
    function: Callable
    answer_names: tuple
    time_limit: float = DEFAULT_TIME_LIMIT
    builds: tuple = ()    # dotted names of the library functions the exercise asks to build

    @property
    def week(self) -> int | str:
        """The week: 5 for "5.1", the string "5b" for a bonus notebook's "5b.1"."""
        return _week_of(self.exercise_id)


_REGISTRY: dict[str, Checker] = {}


def checker(exercise_id: str, title: str, time_limit: float = DEFAULT_TIME_LIMIT,
            builds: tuple = ()):
    """Decorator: register `function(*answers)` as the checker of `exercise_id`; the learner's
    answers get `time_limit` seconds in all; `builds` names ("module.function") the library
    functions the exercise asks the learner to build, which the answers may not call (see
    the module docstring)."""
    if isinstance(builds, str) or not all(isinstance(name, str) and "." in name
                                          for name in builds):
        raise ValueError(f"builds must be a tuple of dotted names such as "
                         f"'dsml.collectives.allgather.allgather' or "
                         f"'dsml.train.optim.Adam.update', got {builds!r}")
    if not isinstance(exercise_id, str) or not _ID_PATTERN.match(exercise_id):
        raise ValueError(f"exercise_id must look like '1.4' (week.number) or '5b.1', "
                         f"got {exercise_id!r}")
    if isinstance(time_limit, bool) or not isinstance(time_limit, numbers.Real) \
            or not 0 < time_limit < float("inf"):
        raise ValueError(f"time_limit must be a finite number of seconds > 0, got {time_limit!r}")

    def register(function: Callable) -> Callable:
        names = tuple(inspect.signature(function).parameters)
        previous = _REGISTRY.get(exercise_id)
        if previous is not None and previous.function.__qualname__ != function.__qualname__:
            raise ValueError(f"exercise {exercise_id} already has a checker "
                             f"({previous.function.__qualname__})")
        _REGISTRY[exercise_id] = Checker(exercise_id, title, function, names, float(time_limit),
                                         tuple(builds))
        return function
    return register


# --- finding checkers --------------------------------------------------------------------

def _week_modules() -> list[str]:
    """Names of the week modules in this package: week1, week2, ..., week5b, ..."""
    return sorted((info.name for info in pkgutil.iter_modules(__path__)
                   if re.fullmatch(r"week\d+[a-z]?", info.name)),
                  key=lambda name: _week_key(name[4:]))


def _week_of(exercise_id: str) -> int | str:
    """The part of an id before its last dot: an int for a week, a string for a bonus week."""
    week = exercise_id.rsplit(".", 1)[0]
    return int(week) if week.isdigit() else week


def _week_key(week: str):
    """Sort key of a week's name: 5 before 5b before 6."""
    digits = week.rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(digits), week[len(digits):]


def _load_week(week: str) -> None:
    if f"week{week}" in _week_modules():
        importlib.import_module(f"{__name__}.week{week}")


def _sort_key(exercise_id: str):
    week, number = exercise_id.rsplit(".", 1)
    return _week_key(week), int(number)


def known_ids() -> list[str]:
    """Every exercise id that has a checker (imports all week modules)."""
    for name in _week_modules():
        importlib.import_module(f"{__name__}.{name}")
    return sorted(_REGISTRY, key=_sort_key)


def checkers(week: int | None = None) -> list[Checker]:
    """The registered checkers, in order; only those of `week` (5, or "5b") if given."""
    return [_REGISTRY[i] for i in known_ids() if week is None or _REGISTRY[i].week == week]


def _lookup(exercise_id) -> Checker:
    if not isinstance(exercise_id, str):
        kind = type(exercise_id).__name__
        meant = f"'{exercise_id}'" if isinstance(exercise_id, float) else "'1.4'"
        ambiguous = (" (a number cannot tell 1.1 from 1.10: quote the id as it is written)"
                     if isinstance(exercise_id, float) else "")
        raise ValueError(f"an exercise id is a string, such as {meant} in check({meant}, …); "
                         f"got the {kind} {exercise_id!r}{ambiguous}. The ids are "
                         f"{', '.join(repr(i) for i in known_ids())}")
    match = _ID_PATTERN.match(exercise_id)
    if match:
        _load_week(match.group(1))
        if exercise_id in _REGISTRY:
            return _REGISTRY[exercise_id]
    raise ValueError(f"unknown exercise id {exercise_id!r}; known ids: "
                     f"{', '.join(known_ids())} (give the id as a string, e.g. '1.4')")


# --- the time limit ---------------------------------------------------------------------

class OutOfTime(BaseException):
    """Raised inside the learner's code when its time is up. A BaseException, so that an
    `except Exception` in that code (or in an engine running it) does not swallow it."""


@contextmanager
def time_limit(seconds: float):
    """Raise OutOfTime in the code run inside the block once `seconds` have passed."""
    if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
        with _alarm(seconds):
            yield
    else:
        with _traced(seconds):
            yield


def _out_of_time(signum=None, frame=None):
    raise OutOfTime()


@contextmanager
def _alarm(seconds: float):
    previous = signal.signal(signal.SIGALRM, _out_of_time)
    # Then again every ALARM_REPEAT s: an exception raised where Python cannot pass it on
    # (a fork hook, a __del__) is printed and lost, and the code would run on.
    before, _ = signal.setitimer(signal.ITIMER_REAL, seconds, ALARM_REPEAT)
    started = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if before:                     # someone else's timer was running: give back its rest
            left = before - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3))


@contextmanager
def _traced(seconds: float):
    end = time.monotonic() + seconds
    clock = time.monotonic

    def local(frame, event, arg):
        if clock() > end:
            raise OutOfTime()
        return local

    def tracer(frame, event, arg):
        if clock() > end:
            raise OutOfTime()
        return local

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield
    finally:
        sys.settrace(previous)


# --- fresh cases ------------------------------------------------------------------------

# The seed of a check's fresh cases: a base drawn once per process (or set by `fresh_seed`)
# and the number of the check, so that no two checks see the same fresh cases.
_FRESH = {"base": secrets.randbits(64), "checks": 0, "current": None}


def fresh_rng() -> np.random.Generator:
    """The random generator of the running check's fresh cases (a new seed for every check).
    Outside a check it is seeded from the last check's seed (or the base, before any)."""
    seed = _FRESH["current"] or (_FRESH["base"], _FRESH["checks"])
    return np.random.default_rng(list(seed))


@contextmanager
def fresh_seed(base: int):
    """Within the block, the fresh cases of the k-th check are those of seed (base, k): the
    same every run. For tests, which must be deterministic."""
    if isinstance(base, bool) or not isinstance(base, numbers.Integral) or base < 0:
        raise ValueError(f"base must be an integer ≥ 0, got {base!r}")
    saved = dict(_FRESH)
    _FRESH.update(base=int(base), checks=0, current=None)
    try:
        yield
    finally:
        _FRESH.update(saved)


# --- exercises that must be built ----------------------------------------------------------

class BuildItYourself(Exception):
    """Raised when the learner's code calls a library function the exercise asks them to
    build. An Exception, so the engines report it like any other error of the learner's code;
    the harness grades the check by what was called, however the error was wrapped."""


def _resolve(dotted: str) -> Callable:
    """The function named "package.module.function" (or "package.module.Class.method")."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            target = getattr(target, name)
        return target
    raise ValueError(f"no importable module in {dotted!r}")


def _owner_class(dotted: str):
    """For "package.module.Class.method", the class; None for a module-level function."""
    parts = dotted.split(".")
    try:
        owner = _resolve(".".join(parts[:-1]))
    except (ValueError, AttributeError):
        return None
    return owner if isinstance(owner, type) else None


def _unwrap(answer):
    """The plain function behind an answer: a partial's function, a bound method's function."""
    for _ in range(10):
        if isinstance(answer, functools.partial):
            answer = answer.func
        elif isinstance(answer, types.MethodType):
            answer = answer.__func__
        else:
            break
    return answer


def _wraps(function, real) -> bool:
    """True if `function` is `real`, or a wrapper of it (functools.wraps's __wrapped__ chain:
    `dsml.collectives.allgather` is a tracing wrapper of the module's function)."""
    for _ in range(10):
        if function is real:
            return True
        try:     # the learner's module may hold objects whose attribute lookup misbehaves
            function = getattr(function, "__wrapped__", None)
        except Exception:
            return False
        if function is None:
            return False
    return False


def _namespace_of(answer):
    """The globals of the module the answer was written in, or None."""
    function = _unwrap(answer)
    if not hasattr(function, "__globals__"):
        function = getattr(type(function), "__call__", None)
    return getattr(function, "__globals__", None)


def _run_checker(entry: Checker, answers: tuple):
    """Run the checker (the frame the stand-ins look for: above it is not the learner)."""
    with time_limit(entry.time_limit):
        return entry.function(*answers)


def _called_by_learner(frame, namespaces: list, checker_code=None) -> bool:
    """True if a frame of the learner's module lies between `frame` and the checker (or
    `_run_checker`, if the checker's frame is not met)."""
    while frame is not None and frame.f_code is not _run_checker.__code__ \
            and frame.f_code is not checker_code:
        if any(frame.f_globals is namespace for namespace in namespaces):
            return True
        frame = frame.f_back
    return False


def _build_it_yourself(exercise_id: str, dotted: str, how: str = "your code called") -> str:
    return (f"exercise {exercise_id} asks you to build this yourself: {how} {dotted}, the "
            f"library's own version of what the exercise is about. Write it from the pieces "
            f"the exercise names instead.")


@contextmanager
def _stand_ins(exercise_id: str, builds: tuple, answers: tuple, checker_code=None):
    """Replace the functions named in `builds`, wherever a `dsml` module or the answers'
    module binds them, by stand-ins that refuse the learner's code; yield the list of the
    names the learner's code called. Everything is put back when the block ends."""
    called = []
    if not builds:
        yield called
        return
    namespaces = [ns for ns in (_namespace_of(a) for a in answers) if ns is not None]
    dicts = [vars(module) for name, module in list(sys.modules.items())
             if module is not None and (name == "dsml" or name.startswith("dsml."))]
    dicts += [ns for ns in namespaces if all(ns is not d for d in dicts)]
    swapped = []

    def stand_in_for(real, dotted):
        @functools.wraps(real)
        def stand_in(*args, **kwargs):
            if _called_by_learner(sys._getframe(1), namespaces, checker_code):
                called.append(dotted)
                raise BuildItYourself(_build_it_yourself(exercise_id, dotted))
            return real(*args, **kwargs)
        return stand_in

    try:
        for dotted in builds:
            real = _resolve(dotted)
            owner = _owner_class(dotted)
            if owner is not None:         # a method: replace it on its class (and so for
                name = dotted.rsplit(".", 1)[1]          # the subclasses that inherit it)
                stand_in = stand_in_for(real, dotted)
                setattr(owner, name, stand_in)
                swapped.append((owner, name, real, stand_in))
                continue
            for namespace in dicts:
                for name, value in list(namespace.items()):
                    if callable(value) and _wraps(value, real):    # itself or a wrapper of it
                        stand_in = stand_in_for(value, dotted)
                        namespace[name] = stand_in
                        swapped.append((namespace, name, value, stand_in))
        yield called
    finally:
        for namespace, name, real, stand_in in reversed(swapped):
            if isinstance(namespace, type):
                if namespace.__dict__.get(name) is stand_in:
                    setattr(namespace, name, real)
            elif namespace.get(name) is stand_in:
                namespace[name] = real


def _is_library_answer(answer, builds: tuple) -> str | None:
    """The dotted name of the library function an answer is (or partially applies), or None."""
    function = _unwrap(answer)
    for dotted in builds:
        if _wraps(function, _resolve(dotted)):
            return dotted
    return None


def _describe_answer(answer) -> str:
    kind = type(answer).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    shown = repr(answer)
    if len(shown) > 60:
        shown = shown[:57] + "…"
    return f"{article} {kind} {shown}" if kind in shown and "<" in shown else \
        f"the {kind} {shown}"


# --- grading ---------------------------------------------------------------------------

def _not_implemented(error: BaseException) -> bool:
    """True if NotImplementedError is this error or anywhere in its chain of causes."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, NotImplementedError):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def _first_line(text: str) -> str:
    lines = str(text).strip().splitlines()
    return lines[0].rstrip(":") if lines else ""


def _describe_error(error: Exception) -> str:
    # Imported here: the harness itself does not need the engines.
    from dsml.comm.api import RankError
    from dsml.sim import DeadlockError
    if isinstance(error, DeadlockError):
        return (f"your rank program deadlocked: {_first_line(error)} Look at what each rank "
                f"waits for: a receive that no rank will ever send to.")
    if isinstance(error, RankError):
        return f"your rank program failed: {_first_line(error)}"
    detail = _first_line(error)
    return f"your code raised {type(error).__name__}" + (f": {detail}" if detail else "")


def grade(exercise_id: str, *answers) -> Grade:
    """Grade `answers` for `exercise_id` and return the Grade, printing nothing.

    Raises ValueError for an unknown id; every problem with the answers becomes a Grade.
    """
    entry = _lookup(exercise_id)

    def result(status: str, message: str) -> Grade:
        message = " ".join(str(message).split())   # one line, whatever the hint contained
        return Grade(entry.exercise_id, entry.title, status, message)

    if any(answer is None or answer is Ellipsis for answer in answers):
        return result(NOT_ATTEMPTED, "not attempted yet")
    if len(answers) != len(entry.answer_names):
        expected = ", ".join(entry.answer_names)
        return result(FAILED, f"check({exercise_id!r}, ...) takes {len(entry.answer_names)} "
                              f"answer(s) ({expected}), got {len(answers)}; call it as "
                              f"check({exercise_id!r}, {expected})")
    for name, answer in zip(entry.answer_names, answers):
        if not callable(answer):
            return result(FAILED, f"check({exercise_id!r}, …) expects a function ({name}, "
                                  f"defined with def in the exercise cell); got "
                                  f"{_describe_answer(answer)}")
        dotted = _is_library_answer(answer, entry.builds)
        if dotted is not None:
            return result(FAILED, _build_it_yourself(exercise_id, dotted,
                                                     f"the answer {name} is"))
    _FRESH["checks"] += 1
    _FRESH["current"] = (_FRESH["base"], _FRESH["checks"])
    try:
        with _stand_ins(exercise_id, entry.builds, answers,
                        getattr(entry.function, "__code__", None)) as called:
            try:
                note = _run_checker(entry, answers)
            finally:
                _FRESH["current"] = None
    except OutOfTime:
        if called:
            return result(FAILED, _build_it_yourself(exercise_id, called[0]))
        return result(FAILED, f"your code did not finish within {entry.time_limit:g} s and was "
                              f"stopped: an endless loop, or a wait that never ends?")
    except Wrong as wrong:
        if called:     # however the checker reported the refusal, say what happened
            return result(FAILED, _build_it_yourself(exercise_id, called[0]))
        return result(FAILED, wrong.hint)
    except Exception as error:   # the learner's code: report it, never crash the notebook
        if called:
            return result(FAILED, _build_it_yourself(exercise_id, called[0]))
        if _not_implemented(error):
            return result(NOT_ATTEMPTED, "not attempted yet")
        return result(FAILED, _describe_error(error))
    if called:         # the learner's code caught the refusal and carried on
        return result(FAILED, _build_it_yourself(exercise_id, called[0]))
    return result(PASSED, "correct" + (f" — {note}" if note else ""))


def check(exercise_id: str, *answers) -> None:
    """Grade `answers` for `exercise_id` and print one line: ✓, ✗ with a hint, or ·."""
    print(grade(exercise_id, *answers).line())


# --- helpers for checkers ------------------------------------------------------------------

def as_float(value, what: str) -> float:
    """`value` as a float, or Wrong saying what came back instead of a number."""
    if value is None:
        raise Wrong(f"{what} returned None; did you forget a `return`?")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.ndarray)):
        raise Wrong(f"{what} returned {value!r} ({type(value).__name__}); expected a number")
    array = np.asarray(value, dtype=float)
    if array.size != 1:
        raise Wrong(f"{what} returned an array of shape {array.shape}; expected one number")
    return float(array.reshape(()))


def expect_rank_program(probe, call: str, example: str) -> None:
    """Wrong unless `probe` — what calling the learner's answer returned — is a generator, as a
    rank program must be; `call` shows how it was called, `example` a request it could yield.
    Closes the probe (it was only a test call)."""
    if not isinstance(probe, types.GeneratorType):
        raise Wrong(f"{call} returned {type(probe).__name__}, not a generator: a rank program "
                    f"must `yield` its requests, e.g. `{example}`, and `return` its result.")
    probe.close()


def expect_close(got, expected: float, what: str, reconsider: str, rtol: float = 1e-9,
                 unit: str = "", drawn: bool = False) -> None:
    """Wrong unless `got` (a number) is within `rtol` of `expected`; the hint says what
    was called (`what`), what was expected, what came back, and what to `reconsider`. For a
    case `drawn` afresh it does not say what was expected, only that this was such a case."""
    value = as_float(got, what)
    if not np.isclose(value, expected, rtol=rtol, atol=0.0):
        unit = f" {unit}" if unit else ""
        if drawn:
            note = "" if "drawn afresh" in what else " (a case drawn afresh for this check)"
            raise Wrong(f"{what}{note} returned {value:.6g}{unit}, not the expected value; "
                        f"call your function with these inputs to see it again. {reconsider}")
        raise Wrong(f"{what} returned {value:.6g}{unit}, expected {expected:.6g}{unit}. "
                    f"{reconsider}")
