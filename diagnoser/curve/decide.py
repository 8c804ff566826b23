"""How much more traffic, at which load, would decide a change that had no bucket in common.

A change is judged only at the concurrency buckets both sides measured densely (points.py:
MIN_INTERVALS intervals and MIN_REQUESTS requests). Where none is, the verdict is
`not_comparable` and this says, per bucket either side reached, how many more intervals of
traffic at that load each side needs to make the bucket comparable: the intervals it lacks, or
the intervals its requests per interval there (or the other side's, where it has none) take to
reach the requests it lacks, whichever is more. Sorted by the seconds of traffic the bucket
still needs, fewest first: the load to hold next to decide the change.
"""

from __future__ import annotations

import math

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


def more_traffic(before: list[Point], after: list[Point], step: float) -> list[dict]:
    """Per bucket either side measured, {bucket, concurrency, before, after} with each side's
    {intervals, requests, more_intervals, more_seconds} (more_* None: not estimable), at most
    SHOWN, the least traffic first; [] where a bucket is dense on both sides already."""
    b_by, a_by = {p.bucket: p for p in before}, {p.bucket: p for p in after}
    out: list[tuple[float, dict]] = []
    for bucket in sorted(set(b_by) | set(a_by)):
        b, a = b_by.get(bucket), a_by.get(bucket)
        if b and a and not b.sparse and not a.sparse:
            return []
        sides, seconds = {}, 0.0
        for name, p, other in (("before", b, a), ("after", a, b)):
            n = _needed(p, other)
            sides[name] = {
                "intervals": p.intervals if p else 0,
                "requests": p.requests if p else 0.0,
                "more_intervals": n,
                "more_seconds": None if n is None else n * step,
            }
            seconds += math.inf if n is None else n * step
        conc = [p.concurrency for p in (b, a) if p]
        out.append((seconds, {"bucket": list(bucket), "concurrency": round(sum(conc) / len(conc), 3)} | sides))
    return [x for _, x in sorted(out, key=lambda t: t[0])][:SHOWN]
