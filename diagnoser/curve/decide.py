"""How much more traffic, at which load, would decide a change that had no bucket in common, or
whose matched buckets left an interval straddling a threshold.

A change is judged only at the concurrency buckets both sides measured densely (points.py:
MIN_INTERVALS intervals and MIN_REQUESTS requests). Where none is, the verdict is
`not_comparable` and this says, per bucket either side reached, how many more intervals of
traffic at that load each side needs to make the bucket comparable: the intervals it lacks, or
the intervals its requests per interval there (or the other side's, where it has none) take to
reach the requests it lacks, whichever is more. Sorted by the seconds of traffic the bucket
still needs, fewest first: the load to hold next to decide the change.

The intervals are at that load. On load that moves, most of the next traffic lands at other
loads, so each side also says the wall time it would take at the mix of load it held so far
(`more_wall_seconds`: the intervals asked over the side's share of its intervals at that bucket).
An estimate that holds while the traffic keeps its shape; a side with no interval at the bucket
has no share, and no wall time is said for it.
"""

from __future__ import annotations

import math

from kvscope.diagnoser.curve.compare import At, Thresholds, undecided
from kvscope.diagnoser.curve.points import MIN_INTERVALS, MIN_REQUESTS, Point

SHOWN = 3
"""Buckets listed (the ones that need the least traffic)."""


def _needed(p: Point | None, other: Point | None) -> int | None:
    """Intervals one side still needs at a bucket (0: dense already); None where neither side
    says how many requests an interval there holds."""
    have, reqs = (p.intervals, p.requests or 0.0) if p else (0, 0.0)
    more = max(MIN_INTERVALS - have, 0)
    if reqs >= MIN_REQUESTS:
        return more
    src = p if p and p.requests else other
    if src is None or not src.requests or not src.intervals:
        return None
    per = src.requests / src.intervals
    return max(more, math.ceil((MIN_REQUESTS - reqs) / per))


def wall_seconds(more: int | None, have: int, total: int | None, step: float) -> float | None:
    """The seconds of traffic shaped as one side's so far that put `more` intervals at a bucket
    where it has `have` intervals in a side `total` scrape intervals long (several engines: their
    intervals over the side's length; None: no share read, or nothing asked)."""
    if not more or not have or not total:
        return None
    return math.ceil(more * total / have) * step


Ask = tuple[tuple, float, tuple[tuple[int, float | None, int | None], ...]]
"""A bucket, its concurrency, and per side (before, after): (intervals, requests (None: not read),
more intervals it needs; None: not estimable)."""


def _least(asks: list[Ask], step: float, totals: tuple[int, int] | None) -> list[dict]:
    """The asks as {bucket, concurrency, before, after}, each side {intervals, requests,
    more_intervals, more_seconds, more_wall_seconds} (`wall_seconds` from `totals`), at most
    SHOWN, the least traffic (both sides' seconds; a side not estimable: last) first."""
    out: list[tuple[float, dict]] = []
    for bucket, concurrency, sides in asks:
        row: dict = {"bucket": list(bucket), "concurrency": concurrency}
        for k, (name, (have, reqs, n)) in enumerate(zip(("before", "after"), sides, strict=True)):
            row[name] = {
                "intervals": have,
                "requests": reqs,
                "more_intervals": n,
                "more_seconds": None if n is None else n * step,
                "more_wall_seconds": wall_seconds(n, have, totals and totals[k], step),
            }
        out.append((sum(math.inf if n is None else n * step for _, _, n in sides), row))
    return [row for _, row in sorted(out, key=lambda t: t[0])][:SHOWN]


def more_traffic(
    before: list[Point], after: list[Point], step: float, totals: tuple[int, int] | None = None
) -> list[dict]:
    """Per bucket either side measured, {bucket, concurrency, before, after} with each side's
    {intervals, requests, more_intervals, more_seconds, more_wall_seconds} (more_* None: not
    estimable; the wall time from `totals`, each side's length in scrape intervals), at most
    SHOWN, the least traffic first; [] where a bucket is dense on both sides already."""
    b_by, a_by = {p.bucket: p for p in before}, {p.bucket: p for p in after}
    asks: list[Ask] = []
    for bucket in sorted(set(b_by) | set(a_by)):
        b, a = b_by.get(bucket), a_by.get(bucket)
        if b and a and not b.sparse and not a.sparse:
            return []
        conc = [p.concurrency for p in (b, a) if p]
        sides = tuple(
            (p.intervals if p else 0, p.requests if p else 0.0, _needed(p, other)) for p, other in ((b, a), (a, b))
        )
        asks.append((bucket, round(sum(conc) / len(conc), 3), sides))
    return _least(asks, step, totals)


def _factor(point: float | None, iv: list[float] | None, t: float) -> float | None:
    """(h / r)^2 on one scale where its interval straddles +-t: h its half-width, r the distance
    from the estimate to the threshold inside it; None where it straddles neither or r is under a
    tenth of t (the estimate sits on the threshold: no amount is estimable)."""
    if point is None or not iv:
        return None
    inside = [x for x in (t, -t) if iv[0] < x < iv[1]]
    if not inside:
        return None
    room = min(abs(point - x) for x in inside)
    return None if room < 0.1 * t else ((iv[1] - iv[0]) / 2 / room) ** 2


def more_to_settle(
    d: dict, th: Thresholds, matched: list[At], step: float, totals: tuple[int, int] | None = None
) -> list[dict]:
    """Where buckets matched and some metric's interval neither clears the thresholds nor rules
    them out (`compare.undecided`): per matched bucket or pool (`compare.At`; a pool by its outer
    edges), as `more_traffic`, the intervals each side would add, every matched bucket alike, for
    the intervals to settle it, if the change stayed at its estimate and the interval narrowed as
    one over the square root of the intervals (the bootstrap's own rate on a stationary side): for
    each undecided metric, on the scale (absolute or relative) whose interval straddles its
    threshold and needs the least, (h / r)^2 times the intervals (`_factor`); the metric needing
    the most sets it, and `totals` (each side's length in scrape intervals) the wall time at each
    side's mix of load (`wall_seconds`). An estimate, said as one. [] where none is estimable."""
    factor = 0.0
    for m in undecided(d, th):
        x = d[m]
        scales = (
            _factor(x.get("delta"), x.get("interval"), getattr(th, m)),
            _factor(x.get("relative"), x.get("relative_interval"), th.relative),
        )
        known = [f for f in scales if f is not None]
        if not known:
            return []
        factor = max(factor, min(known))
    if factor <= 1.0:
        return []
    asks: list[Ask] = []
    for at in matched:
        more = tuple(math.ceil(have * (factor - 1.0)) for have in at.intervals)
        asks.append((at.bucket, at.concurrency, tuple(zip(at.intervals, at.requests, more, strict=True))))
    return _least(asks, step, totals)
