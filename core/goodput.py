"""Goodput bounds from per-objective histograms: the arithmetic every reader shares (docs/goodput.md).

An engine exports one histogram per objective (TTFT, per-request TPOT, end to end) and no joint
distribution: which requests were slow to the first token and which were slow per token is not
known. So the share of requests that met every objective at once is known only between the
Fréchet bounds of the per-objective shares a_i:

    upper = min a_i                       (a request good on all is good on each)
    lower = max(0, 1 - sum(1 - a_i))      (at most sum(1 - a_i) requests missed one)

Each a_i is itself an interval when the objective's bound falls between two bucket bounds: at
least the share under the bucket bound below it, at most the share under the one above.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Attainment:
    """Requests of one objective: `total` counted, at least `good_lo` and at most `good_hi` within
    the bound (equal when the bound is a bucket bound)."""

    good_lo: float
    good_hi: float
    total: float

    @property
    def share(self) -> tuple[float, float]:
        """(lowest, highest) share of requests within the bound; total must be > 0."""
        return self.good_lo / self.total, self.good_hi / self.total

    def __add__(self, other: Attainment) -> Attainment:
        return Attainment(self.good_lo + other.good_lo, self.good_hi + other.good_hi, self.total + other.total)


def attainment(buckets: Sequence[tuple[float, float]], bound: float) -> Attainment | None:
    """Requests within `bound` from cumulative buckets [(le, count)] (one histogram's increase over
    a window, +Inf included). None without a +Inf bucket or with no request counted."""
    pts = sorted((float(le), float(n)) for le, n in buckets if not math.isnan(n))
    if not pts or not math.isinf(pts[-1][0]) or pts[-1][1] <= 0:
        return None
    total = pts[-1][1]
    below = [n for le, n in pts if le <= bound + 1e-9]
    above = [n for le, n in pts if le >= bound - 1e-9]
    # cumulative counts of a counter read at two moments can dip by a reset or a late scrape: clamp
    lo = min(max(below), total) if below else 0.0
    hi = min(above[0], total) if above else total
    return Attainment(lo, max(lo, hi), total)


@dataclass(frozen=True)
class Goodput:
    """The share of requests that met every objective read, as bounds; `lower` is None when an
    objective could not be read (a request failing it would not be seen)."""

    lower: float | None
    upper: float | None
    read: tuple[str, ...]
    not_evaluable: tuple[str, ...]


def frechet(shares: Mapping[str, tuple[float, float]], not_evaluable: Sequence[str] = ()) -> Goodput:
    """Goodput bounds from each read objective's (lowest, highest) share (module docstring)."""
    read = tuple(shares)
    if not read:
        return Goodput(None, None, (), tuple(not_evaluable))
    upper = min(hi for _, hi in shares.values())
    lower = max(0.0, 1.0 - sum(1.0 - lo for lo, _ in shares.values()))
    return Goodput(None if not_evaluable else min(lower, upper), upper, read, tuple(not_evaluable))
