"""The import graph runs one way: presenters -> diagnoser -> agent, and inside the agent and the
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
    "agent": {"agent"},
    "rules": {"rules"},
    "diagnoser": {"diagnoser", "agent", "rules"},
    "report": {"report", "diagnoser", "agent", "rules"},
    "dashboards": {"dashboards", "diagnoser", "agent", "rules"},
    "ui": {"ui", "report", "diagnoser", "agent", "rules"},
}
"""Top-level package -> the top-level packages it may import (the CLI, `kvscope`, may import all)."""

LAYERS = {
    "agent": {
        "signals": 0,
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
        "rulebook": 2,
        "actions": 3,
        "promql": 4,
        "evaluate": 5,
        "render": 5,
        "sources": 6,
        "routing": 6,
        "pushdown": 7,
        "curve": 7,
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
    assert violations("dashboards", "lint", imports_of("from kvscope.ui.data import x"))
    assert not violations("agent", "recording", imports_of("from kvscope.agent.derive.gpu_join import x"))
    assert violations("agent", "newstage", imports_of("from kvscope.agent.signals import x"))
