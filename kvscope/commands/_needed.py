"""The canonical signals kvscope's own consumers read: the diagnosis rules, the dashboards and the
generated Prometheus rules. `kvscope rules coverage` checks that every engine release maps them."""

from __future__ import annotations

import re

from kvscope.core.signals import Catalog, signal_of


def needed_signals(catalog: Catalog) -> dict[str, set[str]]:
    """signal -> where it is read ("rules", "dashboards", "prometheus")."""
    from kvscope.dashboards.registry import BOARDS
    from kvscope.diagnoser.evaluate.evaluator import sample_names
    from kvscope.diagnoser.promql.rulefiles import build_rule_files
    from kvscope.diagnoser.rulebook.rule import read_rules

    out: dict[str, set[str]] = {}

    def add(name: str, where: str) -> None:
        sig = signal_of(name, catalog)
        if sig in catalog.signals:
            out.setdefault(sig, set()).add(where)

    for rule in read_rules():
        for name in sample_names(rule):
            add(name, "rules")
    for board in BOARDS:
        for panel in board.panels():
            for sig in panel.signals():
                add(sig, "dashboards")
    text = "\n".join(t for name, t in build_rule_files(catalog).items() if name != "kvscope-canonical.yml")
    for name in re.findall(r"kvscope:([A-Za-z0-9_]+)", text):
        add(name, "prometheus")
    return out
