"""Vectorised series functions on a time grid: arrays [rows, T], NaN = absent.

The grid twins of `kvscope.agent.derive`'s scalar functions, with the same semantics
(tests/unit/test_diagnoser_grid.py checks them against each other), vectorised for fleet scale.

A trailing window of `k` steps at grid index t covers indices [t-k, t]. At the start of the data
the window is clipped to what exists, as Prometheus does with the samples inside a range.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from kvscope.core.rates import step_increases

_AGGS = ("sum", "max", "min", "avg", "median", "count")
_CHUNK_ROWS = 256
"""Rows per slice where a whole-block check would otherwise build a [rows, T] temporary."""


def ffill(values: np.ndarray, limit: int | None = None) -> np.ndarray:
    """Carry the last present value forward along time (rows independent), at most `limit` steps
    past it (None: any number); a new array."""
    k = np.arange(values.shape[1])[None, :]
    last = np.where(~np.isnan(values), k, -1)
    np.maximum.accumulate(last, axis=1, out=last)
    out = values[np.arange(values.shape[0])[:, None], last]  # -1 (nothing yet) is masked below
    out[(last < 0) if limit is None else (last < 0) | (k - last > limit)] = np.nan
    return out


def counter_rate(values: np.ndarray, k: int, step: float) -> np.ndarray:
    """Per-second rate of counters over a trailing window of k steps: the increase (a drop is a
    reset, counted as the value after it) from the window's first present point to t over the time
    between them, no extrapolation; NaN when t is absent or the window has one point."""
    present = ~np.isnan(values)
    adj = reset_adjusted(values) if present.all() else None
    if adj is not None:  # no gaps: increases of the reset-adjusted counters
        with np.errstate(invalid="ignore", divide="ignore"):
            return window_increase(adj, k) / (window_spans(values.shape[1], k) * step)
    filled = ffill(values)
    d = step_increases(filled)
    adj = np.concatenate([np.zeros((values.shape[0], 1)), np.cumsum(np.nan_to_num(d), axis=1)], axis=1)
    n_t = values.shape[1]
    t_idx = np.arange(n_t)[None, :]
    rows = np.arange(values.shape[0])[:, None]
    # the first present point in each window (after a gap it is not the window's start)
    nxt = np.minimum.accumulate(np.where(present, t_idx, n_t)[:, ::-1], axis=1)[:, ::-1]
    j = np.minimum(nxt[rows, np.maximum(t_idx - k, 0)], n_t - 1)
    span = t_idx - j
    inc = adj[rows, np.broadcast_to(t_idx, j.shape)] - adj[rows, np.minimum(j, n_t - 1)]
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = inc / (span * step)
    rate[(span <= 0) | ~present] = np.nan
    return rate


def reset_adjusted(values: np.ndarray) -> np.ndarray | None:
    """Gap-free counters with every reset undone (each series continues from where it was), or
    None when some series has gaps. Increases over any window are then one subtraction."""
    reset = np.zeros(values.shape[0], dtype=bool)
    for a in range(0, values.shape[0], _CHUNK_ROWS):  # small temporaries: no page-fault churn
        part = values[a : a + _CHUNK_ROWS]
        if np.isnan(part).any():
            return None
        if values.shape[1] >= 2:
            np.any(part[:, 1:] < part[:, :-1], axis=1, out=reset[a : a + _CHUNK_ROWS])
    if values.shape[1] < 2 or not reset.any():
        return values
    d = step_increases(values[reset])
    adj = values.copy()
    fixed = np.empty((int(reset.sum()), values.shape[1]))
    fixed[:, 0] = values[reset][:, 0]
    np.cumsum(d, axis=1, out=fixed[:, 1:])
    fixed[:, 1:] += fixed[:, :1]
    adj[reset] = fixed
    return adj


def window_increase(adjusted: np.ndarray, k: int) -> np.ndarray:
    """Increase over a trailing window of k steps of reset-adjusted counters (clipped at the
    start; NaN at the first point, which has no window)."""
    n_t = adjusted.shape[1]
    out = np.empty_like(adjusted)
    if n_t < 2:
        out[:] = np.nan
        return out
    k = max(1, min(k, n_t - 1))
    np.subtract(adjusted[:, k:], adjusted[:, :-k], out=out[:, k:])
    np.subtract(adjusted[:, :k], adjusted[:, :1], out=out[:, :k])
    out[:, 0] = np.nan
    return out


def window_spans(n_t: int, k: int) -> np.ndarray:
    """Steps covered by window_increase at each point (k, or fewer at the start)."""
    return np.minimum(np.arange(n_t, dtype=float), float(max(1, min(k, max(n_t - 1, 1)))))


def group_index(keys: list[tuple[str, ...]]) -> tuple[list[tuple[str, ...]], np.ndarray]:
    """Distinct keys (sorted) and, for each row, the index of its key."""
    distinct = sorted(set(keys))
    pos = {k: i for i, k in enumerate(distinct)}
    return distinct, np.fromiter((pos[k] for k in keys), dtype=np.int64, count=len(keys))


def reduce_groups(values: np.ndarray, inverse: np.ndarray, n_groups: int, agg: str) -> np.ndarray:
    """Aggregate rows into groups ignoring absent values; a group with none present is NaN."""
    if agg not in _AGGS:
        raise ValueError(f"unknown aggregation {agg!r}")
    n_t = values.shape[1]
    if values.shape[0] == 0:
        return np.full((n_groups, n_t), np.nan)
    if (
        agg in ("sum", "max", "min", "avg", "median")
        and len(inverse) == n_groups
        and np.array_equal(np.sort(inverse), np.arange(n_groups))
    ):
        if np.array_equal(inverse, np.arange(n_groups)):
            return values  # already one row per group, in group order
        out = np.empty_like(values)
        out[inverse] = values  # one series per group: the aggregate is the series
        return out
    order = np.argsort(inverse, kind="stable")
    sv, si = values[order], inverse[order]
    starts = np.flatnonzero(np.r_[True, si[1:] != si[:-1]])
    gids = si[starts]
    counts = np.add.reduceat(~np.isnan(sv), starts, axis=0).astype(float)
    red = _reduce_sorted(sv, starts, counts, agg)
    if agg != "count":
        red[counts == 0] = np.nan
    out = np.full((n_groups, n_t), np.nan)
    out[gids] = red
    return out


def _reduce_sorted(sv: np.ndarray, starts: np.ndarray, counts: np.ndarray, agg: str) -> np.ndarray:
    """`agg` over runs of rows sorted by group (each run starts at `starts`; `counts`: present
    values per run and time), absent values ignored."""
    if agg == "median":
        ends = list(starts[1:]) + [len(sv)]
        with _quiet_nan_warnings():
            return np.vstack([np.nanmedian(sv[a:b], axis=0) for a, b in zip(starts, ends, strict=True)])
    if agg == "count":
        return counts.copy()
    if agg == "max":
        return np.fmax.reduceat(sv, starts, axis=0)
    if agg == "min":
        return np.fmin.reduceat(sv, starts, axis=0)
    red = np.add.reduceat(_zero_nan(sv), starts, axis=0)
    if agg == "avg":
        with np.errstate(invalid="ignore", divide="ignore"):
            red = red / counts
    return red


def sum_dense_groups(values: np.ndarray, inverse: np.ndarray, n_groups: int) -> np.ndarray:
    """Sum rows without absent values into groups (a group without rows is 0).

    Few groups of many rows: each group's rows are summed where they lie (a strided view when
    evenly spaced), so the block is never copied. Many small groups: sorted, then reduceat."""
    order = np.argsort(inverse, kind="stable")
    si = inverse[order]
    starts = np.flatnonzero(np.r_[True, si[1:] != si[:-1]])
    out = np.zeros((n_groups, values.shape[1]))
    if len(starts) <= 4096:
        ends = np.r_[starts[1:], len(si)]
        for a, b in zip(starts, ends, strict=True):
            np.sum(_rows_view(values, order[a:b]), axis=0, out=out[si[a]])
        return out
    sorted_rows = values if (order == np.arange(len(order))).all() else values[order]
    out[si[starts]] = np.add.reduceat(sorted_rows, starts, axis=0)
    return out


def bucket_quantile(q: float, les: np.ndarray, buckets: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """histogram_quantile over [groups, buckets, T] of per-bucket cumulative rates; with `rows`
    ([groups, buckets] row numbers), `buckets` is [rows, T] and each group's buckets are read from
    it. `les` are the sorted upper bounds (the last is +Inf); absent counts are 0, counts are
    forced monotonic, and the rest is quantile_from_planes' Prometheus arithmetic."""
    gathered = np.moveaxis(buckets, 1, 0) if rows is None else buckets[rows.T]
    planes = _zero_nan(gathered)
    np.fmax.accumulate(planes, axis=0, out=planes)
    return quantile_from_planes(q, les, planes)


def window_bucket_planes(
    cumulative: np.ndarray, rows: np.ndarray, k: int, scratch: np.ndarray | None = None
) -> np.ndarray:
    """Per-bucket increases over a trailing window of k steps, forced monotonic: [buckets, G, T].

    `cumulative` holds gap-free, reset-adjusted bucket counters; `rows` [G, buckets] picks each
    group's buckets in `le` order. Increases are window_increase's, 0 at the first point. Written
    into `scratch` (1-D, at least buckets x G x T) when given, else into a new array.
    """
    n_g, n_b = rows.shape
    n_t = cumulative.shape[1]
    k = max(1, min(k, n_t - 1))
    size = n_b * n_g * n_t
    planes = (
        scratch[:size].reshape(n_b, n_g, n_t)
        if scratch is not None and scratch.size >= size
        else np.empty((n_b, n_g, n_t))
    )
    gathered = None
    for b in range(n_b):
        src = _rows_view(cumulative, rows[:, b], gathered)
        if not np.may_share_memory(src, cumulative):
            gathered = src  # rows not evenly spaced: reuse the copy's memory
        out = planes[b]
        np.subtract(src[:, k:], src[:, :-k], out=out[:, k:])
        np.subtract(src[:, :k], src[:, :1], out=out[:, :k])
        if b:
            np.maximum(out, planes[b - 1], out=out)
    return planes


PLANES_CHUNK_BYTES = 8 << 20
"""Bucket planes are built for this many bytes' worth of groups at a time (window_quantile):
small enough to stay in cache between building the planes and reading the quantiles."""


def window_quantile(
    q: float, les: np.ndarray, cumulative: np.ndarray, rows: np.ndarray, k: int, order: np.ndarray | None = None
) -> np.ndarray:
    """histogram_quantile of the increases over a trailing window of k steps of gap-free
    cumulative bucket counters: [G, T].

    `rows` [G, buckets] as for window_bucket_planes; with `order` (a permutation of range(G)),
    group i's quantiles go to output row order[i]. Groups go a cache-sized chunk at a time.
    """
    n_g, n_b = rows.shape
    n_t = cumulative.shape[1]
    chunk = max(1, PLANES_CHUNK_BYTES // (8 * n_b * n_t))
    out = np.empty((n_g, n_t))
    scratch = np.empty(min(n_g, chunk) * n_b * n_t)
    for a in range(0, n_g, chunk):
        planes = window_bucket_planes(cumulative, rows[a : a + chunk], k, scratch)
        dest = slice(a, a + chunk) if order is None else order[a : a + chunk]
        out[dest] = quantile_from_planes(q, les, planes)
    return out


def _rows_view(values: np.ndarray, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """values[rows]: a strided view when the row numbers are evenly spaced, else a gathered copy
    (into `out` when given)."""
    if len(rows) == 1:
        return values[rows[0] : rows[0] + 1]
    d = int(rows[1] - rows[0])
    if d > 0 and rows[-1] - rows[0] == d * (len(rows) - 1) and (np.diff(rows) == d).all():
        return values[rows[0] : rows[-1] + 1 : d]
    return np.take(values, rows, axis=0, out=out)


def quantile_from_planes(q: float, les: np.ndarray, planes: np.ndarray) -> np.ndarray:
    """histogram_quantile over window_bucket_planes' output: [G, T], NaN without observations.

    Prometheus semantics: linear interpolation inside the bucket holding the rank (found by
    counting the monotonic planes below it), the +Inf bucket answered with the highest finite
    bound, a first bound <= 0 answered as itself.
    """
    n_b = planes.shape[0]
    total = planes[-1]
    rank = q * total
    below_rank = np.zeros(total.shape, dtype=np.uint8 if n_b < 255 else np.intp)
    lt = np.empty(total.shape, dtype=bool)
    for b in range(n_b):
        np.less(planes[b], rank, out=lt)
        if not lt.any():
            break  # monotonic: no higher plane is below the rank either
        np.add(below_rank, lt, out=below_rank)
    idx = below_rank.ravel()  # bucket holding the rank; n_b = none does
    n = idx.size
    flat = planes.reshape(-1)
    upper_b = np.minimum(idx, n_b - 1)
    pos = upper_b.astype(np.intp)
    pos *= n
    pos += np.arange(n)  # flat index of (bucket upper_b, cell)
    in_bucket = np.take(flat, pos)  # the bucket's cumulative count, then minus below
    pos -= n
    below = np.take(flat, pos, mode="clip")  # the bucket under it (clipped index where none)
    below[idx == 0] = 0.0
    np.subtract(in_bucket, below, out=in_bucket)
    frac = np.subtract(rank.reshape(-1), below, out=below)
    lowers = np.concatenate([[0.0], les[:-1]])
    widths = les - lowers
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        inside = in_bucket > 0
        np.divide(frac, in_bucket, out=frac, where=inside)
        frac[~inside] = 0.0
        out = np.multiply(widths.take(upper_b), frac, out=frac)
        np.add(lowers.take(upper_b), out, out=out)
    if n_b >= 2 and les[0] <= 0:
        out[idx == 0] = les[0]
    out[idx == n_b - 1] = les[n_b - 2] if n_b >= 2 else np.nan
    out[(idx >= n_b) | (total.reshape(-1) <= 0)] = np.nan
    return out.reshape(total.shape)


def window_view(values: np.ndarray, k: int) -> np.ndarray:
    """[rows, T, k+1] trailing windows, NaN-padded before the start."""
    pad = np.full((values.shape[0], k), np.nan)
    return np.lib.stride_tricks.sliding_window_view(np.concatenate([pad, values], axis=1), k + 1, axis=1)


def over_time(values: np.ndarray, k: int, agg: str) -> np.ndarray:
    """avg / max / min / median of each row over a trailing window of k steps (absent ignored)."""
    if agg == "avg":
        if np.isfinite(values).all():  # no gaps: every row's counts are the window lengths
            c = np.minimum(np.arange(1, values.shape[1] + 1, dtype=float), float(k + 1))
            out = _trailing_sum(values, k)
            out /= c
            return out
        present = ~np.isnan(values)
        c = _trailing_sum(present.astype(float), k)
        s = _trailing_sum(np.nan_to_num(values), k)
        with np.errstate(invalid="ignore", divide="ignore"):
            out = s / c
        out[c == 0] = np.nan
        return out
    if agg == "max":
        return _sliding(values, k, np.fmax)
    if agg == "min":
        return _sliding(values, k, np.fmin)
    view = window_view(values, k)
    if agg == "median":
        with np.errstate(all="ignore"), _quiet_nan_warnings():
            return np.nanmedian(view, axis=-1)
    raise ValueError(f"unknown over_time aggregation {agg!r}")


def _sliding(values: np.ndarray, k: int, pick: np.ufunc) -> np.ndarray:
    """np.fmax / np.fmin of each trailing window of k steps, in O(log k) whole-array passes.

    Windows of doubling width are built, then each k+1 window is the pick of the two largest
    power-of-two windows at its start and its end (exact: equals a reduce over window_view).
    """
    width = k + 1
    m = np.concatenate([np.full((values.shape[0], k), np.nan), values], axis=1)
    span = 1
    while span * 2 <= width:
        m = pick(m[:, :-span], m[:, span:])  # m[i] now covers padded points i .. i + 2 span - 1
        span *= 2
    n_t = values.shape[1]
    return pick(m[:, :n_t], m[:, width - span : width - span + n_t])


def shift(values: np.ndarray, k: int) -> np.ndarray:
    """The value k steps earlier (NaN before the start)."""
    if k <= 0:
        return values
    out = np.full_like(values, np.nan)
    out[:, k:] = values[:, :-k]
    return out


DERIV_MIN_POINTS = 3


def deriv(
    values: np.ndarray, k: int, step: float, min_points: int = DERIV_MIN_POINTS, ahead: float | None = None
) -> np.ndarray:
    """Least-squares slope per second over a trailing window of k steps; given `ahead` seconds,
    the line's value that far past each point instead (PromQL `predict_linear`)."""
    m = (~np.isnan(values)).astype(float)
    x = np.arange(values.shape[1], dtype=float)[None, :] * m
    y = np.nan_to_num(values)
    n = _trailing_sum(m, k)
    sx, sy = _trailing_sum(x, k), _trailing_sum(y, k)
    sxx, sxy = _trailing_sum(x * x, k), _trailing_sum(x * y, k)
    den = n * sxx - sx * sx
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = (n * sxy - sx * sy) / den / step
    slope[(n < min_points) | (den <= 0)] = np.nan
    if ahead is None:
        return slope
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.arange(values.shape[1], dtype=float)[None, :]
        return sy / n + slope * ((t - sx / n) * step + ahead)


def resets(values: np.ndarray, k: int) -> np.ndarray:
    """How many times each counter dropped (was reset) within a trailing window of k steps."""
    filled = ffill(values)
    d = np.zeros_like(values)
    diff = np.diff(filled, axis=1)
    d[:, 1:] = (diff < 0) & ~np.isnan(diff)
    return _trailing_sum(d, k - 1) if k > 1 else d


def changes(values: np.ndarray, k: int, settle: int = 0) -> np.ndarray:
    """How many times each row's value changed within a trailing window of k steps; the first
    `settle` steps after a row appears count as absent (tree.Changes).
    PromQL: `changes((X and X offset <settle>)[range:step])`."""
    if settle > 0:
        values = np.where(np.isnan(shift(values, settle)), np.nan, values)
    filled = ffill(values)
    d = np.zeros_like(values)
    d[:, 1:] = (np.diff(filled, axis=1) != 0) & ~np.isnan(np.diff(filled, axis=1))
    out = _trailing_sum(d, k - 1) if k > 1 else d
    out[np.isnan(values)] = np.nan
    return out


def _zero_nan(values: np.ndarray) -> np.ndarray:
    """A copy with NaN (absent) as 0, for sums; cheaper than nan_to_num (no inf handling)."""
    return np.where(np.isnan(values), 0.0, values)


def _trailing_sum(values: np.ndarray, k: int) -> np.ndarray:
    c = np.cumsum(values, axis=1)
    if k + 1 >= c.shape[1]:
        return c
    out = np.empty_like(c)
    out[:, : k + 1] = c[:, : k + 1]
    np.subtract(c[:, k + 1 :], c[:, : -(k + 1)], out=out[:, k + 1 :])
    return out


@contextmanager
def _quiet_nan_warnings() -> Iterator[None]:
    """nanmedian warns on all-NaN windows; absent is a normal state here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield
