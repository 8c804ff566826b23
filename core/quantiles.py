"""`histogram_quantile` with Prometheus semantics over (le, cumulative count) buckets: linear
interpolation inside the bucket holding the rank, the +Inf bucket answered with the highest finite
bound, counts forced monotonic, None without observations. Windowed quantiles over stored points:
testbed/promref.py (the test reference for the diagnoser's grid)."""

from __future__ import annotations

import math
from collections.abc import Sequence

Bucket = tuple[float, float]  # (upper bound `le`, cumulative count)


def histogram_quantile(q: float, buckets: Sequence[Bucket]) -> float | None:
    """The q-quantile of (le, cumulative count) pairs in any order; None without observations, with
    fewer than two buckets or no +Inf bucket; q < 0 gives -inf and q > 1 +inf, as in Prometheus."""
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
