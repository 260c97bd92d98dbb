"""Plumbing (hand-written): build the course headless — execute every notebook, render HTML, summarise.

For each ``notebooks/week*.ipynb``: run it top to bottom in a fresh ``python3`` kernel
(cwd ``notebooks/``, Matplotlib backend Agg), then write

    build/<name>.ipynb   the executed notebook
    build/<name>.html    the rendered page, figures embedded
    build/index.html     one link per week with its title, run time and checks
    build/summary.json   the same numbers, machine-readable
    build/mathjax/       MathJax 2.7, copied from the jupyter-server-mathjax package: the pages
                         render their formulas with no network (see `ship_mathjax`)

A page loads no script from any other site: the page template (`PAGE_TEMPLATE`) drops
nbconvert's require.js and mermaid tags (the course uses neither: figures are inline PNGs)
and configures MathJax for the only web font that package ships, STIX-Web.

and print a table: seconds against a per-notebook budget, figures, asserts, graded exercises.
Exits non-zero if any notebook fails, showing the failing cell's error.
"""
from __future__ import annotations

import ast
import itertools
import html
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import jinja2
import nbformat
from nbclient import NotebookClient
from traitlets.config import Config
from nbclient.exceptions import CellExecutionError, CellTimeoutError
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_BUDGET_S = 60.0
TOTAL_BUDGET_S = 360.0
CELL_TIMEOUT_S = 600
MATHJAX_PACKAGE = "jupyter_server_mathjax"   # MathJax 2.7's files, on PyPI (the course extra)
MATHJAX_CONFIG = "TeX-AMS-MML_HTMLorMML-full,Safe"   # a configuration that package ships
MATHJAX_FONT = "STIX-Web"   # the only HTML-CSS web font the package ships (no TeX fonts)
CDN_MATHJAX = HTMLExporter.mathjax_url.default_value
# nbconvert's "lab" page without its CDN scripts (require.js, mermaid), and with a MathJax
# configuration that uses the shipped font: MathJax 2.7's HTML-CSS output defaults to the TeX
# web font, which the package does not ship, so without this the formulas would render only
# where STIX or TeX fonts happen to be installed. Local fonts are not used either
# (availableFonts: []), so every machine renders alike; the renderer and font menus are off
# because the other renderers are not shipped. The hidden MathML copy that MathJax keeps for
# screen readers gets a plain font: its style sheet names the TeX web fonts.
PAGE_TEMPLATE = "dsml_page.html.j2"
PAGE_TEMPLATE_SOURCE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_js_mathjax -%}
<script type="text/x-mathjax-config">
MathJax.Hub.Config({
    TeX: {equationNumbers: {autoNumber: "AMS", useLabelIds: true}},
    tex2jax: {inlineMath: [["$", "$"], ["\\\\(", "\\\\)"]],
              displayMath: [["$$", "$$"], ["\\\\[", "\\\\]"]],
              processEscapes: true, processEnvironments: true},
    displayAlign: "center",
    messageStyle: "none",
    "HTML-CSS": {availableFonts: [], preferredFont: null, webFont: "FONT",
                 imageFont: null, linebreaks: {automatic: true}},
    MathMenu: {showRenderer: false, showFontMenu: false}
});
</script>
<script src="{{ resources.mathjax_url }}"></script>
<style type="text/css">
/* The hidden MathML copy kept for screen readers would otherwise ask for MathJax's TeX web
   fonts (not shipped) wherever a formula has a math variant such as \\mathbb. */
.MJX_Assistive_MathML * { font-family: serif !important; }
</style>
{%- endblock html_head_js_mathjax -%}
""".replace("FONT", MATHJAX_FONT)
_kernels = itertools.count()
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
HEADING_RE = re.compile(r"^#+\s+(.+?)\s*#*\s*$")


def count_asserts(nb: nbformat.NotebookNode) -> int:
    """Number of ``assert`` statements in the code cells (magic and shell lines ignored)."""
    total = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        code = "\n".join(line for line in cell.source.split("\n")
                         if not line.lstrip().startswith(("%", "!")))
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        total += sum(isinstance(node, ast.Assert) for node in ast.walk(tree))
    return total


def title_of(nb: nbformat.NotebookNode, default: str) -> str:
    """The text of the notebook's first Markdown heading, or ``default``."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.split("\n"):
                match = HEADING_RE.match(line)
                if match:
                    return match.group(1)
    return default


def _output_texts(nb: nbformat.NotebookNode):
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                yield out.get("text", "")
            elif "data" in out:
                yield out["data"].get("text/plain", "")


def output_stats(nb: nbformat.NotebookNode) -> dict[str, int]:
    """Figures (``image/png`` outputs) and exercise checks (✓ passed, ✗ failed, · not attempted)."""
    figures = sum("image/png" in out.get("data", {})
                  for cell in nb.cells for out in cell.get("outputs", []))
    passed = failed = not_attempted = 0
    for text in _output_texts(nb):
        for line in text.split("\n"):
            if line.startswith("✓ "):
                passed += 1
            elif line.startswith("✗ "):
                failed += 1
            elif line.startswith("· ") and "not attempted yet" in line:
                not_attempted += 1
    return {"figures": figures, "passed": passed, "failed": failed,
            "not_attempted": not_attempted}


def mathjax_files() -> Path | None:
    """The directory holding MathJax.js in the installed jupyter-server-mathjax package (found
    without importing it: it would import a Jupyter server), or None if it is not installed."""
    spec = importlib.util.find_spec(MATHJAX_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    static = Path(list(spec.submodule_search_locations)[0]) / "static"
    return static if (static / "MathJax.js").is_file() else None


def ship_mathjax(outdir: Path) -> str:
    """Copy MathJax into ``outdir/mathjax`` (once) and return the page-relative URL the HTML
    loads it from, so that the course renders its formulas offline. Without the package the
    pages load MathJax from its CDN, with a warning."""
    source = mathjax_files()
    if source is None:
        print(f"warning: {MATHJAX_PACKAGE} is not installed (pip install -e '.[course]'); the "
              f"HTML will load MathJax from {CDN_MATHJAX.split('/ajax')[0]} and show formulas "
              f"as LaTeX source offline", file=sys.stderr)
        return CDN_MATHJAX
    target = Path(outdir) / "mathjax"
    if not (target / "MathJax.js").is_file():
        shutil.copytree(source, target, dirs_exist_ok=True)
    return f"mathjax/MathJax.js?config={MATHJAX_CONFIG}"


def kernel_config() -> Config:
    """The kernel talks to nbclient over local (IPC) sockets where the platform has them. Over
    TCP, its default, ipykernel warns at every start that the traffic is not encrypted."""
    config = Config()
    if os.name == "posix":
        config.KernelManager.transport = "ipc"
        # The sockets' path prefix must be absolute: the kernel runs in the notebook's folder.
        config.KernelManager.ip = os.path.join(tempfile.gettempdir(),
                                               f"dsml-kernel-{os.getpid()}-{next(_kernels)}")
    return config


def render_html(nb: nbformat.NotebookNode, outdir: Path) -> str:
    """The notebook as an HTML page whose figures are embedded and whose formulas MathJax
    renders from ``outdir/mathjax`` (`ship_mathjax`)."""
    exporter = HTMLExporter(
        extra_loaders=[jinja2.DictLoader({PAGE_TEMPLATE: PAGE_TEMPLATE_SOURCE})],
        template_file=PAGE_TEMPLATE)
    exporter.embed_images = True
    exporter.mathjax_url = ship_mathjax(outdir)
    body, _ = exporter.from_notebook_node(nb)
    return body


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env["MPLBACKEND"] = "Agg"
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    # Let the kernel import dsml from this checkout even without an editable install.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _trim(text: str, max_lines: int = 40) -> str:
    lines = ANSI_RE.sub("", text).strip().split("\n")
    if len(lines) > max_lines:
        lines = ["..."] + lines[-max_lines:]
    return "\n".join(lines)


def run_notebook(path: Path | str, outdir: Path | str) -> dict:
    """Execute the notebook at ``path`` in a fresh kernel; write ``<name>.ipynb`` and ``.html``.

    Returns its stats: ``notebook``, ``title``, ``ok``, ``error`` (trimmed cell error or
    ``None``), ``seconds``, ``figures``, ``asserts``, and exercise checks ``passed``,
    ``failed``, ``not_attempted``. A failing notebook is still written, up to the failing
    cell, so its output can be inspected.
    """
    path, outdir = Path(path), Path(outdir)
    if not path.is_file():
        raise FileNotFoundError(f"path must be an existing notebook file, got {str(path)!r}")
    outdir.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(path, as_version=4)
    # MPLBACKEND=Agg keeps every process headless (worker processes included); the kernel
    # itself switches to the inline backend, which renders with Agg and captures the figures.
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            extra_arguments=["--matplotlib=inline"], config=kernel_config(),
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    error = None
    start = time.perf_counter()
    try:
        client.execute(env=_kernel_env())
    except (CellExecutionError, CellTimeoutError) as exc:
        error = _trim(str(exc))
    seconds = time.perf_counter() - start

    nbformat.write(nb, str(outdir / f"{path.stem}.ipynb"))
    (outdir / f"{path.stem}.html").write_text(render_html(nb, outdir), encoding="utf-8")

    stats = {"notebook": path.stem, "title": title_of(nb, path.stem), "ok": error is None,
             "error": error, "seconds": round(seconds, 2), "asserts": count_asserts(nb)}
    stats.update(output_stats(nb))
    return stats


def write_index(results: list[dict], outdir: Path) -> None:
    """Write ``index.html`` (a link per week) and ``summary.json`` into ``outdir``."""
    rows = []
    for r in results:
        status = "ok" if r["ok"] else "FAILED"
        rows.append(
            f"<tr><td><a href=\"{html.escape(r['notebook'])}.html\">{html.escape(r['title'])}</a></td>"
            f"<td>{r['seconds']:.1f} s</td><td>{r['figures']}</td><td>{r['asserts']}</td>"
            f"<td>{r['passed']} ✓ / {r['failed']} ✗ / {r['not_attempted']} ·</td>"
            f"<td>{status}</td></tr>")
    page = "\n".join([
        "<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\">",
        "<title>Distributed Systems for Machine Learning from first principles</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
        "td,th{padding:.3em .8em;text-align:left}td+td{white-space:nowrap}</style></head><body>",
        "<h1>Distributed Systems for Machine Learning from first principles</h1>",
        "<table><tr><th>week</th><th>run time</th><th>figures</th><th>asserts</th>"
        "<th>exercises</th><th>status</th></tr>",
        *rows, "</table></body></html>", ""])
    (outdir / "index.html").write_text(page, encoding="utf-8")
    summary = {"budget_per_notebook_s": NOTEBOOK_BUDGET_S, "budget_total_s": TOTAL_BUDGET_S,
               "total_s": round(sum(r["seconds"] for r in results), 2), "notebooks": results}
    (outdir / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n",
                                         encoding="utf-8")


def print_table(results: list[dict]) -> None:
    """Print one line per notebook and the total against the budgets."""
    width = max([len("notebook"), len("total")] + [len(r["notebook"]) for r in results])
    print(f"{'notebook':<{width}} {'seconds':>8} {'budget':>10} {'figures':>8} {'asserts':>8}  exercises")
    for r in results:
        budget = f"{NOTEBOOK_BUDGET_S:.0f} s" + (" OVER" if r["seconds"] > NOTEBOOK_BUDGET_S else "")
        status = "" if r["ok"] else "  FAILED"
        print(f"{r['notebook']:<{width}} {r['seconds']:>8.1f} {budget:>10} {r['figures']:>8} "
              f"{r['asserts']:>8}  {r['passed']} ✓ {r['failed']} ✗ {r['not_attempted']} ·{status}")
    total = sum(r["seconds"] for r in results)
    over = " OVER" if total > TOTAL_BUDGET_S else ""
    print(f"{'total':<{width}} {total:>8.1f} {TOTAL_BUDGET_S:>8.0f} s{over}")


def main(root: Path = ROOT) -> int:
    """Build the whole course into ``root/build``; return the exit status."""
    paths = sorted((root / "notebooks").glob("week*.ipynb"))
    if not paths:
        print("no notebooks/week*.ipynb yet: nothing to build")
        return 0
    outdir = root / "build"
    results = []
    for path in paths:
        print(f"running {path.relative_to(root)} ...", flush=True)
        results.append(run_notebook(path, outdir))
    write_index(results, outdir)
    print()
    print_table(results)
    failures = [r for r in results if not r["ok"]]
    for r in failures:
        print(f"\nFAILED notebooks/{r['notebook']}.ipynb:\n{r['error']}", file=sys.stderr)
    print(f"\ncourse written to {outdir.relative_to(root)}/index.html")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
