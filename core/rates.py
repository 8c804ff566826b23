"""Reset-aware counter increases: a counter that goes down was reset (the engine restarted), and
the increase across the reset is the value after it, as in Prometheus, so a restart never gives
a negative rate or a spike. Points are `(timestamp_s, value)` pairs sorted by time. The scalar
`increase`/`rate` with Prometheus' window extrapolation are testbed/promref.py (test reference)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Points = Sequence[tuple[float, float]]


def deltas(points: Points) -> list[tuple[float, float]]:
    """Reset-aware increase between each point and the one before, stamped at the later point."""
    return [(ts, cur - prev if cur >= prev else cur) for (_, prev), (ts, cur) in zip(points, points[1:], strict=False)]


def step_increases(values: np.ndarray) -> np.ndarray:
    """`deltas` for arrays along the last axis (one element shorter; NaN where either value is NaN):
    the rule grid's and the weekly report's counter increases."""
    d = np.diff(values, axis=-1)
    np.copyto(d, values[..., 1:], where=d < 0)
    return d


INTERVAL_JITTER = 0.01
"""A measured interval within this fraction of a whole number of seconds (at least 1 s) is that
whole number (`configured_interval`)."""


def configured_interval(measured: float) -> float:
    """The scrape interval a scraper was configured at, from the interval measured between its
    scrapes: scrapers are configured in durations (`scrape_interval: 2s`) and start each scrape a
    little late or early (a loaded scraper, the clock read after the request went out), so the
    measured median is the configured interval plus jitter (2.001 s, 1.998 s, 2.0025 s in the
    incident library). A measured interval within INTERVAL_JITTER (1 %) of a whole number of
    seconds, at least 1 s, is that whole number; any other is kept as measured, to the
    millisecond (timestamps' resolution): 0.25 s, 1.5 s, and 2.05 s, which is no 2 s scraper's
    jitter."""
    ms, whole = round(measured * 1000), round(measured)
    if whole >= 1 and abs(ms - 1000 * whole) <= INTERVAL_JITTER * 1000 * whole:
        return float(whole)
    return ms / 1000
