"""Recorded quantiles (`kvscope-quantiles.yml`, docs/alerting.md): one recording rule per distinct
histogram quantile node of the shipped rules, at time scale 1 and the rules' defaults, shipped for
ad-hoc queries (nothing in kvscope reads them back). The expression is the node's own over the
engines' series, so it can be backfilled; nodes with label matchers are not recorded.
"""

from __future__ import annotations

from typing import Any

from kvscope.core.signals import Catalog
from kvscope.diagnoser.promql.series import NotExpressible, SeriesCompiler
from kvscope.diagnoser.promql.signals import InlineSignals, prom_number
from kvscope.diagnoser.rulebook import tree
from kvscope.diagnoser.rulebook.rule import Rule

QUANTILE_BY = "kvscope_by"
"""The label naming a recorded quantile's grouping (one record name serves every grouping)."""


def quantile_rules(rules: list[Rule], catalog: Catalog) -> list[dict[str, Any]]:
    """One recording rule per distinct quantile the rules read (first rule's expression wins; the
    same key gives the same series), in key order."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for rule in rules:
        if rule.missing_params():
            continue
        compiler = SeriesCompiler(rule, InlineSignals(catalog))
        for name, node in rule.tree.series.items():
            if not isinstance(node, tree.Quantile):
                continue
            by = compiler.by_of(name)
            if compiler._matchers(node, ", ".join(by)):
                continue
            q = prom_number(node.q)
            key = (f"kvscope:{node.signal}:quantile_{compiler._range(node)}", q, ",".join(by))  # name, labels
            if key in out:
                continue
            try:
                expr = compiler.expr(name)
            except (NotExpressible, KeyError, ValueError):
                continue
            out[key] = {"record": key[0], "expr": expr, "labels": {"quantile": q, QUANTILE_BY: key[2]}}
    return [out[k] for k in sorted(out)]


QUANTILE_INTERVAL = "15s"
"""The records' evaluation interval: a record read at a grid point holds the value of at most
one interval earlier (the prefilters' slack covers that at a 15 s grid)."""


def quantile_file(rules: list[Rule], catalog: Catalog) -> tuple[str, list[dict[str, Any]]]:
    """(file name, rule groups) of `kvscope-quantiles.yml`."""
    return "kvscope-quantiles.yml", [
        {"name": "kvscope-quantiles", "interval": QUANTILE_INTERVAL, "rules": quantile_rules(rules, catalog)}
    ]
