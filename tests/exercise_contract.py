"""The exercise contract every week's checkers keep, as helpers for the week test modules.

Each `tests/test_exercises_weekN.py` keeps what only that week knows (its named wrong answers,
its hints, its cases) and adopts the rest with one line,
`globals().update(contract_tests(week, count, solution, WRONG, ...))`, which checks that:

- every reference solution in `solutions/weekN.py` passes its checker, and every checker has
  a reference solution and every solution a checker;
- every named plausible mistake fails, with a one-line hint long enough to teach;
- an untouched stub (NotImplementedError, also inside a rank program) is "not attempted";
- a learner's exception or crashed rank program is a ✗, never raised;
- the notebook's exercise stubs do not shadow a name the notebook body defines, and the
  exercise cells (statement, stub, `check(...)`) match the checkers.

Not a test module itself (no `test_` prefix): pytest imports it only through the week modules.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable

import pytest

from dsml.exercises import FAILED, NOT_ATTEMPTED, PASSED, checkers, grade

ROOT = Path(__file__).resolve().parent.parent

# A hint shorter than this says "wrong" without saying what was wrong or what was expected.
MIN_HINT_LENGTH = 60

# The line every stub cell raises, so an untouched stub grades as "not attempted".
STUB_LINE = "raise NotImplementedError  # your code here"


# --- a week's exercises and reference solutions -----------------------------------------------

def solution_module(week: int | str) -> ModuleType:
    """`solutions/week<week>.py` (week 5, or "5b" for a bonus notebook), the reference solutions (the repository root goes on
    sys.path: `solutions` is not part of the installed package)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"solutions.week{week}")


def exercise_ids(week: int) -> list[str]:
    """The ids of `week`'s checkers, in order: ["2.1", "2.2", ...]."""
    return [entry.exercise_id for entry in checkers(week=week)]


def answer_names(week: int) -> set[str]:
    """The names of the answers `week`'s checkers grade (the notebook's stub functions)."""
    return {name for entry in checkers(week=week) for name in entry.answer_names}


def reference(week: int, exercise_id: str, solution: ModuleType) -> Callable:
    """The reference solution of `exercise_id` (a one-answer exercise) in `solution`."""
    (name,) = next(entry for entry in checkers(week=week)
                   if entry.exercise_id == exercise_id).answer_names
    return getattr(solution, name)


def answer_cases(answers: dict[str, list[Callable]]) -> list[tuple[str, Callable]]:
    """{"2.1": [f, g], ...} as the (exercise id, answer) pairs a parametrized test takes."""
    return [(exercise_id, answer) for exercise_id, functions in answers.items()
            for answer in functions]


def case_name(value) -> str:
    """A parametrized case's id: a function by its name, anything else as it is."""
    return getattr(value, "__name__", value)


# --- assertions: the checkers ------------------------------------------------------------------

def assert_week_has_exercises(week: int, count: int, wrong: dict[str, list[Callable]]) -> None:
    """`week` has exercises week.1 … week.count, and each has at least two named mistakes."""
    ids = exercise_ids(week)
    assert ids == [f"{week}.{k}" for k in range(1, count + 1)]
    assert set(wrong) == set(ids), "every exercise needs named wrong answers, and only those"
    assert all(len(mistakes) >= 2 for mistakes in wrong.values()), \
        "each exercise needs at least two named mistakes"


def assert_passes(exercise_id: str, answer: Callable) -> None:
    result = grade(exercise_id, answer)
    assert result.status == PASSED, result.line()


def assert_mistake_fails(exercise_id: str, wrong: Callable, words: str | None = None) -> None:
    """`wrong` fails with a one-line hint that teaches (and contains `words`, if given)."""
    result = grade(exercise_id, wrong)
    assert result.status == FAILED, result.line()
    assert "\n" not in result.message
    assert len(result.message) > MIN_HINT_LENGTH, "a hint should teach, not just say 'wrong'"
    if words is not None:
        assert words in result.message, result.message


def assert_untouched_stub_is_not_attempted(exercise_id: str) -> None:
    def stub(*args):
        raise NotImplementedError  # your code here
    result = grade(exercise_id, stub)
    assert result.status == NOT_ATTEMPTED, result.line()


def assert_generator_stub_is_not_attempted(exercise_id: str) -> None:
    # A stub that is already a generator fails inside the simulator (a RankError);
    # NotImplementedError in its cause still means "not attempted".
    def stub(comm, *args):
        raise NotImplementedError  # your code here
        yield
    result = grade(exercise_id, stub)
    assert result.status == NOT_ATTEMPTED, result.line()


def assert_is_not_attempted(exercise_id: str, answer) -> None:
    """For an answer that is not code at all: None or `...`."""
    result = grade(exercise_id, answer)
    assert result.status == NOT_ATTEMPTED, result.line()


def assert_learner_exception_is_failed(exercise_id: str) -> None:
    def buggy(*args):
        return "n" + 1   # TypeError
    result = grade(exercise_id, buggy)
    assert result.status == FAILED
    assert "TypeError" in result.message


def assert_crashed_rank_program_is_failed(exercise_id: str) -> None:
    # The rank sends first (on one rank there is no one to send to), so the crash happens
    # inside the simulation, not before it starts.
    def program(comm, *args):
        if comm.size > 1:
            yield comm.send((comm.rank + 1) % comm.size, args[0])
        else:
            yield comm.compute(0.0)
        raise IndexError("list index out of range")
    result = grade(exercise_id, program)
    assert result.status == FAILED
    assert "IndexError" in result.message and "rank" in result.message


def assert_rank_program_returning_none_is_named(exercise_id: str) -> None:
    def program(comm, *args):
        yield comm.compute(0.0)
    assert "returned None" in grade(exercise_id, program).message


def assert_solutions_match_checkers(week: int, solution: ModuleType) -> None:
    """Every checker has a reference solution and every public solution a checker."""
    solution_names = {name for name, value in vars(solution).items()
                      if inspect.isfunction(value) and value.__module__ == solution.__name__
                      and not name.startswith("_")}
    graded = answer_names(week)
    assert graded - solution_names == set(), "checkers without a reference solution"
    assert solution_names - graded == set(), "solutions without a checker"


# --- the notebook: cells, the names its body defines, its exercise cells ---------------------

def notebook_cells(path: Path) -> list[tuple[str, str]]:
    """(cell type, source) of each cell of a notebook."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [(cell["cell_type"], "".join(cell["source"])) for cell in cells]


def percent_script_cells(path: Path) -> list[tuple[str, str]]:
    """(cell type, source) of each cell of a jupytext py:percent script."""
    cells = []
    for chunk in re.split(r"^# %%", path.read_text(encoding="utf-8"), flags=re.M)[1:]:
        header, _, body = chunk.partition("\n")
        if "[markdown]" in header:
            body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#")
                             for line in body.strip().splitlines())
            cells.append(("markdown", body))
        else:
            cells.append(("code", body.strip()))
    return cells


def python_lines(source: str) -> str:
    """A code cell without IPython magics and shell escapes (a line starting % or !, but
    not a continuation line that starts with the operator !=)."""
    def magic(line):
        stripped = line.lstrip()
        return stripped.startswith("%") or (stripped.startswith("!")
                                            and not stripped.startswith("!="))
    return "\n".join(line for line in source.splitlines() if not magic(line))


def split_at_exercises(cells):
    """(cells before "## Exercises", cells from it on, up to "## Summary")."""
    starts = [i for i, (kind, source) in enumerate(cells)
              if kind == "markdown" and source.lstrip().startswith("## Exercises")]
    if not starts:
        return cells, []
    body, rest = cells[:starts[0]], cells[starts[0]:]
    ends = [i for i, (kind, source) in enumerate(rest)
            if kind == "markdown" and source.lstrip().startswith("## Summary")]
    return body, rest[:ends[0]] if ends else rest


def defined_names(cells) -> set[str]:
    """Names bound at the top level of the code cells: functions, classes, imports and
    assignment targets."""
    names = set()
    for kind, source in cells:
        if kind != "code":
            continue
        for node in ast.parse(python_lines(source)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
            else:
                for target in ast.walk(node):
                    if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store):
                        names.add(target.id)
    return names


def body_definitions(notebook: Path) -> set[str]:
    """Names bound at the top level of the notebook's code cells before its exercises."""
    body, _ = split_at_exercises(notebook_cells(notebook))
    return defined_names(body)


def assert_no_stub_shadows_the_body(week: int, notebook: Path, body_names: set[str]) -> None:
    """Filling in a stub must not replace a name the notebook built and uses again.
    `body_names` are names the body is known to define: proof the parse found the body."""
    defined = body_definitions(notebook)
    assert body_names <= defined, f"not found in the notebook body: {body_names - defined}"
    assert answer_names(week) & defined == set()


def stub_cells(notebook: Path, script: Path | None = None) -> list[tuple[str, str]]:
    """The exercise cells ("## Exercises" up to "## Summary"): from the notebook once they
    are in it, else from the py:percent `script` they are written in first (skip if neither)."""
    _, exercises = split_at_exercises(notebook_cells(notebook))
    if exercises:
        return exercises
    if script is None or not script.exists():
        pytest.skip(f"the exercise cells are neither in {notebook.name} nor in {script}")
    return percent_script_cells(script)


def assert_exercise_cells_match_checkers(week: int, cells, solution: ModuleType) -> None:
    """One "### Exercise N.k — " statement per checker, in order, each with an example; a stub
    cell per exercise with the answer's name, the reference solution's parameters, the stub
    line, and the `check(...)` call."""
    assert cells[0][0] == "markdown" and cells[0][1].lstrip().startswith("## Exercises")
    headings = [re.match(r"### Exercise (\d+[a-z]?\.\d+) — ", source.lstrip())   # 5b.1 too
                for kind, source in cells if kind == "markdown"]
    assert [m.group(1) for m in headings if m] == exercise_ids(week)
    for entry in checkers(week=week):
        (name,) = entry.answer_names
        statement = next(source for kind, source in cells if kind == "markdown"
                         and f"### Exercise {entry.exercise_id} " in source)
        assert "*Example:*" in statement, entry.exercise_id
        stub = next(source for kind, source in cells if kind == "code"
                    and f'check("{entry.exercise_id}", {name})' in source)
        function = next(node for node in ast.parse(stub).body
                        if isinstance(node, ast.FunctionDef))
        assert function.name == name
        assert [a.arg for a in function.args.args] == \
            list(inspect.signature(getattr(solution, name)).parameters)
        assert STUB_LINE in stub


def run_exercise_cells(cells, namespace: dict, solution: ModuleType | None = None) -> list[str]:
    """Execute the exercise code cells in `namespace` (the names the notebook defines above
    them), as the notebook would, and return the lines they print. With `solution`, each stub
    function is first swapped for the reference solution of the same name."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for kind, source in cells:
            if kind != "code":
                continue
            if solution is not None:
                for node in ast.parse(source).body:
                    if isinstance(node, ast.FunctionDef) and hasattr(solution, node.name):
                        source = source.replace(ast.get_source_segment(source, node),
                                                f"{node.name} = solution.{node.name}")
                namespace["solution"] = solution
            exec(compile(source, "<exercise cell>", "exec"), namespace)
    return out.getvalue().splitlines()


def assert_cells_print_not_attempted(week: int, lines: list[str]) -> None:
    ids = exercise_ids(week)
    assert len(lines) == len(ids)
    for exercise_id, line in zip(ids, lines):
        assert line.startswith(f"· Exercise {exercise_id} (") and \
            line.endswith("not attempted yet"), line


def assert_cells_print_correct(week: int, lines: list[str]) -> None:
    ids = exercise_ids(week)
    assert len(lines) == len(ids)
    for exercise_id, line in zip(ids, lines):
        assert line.startswith(f"✓ Exercise {exercise_id} ("), line


# --- the contract's tests, written once --------------------------------------------------------

def contract_tests(week: int, count: int, solution: ModuleType, wrong: dict,
                   not_attempted_id: str, right: dict | None = None,
                   hint_words: dict | None = None, rank_programs=()) -> dict[str, Callable]:
    """The tests every week's exercises must pass, as test functions for a week's module to
    adopt with `globals().update(contract_tests(...))`: each reference solution passes, each
    named mistake fails (with `hint_words` in its hint if given), each other right answer passes,
    untouched stubs are "not attempted", a learner's crash is ✗, and checkers and solutions
    match one to one. `rank_programs` lists the exercises whose answer is a rank program."""
    ids = exercise_ids(week)
    hint_words = hint_words or {}

    def test_week_has_its_exercises():
        assert_week_has_exercises(week, count, wrong)

    @pytest.mark.parametrize("exercise_id", ids)
    def test_reference_solution_passes(exercise_id):
        assert_passes(exercise_id, reference(week, exercise_id, solution))

    @pytest.mark.parametrize("exercise_id, wrong_answer", answer_cases(wrong), ids=case_name)
    def test_named_mistake_fails(exercise_id, wrong_answer):
        assert_mistake_fails(exercise_id, wrong_answer, hint_words.get(wrong_answer))

    @pytest.mark.parametrize("exercise_id", ids)
    def test_untouched_stub_is_not_attempted(exercise_id):
        assert_untouched_stub_is_not_attempted(exercise_id)

    @pytest.mark.parametrize("answer", [None, ...])
    def test_none_or_ellipsis_is_not_attempted(answer):
        assert_is_not_attempted(not_attempted_id, answer)

    @pytest.mark.parametrize("exercise_id", ids)
    def test_learner_exception_is_failed_not_raised(exercise_id):
        assert_learner_exception_is_failed(exercise_id)

    def test_every_checker_has_a_solution_and_every_solution_a_checker():
        assert_solutions_match_checkers(week, solution)

    tests = {f"test_week{week}_has_{count}_exercises": test_week_has_its_exercises,
             "test_reference_solution_passes": test_reference_solution_passes,
             "test_named_mistake_fails": test_named_mistake_fails,
             "test_untouched_stub_is_not_attempted": test_untouched_stub_is_not_attempted,
             "test_none_or_ellipsis_is_not_attempted": test_none_or_ellipsis_is_not_attempted,
             "test_learner_exception_is_failed_not_raised":
                 test_learner_exception_is_failed_not_raised,
             "test_every_checker_has_a_solution_and_every_solution_a_checker":
                 test_every_checker_has_a_solution_and_every_solution_a_checker}
    if right:
        @pytest.mark.parametrize("exercise_id, right_answer", answer_cases(right), ids=case_name)
        def test_other_right_answer_passes(exercise_id, right_answer):
            assert_passes(exercise_id, right_answer)
        tests["test_other_right_answer_passes"] = test_other_right_answer_passes
    if rank_programs:
        @pytest.mark.parametrize("exercise_id", list(rank_programs))
        def test_generator_stub_of_a_rank_program_is_not_attempted(exercise_id):
            assert_generator_stub_is_not_attempted(exercise_id)

        @pytest.mark.parametrize("exercise_id", list(rank_programs))
        def test_rank_program_that_raises_is_failed(exercise_id):
            assert_crashed_rank_program_is_failed(exercise_id)

        @pytest.mark.parametrize("exercise_id", list(rank_programs))
        def test_rank_program_returning_none_is_named(exercise_id):
            assert_rank_program_returning_none_is_named(exercise_id)
        tests.update({
            "test_generator_stub_of_a_rank_program_is_not_attempted":
                test_generator_stub_of_a_rank_program_is_not_attempted,
            "test_rank_program_that_raises_is_failed": test_rank_program_that_raises_is_failed,
            "test_rank_program_returning_none_is_named": test_rank_program_returning_none_is_named})
    for name, test in tests.items():
        test.__name__ = test.__qualname__ = name
    return tests


# --- fresh cases: remembered answers do not pass ---------------------------------------------

FRESH_BASES = range(6)    # the bases a test of fresh cases tries (each check draws anew)


def learn_from_hints(exercise_id: str, call_pattern: str, expected_pattern: str,
                     tries: int = 30) -> tuple[bool, dict, str]:
    """Play the learner who does not solve the exercise but keeps a table of the answers the
    hints give away: an answer that looks its inputs up (0 if unknown); after every ✗ the
    inputs (`call_pattern`'s groups) and the expected value (`expected_pattern`'s group) that
    the hint shows go into the table. Returns (passed, table, the last message)."""
    table: dict = {}

    def remembered(*args):
        return table.get(tuple(float(a) for a in args), 0.0)

    message = ""
    for _ in range(tries):
        result = grade(exercise_id, remembered)
        message = result.message
        if result.passed:
            return True, table, message
        call, expected = re.search(call_pattern, message), re.search(expected_pattern, message)
        if call is None or expected is None:
            return False, table, message           # the hint gave nothing more away
        key, value = tuple(float(v) for v in call.groups()), float(expected.group(1))
        if table.get(key) == value:                # nothing new: it cannot get further
            return False, table, message
        table[key] = value                         # (a hint may show more digits next time)
    return False, table, message


def passes_for_every_base(exercise_id: str, answer: Callable, calls: int = 2) -> list[str]:
    """The messages of the checks of `answer` that did not pass, over FRESH_BASES × `calls`."""
    from dsml.exercises import fresh_seed
    failures = []
    for base in FRESH_BASES:
        with fresh_seed(base):
            for _ in range(calls):
                result = grade(exercise_id, answer)
                if not result.passed:
                    failures.append(f"base {base}: {result.line()}")
    return failures


def fails_for_every_base(exercise_id: str, answer: Callable, calls: int = 2) -> list[str]:
    """The bases (and calls) under which `answer`, a wrong answer, passed."""
    from dsml.exercises import fresh_seed
    passed = []
    for base in FRESH_BASES:
        with fresh_seed(base):
            for call in range(calls):
                if grade(exercise_id, answer).passed:
                    passed.append(f"base {base}, call {call}")
    return passed


def fresh_cases_keep_the_contract(exercise_id: str, reference: Callable, wrong: dict,
                                  right: dict) -> None:
    """Under every base of FRESH_BASES (two checks each), the reference and the accepted
    alternatives pass and every named mistake fails."""
    assert passes_for_every_base(exercise_id, reference) == []
    for answer in right.get(exercise_id, []):
        assert passes_for_every_base(exercise_id, answer) == [], answer.__name__
    for answer in wrong.get(exercise_id, []):
        assert fails_for_every_base(exercise_id, answer) == [], answer.__name__


def copied_answers_never_pass(exercise_id: str, call_pattern: str, expected_pattern: str) -> int:
    """Under every base of FRESH_BASES, the learner who keeps a table of the values the hints
    give away (`learn_from_hints`) does not pass; returns how many entries it learned at most."""
    from dsml.exercises import fresh_seed
    most = 0
    for base in FRESH_BASES:
        with fresh_seed(base):
            passed, table, message = learn_from_hints(exercise_id, call_pattern,
                                                      expected_pattern)
        assert not passed, f"base {base}: {message}"
        most = max(most, len(table))
    return most
