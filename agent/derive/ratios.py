"""Guarded ratios: a missing or zero denominator gives None, never 0 or an exception.

Used for hit ratios (prefix-cache hits / queries), utilisation (used / total) and shares
(one tenant's part of a whole). None means "cannot be known from the data", which rules treat
differently from a real 0.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


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


def ratios_by_key(
    numerators: Mapping[K, float | None], denominators: Mapping[K, float | None]
) -> dict[K, float | None]:
    """`ratio` per key of the denominators; a key without a numerator gives None."""
    return {k: ratio(numerators.get(k), d) for k, d in denominators.items()}


def shares(parts: Mapping[K, float | None]) -> dict[K, float | None]:
    """Each part's `fraction` of the sum of the known parts (None parts are left out of the sum)."""
    whole = sum(v for v in parts.values() if v is not None and v > 0)
    return {k: (None if v is None else fraction(v, whole)) for k, v in parts.items()}
