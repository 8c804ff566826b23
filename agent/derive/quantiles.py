"""Histogram quantiles and means over a window, from cumulative bucket counters.

A canonical histogram is stored flattened: `<name>_bucket{le=...}`, `<name>_sum`, `<name>_count`,
all counters. A quantile over a window is computed from the bucket *increases* in that window
(reset-aware, see rates.py), with Prometheus' `histogram_quantile` semantics: linear
interpolation inside the bucket that holds the rank, the +Inf bucket answered with the highest
finite bound, bucket counts forced monotonic, and no answer (None) without observations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from kvscope.agent.derive.rates import Points, increase, rate
from kvscope.agent.signals import Labels

Bucket = tuple[float, float]  # (upper bound `le`, cumulative count)


def parse_le(text: str) -> float | None:
    """The `le` label as a float ("+Inf" included); None when it is not a number."""
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def histogram_quantile(q: float, buckets: Sequence[Bucket]) -> float | None:
    """The q-quantile of one histogram given as (le, cumulative count) pairs in any order.

    None when there are no observations, fewer than two buckets or no +Inf bucket. q below 0
    gives -inf and above 1 gives +inf, as in Prometheus.
    """
    if math.isnan(q):
        return None
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = _monotonic(sorted(buckets))
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]):
        return None
    observations = ordered[-1][1]
    if not observations > 0:
        return None
    rank = q * observations
    b = next(i for i, (_, count) in enumerate(ordered) if count >= rank)
    if b == len(ordered) - 1:
        return ordered[-2][0]
    upper, count = ordered[b]
    if b == 0 and upper <= 0:
        return upper
    lower, below = (0.0, 0.0) if b == 0 else ordered[b - 1]
    in_bucket = count - below
    if in_bucket <= 0:
        return lower
    return lower + (upper - lower) * ((rank - below) / in_bucket)


def _monotonic(buckets: list[Bucket]) -> list[Bucket]:
    """Merge equal bounds and make counts non-decreasing in `le` (scrapes are not atomic, so a
    higher bucket can be read a moment before a lower one)."""
    out: list[Bucket] = []
    for le, count in buckets:
        if out and out[-1][0] == le:
            out[-1] = (le, out[-1][1] + count)
            continue
        out.append((le, max(count, out[-1][1]) if out else count))
    return out


def group_buckets(series: Mapping[Labels, Points]) -> dict[Labels, dict[float, Points]]:
    """Split `<name>_bucket` series (as `Store.query` returns them) into histograms: the labels
    without `le` -> {le: points}. Series with an unparseable `le` are skipped."""
    out: dict[Labels, dict[float, Points]] = {}
    for labels, points in series.items():
        le = parse_le(dict(labels).get("le", ""))
        if le is None:
            continue
        rest = tuple(kv for kv in labels if kv[0] != "le")
        out.setdefault(rest, {})[le] = points
    return out


def bucket_increases(
    buckets: Mapping[float, Points], start: float | None = None, end: float | None = None
) -> list[Bucket] | None:
    """(le, increase over the points given) for one histogram; None if any bucket has fewer than
    two points (the window cannot say how many observations fell in it). With the window's
    `start`/`end` the increases are extrapolated as Prometheus' `rate()` does (see rates.py)."""
    out: list[Bucket] = []
    for le, points in buckets.items():
        # with bounds, per-second rates: quantiles do not change with the scale, and this is
        # the arithmetic of histogram_quantile(q, rate(...)) step for step
        inc = increase(points) if start is None or end is None else rate(points, start, end)
        if inc is None:
            return None
        out.append((le, inc))
    return out


def window_quantile(
    q: float, buckets: Mapping[float, Points], start: float | None = None, end: float | None = None
) -> float | None:
    """The q-quantile of the observations made during the window the points cover. Given the
    window bounds it equals Prometheus' `histogram_quantile(q, rate(<name>_bucket[window]))`."""
    increases = bucket_increases(buckets, start, end)
    return None if increases is None else histogram_quantile(q, increases)


def window_quantiles(
    q: float, series: Mapping[Labels, Points], start: float | None = None, end: float | None = None
) -> dict[Labels, float | None]:
    """`window_quantile` for every histogram in a `<name>_bucket` query result."""
    return {labels: window_quantile(q, buckets, start, end) for labels, buckets in group_buckets(series).items()}
