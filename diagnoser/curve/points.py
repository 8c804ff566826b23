"""The curve's points: intervals bucketed by concurrency, latency quantiles from merged histograms.

A bucket's TTFT/ITL quantiles come from the bucket increases summed over all its intervals, then
one histogram_quantile (never an average of per-interval percentiles). Each quantile carries a
95 % distribution-free interval (the binomial order-statistic interval for the rank, read off the
same merged histogram), each rate a 95 % normal interval over its intervals. A bucket with fewer
than `min_intervals` intervals or `min_requests` requests is flagged sparse and kept as measured:
it is never smoothed, and the knee and C_max do not read it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from kvscope.core.quantiles import histogram_quantile
from kvscope.diagnoser.curve.intervals import CONCURRENCY, WAITING, Intervals
from kvscope.diagnoser.curve.window import CONCURRENCY_SIGNAL

Z95 = 1.96
MIN_INTERVALS = 5
MIN_REQUESTS = 50
EDGES = np.array([0.5, 1.5, 2.5, 3.5, 5, 7, 10, 14, 20, 28, 40, 56, 80, 113, 160, 226, 320, 453, 640, 905, 1280])
"""Concurrency bucket edges: one running request wide up to 3, then about x1.41 (half a
doubling), so a bucket holds the normal jitter of a steady load. Below 0.5 the engine is idle."""

Interval = tuple[float, float] | None


@dataclass
class Point:
    """One concurrency bucket of a pool's curve (per instance)."""

    concurrency: float  # mean requests in the engine (intervals.CONCURRENCY) over its intervals
    bucket: tuple[float, float]  # its edges
    intervals: int
    requests: float | None  # requests with a first token in it (the TTFT histogram's count)
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    ttft_p99_ci: Interval
    itl_p50_s: float | None
    itl_p99_s: float | None
    itl_p99_ci: Interval
    rps: float | None  # finished requests per second per instance
    rps_ci: Interval
    output_tokens_per_s: float | None
    output_tokens_per_s_ci: Interval
    kv_usage: float | None
    waiting: float | None  # mean requests waiting per instance
    preemptions_per_s: float | None
    sparse: bool
    running: float | None = None  # mean requests running per instance (None: not read, as from the records)
    tpot_p99_s: float | None = None  # per-request TPOT p99 (None: the engine exports no per-request histogram)
    e2e_p99_s: float | None = None  # end-to-end p99 (None: not exported, or read from the records)

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


def _q(q: float, les: np.ndarray, counts: np.ndarray) -> float | None:
    return histogram_quantile(q, list(zip(les.tolist(), counts.tolist(), strict=True)))


def quantile_ci(q: float, les: np.ndarray, counts: np.ndarray) -> tuple[float | None, Interval]:
    """The q-quantile of merged cumulative bucket counts and its 95 % interval (ranks
    q ± 1.96 sqrt(q(1-q)/n), clipped to [0, 1])."""
    n = float(counts[-1]) if len(counts) else 0.0
    value = _q(q, les, counts)
    if value is None or n <= 0:
        return None, None
    half = Z95 * math.sqrt(q * (1 - q) / n)
    lo, hi = _q(max(0.0, q - half), les, counts), _q(min(1.0, q + half), les, counts)
    return value, (lo, hi) if lo is not None and hi is not None else None


Moments = tuple[int, float, float]
"""(values present, their sum, the sum of their squares): all a mean and its interval need."""


def moments(values: np.ndarray) -> Moments:
    v = values[~np.isnan(values)]
    return len(v), float(v.sum()), float((v * v).sum())


def _rate(m: Moments, seconds: float) -> tuple[float | None, Interval]:
    """Mean per-second rate over intervals and its 95 % interval; None when absent."""
    n, total, squares = m
    if not n:
        return None, None
    mean = total / n / seconds
    var = max(0.0, (squares - total * total / n) / (n - 1)) if n > 1 else math.inf
    half = Z95 * math.sqrt(var) / seconds / math.sqrt(n)
    return mean, (max(0.0, mean - half), mean + half)


def _mean(m: Moments) -> float | None:
    return m[1] / m[0] if m[0] else None


@dataclass
class BucketSums:
    """What one concurrency bucket's intervals add up to: everything its point is computed from,
    whether summed here from a window's intervals or by the TSDB's recording rules (records.py)."""

    intervals: int
    concurrency: float  # the sum of the intervals' concurrency
    hists: dict[str, tuple[np.ndarray, np.ndarray]]  # bounds, bucket increases summed (cumulative)
    counters: dict[str, Moments]  # per-interval increases
    gauges: dict[str, Moments]  # per-interval means


def point_of(k: int, s: BucketSums, seconds: float, min_intervals: int, min_requests: int) -> Point:
    """Bucket k's point from its sums; `seconds`: the length of one interval."""
    quant: dict[str, tuple] = {}
    for h, (les, merged) in s.hists.items():
        merged = np.maximum.accumulate(merged)
        p50, _ = quantile_ci(0.5, les, merged)
        p99, ci = quantile_ci(0.99, les, merged)
        quant[h] = (p50, p99, ci, float(merged[-1]))
    ttft = quant.get("request_ttft_seconds", (None, None, None, None))
    itl = quant.get("request_itl_seconds", (None, None, None, None))
    none: Moments = (0, 0.0, 0.0)
    rps, rps_ci = _rate(s.counters.get("engine_requests_finished_total", none), seconds)
    tok, tok_ci = _rate(s.counters.get("engine_generation_tokens_total", none), seconds)
    pre, _ = _rate(s.counters.get("engine_preemptions_total", none), seconds)
    requests = ttft[3]
    return Point(
        concurrency=round(s.concurrency / s.intervals, 3),
        bucket=(float(EDGES[k]), float(EDGES[k + 1])),
        intervals=s.intervals,
        requests=requests,
        ttft_p50_s=ttft[0],
        ttft_p99_s=ttft[1],
        ttft_p99_ci=ttft[2],
        itl_p50_s=itl[0],
        itl_p99_s=itl[1],
        itl_p99_ci=itl[2],
        rps=rps,
        rps_ci=rps_ci,
        output_tokens_per_s=tok,
        output_tokens_per_s_ci=tok_ci,
        kv_usage=_mean(s.gauges.get("engine_kv_cache_usage_ratio", none)),
        waiting=_mean(s.gauges.get("engine_requests_waiting", none)),
        preemptions_per_s=pre,
        sparse=s.intervals < min_intervals or (requests is not None and requests < min_requests),
        running=_mean(s.gauges.get(CONCURRENCY_SIGNAL, none)),
        tpot_p99_s=quant.get("request_tpot_seconds", (None, None))[1],
        e2e_p99_s=quant.get("request_e2e_seconds", (None, None))[1],
    )


def bucket_of(concurrency: np.ndarray) -> np.ndarray:
    """Bucket index per value (-1: idle, below the first edge; len(EDGES)-1 beyond the last)."""
    return np.searchsorted(EDGES, concurrency, side="right") - 1


def placed(iv: Intervals) -> tuple[np.ndarray, np.ndarray]:
    """(bucket per interval, whether it is placed). An interval is left out when the engine was idle
    or when the standard error of its concurrency (intervals.py: Little's law's edge error weighed
    with the gauges' samples, or the gauges' alone) is wider than its bucket: which bucket the
    interval belongs to is unknown, and it is not guessed."""
    conc = iv.gauges[CONCURRENCY]
    b = bucket_of(conc)
    inside = (b >= 0) & (b < len(EDGES) - 1)
    width = np.diff(EDGES)[np.clip(b, 0, len(EDGES) - 2)]
    return b, inside & ~(iv.spread > width)


def coarse_share(iv: Intervals) -> float:
    """Share of busy intervals left out because their concurrency is less certain than a bucket is
    wide (the gauges swung faster than they were sampled and no latency sum integrates them)."""
    b, ok = placed(iv)
    busy = b >= 0
    return float((busy & ~ok).sum() / busy.sum()) if busy.any() else 0.0


def curve_points(iv: Intervals, min_intervals: int = MIN_INTERVALS, min_requests: int = MIN_REQUESTS) -> list[Point]:
    """The pool's points, lowest concurrency first; buckets without intervals are not points."""
    b, ok = placed(iv)
    out = []
    for k in np.unique(b[ok]):
        sel = ok & (b == k)
        sums = BucketSums(
            intervals=int(sel.sum()),
            concurrency=float(iv.gauges[CONCURRENCY][sel].sum()),
            hists={h: (les, np.nansum(arr[sel], axis=0)) for h, (les, arr) in iv.hists.items()},
            counters={name: moments(c[sel]) for name, c in iv.counters.items()},
            gauges={
                name: moments(iv.gauges[name][sel])
                for name in ("engine_kv_cache_usage_ratio", WAITING, CONCURRENCY_SIGNAL)
            },
        )
        out.append(point_of(int(k), sums, iv.step, min_intervals, min_requests))
    return out
