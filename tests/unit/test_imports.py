"""The import graph of the product's packages: the one-way rule, and no import cycles.

Every module of gateway/, workers/, shared/ and firsttoken/ is parsed (not imported) with
``ast``; every import counts, at the top of a module or inside a function (a late import hides
a cycle, it does not remove it). An import names its target module: ``from a import b`` is the
module ``a.b`` where that is a module, else ``a``; the packages above a target are not counted
(importing ``a.b`` runs ``a/__init__``, but a package importing its own modules is no cycle).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "workers", "shared", "firsttoken", "migrations", "bench")

# Which top-level packages each one must never import (the one-way rule): gateway and workers
# never import each other, shared imports neither, only firsttoken (the CLI above all) imports
# firsttoken, migrations/ (Alembic) reads shared's models and only firsttoken (`firsttoken
# migrate`, above it) imports it, and bench/ (scripts on top of everything) is imported by nothing.
FORBIDDEN = {
    "gateway": {"workers", "firsttoken", "migrations", "bench"},
    "workers": {"gateway", "firsttoken", "migrations", "bench"},
    "shared": {"gateway", "workers", "firsttoken", "migrations", "bench"},
    "firsttoken": {"bench"},
    "migrations": {"gateway", "workers", "firsttoken", "bench"},
    "bench": set(),
}

# Cycles tolerated, each from its smallest module name; any other cycle fails the test.
KNOWN_CYCLES: frozenset[tuple[str, ...]] = frozenset()

Graph = dict[str, set[str]]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the product's packages, by dotted name."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            found[module_name(path, root)] = path
    return found


def imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, str]]:
    """(imported module, name after it or "") for every import anywhere in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ""
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                # Relative: from the module's package (a package's __init__ is its own package).
                anchor = module.split(".")
                if not is_package:
                    anchor = anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield base, alias.name


def resolve(target: str, name: str, modules: Iterable[str]) -> str | None:
    """The product module an import names, or None for one outside the product."""
    known = set(modules)
    if name and name != "*" and f"{target}.{name}" in known:
        return f"{target}.{name}"
    return target if target in known else None


def import_graph(modules: dict[str, Path]) -> Graph:
    """Module -> the product modules it imports (itself excluded)."""
    graph: Graph = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        for target, attr in imported_names(tree, name, is_package):
            resolved = resolve(target, attr, graph)
            if resolved is not None and resolved != name:
                graph[name].add(resolved)
    return graph


def one_way_violations(graph: Graph) -> list[str]:
    out = []
    for module, targets in sorted(graph.items()):
        banned = FORBIDDEN[module.split(".")[0]]
        for target in sorted(targets):
            if target.split(".")[0] in banned:
                out.append(f"{module} imports {target}")
    return out


def strongly_connected(graph: Graph) -> list[set[str]]:
    """Tarjan's components of more than one module: each holds at least one cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def cycles(graph: Graph, limit: int = 200) -> list[tuple[str, ...]]:
    """Every elementary cycle (at most `limit`), each from its smallest module name."""
    found: list[tuple[str, ...]] = []
    for component in strongly_connected(graph):
        for start in sorted(component):
            # Cycles through `start` over modules after it: each cycle is found once.
            later = {m for m in component if m > start}
            _cycles_from(graph, [start], later, found, limit)
    return sorted(found)


def _cycles_from(
    graph: Graph, path: list[str], later: set[str], found: list[tuple[str, ...]], limit: int
) -> None:
    for nxt in sorted(graph[path[-1]]):
        if len(found) >= limit:
            return
        if nxt == path[0]:
            found.append(tuple(path))
        elif nxt in later and nxt not in path:
            path.append(nxt)
            _cycles_from(graph, path, later, found, limit)
            path.pop()


def show(cycle: tuple[str, ...]) -> str:
    return " -> ".join([*cycle, cycle[0]])


# --- the rules on this tree --------------------------------------------------------------------


def test_every_package_is_parsed() -> None:
    modules = product_modules()
    for package in PACKAGES:
        assert any(m.split(".")[0] == package for m in modules), f"{package}/ has no module"
    assert "workers.chat.run" in modules and "shared.settings" in modules


def test_one_way_rule() -> None:
    bad = one_way_violations(import_graph(product_modules()))
    assert not bad, (
        "the one-way rule is broken (gateway and workers never import each other, shared "
        "imports neither, only firsttoken imports firsttoken); move the shared part to shared/:\n  "
        + "\n  ".join(bad)
    )


def test_no_import_cycles() -> None:
    new = [c for c in cycles(import_graph(product_modules())) if c not in KNOWN_CYCLES]
    assert not new, (
        "import cycles between modules (a late import inside a function counts too); move what "
        "both sides need into a module of its own:\n  " + "\n  ".join(show(c) for c in new)
    )


# --- the checker itself ------------------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {module_name(p, tmp_path): p for p in sorted(tmp_path.rglob("*.py"))}


def test_function_level_and_relative_imports_count(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "shared/__init__.py": "",
            "shared/a.py": "def f():\n    from shared.b import x\n",
            "shared/b.py": "from . import c\n",
            "shared/c.py": "from .a import f\n",
            "shared/pkg/__init__.py": "from .d import y\n",
            "shared/pkg/d.py": "import shared.pkg\n",
        },
    )
    graph = import_graph(modules)
    assert graph["shared.a"] == {"shared.b"}
    assert graph["shared.b"] == {"shared.c"}
    assert graph["shared.c"] == {"shared.a"}
    assert graph["shared.pkg"] == {"shared.pkg.d"}
    assert cycles(graph) == [
        ("shared.a", "shared.b", "shared.c"),
        ("shared.pkg", "shared.pkg.d"),
    ]
    assert show(("shared.a", "shared.b")) == "shared.a -> shared.b -> shared.a"


def test_one_way_rule_names_each_offending_import(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "gateway/__init__.py": "",
            "gateway/app.py": "import workers.chat.run\nimport shared.keys\n",
            "workers/__init__.py": "",
            "workers/chat/run.py": "",
            "shared/__init__.py": "",
            "shared/keys.py": "def f():\n    from firsttoken import cli\n",
            "firsttoken/__init__.py": "",
            "firsttoken/cli.py": "import gateway.app\nimport workers.chat.run\n",
        },
    )
    assert one_way_violations(import_graph(modules)) == [
        "gateway.app imports workers.chat.run",
        "shared.keys imports firsttoken.cli",
    ]


def test_every_cycle_of_one_component_is_listed(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "workers/__init__.py": "",
            "workers/context.py": "import workers.record\nimport workers.stage\n",
            "workers/record.py": "import workers.context\n",
            "workers/stage.py": "import workers.context\n",
        },
    )
    assert cycles(import_graph(modules)) == [
        ("workers.context", "workers.record"),
        ("workers.context", "workers.stage"),
    ]
