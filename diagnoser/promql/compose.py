"""The PromQL vocabulary generated queries are written in: the rule files (rulefiles.py) and the
dashboards (dashboards/queries.py). Rates only of counters, buckets, `_sum` and `_count`;
quantiles over bucket rates summed by `le`; every division guarded (`num / (den > 0)`: no
series, not NaN or Inf, when the denominator is zero). `selected` is a series with its matchers
(`name{...}`), `w` a range as PromQL writes it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
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
    name: str,
    slo: str,
    record_of: Callable[[str], str],
    window: tuple[str, str, float, str],
    target: float,
    subject: str,
    requests: str,
    allows: str = ".",
    tail: str = "",
    where: str = "",
) -> dict[str, Any]:
    """One multi-window burn-rate alert, as every SLO rule file writes it: the error ratios
    `record_of` both windows over burn x the error budget (1 - `target`), held 2m (critical) or
    15m; its summary names `subject` (`where` after the burn), its description `requests` (which
    requests, doing what), `allows` after the budget and `tail` after the budget's lifetime."""
    long_w, short_w, burn, severity = window
    budget = round(1 - target, 10)
    limit = round(burn * budget, 10)
    return {
        "alert": name,
        "expr": f"{record_of(long_w)} > {limit}\nand\n{record_of(short_w)} > {limit}",
        "for": "2m" if severity == "critical" else "15m",
        "labels": {"severity": severity, "slo": slo, "window": f"{long_w}/{short_w}"},
        "annotations": {
            "summary": f"{subject} burning {burn}x budget{where} ({long_w} and {short_w} windows)",
            "description": (
                f"{{{{ $value | humanizePercentage }}}} of {requests} over the last {long_w}, and more than "
                f"{limit:.4g} over the last {short_w}; the SLO allows {budget:.4g}{allows} At this rate a 30-day "
                f"error budget lasts {30 / burn:.3g} days.{tail}"
            ),
        },
    }
