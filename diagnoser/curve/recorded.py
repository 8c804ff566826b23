"""The curve and what changed in a window, read back from kvscope-curve.yml's records (records.py).

Each evaluation of the records' group writes, per pool (model x engine) and concurrency bucket,
the sums of that interval over the pool's engines in the bucket. The records' raw samples in the
window are read in one query, and each (pool, bucket, evaluation) is one row of the pool's
`Intervals`: its increases and histogram bucket increases summed over its engines, its mean
concurrency, and `weight`, the engines it holds (their other sums in `Intervals.sums`). From the
rows, with the code the raw path uses:

* the curve's points: a bucket's rows summed (`points.BucketSums`, `point_of`);
* what changed (`recorded_events`): the pool's replica count (the engines its rows hold at each
  evaluation, as `changes` counts the instances reporting), restarts
  (`kvscope:curve_restarts:count`), and at each restart the settings that moved, read from the
  engines' own series over a few intervals around it only (`changes.raw_changes` on that narrow
  window: settings are info-series label values, which a recording rule cannot keep);
* each change judged as the raw path judges it (`report.judge`: before since the previous change,
  after less the settle time, the block bootstrap of bootstrap.py over the rows in each matched
  bucket, the same thresholds and token-mix check).

What differs from the raw path: an interval is the rules' interval (not the scrape interval) and
a row holds every engine of the pool that was in the bucket then, so the bootstrap resamples
bucket-intervals, and a change is judged on its whole pool (the records keep no instance); the
concurrency is the records' (Little's law, else the gauges' mean, never the two weighed: records.py),
and no interval is left out for swinging faster than sampled. On a pool of one engine a row
is that engine's interval. docs/curve.md "From recording rules".
"""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from kvscope.core.quantiles import histogram_quantile
from kvscope.core.scalars import iso_utc
from kvscope.diagnoser.curve.changes import Change, count_changes, merge, raw_changes
from kvscope.diagnoser.curve.compare import Thresholds
from kvscope.diagnoser.curve.intervals import ARRIVAL_RATE, CONCURRENCY, WAITING, Intervals, Pool
from kvscope.diagnoser.curve.operating import DEFAULT_SLO_TTFT_P99_S, operating_point
from kvscope.diagnoser.curve.points import EDGES, MIN_INTERVALS, MIN_REQUESTS, BucketSums, Point, point_of
from kvscope.diagnoser.curve.records import BOUNDS, BUCKET, FILE, GAUGES, PREFIX, RESTART_SPAN_S
from kvscope.diagnoser.curve.report import SETTLE_S, PoolCurve, curve_shift, judge
from kvscope.diagnoser.curve.window import (
    CONCURRENCY_SIGNAL,
    CONFIG_GAUGES,
    COUNTERS,
    HISTOGRAMS,
    LITTLE_SUMS,
    MIX_COUNTERS,
)
from kvscope.diagnoser.evaluate.frame import Frame
from kvscope.diagnoser.sources import SourceError
from kvscope.diagnoser.sources.promapi import PromClient, as_points
from kvscope.diagnoser.sources.prometheus import PrometheusSource
from kvscope.diagnoser.sources.window import Source, Span, read_window

RESTARTS = "restarts:count"
ROW_RECORDS = (
    "intervals:count",
    "concurrency:sum",
    *(f"{h}_bucket:increase" for h in HISTOGRAMS),
    *(f"{c}:{part}" for c in COUNTERS for part in ("increase", "increase_squared", "intervals")),
    *(f"{g}:{part}" for g in GAUGES for part in ("sum", "intervals")),
    *(f"{c}:increase" for c in MIX_COUNTERS),
)
"""The records a row is made of, per pool and concurrency bucket."""
MAX_ROWS = 1000
"""Rows per pool bucket at most: a longer window's rows each span several of the records'
intervals (`block_length`; their sums add up exactly, the bootstrap resamples the spans)."""
MAX_SETTING_READS = 20
"""Restarts per window whose engines' settings are read around them (each a narrow read of the
pool's info series); later ones stay restarts, their settings not read (said in a note)."""
SettingsReader = Callable[[float, float, float], Frame]
"""(start, end, step) -> the engines' CONFIG_GAUGES and concurrency signal over that span."""


def _bucket_lo(unit: tuple[str, str]) -> float:
    return float(unit[0].split("=", 1)[1])


def _aligned(pts: np.ndarray | None, t: np.ndarray) -> np.ndarray:
    """`pts`' values at the times `t` (NaN where it has none)."""
    out = np.full(len(t), np.nan)
    if pts is None or not len(pts):
        return out
    idx = np.clip(np.searchsorted(pts[:, 0], t), 0, len(pts) - 1)
    hit = pts[idx, 0] == t
    out[hit] = pts[idx[hit], 1]
    return out


def _pool_rows(
    interval_s: float, block: float, start: float, buckets: dict[str, dict], restarts: np.ndarray | None
) -> Intervals | None:
    """One pool's rows from its records' sums per bucket and span of `block` seconds (lower edge ->
    record -> points, or (record, le) -> points for the histograms); a row holds a restart where
    one of `restart_times` falls in its span."""
    parts = []
    units = []
    for lo_text, series in sorted(buckets.items(), key=lambda kv: float(kv[0])):
        count = series.get("intervals:count")
        if count is None:
            continue
        t = count[count[:, 1] > 0, 0]
        if not len(t):
            continue
        units.append((f"{BUCKET}={lo_text}", ""))
        parts.append((len(units) - 1, float(lo_text), t, series))
    if not parts:
        return None
    t_end = np.concatenate([t for _, _, t, _ in parts])
    unit = np.concatenate([np.full(len(t), u) for u, _, t, _ in parts])
    col = lambda name: np.concatenate([_aligned(s.get(name), t) for _, _, t, s in parts])  # noqa: E731
    weight = col("intervals:count")
    sums = {"concurrency": col("concurrency:sum")}
    lo = np.concatenate([np.full(len(t), lo) for _, lo, t, _ in parts])
    hi = np.array([BOUNDS[min(int(np.searchsorted(BOUNDS, x, side="right")), len(BOUNDS) - 1)] for x in lo])
    # the rows' mean concurrency, kept inside its bucket against rounding (the bucket is the record's)
    mean = np.clip(sums["concurrency"] / weight, lo, np.nextafter(hi, lo))
    counters = {}
    for c in COUNTERS:
        counters[c] = col(f"{c}:increase")
        sums[f"{c}:squared"], sums[f"{c}:n"] = col(f"{c}:increase_squared"), col(f"{c}:intervals")
    for c in MIX_COUNTERS:
        counters[c] = col(f"{c}:increase")
    for g in GAUGES:
        sums[f"{g}:sum"], sums[f"{g}:n"] = col(f"{g}:sum"), col(f"{g}:intervals")
    hists = {}
    for h in HISTOGRAMS:
        les = sorted(
            {le for _, _, _, s in parts for key in s if isinstance(key, tuple) and key[0] == h for le in [key[1]]}
        )
        if len(les) < 2 or not np.isinf(les[-1]):
            continue
        arr = np.stack([col((h, le)) for le in les], axis=1)
        hists[h] = (np.array(les), arr)
        counters[f"{h}_count"] = arr[:, -1]
    # the requests that reached an engine per second, the row's mean over its engine-intervals: its
    # finished requests over their seconds (the raw path's rate less the change in requests held
    # at the ends of each interval, which averages out over a row's many intervals)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(weight > 0, counters["engine_requests_finished_total"] / (weight * interval_s), np.nan)
    iv = Intervals(
        interval_s,
        f"Little's law on the latency sums where a request finished, else {CONCURRENCY_SIGNAL} (+ {WAITING} where "
        f"exported), over {interval_s:g} s",
        t_end,
        unit,
        units,
        {CONCURRENCY: mean, ARRIVAL_RATE: rate},
        np.zeros(len(t_end)),
        counters,
        hists,
        _holds(t_end, block, restart_times(restarts, interval_s, start)),
        np.zeros(len(t_end)),
        None,
        None,
        weight,
        sums,
    )
    return iv


def _holds(t_end: np.ndarray, block: float, times: np.ndarray) -> np.ndarray:
    """Whether each row's span (t_end - block, t_end] holds one of `times`."""
    if not len(times):
        return np.zeros(len(t_end), dtype=bool)
    times = np.sort(times)
    return np.searchsorted(times, t_end, side="right") > np.searchsorted(times, t_end - block, side="right")


def restart_times(restarts: np.ndarray | None, step: float, start: float) -> np.ndarray:
    """The evaluations at which the pool's count of restarts in the last RESTART_SPAN_S rose (the
    restart's first sample after its gap arrived), except at the window's first evaluation (what it
    counts may lie before the window)."""
    if restarts is None or not len(restarts):
        return np.zeros(0)
    t, n = restarts[:, 0], restarts[:, 1]
    prev = np.concatenate([[0.0], n[:-1]])
    prev = np.where(np.concatenate([[False], np.diff(t) <= 1.5 * step]), prev, 0.0)
    return t[(n > prev) & (t > start + step)]


def block_length(start: float, end: float, interval_s: float) -> float:
    """Seconds one row spans: the records' interval, or as many of them as keep a series of the
    window within MAX_ROWS rows (a week of 1-minute records: 11 minutes)."""
    return interval_s * max(1, math.ceil((end - start) / interval_s / MAX_ROWS))


def read_rows(
    client: PromClient, start: float, end: float, interval_s: float, model: str | None = None
) -> tuple[dict[Pool, Intervals], dict[Pool, np.ndarray], float]:
    """Each pool's rows over the window (of `model`'s pools only when given), each pool's restart
    record ((time, restarts) points), and the rows' span (`block_length`): per record, one range
    query of its sums over consecutive spans ending at `end` (the window's first partial span, if
    any, left out), and the restarts' raw samples."""
    block = block_length(start, end, interval_s)
    n = max(1, int((end - start + 1e-6) // block))
    first = end - (n - 1) * block
    scope = f"{{model={json.dumps(model)}}}" if model else ""
    span = f"[{max(1, round(block * 1000) - 1)}ms]"  # (t - block, t]: Prometheus 2 includes both ends

    def one(record: str) -> list[dict]:
        got = client.query_range(f"sum_over_time({PREFIX}{record}{scope}{span})", first, end, block)
        return [{**s, "record": record} for s in got]

    by_pool: dict[Pool, dict[str, dict]] = defaultdict(lambda: defaultdict(dict))
    for s in (s for part in client.map(one, list(ROW_RECORDS)) for s in part):
        m, record = s["metric"], s["record"]
        pool = (m.get("model", ""), m.get("engine", ""))
        pts = as_points(s.get("values"))
        try:
            float(m.get(BUCKET, ""))
        except ValueError:
            continue
        if record.endswith("_bucket:increase"):
            try:
                key: str | tuple[str, float] = (record.removesuffix("_bucket:increase"), float(m.get("le", "")))
            except ValueError:
                continue
        else:
            key = record
        by_pool[pool][m[BUCKET]][key] = pts[np.argsort(pts[:, 0], kind="stable")]
    restarts: dict[Pool, np.ndarray] = {}
    for s in client.raw_samples(f"{PREFIX}{RESTARTS}{scope}", end - start - 0.001, end):
        m = s["metric"]
        pts = as_points(s.get("values"))
        restarts[(m.get("model", ""), m.get("engine", ""))] = pts[np.argsort(pts[:, 0], kind="stable")]
    out = {}
    for pool, buckets in sorted(by_pool.items()):
        iv = _pool_rows(interval_s, block, start, buckets, restarts.get(pool))
        if iv is not None:
            out[pool] = iv
    return out, restarts, block


def _moments(iv: Intervals, total: np.ndarray, n: str, squares: str | None = None) -> tuple[int, float, float]:
    have = ~np.isnan(total)
    count = int(round(float(np.nansum(iv.sums[n]))))
    return count, float(total[have].sum()), float(np.nansum(iv.sums[squares])) if squares else 0.0


def bucket_sums(iv: Intervals) -> dict[int, BucketSums]:
    """Per concurrency bucket (-1: idle), the sums of its rows: what `point_of` reads."""
    out = {}
    for u in np.unique(iv.unit):
        k = int(np.searchsorted(EDGES, _bucket_lo(iv.units[u]), side="right")) - 1
        if k >= len(EDGES) - 1:
            continue
        part = iv.take(iv.unit == u)
        n = int(round(float(np.nansum(part.weight)))) if part.weight is not None else len(part)
        if n <= 0:
            continue
        out[k] = BucketSums(
            intervals=n,
            concurrency=float(np.nansum(part.sums["concurrency"])),
            hists={h: (les, np.nansum(arr, axis=0)) for h, (les, arr) in part.hists.items()},
            counters={c: _moments(part, part.counters[c], f"{c}:n", f"{c}:squared") for c in COUNTERS},
            gauges={g: _moments(part, part.sums[f"{g}:sum"], f"{g}:n") for g in GAUGES},
        )
    return out


def recorded_points(iv: Intervals, min_intervals: int = MIN_INTERVALS, min_requests: int = MIN_REQUESTS) -> list[Point]:
    """The curve's points from the rows (idle rows are no point), lowest concurrency first."""
    return [point_of(k, s, iv.step, min_intervals, min_requests) for k, s in sorted(bucket_sums(iv).items()) if k >= 0]


def recorded_events(
    iv: Intervals,
    block: float,
    restarts: np.ndarray | None,
    start: float,
    pool: Pool,
    settings: SettingsReader | None,
    notes: list[str],
) -> list[Change]:
    """The pool's changes from its rows (each spanning `block` seconds) and restart record: replica
    counts (the engines per evaluation, averaged over a row's span), restarts, and the settings that
    moved at each restart (read by `settings` around it; MAX_SETTING_READS at most)."""
    step, interval = block, iv.step
    times = np.unique(iv.t_end)
    out: list[Change] = []
    if len(times):
        grid = times[0] + step * np.arange(int(round((times[-1] - times[0]) / step)) + 1)
        engines = np.zeros(len(grid))
        at = np.clip(np.searchsorted(grid, iv.t_end - step / 2), 0, len(grid) - 1)
        np.add.at(engines, at, np.nan_to_num(iv.weight if iv.weight is not None else np.ones(len(iv))))
        out += count_changes(grid, np.round(engines * interval / block))
    restarted = [Change(float(t), "restart") for t in restart_times(restarts, interval, start)]
    restarted = merge(restarted, 3 * step)
    if settings is not None:
        for c in restarted[:MAX_SETTING_READS]:
            found = raw_changes(settings(c.time - RESTART_SPAN_S, c.time + interval, interval / 2)).get(pool, [])
            for f in found:
                if f.kind == "config":
                    c.kind, c.diff = "config", {**c.diff, **f.diff}
                    c.instances = sorted(set(c.instances) | set(f.instances))
        if len(restarted) > MAX_SETTING_READS:
            notes.append(
                f"{len(restarted)} restarts in the window: the settings of the first {MAX_SETTING_READS} were read"
            )
    return merge(out + restarted, 3 * step)


def settings_reader(source: Source) -> SettingsReader:
    """The engines' settings (and concurrency signal, which places them in their pool) from
    `source` over a span: what `recorded_events` reads around a restart."""
    names = frozenset(CONFIG_GAUGES) | {CONCURRENCY_SIGNAL}
    return lambda start, end, step: read_window(source, names, Span(start, end), step)


def _peak(counts: dict[int, float]) -> float | None:
    """The 99th percentile of the intervals' concurrency, interpolated in its bucket (-1: idle)."""
    per_bucket = (counts.get(k, 0.0) for k in range(-1, len(BOUNDS) - 2))  # bucket k ends at BOUNDS[k + 2]
    cumulative = list(zip(BOUNDS[1:], itertools.accumulate(per_bucket), strict=True))
    peak = histogram_quantile(0.99, [*cumulative, (math.inf, sum(counts.values()))])
    return None if peak is None else round(peak, 3)


def recorded_interval(client: PromClient, start: float, end: float) -> float | None:
    """The records' interval: the shortest gap between two samples of one pool bucket's interval
    count in the window's last hour (a bucket's series has gaps where the pool was in others);
    None when the window holds no two."""
    gaps = [
        np.diff(np.sort(as_points(series.get("values"))[:, 0]))
        for series in client.raw_samples(f"{PREFIX}intervals:count", min(end - start, 3600.0), end)
    ]
    positive = [g[g > 0] for g in gaps if len(g)]
    return float(min(g.min() for g in positive if len(g))) if any(len(g) for g in positive) else None


def read_recorded(
    client: PromClient,
    start: float,
    end: float,
    interval_s: float,
    slo_s: float = DEFAULT_SLO_TTFT_P99_S,
    settings: SettingsReader | None = None,
    model: str | None = None,
    th: Thresholds | None = None,
) -> list[PoolCurve]:
    """Each pool's curve over (start, end] and its judged changes from the records (of `model`'s
    pools only when given). `interval_s`: the rules' interval; `settings`: reads the engines'
    settings around a restart (None: restarts are not looked into)."""
    th = th or Thresholds()
    rows, restarts, block = read_rows(client, start, end, interval_s, model)
    out = []
    for (name, engine), iv in rows.items():
        notes: list[str] = []
        counts = {k: float(s.intervals) for k, s in bucket_sums(iv).items()}
        points = recorded_points(iv.take(~iv.resets))
        op = operating_point(points, _peak(counts), slo_s)
        events = recorded_events(iv, block, restarts.get((name, engine)), start, (name, engine), settings, notes)
        judged = (
            judge(iv, events, SETTLE_S, th, recorded_points)
            if events
            else [s for s in [curve_shift(iv, th, recorded_points)] if s]
        )
        op.notes.append(
            f"read from kvscope's curve records ({FILE}, {interval_s:g} s intervals): the peak is the recorded "
            "buckets' 99th percentile; changes judged per pool on the records' intervals"
        )
        op.notes += notes
        if len(iv) and float(iv.t_end.min()) - block > start + 2 * block:
            op.notes.append(
                f"the records of this pool begin at {iso_utc(float(iv.t_end.min()) - block)}, after the window's "
                "start: what changed before it is not judged (backfill the records: docs/curve.md)"
            )
        labels = {k: v for k, v in (("model", name), ("engine", engine)) if v}
        total = int(sum(counts.values()))
        out.append(PoolCurve(labels, points, op, judged, total, None, iv.signal, interval_s, ESTIMATOR))
    return out


ESTIMATOR = {
    "method": "littles_law|gauges",
    "sum": " or ".join(" + ".join(names) for names in LITTLE_SUMS),
    "littles_law_weight": None,
}
"""How the records' concurrency is estimated (records.py): Little's law on the first of the sums an
engine exports where a request finished in the interval, else the gauges' mean; which of the two an
engine-interval used is not recorded, so no weight."""


def recorded_curves(
    client: PromClient,
    start: float,
    end: float,
    slo_s: float = DEFAULT_SLO_TTFT_P99_S,
    settings: SettingsReader | None = None,
    model: str | None = None,
) -> list[PoolCurve]:
    """`read_recorded` at the records' own interval; a SourceError that says what to load when the
    window holds none (`kvscope curve --recorded`, the UI's Operating point page, the webhook)."""
    interval = recorded_interval(client, start, end)
    if interval is None:
        raise SourceError(
            f"no kvscope:curve_* records in this window: load {FILE} (kvscope rules build) into the TSDB's "
            "rules and wait an interval, or read every engine's histograms instead (without --recorded)"
        )
    return read_recorded(client, start, end, interval, slo_s, settings, model)


def recorded_pool_curves(source: PrometheusSource, start: float, end: float, interval_s: float) -> list[PoolCurve]:
    """The curves and judged changes of `source.model`'s pools (every pool when `scope_to_pool`
    found no model) from the records at `interval_s`, the settings read from `source` around
    restarts: what the webhook attaches where the TSDB keeps the records."""
    return read_recorded(source.client, start, end, interval_s, settings=settings_reader(source), model=source.model)
