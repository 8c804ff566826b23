"""The curve's recording rules (`kvscope-curve.yml`) and the curve read back from them.

Read in full, a pool's curve needs every engine's TTFT and ITL buckets over the window: a week of
a large fleet is gigabytes through the client (docs/curve.md "From recording rules"). The TSDB can keep
the curve's sums instead, at each evaluation of one rule group (every `interval`, each rule
reading the last `interval` of samples):

1. `kvscope:curve_concurrency:avg` per engine: its concurrency over the interval (the mean of the
   running gauge, plus waiting where the engine exports its queue, as `intervals.CONCURRENCY`);
   `kvscope:curve_bucket:avg` the same, labelled with its concurrency bucket
   (`concurrency_bucket`: the bucket's lower edge, points.EDGES; "0" below the first: idle).
2. Per pool (model x engine) and concurrency bucket, the sums a point is computed from
   (points.BucketSums): the intervals and their concurrency, each histogram bucket's increase, each
   counter's increase and its square, the KV usage and waiting gauges and how many intervals
   had them. Each joins the engine's increases to its bucket of the same interval.

A week is then one `sum_over_time` per record over a few thousand pool series. Rules of one group
run in order at one time, so step 2 reads step 1 of the same evaluation (Prometheus; vmalert in
replay mode needs step 1 flushed first).

What differs from the curve read in full: an interval is the rule's `interval` (not the scrape
interval), its concurrency the mean over it, and no interval is left out for swinging faster
than sampled; the window's peak is the 99th percentile of the recorded concurrency buckets
(interpolated); changes are not judged (each change's sides need the raw intervals). Prometheus'
`increase` extrapolates to the interval's edges; VictoriaMetrics' does not.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from kvscope.core.signals import Catalog
from kvscope.diagnoser.curve.intervals import WAITING
from kvscope.diagnoser.curve.operating import DEFAULT_SLO_TTFT_P99_S, operating_point
from kvscope.diagnoser.curve.points import EDGES, MIN_INTERVALS, MIN_REQUESTS, BucketSums, point_of
from kvscope.diagnoser.curve.report import PoolCurve
from kvscope.diagnoser.curve.window import CONCURRENCY_SIGNAL, COUNTERS, HISTOGRAMS
from kvscope.diagnoser.promql.signals import InlineSignals, prom_number
from kvscope.diagnoser.rulebook.rule import parse_duration
from kvscope.diagnoser.sources import SourceError
from kvscope.diagnoser.sources.promapi import PromClient, as_points

FILE = "kvscope-curve.yml"
GROUP = "kvscope-curve"
DEFAULT_INTERVAL = "1m"
"""The rules' interval, also the span each reads: it needs two scrapes in it (a scrape interval
of 30 s or less; `kvscope rules build --curve-interval 2m` for 60 s scrapes)."""
BUCKET = "concurrency_bucket"
UNIT = ("instance", "engine", "model", "dp_rank")
POOL = ("model", "engine")
GAUGES = ("engine_kv_cache_usage_ratio", WAITING)
PREFIX = "kvscope:curve_"
BOUNDS = [0.0, *EDGES.tolist()]
"""The buckets' edges with the idle one ([0, first edge)) in front: bucket k spans BOUNDS[k + 1:k + 3]."""


def _this_evaluation(interval: str) -> Callable[[str], str]:
    """A record of this group as written by this evaluation only: its samples in the last half
    interval. Read as a plain instant vector, an engine's bucket of an earlier interval would stay
    visible for the TSDB's lookback (5 minutes) where no staleness marker ends it (VictoriaMetrics'
    vmalert in replay mode writes none), and the engine would count in two buckets at once."""
    half = f"{max(1, int(parse_duration(interval)) // 2)}s"
    return lambda record: f"last_over_time({record}[{half}])"


def curve_rules(catalog: Catalog, interval: str = DEFAULT_INTERVAL) -> list[dict[str, Any]]:
    """The group's rules, in evaluation order."""
    read = InlineSignals(catalog)

    def over(signal: str, fn: str, outer: str, extra: tuple[str, ...] = ()) -> str:
        return read.read(signal, [], fn=fn, rng=interval, by=(*UNIT, *extra), outer=outer)

    running = over(CONCURRENCY_SIGNAL, "avg_over_time", "max")
    waiting = over(WAITING, "avg_over_time", "max")
    conc = f"({running} + on ({', '.join(UNIT)}) {waiting}) or {running}"
    now = _this_evaluation(interval)
    branches = [
        f'label_replace({now(f"{PREFIX}concurrency:avg")} >= {prom_number(lo)} < {prom_number(hi)}, "{BUCKET}", '
        f'"{prom_number(lo)}", "", "")'
        for lo, hi in zip(BOUNDS, BOUNDS[1:], strict=False)
    ]
    bucket = now(f"{PREFIX}bucket:avg")
    one = f"on ({', '.join(UNIT)}) group_left ({BUCKET}) ({bucket} * 0 + 1)"
    pool = ", ".join((*POOL, BUCKET))
    rules = [
        {"record": f"{PREFIX}concurrency:avg", "expr": conc},
        {"record": f"{PREFIX}bucket:avg", "expr": "\nor\n".join(branches)},
        {"record": f"{PREFIX}intervals:count", "expr": f"count by ({pool}) ({bucket})"},
        {"record": f"{PREFIX}concurrency:sum", "expr": f"sum by ({pool}) ({bucket})"},
    ]
    for h in HISTOGRAMS:
        inc = over(f"{h}_bucket", "increase", "sum", ("le",))
        rules.append({"record": f"{PREFIX}{h}_bucket:increase", "expr": f"sum by ({pool}, le) ({inc} * {one})"})
    for c in COUNTERS:
        inc = over(c, "increase", "sum")
        rules.append({"record": f"{PREFIX}{c}:increase", "expr": f"sum by ({pool}) ({inc} * {one})"})
        rules.append({"record": f"{PREFIX}{c}:increase_squared", "expr": f"sum by ({pool}) (({inc}) ^ 2 * {one})"})
        rules.append({"record": f"{PREFIX}{c}:intervals", "expr": f"count by ({pool}) ({inc} * {one})"})
    for g in GAUGES:
        mean = over(g, "avg_over_time", "max")
        rules.append({"record": f"{PREFIX}{g}:sum", "expr": f"sum by ({pool}) ({mean} * {one})"})
        rules.append({"record": f"{PREFIX}{g}:intervals", "expr": f"count by ({pool}) ({mean} * {one})"})
    return rules


def curve_file(catalog: Catalog, interval: str = DEFAULT_INTERVAL) -> tuple[str, list[dict[str, Any]]]:
    """(file name, rule groups) of `kvscope-curve.yml`."""
    return FILE, [{"name": GROUP, "interval": interval, "rules": curve_rules(catalog, interval)}]


# ---------------------------------------------------------------- the curve read back


def _by_pool(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[tuple[dict[str, str], float]]]:
    out: dict[tuple[str, str, str], list[tuple[dict[str, str], float]]] = defaultdict(list)
    for row in rows:
        m, value = row["metric"], row["value"]
        if value is not None and math.isfinite(value[1]):
            out[(m.get("model", ""), m.get("engine", ""), m.get(BUCKET, ""))].append((m, value[1]))
    return out


def _scalar(rows: dict, key: tuple[str, str, str]) -> float:
    return sum(v for _, v in rows.get(key, []))


def _moments(parts: list[dict], key: tuple[str, str, str]) -> tuple[int, float, float]:
    """(intervals, sum[, sum of squares]) of one pool bucket from its records."""
    n, total, *squares = (_scalar(rows, key) for rows in parts)
    return int(round(n)), total, squares[0] if squares else 0.0


def _histogram(rows: list[tuple[dict[str, str], float]]) -> tuple[np.ndarray, np.ndarray] | None:
    by_le: dict[float, float] = defaultdict(float)
    for m, v in rows:
        try:
            by_le[float(m.get("le", ""))] += v
        except ValueError:
            continue
    les = np.array(sorted(by_le))
    if len(les) < 2 or not np.isinf(les[-1]):
        return None
    return les, np.array([by_le[le] for le in les])


def _peak(counts: dict[int, float]) -> float | None:
    """The 99th percentile of the intervals' concurrency, interpolated in its bucket (-1: idle)."""
    total = sum(counts.values())
    if not total:
        return None
    seen = 0.0
    for k in sorted(counts):
        if seen + counts[k] >= 0.99 * total:
            lo, hi = BOUNDS[k + 1], BOUNDS[k + 2]
            return round(lo + (hi - lo) * (0.99 * total - seen) / counts[k], 3)
        seen += counts[k]
    return None


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
    min_intervals: int = MIN_INTERVALS,
    min_requests: int = MIN_REQUESTS,
) -> list[PoolCurve]:
    """Each pool's curve over [start, end] from the records: one `sum_over_time` per record at
    `end`. `interval_s`: the rules' interval (the length of one recorded interval)."""
    span = f"[{max(1, int(round((end - start) * 1000)) - 1)}ms]"  # (start, end]: Prometheus 2 includes both ends

    def read(record: str) -> dict[tuple[str, str, str], list[tuple[dict[str, str], float]]]:
        return _by_pool(client.query(f"sum_over_time({PREFIX}{record}{span})", end))

    intervals, concurrency = read("intervals:count"), read("concurrency:sum")
    hists = {h: read(f"{h}_bucket:increase") for h in HISTOGRAMS}
    counters = {c: [read(f"{c}:{part}") for part in ("intervals", "increase", "increase_squared")] for c in COUNTERS}
    gauges = {g: [read(f"{g}:{part}") for part in ("intervals", "sum")] for g in GAUGES}
    by_pool: dict[tuple[str, str], dict[int, tuple[str, str, str]]] = defaultdict(dict)
    for key in intervals:
        try:
            lo = float(key[2])
        except ValueError:
            continue
        k = int(np.searchsorted(EDGES, lo, side="right")) - 1
        if k < len(EDGES) - 1:
            by_pool[key[:2]][k] = key
    out = []
    for (model, engine), buckets in sorted(by_pool.items()):
        counts = {k: _scalar(intervals, key) for k, key in buckets.items()}
        points = []
        for k, key in sorted(buckets.items()):
            n = int(round(counts[k]))
            if k < 0 or n <= 0:
                continue
            sums = BucketSums(
                intervals=n,
                concurrency=_scalar(concurrency, key),
                hists={h: got for h, rows in hists.items() if (got := _histogram(rows.get(key, [])))},
                counters={c: _moments(parts, key) for c, parts in counters.items()},
                gauges={g: _moments(parts, key) for g, parts in gauges.items()},
            )
            points.append(point_of(k, sums, interval_s, min_intervals, min_requests))
        op = operating_point(points, _peak(counts), slo_s)
        op.notes.append(
            f"read from kvscope's curve records ({FILE}, {interval_s:g} s intervals): "
            "the peak is the recorded buckets' 99th percentile; changes are not judged on this path"
        )
        labels = {k: v for k, v in (("model", model), ("engine", engine)) if v}
        signal = f"{CONCURRENCY_SIGNAL} (+ {WAITING} where exported), mean over {interval_s:g} s"
        out.append(PoolCurve(labels, points, op, [], int(sum(counts.values())), None, signal, interval_s))
    return out


def recorded_curves(
    client: PromClient, start: float, end: float, slo_s: float = DEFAULT_SLO_TTFT_P99_S
) -> list[PoolCurve]:
    """`read_recorded` at the records' own interval; a SourceError that says what to load when the
    window holds none (`kvscope curve --recorded`, the UI's Operating point page)."""
    interval = recorded_interval(client, start, end)
    if interval is None:
        raise SourceError(
            f"no kvscope:curve_* records in this window: load {FILE} (kvscope rules build) into the TSDB's "
            "rules and wait an interval, or read every engine's histograms instead (without --recorded)"
        )
    return read_recorded(client, start, end, interval, slo_s)
