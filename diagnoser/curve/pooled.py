"""Adaptive buckets: sparse concurrency buckets pooled, each side weighted to the same mix of load.

A concurrency bucket is compared on its own only where both sides hold MIN_INTERVALS intervals
and MIN_REQUESTS requests in it. Load that moves leaves many buckets short of that: a closed
loop of 16 streams held 4.3 requests in the engine in one pass and 6.7 in the next, so its 6-12
intervals a side fall over three or four buckets, each too few alone. Here the buckets that are
not compared on their own are pooled, adjacent ones from the lowest up, until a pool holds
enough on both sides; a last pool short of it joins the one below it when they touch.

Within a pool the two sides are held at the same load by post-stratification: each bucket of the
pool weighs the smaller side's count of intervals in it on both sides (a bucket only one side
reached weighs nothing), spread evenly over that side's intervals there. So each side's merged
histogram and summed counters are the same mixture of loads, bucket by bucket, as a bucket
compared on its own is; only the share of each bucket is fixed by the data both sides have.
**Assumption**: within one bucket, load is matched (as for a bucket compared alone).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvscope.diagnoser.curve.bootstrap import Matched
from kvscope.diagnoser.curve.intervals import CONCURRENCY, WAITING, Intervals
from kvscope.diagnoser.curve.points import EDGES, MIN_INTERVALS, MIN_REQUESTS, placed

REQUESTS = "request_ttft_seconds_count"
PREEMPTIONS = "engine_preemptions_total"


class Load(NamedTuple):
    """One side's load in a pool, weighted as its metrics are (what `compare.same_batch` reads of
    a point): mean requests in the engine, mean waiting and preemptions per second (None: not
    exported)."""

    concurrency: float
    waiting: float | None
    preemptions_per_s: float | None


def _mean(values: np.ndarray | None, scale: np.ndarray) -> float | None:
    if values is None or np.isnan(values).all():
        return None
    ok = ~np.isnan(values)
    return float(np.average(values[ok], weights=scale[ok]))


def load(iv: Intervals, rows: np.ndarray, scale: np.ndarray | None) -> Load:
    """The load of one side of a pool (`Matched.side`; scale None: every row weighs one)."""
    w = np.ones(len(rows)) if scale is None else scale
    pre = iv.counters.get(PREEMPTIONS)
    wait = iv.gauges.get(WAITING)
    per_interval = _mean(None if pre is None else pre[rows], w)
    return Load(
        _mean(iv.gauges[CONCURRENCY][rows], w) or 0.0,
        _mean(None if wait is None else wait[rows], w),
        None if per_interval is None else per_interval / iv.step,
    )


def _stratum(b: np.ndarray, ok: np.ndarray, k: int) -> np.ndarray:
    return np.flatnonzero(ok & (b == k))


def _pool(before: Intervals, after: Intervals, strata: list[tuple[np.ndarray, np.ndarray]]) -> Matched | None:
    """The pool of these buckets' rows with their stratum weights; None where it holds too little."""
    rows: list[list[np.ndarray]] = [[], []]
    scales: list[list[np.ndarray]] = [[], []]
    weight = 0.0
    for rows_b, rows_a in strata:
        n = min(len(rows_b), len(rows_a))
        if not n:
            continue
        weight += n
        for side, r in enumerate((rows_b, rows_a)):
            rows[side].append(r)
            scales[side].append(np.full(len(r), n / len(r)))
    if weight < MIN_INTERVALS:
        return None
    out = []
    for side, iv in enumerate((before, after)):
        r, s = np.concatenate(rows[side]), np.concatenate(scales[side])
        order = np.argsort(r)
        r, s = r[order], s[order]
        requests = iv.counters.get(REQUESTS)
        if requests is None or float(np.nansum(requests[r] * s)) < MIN_REQUESTS:
            return None
        out.append((r, s))
    (rb, sb), (ra, sa) = out
    return Matched(rb, ra, weight, sb, sa)


def pools(before: Intervals, after: Intervals, taken: set[int]) -> list[Matched]:
    """The pools of adjacent buckets not in `taken` (the buckets compared on their own), lowest
    first, each as one matched bucket: both sides' rows with their stratum weights, and the
    weight of the pool (its intervals matched: the sum over its buckets of the smaller side's)."""
    (bb, okb), (ba, oka) = placed(before), placed(after)

    def pool(run: list[int]) -> Matched | None:
        return _pool(before, after, [(_stratum(bb, okb, k), _stratum(ba, oka, k)) for k in run])

    out: list[tuple[list[int], Matched]] = []
    run: list[int] = []
    for k in [*range(len(EDGES) - 1), None]:
        if k is None or k in taken:  # the run ends: a short tail joins the pool it touches
            if run and out and run[0] == out[-1][0][-1] + 1 and (m := pool(out[-1][0] + run)):
                out[-1] = (out[-1][0] + run, m)
            run = []
            continue
        run.append(k)
        if m := pool(run):
            out.append((run, m))
            run = []
    return [m for _, m in out]
