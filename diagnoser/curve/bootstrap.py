"""The uncertainty of a comparison at matched load: a block bootstrap over intervals.

A bucket's TTFT p99 comes from the merged histogram of its intervals; the order-statistic interval
of that quantile treats every request as independent of every other, and the rates' normal
interval treats every interval so. On a shared box neither holds: the engine's step time drifts
with the machine's load from one interval to the next, and the requests of one interval share it.
Here each side's intervals are resampled with replacement, within each matched concurrency bucket
(the comparison holds the bucket fixed), in blocks of consecutive intervals of one instance (so a
drift that lasts several intervals moves a whole block), and each metric is recomputed from the
resampled intervals exactly as the point computes it: quantiles from the merged bucket increases,
rates and means from the summed counters. The spread of the replicates is the spread of the
estimate under the drift the side itself shows; drift that lands exactly at the change, and nowhere
inside either side, is not in it (nothing in the metrics tells it from the change).

Block length: chosen from the side's own autocorrelation (`block_length`: Politis and White 2004,
with Patton, Politis and White's 2009 correction, for the circular block bootstrap) on the series
the drift shows in, the output tokens per interval of each instance in time: a side whose load
drifts slowly gets long blocks and so a wide interval, a side that holds still gets short ones.
Seeded: the same window gives the same intervals.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from kvscope.diagnoser.curve.intervals import Intervals
from kvscope.diagnoser.evaluate.grid import quantile_from_planes

REPLICATES = 400
SEED = 55
LEVEL = 0.95

Totals = Callable[[np.ndarray], np.ndarray]
"""x [rows] or [rows, k] -> per replicate the sum of x over its rows, each weighed by how often the
replicate holds it: [replicates] or [replicates, k]."""

Stat = Callable[[Intervals, Totals], np.ndarray]
"""(intervals of one bucket-side, their `Totals`) -> the metric per replicate."""


def _acf(series: list[np.ndarray], lags: int) -> np.ndarray:
    """Autocovariances R(0..lags) pooled over the series (each about its own mean)."""
    out, n = np.zeros(lags + 1), 0
    for x in series:
        x = x - x.mean()
        for k in range(min(lags, len(x) - 1) + 1):
            out[k] += float(x[: len(x) - k] @ x[k:])
        n += len(x)
    return out / max(n, 1)


def block_length(iv: Intervals, series: str = "engine_generation_tokens_total") -> float:
    """The circular block bootstrap's block length for these intervals (Politis-White): from the
    autocorrelation of `series` per instance in time order. 1 where the series is absent or flat."""
    parts = []
    for u in np.unique(iv.unit):
        x = iv.counters.get(series, np.full(len(iv), np.nan))[iv.unit == u]
        x = x[np.argsort(iv.t_end[iv.unit == u], kind="stable")]
        x = x[~np.isnan(x)]
        if len(x) > 2:
            parts.append(x)
    n = sum(len(x) for x in parts)
    if n < 4:
        return 1.0
    k_n = max(5, math.ceil(math.sqrt(math.log10(n))))
    m_max = math.ceil(math.sqrt(n)) + k_n
    r = _acf(parts, m_max + k_n)
    if r[0] <= 0:
        return 1.0
    rho, bound = r / r[0], 2.0 * math.sqrt(math.log10(n) / n)
    m_hat = next((m for m in range(1, m_max + 1) if np.all(np.abs(rho[m : m + k_n]) < bound)), m_max)
    big_m = min(2 * m_hat, m_max)
    k = np.arange(-big_m, big_m + 1)
    t = np.abs(k) / big_m
    lam = np.where(t <= 0.5, 1.0, 2.0 * (1.0 - t))
    rk = r[np.abs(k)]
    g = float(np.sum(lam * np.abs(k) * rk))
    d = 4.0 / 3.0 * float(np.sum(lam * rk)) ** 2
    if d <= 0:
        return 1.0
    return max(1.0, (2.0 * g * g / d) ** (1 / 3) * n ** (1 / 3))


def weighted(w: np.ndarray) -> Totals:
    """Totals under explicit weights [replicates, rows] (the point estimate: one replicate)."""
    return lambda x: w @ x


def resampled(
    iv: Intervals,
    rows: np.ndarray,
    rng: np.random.Generator,
    replicates: int,
    length: float,
    scale: np.ndarray | None = None,
) -> Totals:
    """Totals over `replicates` resamples of `rows` (each row times its `scale`): blocks of `length`
    consecutive intervals (per instance, in time) drawn with replacement until the replicate holds
    as many intervals as the side, the last block drawn cut there. A replicate's total is the sum
    over the blocks it drew of each block's total, plus the cut block's first rows: the rows'
    weights are never written out ([replicates, rows] for every metric)."""
    n = len(rows)
    # at most min(3 sqrt(n), n / 3) (Patton's bound on the estimate): at least three blocks, so a
    # side whose drift is as long as the side itself never resamples into one block, which
    # would repeat the side and give an interval of zero width
    size = max(1, min(math.ceil(length), math.ceil(min(3 * math.sqrt(n), n / 3))))
    # each instance's rows in time order, cut into blocks of `size`: block b's rows are padded[b],
    # padded with n where it is short (an instance's last block), which reads a zero row
    order = np.lexsort((iv.t_end[rows], iv.unit[rows]))  # by instance, then in time
    unit = iv.unit[rows][order]
    starts = np.flatnonzero(np.r_[True, unit[1:] != unit[:-1]])
    counts = np.diff(np.r_[starts, n])  # rows per instance
    at = np.arange(n) - np.repeat(starts, counts)  # each row's position in its instance
    per_unit = -(-counts // size)  # blocks per instance
    block = np.repeat(np.cumsum(per_unit) - per_unit, counts) + at // size
    padded = np.full((int(per_unit.sum()), size), n)
    padded[block, at % size] = order
    draws = math.ceil(n / size) + 1
    picks = rng.integers(0, len(padded), size=(replicates, draws))
    lens = np.bincount(block, minlength=len(padded))[picks]
    taken = np.cumsum(lens, axis=1)
    # each replicate's blocks end to end: those that end within n intervals count whole, the one
    # that crosses n counts its first n - (what came before) rows
    each = np.arange(replicates)
    whole = np.bincount((each[:, None] * len(padded) + picks)[taken <= n], minlength=replicates * len(padded))
    whole = whole.reshape(replicates, len(padded)).astype(float)
    cut = np.argmax(taken > n, axis=1)
    cut_block = picks[each, cut]
    cut_rows = np.where(taken[:, -1] > n, n - (taken[each, cut] - lens[each, cut]), 0)

    def totals(x: np.ndarray) -> np.ndarray:
        x2 = x.reshape(n, -1) * (1.0 if scale is None else scale[:, None])
        within = np.cumsum(np.vstack([x2, np.zeros((1, x2.shape[1]))])[padded], axis=1)
        head = np.concatenate([np.zeros((len(padded), 1, x2.shape[1])), within], axis=1)
        out = whole @ within[:, -1] + head[cut_block, cut_rows]
        return out.reshape(replicates, *x.shape[1:])

    return totals


def _absent(iv: Intervals, totals: Totals) -> np.ndarray:
    """NaN for every replicate (the metric's series are absent)."""
    return np.full(len(totals(np.empty((len(iv), 0)))), np.nan)


def quantile_stat(name: str, q: float) -> Stat:
    """The q-quantile of the merged increases of histogram `name` per replicate (NaN: none)."""

    def stat(iv: Intervals, totals: Totals) -> np.ndarray:
        if name not in iv.hists:
            return _absent(iv, totals)
        les, arr = iv.hists[name]
        return quantile_from_planes(q, les, np.maximum.accumulate(totals(np.nan_to_num(arr)), axis=1).T)

    return stat


def ratio_stat(num: str, den: str | None, seconds: float = 1.0) -> Stat:
    """Per replicate: the summed counter `num` over the summed counter `den` (over the intervals
    where both are present; `den` None: per interval of `seconds`, a row holding `iv.weight`
    engine-intervals). NaN where absent."""

    def stat(iv: Intervals, totals: Totals) -> np.ndarray:
        a = iv.counters.get(num)
        b = iv.counters.get(den) if den else np.full(len(iv), seconds) * (1.0 if iv.weight is None else iv.weight)
        if a is None or b is None:
            return _absent(iv, totals)
        ok = ~np.isnan(a) & ~np.isnan(b)
        top, bottom = totals(np.where(ok[:, None], np.column_stack([a, b]), 0.0)).T
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.where(bottom > 0, top / np.where(bottom > 0, bottom, 1.0), np.nan)

    return stat


class Matched(NamedTuple):
    """One matched bucket: each side's rows (ascending), the bucket's weight in the mean over
    buckets, and per side a weight per row (None: every row weighs one; a pooled bucket's rows
    weigh their stratum's share, compare.pooled)."""

    rows_b: np.ndarray
    rows_a: np.ndarray
    weight: float
    scale_b: np.ndarray | None = None
    scale_a: np.ndarray | None = None

    def side(self, s: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(rows, scale) of the before side (0) or the after side (1)."""
        return (self.rows_b, self.scale_b) if s == 0 else (self.rows_a, self.scale_a)


def matched_replicates(
    before: Intervals,
    after: Intervals,
    buckets: list[Matched],
    stats: dict[str, Stat],
    replicates: int = REPLICATES,
    only: dict[str, list[bool]] | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per metric, (before, after) per replicate: the bucket-weighted mean over the matched buckets
    of the metric recomputed on each side's resampled intervals (each drawn row times its scale);
    `only`: per metric, which buckets it is read at (default every one). A replicate whose bucket
    has no value for a metric weighs the buckets that have one."""
    rng = np.random.default_rng(SEED)
    sums = {m: [np.zeros(replicates), np.zeros(replicates)] for m in stats}
    weights = {m: [np.zeros(replicates), np.zeros(replicates)] for m in stats}
    lengths = block_length(before), block_length(after)
    for k, bucket in enumerate(buckets):
        for side, iv in enumerate((before, after)):
            rows, scale = bucket.side(side)
            totals = resampled(iv, rows, rng, replicates, lengths[side], scale)
            part = iv.take(rows)
            for m, stat in stats.items():
                if only and m in only and not only[m][k]:
                    continue
                v = stat(part, totals)
                have = ~np.isnan(v)
                sums[m][side] += np.where(have, v * bucket.weight, 0.0)
                weights[m][side] += np.where(have, bucket.weight, 0.0)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for m in stats:
            b, a = (sums[m][s] / np.where(weights[m][s] > 0, weights[m][s], np.nan) for s in (0, 1))
            out[m] = (b, a)
    return out


def interval(values: np.ndarray, level: float = LEVEL) -> list[float] | None:
    """The central `level` percentile interval of the replicates (NaN replicates left out)."""
    v = values[~np.isnan(values)]
    if not len(v):
        return None
    tail = 100 * (1 - level) / 2
    return [float(np.percentile(v, tail)), float(np.percentile(v, 100 - tail))]
