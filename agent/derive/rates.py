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
