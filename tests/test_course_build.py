"""Plumbing (hand-written): the rendered course works offline — MathJax ships in build/ and the
pages load it by a relative path — and its kernels use local sockets (no TCP warning)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import build_course  # noqa: E402

FORMULA = "The time is $T = \\alpha + n\\beta$ and\n\n$$\\frac{a}{b} = \\sum_{i=1}^{p} x_i$$"


def formula_notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Offline\n\n" + FORMULA)]
    return nb


def test_the_html_loads_mathjax_from_build_not_from_a_cdn(tmp_path):
    page = build_course.render_html(formula_notebook(), tmp_path)
    assert 'src="mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"' in page
    assert "ajax/libs/mathjax" not in page
    assert (tmp_path / "mathjax" / "MathJax.js").is_file()
    assert (tmp_path / "mathjax" / "config" / "TeX-AMS-MML_HTMLorMML-full.js").is_file()


def test_kernels_use_local_sockets_with_an_absolute_path():
    config = build_course.kernel_config()
    if os.name != "posix":
        pytest.skip("IPC sockets are POSIX")
    assert config.KernelManager.transport == "ipc"
    assert os.path.isabs(config.KernelManager.ip)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None or shutil.which("unshare") is None,
                    reason="needs chromium and unshare (a network namespace: no network)")
def test_formulas_render_in_a_browser_with_no_network(tmp_path):
    (tmp_path / "formula.html").write_text(build_course.render_html(formula_notebook(),
                                                                    tmp_path), encoding="utf-8")
    try:
        dom = subprocess.run(
            ["unshare", "-n", CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--virtual-time-budget=15000", "--dump-dom",
             (tmp_path / "formula.html").as_uri()],
            capture_output=True, text=True, timeout=120).stdout
    except subprocess.TimeoutExpired:
        pytest.skip("chromium did not answer within 120 s")
    if not dom:
        pytest.skip("chromium could not run here (no network namespace?)")
    assert 'class="MathJax_Display"' in dom          # the display formula was typeset
    assert "$$\\frac" not in dom                     # not left as LaTeX source
