"""The rule language: which expression forms a rule's `series` may use, and the operators and
right-hand sides of its conditions (docs/rules.md). rulebook/tree.py parses rules against it; the
evaluator (diagnoser/evaluate/) and the PromQL compiler (diagnoser/promql/) implement it.
"""

from __future__ import annotations

import operator
import re
from typing import Any

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

_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w|y))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0, "y": 365 * 86400.0}
"""Prometheus' duration units (a year is 365 days), the ones `prom_duration` writes."""


class RuleError(ValueError):
    """A rule file that cannot be used; str() is `file:line: message`."""

    def __init__(self, message: str, path: str = "", line: int | None = None) -> None:
        self.message, self.path, self.line = message, path, line
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {message}" if where else message)


def parse_duration(value: Any) -> float:
    """'30s', '5m', '1h', '1m30s', '10s1ms', '1w' (Prometheus' durations) or a number of seconds -> seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    if not _DURATION.match(text):
        raise ValueError(f"not a duration: {value!r} (use 30s, 5m, 1h, 1m30s)")
    return sum(float(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(text))
