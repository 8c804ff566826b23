"""Scalar Prometheus arithmetic: the reference the product's vectorised code is checked against.

`increase`/`rate` with Prometheus' extrapolation to the window edges and `window_quantile`
(`histogram_quantile(q, rate(<name>_bucket[window]))`) over `(ts, value)` points, checked bit for
bit against promtool (tests/unit/test_quantiles.py); the diagnoser's grid (diagnoser/evaluate)
and the store's change points are tested against them. Points are sorted by time; a window with
fewer than two points has no rate: None, never 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kvscope.core.quantiles import Bucket, histogram_quantile
from kvscope.core.rates import Points
from kvscope.core.signals import Labels


def raw_increase(points: Points) -> float | None:
    """Increase between the first and last point, resets included, without extrapolation.
    None with fewer than two points."""
    if len(points) < 2:
        return None
    # last - first, plus the value lost at each reset: the sum of `deltas`, computed in the
    # order Prometheus uses so that results agree to the last bit.
    result = points[-1][1] - points[0][1]
    prev = 0.0
    for _, v in points:
        if v < prev:
            result += prev
        prev = v
    return result


def increase(points: Points, start: float | None = None, end: float | None = None) -> float | None:
    """Increase over the window [start, end].

    Without bounds this is `raw_increase`. With bounds it extrapolates to the window edges the
    way Prometheus' `increase()` does: towards an edge by at most half an average sample
    interval when the series starts or ends well inside the window (a gap, a new series), and
    never below a counter value of zero at the start. None with fewer than two points.

    Checked bit for bit against promtool 2.42 (tests/unit/test_quantiles.py). One edge follows
    Prometheus 3 rather than 2.x: the zero clamp applies after the half-interval rule, so a
    counter that starts inside the window is stretched by min(half an interval, time to zero);
    2.x clamps first and may then stretch the full time to zero.
    """
    raw = raw_increase(points)
    if raw is None or start is None or end is None:
        return raw
    factor = _extrapolation(points, raw, start, end)
    return None if factor is None else raw * factor


def _extrapolation(points: Points, raw: float, start: float, end: float) -> float | None:
    """The factor that stretches the sampled span to the window (see `increase`)."""
    first_ts, first_v = points[0]
    last_ts = points[-1][0]
    sampled = last_ts - first_ts
    if sampled <= 0:
        return None
    avg_interval = sampled / (len(points) - 1)
    threshold = avg_interval * 1.1
    to_start = max(0.0, first_ts - start)
    to_end = max(0.0, end - last_ts)
    extend_start = to_start if to_start < threshold else avg_interval / 2
    extend_end = to_end if to_end < threshold else avg_interval / 2
    if raw > 0 and first_v >= 0:  # never extrapolate the counter below zero
        extend_start = min(extend_start, sampled * (first_v / raw))
    return (sampled + extend_start + extend_end) / sampled


def rate(points: Points, start: float | None = None, end: float | None = None) -> float | None:
    """Per-second rate: `increase` divided by the window (or by the sampled span without bounds).
    With bounds the arithmetic follows Prometheus' `rate()` step for step (one scale factor)."""
    raw = raw_increase(points)
    if raw is None:
        return None
    if start is None or end is None:
        span = points[-1][0] - points[0][0]
        return raw / span if span > 0 else None
    factor = _extrapolation(points, raw, start, end)
    if factor is None or end <= start:
        return None
    return raw * (factor / (end - start))


def parse_le(text: str) -> float | None:
    """The `le` label as a float ("+Inf" included); None when it is not a number."""
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


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
