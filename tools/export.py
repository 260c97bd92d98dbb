"""Plumbing (hand-written): export marked notebook cells into the dsml package.

Notebooks teach, the package remembers. A code cell whose first line is exactly

    #| export dsml.some.module

is appended (minus that line) to ``dsml/some/module.py``, in notebook order. Each
module comes from exactly one notebook. When a module uses a name that an earlier
cell of the same notebook exported to a *different* module, the exporter adds the
``from dsml.other import name`` line; a name defined nowhere is an export-time error.

    python tools/export.py           write the generated modules
    python tools/export.py --check   write nothing; exit 1 if any generated file is stale
"""
from __future__ import annotations

import argparse
import ast
import builtins
import json
import re
import symtable
import sys
from dataclasses import dataclass, field
from pathlib import Path

MARKER_PREFIX = "#| export"
MARKER_RE = re.compile(r"^#\| export (dsml(?:\.[A-Za-z_][A-Za-z0-9_]*)+)$")
GENERATED_PREFIX = '"""Generated from notebooks/'
SIBLING_COMMENT = "# names defined in earlier cells of the same notebook (added by the exporter)"
REPEATED_COMMENT = "# imports repeated from earlier cells of the same notebook (added by the exporter)"
FUTURE_RE = re.compile(r"^from __future__ import (.+)$")
# Names every module has without defining them.
ALWAYS_BOUND = set(dir(builtins)) | {
    "__name__", "__file__", "__doc__", "__spec__", "__loader__", "__package__",
    "__builtins__", "__annotations__", "__path__",
}


class ExportError(Exception):
    """A notebook cannot be exported; the message lists every problem found."""


@dataclass
class Cell:
    """One exported cell: where it came from and its code without the marker."""

    index: int
    body: str
    defines: set[str] = field(default_factory=set)
    uses: set[str] = field(default_factory=set)          # names needed at runtime
    mentions: set[str] = field(default_factory=set)      # runtime uses + annotations
    imports: dict[str, str] = field(default_factory=dict)  # name -> the import line binding it


@dataclass
class Module:
    """A generated module: its dotted name, source notebook and cells in order."""

    name: str
    notebook: str
    cells: list[Cell] = field(default_factory=list)
    futures: set[str] = field(default_factory=set)

    @property
    def path(self) -> str:
        return self.name.replace(".", "/") + ".py"

    @property
    def defines(self) -> set[str]:
        return set().union(*(c.defines for c in self.cells))


def notebooks(root: Path) -> list[Path]:
    """The course notebooks ``notebooks/week*.ipynb`` under ``root``, sorted by name."""
    return sorted((Path(root) / "notebooks").glob("week*.ipynb"))


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    text = "".join(src) if isinstance(src, list) else src
    return text.replace("\r\n", "\n")


def _strip_blank_edges(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


class _DropAnnotations(ast.NodeTransformer):
    """Remove annotations, which ``from __future__ import annotations`` never evaluates."""

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node):  # also used for AsyncFunctionDef
        node.returns = None
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign):
        if node.value is None:
            return ast.Pass()
        return ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno)


def _scan(code: str) -> tuple[set[str], set[str]]:
    """Module-level names a piece of code binds, and global names it loads.

    Uses the compiler's own symbol table, so function locals, parameters and
    comprehension variables are never mistaken for module-level names.
    """
    top = symtable.symtable(code, "<cell>", "exec")
    defines = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    loads = {s.get_name() for s in top.get_symbols() if s.is_referenced()}
    stack = list(top.get_children())
    while stack:
        table = stack.pop()
        stack.extend(table.get_children())
        for s in table.get_symbols():
            if s.is_global() and s.is_referenced():
                loads.add(s.get_name())
            if s.is_declared_global() and s.is_assigned():
                defines.add(s.get_name())
    return defines, loads


def _import_lines(tree: ast.Module) -> dict[str, str]:
    """Top-level names bound by an import statement, each with a one-name import line."""
    lines = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                lines[bound] = ast.unparse(ast.Import(names=[alias]))
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                lines[alias.asname or alias.name] = ast.unparse(
                    ast.ImportFrom(module=node.module, names=[alias], level=node.level))
    return lines


def _analyse(cell: Cell, where: str, future_annotations: bool) -> None:
    try:
        tree = ast.parse(cell.body)
    except SyntaxError as exc:
        raise ExportError(f"{where}: exported code is not valid Python "
                          f"(line {exc.lineno}: {exc.msg}); notebook magics cannot be exported")
    cell.defines, cell.mentions = _scan(cell.body)
    cell.imports = _import_lines(tree)
    if future_annotations:
        runtime = ast.unparse(ast.fix_missing_locations(_DropAnnotations().visit(tree)))
        cell.uses = _scan(runtime)[1]
    else:
        cell.uses = set(cell.mentions)


def _parse_notebook(nb_path: Path, root: Path) -> list[Module]:
    rel = nb_path.relative_to(root).as_posix()
    cells = json.loads(nb_path.read_text(encoding="utf-8")).get("cells", [])
    modules: dict[str, Module] = {}
    for index, raw in enumerate(cells):
        if raw.get("cell_type") != "code":
            continue
        lines = _source(raw).split("\n")
        first = lines[0].rstrip()
        if not first.startswith(MARKER_PREFIX):
            continue
        match = MARKER_RE.match(first)
        if not match:
            raise ExportError(f"{rel} cell {index}: bad export marker {first!r}; expected "
                              f"'#| export dsml.<module>' with a dotted module path under dsml")
        module = modules.setdefault(match.group(1), Module(match.group(1), rel))
        body = []
        for line in lines[1:]:
            future = FUTURE_RE.match(line)
            if future:
                module.futures.update(n.strip() for n in future.group(1).split(","))
            else:
                body.append(line)
        module.cells.append(Cell(index, "\n".join(_strip_blank_edges(body))))
    for module in modules.values():
        for cell in module.cells:
            _analyse(cell, f"{rel} cell {cell.index} ({module.name})",
                     "annotations" in module.futures)
    return list(modules.values())


def _sibling_imports(modules: list[Module]) -> tuple[dict[str, dict[str, set[str]]],
                                                     dict[str, set[str]], list[str]]:
    """What each module needs from earlier cells of its notebook, and undefined-name errors.

    Returns ``{module: {sibling module: names}}`` for names an earlier exported cell defines,
    ``{module: import lines}`` for names an earlier exported cell merely imported (the import
    is repeated rather than re-exported through the sibling), and the error lines.
    """
    imports: dict[str, dict[str, set[str]]] = {m.name: {} for m in modules}
    repeated: dict[str, set[str]] = {m.name: set() for m in modules}
    errors: list[str] = []
    for module in modules:
        own = module.defines
        for cell in module.cells:
            for name in sorted(cell.mentions - own - ALWAYS_BOUND):
                # The most recent earlier definition wins, as it would in the notebook.
                best: tuple[Cell, str] | None = None
                for other in modules:
                    if other is module:
                        continue
                    for oc in other.cells:
                        if oc.index < cell.index and name in oc.defines:
                            if best is None or oc.index > best[0].index:
                                best = (oc, other.name)
                if best is not None and name in best[0].imports:
                    repeated[module.name].add(best[0].imports[name])
                elif best is not None:
                    imports[module.name].setdefault(best[1], set()).add(name)
                elif name in cell.uses:
                    errors.append(f"{module.notebook}: module {module.name}, cell {cell.index}: "
                                  f"name {name!r} is not defined, imported, a builtin, or exported "
                                  f"by an earlier cell of this notebook (mark the cell that defines "
                                  f"it with '#| export dsml.<module>', or import it in this cell)")
    return imports, repeated, errors


def _check_cycles(imports: dict[str, dict[str, set[str]]]) -> list[str]:
    errors, done, active = [], set(), []

    def visit(name: str) -> None:
        if name in active:
            cycle = active[active.index(name):] + [name]
            errors.append("exported modules would import each other in a cycle: "
                          + " -> ".join(cycle) + "; move the shared definitions into one module")
            return
        if name in done:
            return
        active.append(name)
        for target in sorted(imports.get(name, {})):
            visit(target)
        active.pop()
        done.add(name)

    for name in sorted(imports):
        visit(name)
    return errors


def _render(module: Module, imports: dict[str, set[str]], repeated: set[str]) -> str:
    header = [f'"""Generated from {module.notebook} — do not edit; edit the notebook '
              f'and run `make export`."""']
    if module.futures:
        header.append(f"from __future__ import {', '.join(sorted(module.futures))}")
    if repeated:
        header += ["", REPEATED_COMMENT, *sorted(repeated)]
    if imports:
        header += ["", SIBLING_COMMENT]
        header += [f"from {src} import {', '.join(sorted(names))}"
                   for src, names in sorted(imports.items())]
    blocks = [f"# -- cell {cell.index}\n{cell.body}".rstrip("\n") for cell in module.cells]
    return "\n".join(header) + "\n\n\n" + "\n\n\n".join(blocks) + "\n"


def _check_target(root: Path, module: Module) -> list[str]:
    """A generated module may not replace a hand-written file or a package."""
    errors = []
    path = root / module.path
    if path.with_suffix("").is_dir():
        errors.append(f"{module.notebook}: target {module.name} is a package directory "
                      f"({path.with_suffix('').relative_to(root).as_posix()}/); choose a module name")
    if path.exists() and not path.read_text(encoding="utf-8").startswith(GENERATED_PREFIX):
        errors.append(f"{module.notebook}: target {module.name} would overwrite the hand-written "
                      f"file {module.path}; choose another module name")
    parts = module.name.split(".")
    for depth in range(2, len(parts)):
        as_file = root / ("/".join(parts[:depth]) + ".py")
        if as_file.exists():
            errors.append(f"{module.notebook}: target {module.name} needs package "
                          f"{'.'.join(parts[:depth])}, but {as_file.relative_to(root).as_posix()} "
                          f"is a module file")
    return errors


def export_all(root: Path | str) -> dict[str, str]:
    """Export every notebook under ``root``; return ``{relative path: generated text}``.

    Paths are POSIX paths relative to ``root`` (e.g. ``"dsml/sim/core.py"``), sorted.
    Writes nothing. Raises ``ExportError`` listing every problem found.
    """
    root = Path(root)
    owner: dict[str, str] = {}
    errors: list[str] = []
    out: dict[str, str] = {}
    for nb_path in notebooks(root):
        modules = _parse_notebook(nb_path, root)
        for module in modules:
            if module.name in owner:
                errors.append(f"module {module.name} is exported by two notebooks: "
                              f"{owner[module.name]} and {module.notebook}; "
                              f"a later week adds a new module instead")
            owner.setdefault(module.name, module.notebook)
            errors += _check_target(root, module)
        imports, repeated, undefined = _sibling_imports(modules)
        errors += undefined + _check_cycles(imports)
        for module in modules:
            out[module.path] = _render(module, imports[module.name], repeated[module.name])
    if errors:
        raise ExportError("\n".join(errors))
    return dict(sorted(out.items()))


def _generated_files(root: Path) -> list[str]:
    found = []
    for path in sorted((root / "dsml").rglob("*.py")):
        with path.open(encoding="utf-8") as fh:
            if fh.readline().startswith(GENERATED_PREFIX):
                found.append(path.relative_to(root).as_posix())
    return found


def _missing_inits(root: Path, paths: list[str]) -> list[str]:
    """Package ``__init__.py`` files below ``dsml/`` that the generated modules need."""
    needed = set()
    for rel in paths:
        parts = rel.split("/")[:-1]
        for depth in range(2, len(parts) + 1):
            needed.add("/".join(parts[:depth]) + "/__init__.py")
    return sorted(p for p in needed if not (root / p).exists())


def _init_text(init_path: str) -> str:
    package = init_path.rsplit("/", 1)[0].replace("/", ".")
    return f'"""Plumbing (hand-written): the {package} package."""\n'


def stale(root: Path | str) -> list[str]:
    """Generated files that differ from a fresh export: one line per file, empty if all match."""
    root = Path(root)
    fresh = export_all(root)
    report = []
    for rel, text in fresh.items():
        path = root / rel
        if not path.exists():
            report.append(f"{rel}: missing (run `make export`)")
        elif path.read_bytes() != text.encode("utf-8"):
            report.append(f"{rel}: differs from a fresh export of its notebook")
    for rel in _generated_files(root):
        if rel not in fresh:
            report.append(f"{rel}: generated file that no notebook exports any more")
    for rel in _missing_inits(root, list(fresh)):
        report.append(f"{rel}: missing package file")
    return report


def write_all(root: Path | str) -> list[str]:
    """Write every generated module (and missing package files); delete orphans. Returns changes."""
    root = Path(root)
    fresh = export_all(root)
    changes = []
    for rel in _missing_inits(root, list(fresh)):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(_init_text(rel), encoding="utf-8", newline="\n")
        changes.append(f"created {rel}")
    for rel, text in fresh.items():
        path = root / rel
        if not path.exists() or path.read_bytes() != text.encode("utf-8"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8", newline="\n")
            changes.append(f"wrote {rel}")
    for rel in _generated_files(root):
        if rel not in fresh:
            (root / rel).unlink()
            changes.append(f"removed {rel} (no notebook exports it any more)")
    return changes


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: write the package, or with ``--check`` only report differences."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; list stale generated files and exit 1 if any")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="repository root (default: the one containing this script)")
    args = parser.parse_args(argv)
    try:
        if args.check:
            report = stale(args.root)
            for line in report:
                print(line)
            if report:
                print("generated modules are out of date: run `make export`", file=sys.stderr)
                return 1
            print("generated modules match the notebooks")
            return 0
        changes = write_all(args.root)
    except ExportError as exc:
        print(f"export failed:\n{exc}", file=sys.stderr)
        return 2
    for line in changes:
        print(line)
    print(f"exported {len(export_all(args.root))} module(s); {len(changes)} file(s) changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
