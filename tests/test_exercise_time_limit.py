"""Plumbing (hand-written): the exercise harness stops an answer that does not finish within
its checker's time limit and grades it ✗ — an endless loop never hangs a notebook."""
from __future__ import annotations

import signal
import threading

import pytest

import dsml
from dsml import exercises
from dsml.exercises import FAILED, PASSED, checker, grade
from leaks import nothing_left_behind  # noqa: F401

LIMIT = 1.0
ID = "99.1"


@pytest.fixture
def registered():
    """A checker that runs the answer once, registered for the test only."""
    @checker(ID, "runs the answer", time_limit=LIMIT)
    def runs(answer):
        answer()
    yield
    del exercises._REGISTRY[ID]


def endless():
    while True:
        pass


def endless_rank_program_on(engine):
    def loops(comm):
        while True:
            yield comm.compute(0.0)

    def answer():
        network = dsml.net.AlphaBeta(1e-6, 1e-9) if engine == "sim" else None
        dsml.run(loops, 2, engine=engine, network=network)
    return answer


def swallows_exceptions():
    while True:
        try:
            while True:
                pass
        except Exception:          # a learner's broad except does not keep it running
            pass


@pytest.mark.parametrize("answer", [endless, swallows_exceptions,
                                    endless_rank_program_on("sim"),
                                    endless_rank_program_on("threads"),
                                    endless_rank_program_on("processes")],
                         ids=["loop", "except", "sim", "threads", "processes"])
def test_an_answer_that_never_finishes_is_stopped_and_graded_wrong(registered, answer):
    result = grade(ID, answer)
    assert result.status == FAILED
    assert result.message.startswith(f"your code did not finish within {LIMIT:g} s")
    assert result.line().startswith(f"✗ Exercise {ID}")


def test_an_answer_that_finishes_in_time_still_passes(registered):
    assert grade(ID, lambda: None).status == PASSED


def test_off_the_main_thread_the_limit_still_holds(registered):
    results = []
    worker = threading.Thread(target=lambda: results.append(grade(ID, endless)))
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive()
    assert results[0].status == FAILED and "did not finish within" in results[0].message


def test_the_callers_alarm_and_handler_are_given_back(registered):
    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGALRM, mine)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1000.0)
        grade(ID, lambda: None)
        assert signal.getsignal(signal.SIGALRM) is mine
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 900 < left <= 1000
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), "5", True])
def test_a_bad_time_limit_is_refused(bad):
    with pytest.raises(ValueError, match=r"time_limit must be a finite number of seconds > 0"):
        checker("99.2", "bad", time_limit=bad)
