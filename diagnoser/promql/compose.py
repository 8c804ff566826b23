"""The PromQL vocabulary generated queries are written in: the rule files (rulefiles.py) and the
dashboards (dashboards/queries.py). Rates only of counters, buckets, `_sum` and `_count`;
quantiles over bucket rates summed by `le`; every division guarded (`num / (den > 0)`: no
series, not NaN or Inf, when the denominator is zero). `selected` is a series with its matchers
(`name{...}`), `w` a range as PromQL writes it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def by(labels: Iterable[str]) -> str:
    """' by (a, b)' for the labels a query is grouped by, '' for none."""
    labels = tuple(labels)
    return f" by ({', '.join(labels)})" if labels else ""


def sum_rate(selected: str, w: str, labels: Iterable[str] = ()) -> str:
    """sum by (labels) (rate(selected[w])) of a counter."""
    return f"sum{by(labels)} (rate({selected}[{w}]))"


def quantile(q: float, bucket: str, w: str, labels: Iterable[str] = ()) -> str:
    """histogram_quantile over a histogram's `_bucket` series' rates, summed by le (plus `labels`)."""
    return f"histogram_quantile({q}, {sum_rate(bucket, w, ('le', *labels))})"


def over_time(agg: str, op: str, selected: str, w: str, labels: Iterable[str] = ()) -> str:
    """agg by (labels) (op_over_time(selected[w])) of a gauge."""
    return f"{agg}{by(labels)} ({op}_over_time({selected}[{w}]))"


def guard(num: str, den: str) -> str:
    """num / (den > 0): no series instead of NaN or Inf where the denominator is zero."""
    return f"({num}) / (({den}) > 0)"


def burn_rate_alert(
    name: str, long_ratio: str, short_ratio: str, limit: float, severity: str, labels: dict[str, str], **notes: str
) -> dict[str, Any]:
    """One multi-window burn-rate alert, as every SLO rule file writes it: both windows' error
    ratios over `limit`, held 2m (critical) or 15m; `labels` after `severity`, `notes` as
    annotations (summary, description)."""
    return {
        "alert": name,
        "expr": f"{long_ratio} > {limit}\nand\n{short_ratio} > {limit}",
        "for": "2m" if severity == "critical" else "15m",
        "labels": {"severity": severity, **labels},
        "annotations": notes,
    }
