"""The rule language: which expression forms a rule's `series` may use, what each reads or refers
to, and the operators and right-hand sides of its conditions (docs/rules.md). The validator
checks rules against it; the evaluator (diagnoser/evaluate/) and the PromQL compiler
(diagnoser/promql/) implement it.
"""

from __future__ import annotations

import operator
from typing import Any

SIGNAL_FORMS = ("gauge", "rate", "increase", "quantile", "mean", "count", "resets")
"""Forms that read a canonical signal from the frame."""
PAIR_FORMS = ("ratio", "sum", "diff", "product", "coalesce")
"""Forms that combine two named series point by point."""
SERIES_FORMS = (*PAIR_FORMS, "scale", "over_time", "deriv", "predict", "changes", "aggregate")
"""Forms that combine other named series."""
FORMS = SIGNAL_FORMS + SERIES_FORMS


class ExprError(ValueError):
    """An expression that cannot be evaluated (bad form, unknown reference, bad grouping)."""


def node_form(node: dict[str, Any]) -> str:
    """Which form an expression mapping is ('gauge', 'rate', ...)."""
    forms = [f for f in FORMS if f in node]
    if len(forms) != 1:
        raise ExprError(f"expression must have exactly one of {', '.join(FORMS)}; got {sorted(node)}")
    return forms[0]


def node_refs(node: dict[str, Any]) -> list[str]:
    """Named series an expression refers to."""
    form = node_form(node)
    if form in PAIR_FORMS:
        return [str(x) for x in node[form]]
    if form == "scale":
        return [str(node["scale"])]
    if form in ("over_time", "aggregate"):
        return [str(node["of"])]
    if form in ("deriv", "predict", "changes"):
        return [str(node[form])]
    return []


OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne}
RIGHT_SIDES = ("value", "than", "baseline", "present")
BASELINE_AGGS = ("avg", "max", "min", "median")
