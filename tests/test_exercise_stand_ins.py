"""Plumbing (hand-written): while a checker runs, the library functions its exercise asks the
learner to build refuse the learner's code (graded ✗ "exercise … asks you to build this
yourself"), still serve the checker, and are back in place when the check ends, however it
ends."""
from __future__ import annotations

import functools
import importlib

import numpy as np
import pytest

import dsml
import dsml.cli
import dsml.collectives
from dsml import exercises
from dsml.collectives import allreduce, busbw_factor
from dsml.exercises import FAILED, PASSED, BuildItYourself, checker, grade

ID = "99.2"
BUILDS = ("dsml.collectives.cost.busbw_factor",)
COST = importlib.import_module("dsml.collectives.cost")   # dsml.collectives.cost is a function
REAL = COST.busbw_factor


@pytest.fixture
def registered():
    """A checker of an exercise that asks for busbw_factor; it uses the real one itself."""
    @checker(ID, "asks for busbw_factor", time_limit=1.0, builds=BUILDS)
    def runs(answer):
        got = answer("allreduce", 4)
        if got != busbw_factor("allreduce", 4):       # the checker's own call: the real one
            raise exercises.Wrong(f"returned {got}")
    yield
    del exercises._REGISTRY[ID]


def everything_is_back():
    return (COST.busbw_factor is REAL and dsml.collectives.busbw_factor is REAL
            and dsml.cli.busbw_factor is REAL and busbw_factor is REAL)


def by_hand(collective, p):
    return 2 * (p - 1) / p


def calls_the_library(collective, p):
    return busbw_factor(collective, p)


def _helper(collective, p):
    return dsml.collectives.busbw_factor(collective, p)


def calls_a_helper_that_calls_the_library(collective, p):
    return _helper(collective, p)


def catches_the_refusal(collective, p):
    try:
        return busbw_factor(collective, p)
    except Exception:
        return 2 * (p - 1) / p


def calls_the_library_then_raises(collective, p):
    busbw_factor(collective, p)


def calls_the_library_then_loops(collective, p):
    try:
        busbw_factor(collective, p)
    finally:
        while True:
            pass


def raises(collective, p):
    raise ValueError("a mistake of the learner's own")


def loops(collective, p):
    while True:
        pass


REFUSED = [calls_the_library, calls_a_helper_that_calls_the_library, catches_the_refusal,
           calls_the_library_then_raises, calls_the_library_then_loops, REAL,
           functools.partial(REAL)]


def test_an_answer_built_by_hand_passes_and_the_checker_had_the_real_function(registered):
    assert grade(ID, by_hand).status == PASSED
    assert everything_is_back()


@pytest.mark.parametrize("answer", REFUSED, ids=lambda a: getattr(a, "__name__", "partial"))
def test_an_answer_that_uses_the_library_is_refused_and_everything_is_put_back(registered,
                                                                                answer):
    result = grade(ID, answer)
    assert result.status == FAILED
    assert result.message.startswith(f"exercise {ID} asks you to build this yourself: ")
    assert "dsml.collectives.cost.busbw_factor" in result.message
    assert everything_is_back()


@pytest.mark.parametrize("answer, words", [(raises, "your code raised ValueError"),
                                           (loops, "did not finish within 1 s")])
def test_after_an_error_or_the_time_limit_everything_is_put_back(registered, answer, words):
    assert words in grade(ID, answer).message
    assert everything_is_back()


def test_outside_a_check_the_library_is_itself():
    assert calls_the_library("allgather", 4) == 0.75
    assert issubclass(BuildItYourself, Exception)


# A rank program on the threads engine: the stand-in is seen from the engine's threads too.
ALLREDUCE_ID = "99.3"


@pytest.fixture
def registered_allreduce():
    @checker(ALLREDUCE_ID, "asks for allreduce", builds=("dsml.collectives.allreduce.allreduce",))
    def runs(answer):
        result = dsml.run(answer, 2, engine="threads", args=(np.ones(3),))
        if not all(np.array_equal(v, 2 * np.ones(3)) for v in result.values):
            raise exercises.Wrong("wrong sums")
    yield
    del exercises._REGISTRY[ALLREDUCE_ID]


def allreduce_from_the_library(comm, x):
    return (yield from allreduce(comm, x))


def allreduce_by_hand(comm, x):
    other = 1 - comm.rank
    return x + (yield comm.sendrecv(other, x, other))


def test_a_rank_program_on_threads_is_refused_too(registered_allreduce):
    assert grade(ALLREDUCE_ID, allreduce_by_hand).status == PASSED
    result = grade(ALLREDUCE_ID, allreduce_from_the_library)
    assert result.status == FAILED
    assert result.message.startswith(f"exercise {ALLREDUCE_ID} asks you to build this yourself")
    assert dsml.collectives.allreduce is allreduce


def test_every_declared_build_names_a_library_function():
    for entry in exercises.checkers():
        for dotted in entry.builds:
            assert dotted.startswith("dsml."), (entry.exercise_id, dotted)
            assert callable(exercises._resolve(dotted)), (entry.exercise_id, dotted)


def test_builds_must_be_dotted_names():
    with pytest.raises(ValueError, match="builds must be a tuple of dotted names"):
        checker("99.4", "bad", builds="dsml.fault.young_interval")


class _Touchy:
    """An object in the learner's module whose attribute lookup raises (as some proxies do)."""

    def __call__(self):
        return None

    def __getattr__(self, name):
        raise RuntimeError(f"no {name} here")


touchy = _Touchy()


def test_odd_objects_in_the_learners_module_do_not_break_the_check(registered):
    assert grade(ID, by_hand).status == PASSED
    assert grade(ID, calls_the_library).status == FAILED
    assert everything_is_back()
