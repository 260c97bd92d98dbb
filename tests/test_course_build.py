"""Plumbing (hand-written): the rendered course works offline — MathJax ships in build/ and the
pages load it by a relative path — and its kernels use local sockets (no TCP warning)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import parse_qs, urlparse

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


# --- every file a page asks for is in build/ (static: no browser, no network) ----------------

class _References(HTMLParser):
    """What a page loads: script/img/source/iframe `src`, link `href`, `url(…)`/`@import` in
    style sheets, and the text of its MathJax configuration blocks."""

    def __init__(self):
        super().__init__()
        self.urls, self.mathjax_config, self._in = [], [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name in ("src",) if tag in ("script", "img", "source", "iframe", "audio",
                                       "video", "embed") else ("href",) if tag == "link" else ():
            if attrs.get(name):
                self.urls.append(attrs[name])
        self._in = ("config" if tag == "script" and attrs.get("type") == "text/x-mathjax-config"
                    else "style" if tag == "style" else None)

    def handle_endtag(self, tag):
        self._in = None

    def handle_data(self, data):
        if self._in == "config":
            self.mathjax_config.append(data)
        elif self._in == "style":
            self.urls += re.findall(r"url\(\s*['\"]?([^'\")]+)", data)
            self.urls += re.findall(r"@import\s+['\"]([^'\"]+)", data)


def _js_strings(text: str) -> list[str]:
    return re.findall(r"[\"']([^\"']+)[\"']", text)


def _mathjax_path(name: str, kind: str) -> str:
    """The file under mathjax/ that MathJax loads for an entry of `extensions` or `jax`."""
    name = name.replace("[MathJax]/", "").replace("[a11y]/", "extensions/a11y/")
    if kind == "jax":
        return f"jax/{name}/config.js"
    return name if name.startswith(("extensions/", "jax/", "config/")) else f"extensions/{name}"


def _woff_name(font: str) -> str:
    """The web-font file MathJax 2.7's HTML-CSS output asks for, as its jax.js names it."""
    name = font.replace("-b", "-B").replace("-i", "-I").replace("-Bold-", "-Bold")
    return name + ("" if "-" in name else "-Regular") + ".woff"


def requested_files(page: Path) -> tuple[list[str], list[Path]]:
    """(external URLs, local files) that `page` and the MathJax it loads will ask for."""
    parser = _References()
    parser.feed(page.read_text(encoding="utf-8"))
    external, files = [], []
    mathjax_src = None
    for url in parser.urls:
        if url.startswith(("data:", "#")):
            continue
        if re.match(r"^[a-z][a-z0-9+.-]*:|^//", url, re.I):
            external.append(url)
            continue
        path = url.split("?")[0].split("#")[0]
        files.append(page.parent / path)
        if path.endswith("MathJax.js"):
            mathjax_src = url
    if mathjax_src is None:
        return external, files
    root = page.parent / mathjax_src.split("?")[0].rsplit("/", 1)[0]
    query = parse_qs(urlparse(mathjax_src).query)
    configs = [root / "config" / f"{name}.js"
               for name in ",".join(query.get("config", [])).split(",") if name]
    files += configs
    # What the configurations load: their `jax` and `extensions` (and Safe's push), except
    # what a combined configuration already carries (its Preloading list).
    texts = [c.read_text(encoding="utf-8") for c in configs if c.is_file()]
    texts += parser.mathjax_config
    preloaded, wanted = set(), []
    for text in texts:
        for block in re.findall(r"Preloading\(([^)]*)\)", text):
            preloaded |= {_mathjax_path(s, "file") for s in _js_strings(block)}
        for kind, block in re.findall(r"\b(jax|extensions)\s*:\s*\[([^\]]*)\]", text):
            wanted += [(_mathjax_path(s, kind)) for s in _js_strings(block)]
        # Hub.config.extensions.push (Safe.js) names a Hub extension; this.config's, inside
        # the TeX input jax (AMSmath.js for equation numbers), a TeX extension.
        for owner, name in re.findall(r"(Hub|this)\.config\.extensions\.push\(\s*[\"']([^\"']+)",
                                      text):
            wanted.append(_mathjax_path(name if owner == "Hub" else f"TeX/{name}", "extensions"))
    files += [root / w for w in wanted if w not in preloaded]
    # The HTML-CSS output's web font: MathJax 2.7's default is "TeX" unless the page says.
    config = "\n".join(parser.mathjax_config)
    found = re.search(r"webFont\s*:\s*[\"']([^\"']+)", config)
    font = found.group(1) if found else "TeX"
    fontdata = root / "jax/output/HTML-CSS/fonts" / font / "fontdata.js"
    files.append(fontdata)
    if fontdata.is_file():
        for name, data in re.findall(r"[\"']?(\w+(?:-[\w-]+)?)[\"']?:\"([\w/-]+/Main\.js)\"",
                                     fontdata.read_text(encoding="utf-8")):
            files.append(fontdata.parent / data)
            files.append(root / "fonts/HTML-CSS" / font / "woff" / _woff_name(name))
    image_font = re.search(r"imageFont\s*:\s*([\"'][^\"']+[\"']|null)", config)
    if image_font is None or image_font.group(1) != "null":     # the default is "TeX" too
        name = image_font.group(1).strip("\"'") if image_font else "TeX"
        files.append(root / "fonts/HTML-CSS" / name / "png")
    return external, files


def test_every_file_a_page_or_its_mathjax_requests_is_in_build(tmp_path):
    """A tiny course (one notebook with formulas and a figure) built into a temporary folder:
    no page names another site, and every file it or MathJax will fetch is there."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    nb = formula_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell(
        "Variants: $\\mathbb{R}^d$, $\\mathcal{O}(\\log p)$, $\\boldsymbol{w}$"))
    nb.cells.append(nbformat.v4.new_code_cell(
        "import matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 0]); plt.title('a figure')"))
    nbformat.write(nb, notebooks / "week0_tiny.ipynb")
    outdir = tmp_path / "build"
    stats = build_course.run_notebook(notebooks / "week0_tiny.ipynb", outdir)
    assert stats["ok"], stats["error"]
    assert stats["figures"] == 1
    build_course.write_index([stats], outdir)
    pages = sorted(outdir.glob("*.html"))
    assert [p.name for p in pages] == ["index.html", "week0_tiny.html"]
    for page in pages:
        external, files = requested_files(page)
        assert external == [], f"{page.name} loads from other sites: {external}"
        missing = sorted({str(f.relative_to(outdir)) for f in files if not f.exists()})
        assert missing == [], f"{page.name} or its MathJax asks for files not in build/: {missing}"
    _, files = requested_files(outdir / "week0_tiny.html")
    shipped = {str(f.relative_to(outdir / "mathjax")) for f in files if "mathjax" in f.parts}
    # The check really followed MathJax: its configuration, Safe's extension and the font.
    assert "config/TeX-AMS-MML_HTMLorMML-full.js" in shipped
    assert "extensions/Safe.js" in shipped
    assert "jax/output/HTML-CSS/fonts/STIX-Web/fontdata.js" in shipped
    assert "fonts/HTML-CSS/STIX-Web/woff/STIXMathJax_Main-BoldItalic.woff" in shipped
    assert "jax/output/HTML-CSS/fonts/STIX-Web/DoubleStruck/Regular/Main.js" in shipped
    page = (outdir / "week0_tiny.html").read_text(encoding="utf-8")
    assert "require.js" not in page and "mermaid" not in page
    assert 'src="data:image/png;base64,' in page          # the figure is inline
    # The hidden MathML copy for screen readers must not reach for the (absent) TeX fonts.
    assert ".MJX_Assistive_MathML * { font-family: serif !important; }" in page


def test_the_static_check_sees_a_cdn_script_and_a_missing_font(tmp_path):
    """The checker above catches what the old pages did: require.js from a CDN, and MathJax
    left on its default TeX web font, which the shipped MathJax does not have."""
    build_course.ship_mathjax(tmp_path)
    (tmp_path / "old.html").write_text(
        '<html><head><script src="https://cdnjs.cloudflare.com/require.js"></script>'
        '<script src="mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"></script>'
        '<script type="text/x-mathjax-config">MathJax.Hub.Config({messageStyle: "none"});'
        '</script></head><body>$x$</body></html>', encoding="utf-8")
    external, files = requested_files(tmp_path / "old.html")
    assert external == ["https://cdnjs.cloudflare.com/require.js"]
    missing = {str(f.relative_to(tmp_path / "mathjax")) for f in files if not f.exists()}
    assert missing == {"jax/output/HTML-CSS/fonts/TeX/fontdata.js", "fonts/HTML-CSS/TeX/png"}
