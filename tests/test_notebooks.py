"""Plumbing (hand-written): every course notebook runs top to bottom and renders (the course build)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from build_course import run_notebook  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("week*.ipynb"))
MIN_FIGURES = 6


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS or [None],
                         ids=lambda p: p.stem if p else "no-notebooks")
def test_notebook_runs_and_renders(path: Path | None) -> None:
    if path is None:
        pytest.skip("no notebooks/week*.ipynb yet")
    stats = run_notebook(path, ROOT / "build")
    assert stats["ok"], f"{path.name} failed:\n{stats['error']}"
    assert stats["figures"] >= MIN_FIGURES, (
        f"{path.name} produced {stats['figures']} figures, expected at least {MIN_FIGURES}")
