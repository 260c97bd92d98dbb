"""Plumbing (hand-written): tests for the exporter and the notebook cleaner, on fixtures and on this repo."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import export as exporter  # noqa: E402
import notebooks as nbtools  # noqa: E402

CORE = '''#| export dsml.demo.core
from __future__ import annotations

import math

SCALE = 2


def double(x: float) -> float:
    """Twice x."""
    return SCALE * x
'''
EXTRA = '''#| export dsml.demo.extra
def quadruple(x: float) -> float:
    """Four times x, built on the notebook's own double."""
    return double(double(x))


def root_of_quadruple(x: float) -> float:
    """Square root of four times x."""
    return math.sqrt(quadruple(x))
'''


def write_notebook(path: Path, cells: list) -> Path:
    """Write a notebook with the given cells (and messy metadata a real editor leaves)."""
    nb = new_notebook(cells=cells)
    nb.metadata["widgets"] = {"state": {}}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A miniature course repository: one notebook exporting two modules."""
    (tmp_path / "dsml").mkdir()
    (tmp_path / "dsml" / "__init__.py").write_text('"""Test package."""\n')
    write_notebook(tmp_path / "notebooks" / "week1.ipynb", [
        new_markdown_cell("# Week 1: doubling"),
        new_code_cell(CORE),
        new_code_cell("assert double(3) == 6"),
        new_code_cell(EXTRA),
    ])
    return tmp_path


def test_sibling_name_is_imported_automatically(repo: Path) -> None:
    out = exporter.export_all(repo)
    assert sorted(out) == ["dsml/demo/core.py", "dsml/demo/extra.py"]
    core, extra = out["dsml/demo/core.py"], out["dsml/demo/extra.py"]
    assert core.split("\n")[:2] == [
        '"""Generated from notebooks/week1.ipynb — do not edit; edit the notebook and run '
        '`make export`."""',
        "from __future__ import annotations",
    ]
    assert "# -- cell 1\nimport math\n\nSCALE = 2" in core
    assert "from __future__" not in extra
    assert f"{exporter.SIBLING_COMMENT}\nfrom dsml.demo.core import double\n" in extra
    # a name the sibling only imported is imported again, not re-exported through the sibling
    assert f"{exporter.REPEATED_COMMENT}\nimport math\n" in extra
    assert "# -- cell 3\ndef quadruple" in extra


def test_written_package_imports_and_runs(repo: Path) -> None:
    exporter.write_all(repo)
    init = repo / "dsml" / "demo" / "__init__.py"
    assert init.read_text() == '"""Plumbing (hand-written): the dsml.demo package."""\n'
    env = {**os.environ, "PYTHONPATH": str(repo)}
    result = subprocess.run([sys.executable, "-c",
                             "from dsml.demo.extra import root_of_quadruple as f; print(f(9))"],
                            cwd=repo, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "6.0"


def test_undefined_name_is_an_export_error(repo: Path) -> None:
    write_notebook(repo / "notebooks" / "week1.ipynb", [
        new_code_cell("LIMIT = 10"),  # defined, but in a cell that is not exported
        new_code_cell("#| export dsml.demo.core\ndef capped(x):\n    return min(x, LIMIT)\n"),
    ])
    with pytest.raises(exporter.ExportError) as err:
        exporter.export_all(repo)
    message = str(err.value)
    assert "dsml.demo.core" in message and "'LIMIT'" in message and "cell 1" in message
    assert "'min'" not in message and "'x'" not in message  # builtins and locals are fine


def test_two_notebooks_cannot_share_a_module(repo: Path) -> None:
    write_notebook(repo / "notebooks" / "week2.ipynb", [new_code_cell(CORE)])
    with pytest.raises(exporter.ExportError) as err:
        exporter.export_all(repo)
    assert "notebooks/week1.ipynb" in str(err.value) and "notebooks/week2.ipynb" in str(err.value)


def test_bad_marker_is_an_error(repo: Path) -> None:
    write_notebook(repo / "notebooks" / "week2.ipynb", [new_code_cell("#| export numpy.linalg\nx = 1")])
    with pytest.raises(exporter.ExportError, match="bad export marker"):
        exporter.export_all(repo)


def test_export_is_deterministic_and_idempotent(repo: Path) -> None:
    first = exporter.export_all(repo)
    assert exporter.export_all(repo) == first
    assert all(text.endswith("\n") and not text.endswith("\n\n") for text in first.values())
    assert exporter.write_all(repo)
    snapshot = {p: (repo / p).read_bytes() for p in first}
    assert exporter.write_all(repo) == []
    assert {p: (repo / p).read_bytes() for p in first} == snapshot
    assert exporter.stale(repo) == []


def test_check_detects_hand_edit_and_orphans(repo: Path, capsys) -> None:
    exporter.write_all(repo)
    assert exporter.main(["--check", "--root", str(repo)]) == 0
    core = repo / "dsml" / "demo" / "core.py"
    core.write_text(core.read_text() + "# a hand edit\n")
    orphan = repo / "dsml" / "demo" / "old.py"
    orphan.write_text('"""Generated from notebooks/week0.ipynb — do not edit."""\n')
    before = core.read_bytes()
    assert exporter.main(["--check", "--root", str(repo)]) == 1
    printed = capsys.readouterr().out
    assert "dsml/demo/core.py" in printed and "dsml/demo/old.py" in printed
    assert core.read_bytes() == before  # --check writes nothing
    exporter.write_all(repo)
    assert not orphan.exists() and exporter.stale(repo) == []


def test_cleaner_removes_outputs_and_is_idempotent(tmp_path: Path) -> None:
    code = new_code_cell("print('hi')", execution_count=3,
                         outputs=[new_output("stream", name="stdout", text="hi\n")])
    code.metadata["collapsed"] = True
    tagged = new_markdown_cell("# Title")
    tagged.metadata["tags"] = ["keep"]
    path = write_notebook(tmp_path / "week9.ipynb", [tagged, code])
    found = nbtools.problems(path)
    assert any("has outputs" in p for p in found)
    assert any("execution_count" in p for p in found)
    assert any("notebook metadata" in p for p in found)
    assert nbtools.clean(path) is True
    assert nbtools.problems(path) == []
    cleaned = path.read_bytes()
    assert nbtools.clean(path) is False and path.read_bytes() == cleaned
    nb = nbformat.read(path, as_version=4)
    assert [c.id for c in nb.cells] == ["cell-000", "cell-001"]
    assert nb.cells[0].metadata == {"tags": ["keep"]} and nb.cells[1].metadata == {}
    assert nb.cells[1].source == "print('hi')"


def test_committed_generated_modules_match_a_fresh_export() -> None:
    assert exporter.stale(ROOT) == []


@pytest.mark.parametrize("path", nbtools.course_notebooks(ROOT), ids=lambda p: p.name)
def test_committed_notebook_is_clean(path: Path) -> None:
    assert nbtools.problems(path) == [], "run `make clean-notebooks`"


@pytest.mark.parametrize("path", nbtools.course_notebooks(ROOT), ids=lambda p: p.name)
def test_no_code_cell_over_sixty_lines(path: Path) -> None:
    # STYLE.md, "Pace": a learner reads a cell at a time; longer code belongs in the library.
    nb = nbformat.read(path, as_version=4)
    long = [(i, len(c.source.splitlines())) for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and len(c.source.splitlines()) > 60]
    assert long == [], f"{path.name}: code cells over 60 lines (index, lines): {long}"
