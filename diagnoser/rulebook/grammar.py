"""The rule language: which expression forms a rule's `series` may use, and the operators and
right-hand sides of its conditions (docs/rules.md). rulebook/tree.py parses rules against it; the
evaluator (diagnoser/evaluate/) and the PromQL compiler (diagnoser/promql/) implement it.
"""

from __future__ import annotations

import operator

PAIR_FORMS = ("ratio", "sum", "diff", "product", "coalesce")
"""Forms that combine two named series point by point."""
FORMS: tuple[str, ...] = ("gauge", "rate", "increase", "quantile", "mean", "count", "resets", *PAIR_FORMS)
FORMS += ("scale", "over_time", "deriv", "predict", "changes", "aggregate")
"""Every series form: the first seven read a canonical signal, the rest combine named series."""


class ExprError(ValueError):
    """An expression that cannot be evaluated (bad form, unknown reference, bad grouping)."""


OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne}
RIGHT_SIDES = ("value", "than", "baseline", "present")
BASELINE_AGGS = ("avg", "max", "min", "median")


class RuleError(ValueError):
    """A rule file that cannot be used; str() is `file:line: message`."""

    def __init__(self, message: str, path: str = "", line: int | None = None) -> None:
        self.message, self.path, self.line = message, path, line
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {message}" if where else message)
