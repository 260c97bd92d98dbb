"""Imports point down the layers of docs/architecture.md, no two modules import each other
(directly or round a longer circle), and every module says what kind it is."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dsml"

# Layer of each top-level part of the package (docs/architecture.md). A module may import
# modules of its own layer or lower ones. A new top-level module must be added here.
LAYERS = {
    "dsml.utils": 0,
    "dsml.validate_args": 0,
    "dsml.sim": 1,
    "dsml.sim_support": 1,
    "dsml.net": 2,
    "dsml.comm": 3,
    "dsml.collectives": 4,
    "dsml.train": 5,
    "dsml.data_parallel": 6,
    "dsml.hogwild": 6,
    "dsml.param_server": 6,
    "dsml.tensor_parallel": 6,
    "dsml.context_parallel": 6,
    "dsml.pipeline": 6,
    "dsml.zero": 6,
    "dsml.model_config": 6,
    "dsml.memory": 6,
    "dsml.step_model": 6,
    "dsml.layout_search": 6,
    "dsml.expert_parallel": 6,
    "dsml.fault": 6,
    "dsml.fault_batch": 6,
    "dsml.checkpoint": 6,
    "dsml.checkpoint_format": 6,
    "dsml.membership_store": 6,
    "dsml.elastic": 6,
    "dsml.heartbeat": 6,
    "dsml.compression": 6,
    "dsml.capstone": 6,
    "dsml.viz": 7,
    "dsml.exercises": 8,
    "dsml.cli": 9,        # a package: dsml.cli.bench, .memory, … take its layer
    "dsml.__main__": 9,
    "dsml": 9,            # the package itself (dsml/__init__.py re-exports everything)
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(name: str) -> int:
    parts = name.split(".")
    for i in range(min(len(parts), 2), 0, -1):
        key = ".".join(parts[:i])
        if key in LAYERS:
            return LAYERS[key]
    raise KeyError(name)


def imported_modules(tree: ast.AST, current: str):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:   # relative import: resolve against the current package
                base = current.split(".")[: -node.level] if not current.endswith("__init__") \
                    else current.split(".")
                yield ".".join(base + ([node.module] if node.module else []))
            elif node.module:
                yield node.module


MODULES = sorted(p for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path):
    name = module_name(path)
    try:
        mine = layer_of(name)
    except KeyError:
        pytest.fail(f"{name} is in no layer: add it to LAYERS here and to docs/architecture.md")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for target in imported_modules(tree, name):
        if target != "dsml" and not target.startswith("dsml."):
            continue
        theirs = layer_of(target)
        assert theirs <= mine, (f"{name} (layer {mine}) imports {target} (layer {theirs}): "
                                f"imports must point down the layers")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_says_its_kind(path):
    first = path.read_text(encoding="utf-8").lstrip().split("\n", 1)[0]
    assert first.startswith(('"""Generated from notebooks/', '"""Plumbing (hand-written)')), (
        f"{path.relative_to(ROOT)}: the first line must say whether the module is generated "
        f"from a notebook or hand-written plumbing, got {first[:60]!r}")


def import_graph() -> dict:
    """module -> the dsml modules it imports, anywhere in its text (a function-local import
    closes a circle as surely as one at the top: it only runs later). `from dsml.x import y`
    counts as importing dsml.x.y when that is a module, else dsml.x."""
    names = {module_name(path) for path in MODULES}
    graph = {}
    for path in MODULES:
        name = module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module \
                    and node.module.startswith("dsml"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in names else node.module)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.startswith("dsml"))
        # A package's own __init__ is imported with each of its modules: not an edge back.
        graph[name] = {t for t in targets if t in names and t != name
                       and not name.startswith(t + ".")}
    return graph


def import_cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_cycles():
    cycles = import_cycles(import_graph())
    assert not cycles, ("modules that import each other (directly or round a circle; imports "
                        f"must point one way): {cycles}")


def test_cycle_finder_finds_a_circle_of_three():
    graph = {"dsml.a": {"dsml.b"}, "dsml.b": {"dsml.c"}, "dsml.c": {"dsml.a"}, "dsml.d": set()}
    assert import_cycles(graph) == [("dsml.a", "dsml.b", "dsml.c")]
    assert import_cycles({"dsml.a": {"dsml.b"}, "dsml.b": set()}) == []
