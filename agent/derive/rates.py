"""Increase and rate of counter series, surviving counter resets.

Points are `(timestamp_s, value)` pairs sorted by time, as `Store.query` returns them. A counter
that goes down was reset (the engine restarted): the increase across the reset is the value
after it, as in Prometheus, so a restart never produces a negative rate or a spike. A window
holding fewer than two points has no rate: the functions return None, never 0.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

import numpy as np

Points = Sequence[tuple[float, float]]


def deltas(points: Points) -> list[tuple[float, float]]:
    """Reset-aware increase between each point and the one before, stamped at the later point."""
    out: list[tuple[float, float]] = []
    for (_, prev), (ts, cur) in zip(points, points[1:], strict=False):
        out.append((ts, cur - prev if cur >= prev else cur))
    return out


def step_increases(values: np.ndarray) -> np.ndarray:
    """`deltas` for arrays: the increase from each value to the next along the last axis, a drop
    counted as a reset (the increase is the value after it). One element shorter than `values`;
    NaN where either value is NaN. Every counter reading in kvscope (the rule grid, the weekly
    report, the UI) takes its increases from here."""
    d = np.diff(values, axis=-1)
    np.copyto(d, values[..., 1:], where=d < 0)
    return d


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


def window(points: Points, start: float, end: float) -> list[tuple[float, float]]:
    """The points with start <= ts <= end (points sorted by time, as everywhere here)."""
    times = [t for t, _ in points]
    return list(points[bisect_left(times, start) : bisect_right(times, end)])
