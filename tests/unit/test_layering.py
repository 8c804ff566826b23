"""The import graph runs one way: presenters -> diagnoser -> agent -> core (the shared kernel), and inside the agent and the
diagnoser, each stage imports only the stages below it (docs/architecture.md, "Layout").

An import that goes the other way (a source importing derive, the agent importing the
diagnoser, a cycle between two folders) fails here with the file and the rule it breaks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TOP_ALLOWED = {
    "core": {"core"},
    "agent": {"agent", "core"},
    "rules": {"rules"},
    "diagnoser": {"diagnoser", "core", "agent", "rules"},
    "report": {"report", "core", "diagnoser", "agent", "rules"},
    "dashboards": {"dashboards", "core", "diagnoser", "agent", "rules"},
    "ui": {"ui", "core", "report", "diagnoser", "agent", "rules"},
}
"""Top-level package -> the top-level packages it may import (the CLI, `kvscope`, may import all)."""

LAYERS = {
    "agent": {
        "ratelog": 0,
        "namematch": 0,
        "config": 1,
        "metricsets": 1,
        "tenants": 1,
        "scrape": 1,
        "serve": 2,
        "normalize": 2,
        "collectors": 3,
        "logs": 3,
        "otel": 3,
        "traces": 4,
        "kvevents": 4,
        "store": 4,
        "tap": 5,
        "derive": 6,
        "recording": 7,
        "runtime": 8,
        "api": 9,
    },
    "diagnoser": {
        "citations": 0,
        "findings": 1,
        "sizing": 1,
        "values": 2,
        "rulebook": 2,
        "actions": 3,
        "promql": 4,
        "evaluate": 5,
        "render": 5,
        "sources": 6,
        "routing": 6,
        "pushdown": 7,
        "curve": 7,
        "goodput": 6,
        "alertmanager": 8,
    },
}
"""Per package, each folder or module's layer: it may import only strictly lower layers (and
itself). Sources (collectors, traces, kvevents, tap) sit below store and derive."""


def imports_of(source: str) -> list[str]:
    """Every `kvscope.*` module a source file imports (at any depth, lazy imports included)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
    return [m for m in out if m.startswith("kvscope.")]


def violations(top: str, unit: str, imported: list[str]) -> list[str]:
    """The imports of one module (in folder/module `unit` of package `top`) that break a rule."""
    bad = []
    for module in imported:
        parts = module.split(".")
        other = parts[1] if len(parts) > 1 else ""
        if other not in TOP_ALLOWED.get(top, {other}) and top in TOP_ALLOWED:
            bad.append(f"{module}: {top} may import only {sorted(TOP_ALLOWED[top])}")
            continue
        layers = LAYERS.get(top)
        if other != top or layers is None or len(parts) < 3 or parts[2] == unit:
            continue
        target = parts[2]
        if target not in layers or unit not in layers:
            bad.append(f"{module}: {top}/{unit} or {top}/{target} has no layer in LAYERS (add it)")
        elif layers[target] >= layers[unit]:
            bad.append(
                f"{module}: {top}/{unit} (layer {layers[unit]}) may import only lower layers, "
                f"not {top}/{target} (layer {layers[target]})"
            )
    return bad


def _modules():
    for top in TOP_ALLOWED:
        for path in sorted((ROOT / top).rglob("*.py")):
            yield top, path


@pytest.mark.parametrize("top", sorted(TOP_ALLOWED))
def test_every_import_goes_down(top):
    found = []
    for t, path in _modules():
        if t != top:
            continue
        unit = path.relative_to(ROOT / top).with_suffix("").parts[0]
        for v in violations(top, unit, imports_of(path.read_text())):
            found.append(f"{path.relative_to(ROOT)} imports {v}")
    assert not found, "\n".join(found)


def test_the_check_rejects_an_upward_import():
    """Negative controls: a source importing derive, the agent importing the diagnoser, and a
    lower diagnoser stage importing a higher one are each reported."""
    assert violations("agent", "tap", imports_of("from kvscope.agent.derive.fairness import x"))
    assert violations("agent", "store", imports_of("import kvscope.diagnoser.findings"))
    assert violations("diagnoser", "rulebook", imports_of("from kvscope.diagnoser.evaluate.expr import x"))
    assert violations("core", "signals", imports_of("from kvscope.agent.ratelog import x"))
    assert violations("dashboards", "lint", imports_of("from kvscope.ui.data import x"))
    assert not violations("agent", "recording", imports_of("from kvscope.agent.derive.gpu_join import x"))
    assert violations("agent", "newstage", imports_of("from kvscope.agent.ratelog import x"))


PACKAGE_OF = {
    "kvscope": "kvscope",
    "agent": "kvscope.agent",
    "core": "kvscope.core",
    "diagnoser": "kvscope.diagnoser",
    "dashboards": "kvscope.dashboards",
    "ui": "kvscope.ui",
    "report": "kvscope.report",
    "rules": "kvscope.rules",
}
"""Product folder -> the package it installs as (pyproject.toml's package-dir)."""


def product_modules() -> dict[str, Path]:
    """Every product module's dotted name -> its file."""
    out = {}
    for folder, package in PACKAGE_OF.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if folder == "kvscope" and parts[0] in PACKAGE_OF:
                continue
            name = ".".join((package, *parts)).removesuffix(".__init__")
            out[name] = path
    return out


def import_graph(modules: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the product modules it imports (module level and inside functions alike);
    `from package import name` counts as importing `package.name` where that is a module."""
    graph = {}
    for name, source in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    edges.add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def private_imports(source: str) -> list[str]:
    """The private names (`_x`, not dunders) a source takes from another product module:
    `from kvscope.m import _x`, or `m._x` on a product module it imported."""
    tree = ast.parse(source)
    modules, bad = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvscope"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    bad.append(f"{node.module}.{alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("kvscope"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            if node.attr.startswith("_") and not node.attr.startswith("__"):
                bad.append(f"{node.value.id}.{node.attr}")
    return bad


def test_product_imports_have_no_cycle():
    """No import circle in product code, counting imports inside functions too: a shared piece
    lives in the module that owns it, and both sides import it from there."""
    modules = {name: path.read_text() for name, path in product_modules().items()}
    assert len(modules) > 100  # the walk found the product
    assert cycles(import_graph(modules)) == []


def test_no_private_name_crosses_modules():
    """A name one module needs from another is public there (or the code moves to its user)."""
    found = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in product_modules().values()
        for name in private_imports(path.read_text())
    ]
    assert not found, "\n".join(found)


def test_the_checks_find_a_cycle_and_a_private_import():
    """Negative controls: a circle through a lazy import and a private name, by `from` and by
    attribute, are each reported; a dunder is not private."""
    modules = {
        "kvscope.a": "from kvscope import b\n",
        "kvscope.b": "def f():\n    from kvscope.c import g\n",
        "kvscope.c": "import kvscope.a\n",
        "kvscope.d": "from kvscope.a import x\n",
    }
    assert cycles(import_graph(modules)) == [["kvscope.a", "kvscope.b", "kvscope.c"]]
    assert private_imports("from kvscope.agent.dialect import _Mapper") == ["kvscope.agent.dialect._Mapper"]
    assert private_imports("from kvscope.agent import config\nconfig._EXTENSIONS") == ["config._EXTENSIONS"]
    assert private_imports("from kvscope import __version__") == []
