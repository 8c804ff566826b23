"""Guarded ratios: a missing or zero denominator gives None, never 0 or an exception.

Used for hit ratios (prefix-cache hits / queries), utilisation (used / total) and shares
(one tenant's part of a whole). None means "cannot be known from the data", which rules treat
differently from a real 0.
"""

from __future__ import annotations

import math


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator; None when either is absent or not finite or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    if not (math.isfinite(numerator) and math.isfinite(denominator)):
        return None
    return numerator / denominator


def fraction(part: float | None, whole: float | None) -> float | None:
    """part / whole for a part of a non-negative whole, clamped to [0, 1].

    The two are usually read from different counters at slightly different instants (a
    cache-hit counter and a query counter), so a part can overshoot its whole by one scrape;
    the clamp absorbs that. None when the whole is absent or not positive.
    """
    if whole is None or whole <= 0:
        return None
    value = ratio(part, whole)
    return None if value is None else min(1.0, max(0.0, value))
