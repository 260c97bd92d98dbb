"""Plumbing (hand-written): keep committed notebooks free of outputs, with deterministic metadata.

The committed ``.ipynb`` is the only source of a notebook, so it must diff cleanly:
no outputs, no execution counts, cell ids ``cell-000``, ``cell-001``, ... by position,
cell metadata empty except a ``tags`` list, and notebook metadata limited to

    kernelspec:    {display_name: "Python 3", language: "python", name: "python3"}
    language_info: {name: "python"}

    python tools/notebooks.py --check   list notebooks that are not in that form (exit 1)
    python tools/notebooks.py --clean   rewrite them into that form (idempotent)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import nbformat

NOTEBOOK_METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}
NBFORMAT, NBFORMAT_MINOR = 4, 5


def cell_id(position: int) -> str:
    """The deterministic id of the cell at ``position`` (0-based): ``cell-000``, ``cell-001``, ..."""
    return f"cell-{position:03d}"


def _canonical(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Return ``nb`` with outputs, counts and non-deterministic metadata removed."""
    nb.nbformat, nb.nbformat_minor = NBFORMAT, NBFORMAT_MINOR
    nb.metadata = nbformat.from_dict(json.loads(json.dumps(NOTEBOOK_METADATA)))
    for position, cell in enumerate(nb.cells):
        cell.id = cell_id(position)
        tags = cell.get("metadata", {}).get("tags") or []
        cell.metadata = nbformat.from_dict({"tags": list(tags)} if tags else {})
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def _text(nb: nbformat.NotebookNode) -> str:
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def problems(path: Path | str) -> list[str]:
    """What keeps the notebook at ``path`` from being in canonical form; empty if nothing."""
    path = Path(path)
    raw = json.loads(path.read_text(encoding="utf-8"))
    found = []
    if (raw.get("nbformat"), raw.get("nbformat_minor")) != (NBFORMAT, NBFORMAT_MINOR):
        found.append(f"nbformat is {raw.get('nbformat')}.{raw.get('nbformat_minor')}, "
                     f"expected {NBFORMAT}.{NBFORMAT_MINOR}")
    if raw.get("metadata") != NOTEBOOK_METADATA:
        extra = sorted(set(raw.get("metadata", {})) - set(NOTEBOOK_METADATA))
        found.append("notebook metadata is not the allowed deterministic set"
                     + (f" (extra keys: {', '.join(extra)})" if extra else ""))
    for position, cell in enumerate(raw.get("cells", [])):
        where = f"cell {position}"
        if cell.get("outputs"):
            found.append(f"{where} has outputs")
        if cell.get("execution_count") is not None:
            found.append(f"{where} has execution_count {cell['execution_count']}, expected None")
        if cell.get("id") != cell_id(position):
            found.append(f"{where} has id {cell.get('id')!r}, expected {cell_id(position)!r}")
        metadata = cell.get("metadata", {})
        tags = metadata.get("tags")
        if set(metadata) - {"tags"} or (tags is not None and not tags):
            found.append(f"{where} has metadata {sorted(metadata)}, only a non-empty 'tags' "
                         f"list is allowed")
    if not found and path.read_text(encoding="utf-8") != _text(_canonical(nbformat.read(path, 4))):
        found.append("not in canonical JSON layout")
    return found


def clean(path: Path | str) -> bool:
    """Rewrite the notebook at ``path`` in canonical form; return whether it changed."""
    path = Path(path)
    nb = _canonical(nbformat.read(path, as_version=NBFORMAT))
    if path.read_text(encoding="utf-8") == _text(nb):
        return False
    nbformat.write(nb, str(path))
    return True


def course_notebooks(root: Path) -> list[Path]:
    """Every committed notebook directly under ``root/notebooks``, sorted by name."""
    return sorted((Path(root) / "notebooks").glob("*.ipynb"))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: ``--check`` or ``--clean`` the given notebooks (default: all)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="list notebooks not in canonical form")
    mode.add_argument("--clean", action="store_true", help="rewrite notebooks in canonical form")
    parser.add_argument("paths", nargs="*", type=Path,
                        help="notebooks (default: notebooks/*.ipynb of this repository)")
    args = parser.parse_args(argv)
    paths = args.paths or course_notebooks(Path(__file__).resolve().parent.parent)
    if args.clean:
        changed = [p for p in paths if clean(p)]
        for p in changed:
            print(f"cleaned {p}")
        print(f"{len(changed)} of {len(paths)} notebook(s) changed")
        return 0
    failing = 0
    for p in paths:
        found = problems(p)
        failing += bool(found)
        for problem in found:
            print(f"{p}: {problem}")
    if failing:
        print(f"{failing} notebook(s) not clean: run `make clean-notebooks`", file=sys.stderr)
        return 1
    print(f"{len(paths)} notebook(s) clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
