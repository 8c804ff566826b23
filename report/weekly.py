"""The weekly efficiency review: what the fleet produced, what it cost, and what went wrong.

From canonical series (a recording, the agent's SQLite store, or Prometheus) it computes per
model/pool (model × role) and for the fleet: output tokens per GPU-hour (002 §9.3), GPU-hours,
mean utilisation and the utilisation trap (002 §9.2), $ per 1M output tokens, prefill tokens
saved by prefix caching, per-tenant usage, the engines' efficiency counters (`Efficiency`),
week-over-week deltas and the week's top findings. It reads one `Frame` through `read_window`
(`report_window`) and holds its points as columns (`Columns`) so the maths is vectorised; a signal
the source lacks stays absent (None), never zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvscope.agent.derive.rates import step_increases
from kvscope.diagnoser.evaluate.frame import Frame
from kvscope.diagnoser.findings import SEVERITY_RANK, Diagnosis, Finding
from kvscope.diagnoser.sources.window import Source, Span, read_window

WEEK_S = 7 * 86400.0
UTILISATION_TRAP = 0.4
"""002 §9.3 'Fleet utilization ... below 40 % - you are in the utilization trap'."""
MAX_GAP_S = 300.0
"""A GPU sample covers the time since the previous one, at most this long or twice the typical
sampling interval, whichever is larger (a gap in the data is not a GPU-hour)."""

COUNTERS = (
    "engine_generation_tokens_total",
    "engine_prompt_tokens_total",
    "engine_prefix_cache_hits_tokens_total",
    "engine_prefix_cache_queries_tokens_total",
    "engine_requests_finished_total",
    "tenant_requests_total",
    "tenant_prompt_tokens_total",
    "tenant_cached_tokens_total",
    "engine_estimated_flops_per_gpu_total",
    "engine_estimated_read_bytes_per_gpu_total",
    "engine_estimated_write_bytes_per_gpu_total",
    "engine_preemptions_total",
    "engine_preempted_prompt_tokens_total",
    "engine_prompt_tokens_cached_total",
    "engine_kv_offload_loaded_tokens_total",
    "kv_tier_loaded_tokens_total",
)
GAUGES = (
    "gpu_utilization_ratio",
    "gpu_graphics_engine_active_ratio",
    "engine_gpu_memory_used_bytes",
    "engine_requests_running",
)
UTILISATION_SIGNALS = ("gpu_graphics_engine_active_ratio", "gpu_utilization_ratio")
"""Utilisation, best first. DCGM's GPU_UTIL (gpu_utilization_ratio) only says *a* kernel was
running in the sample period, so a GPU idling on a tiny decode batch reads ~94 %; where DCGM
profiling reports graphics-engine activity, that is the utilisation the report uses."""
SIGNALS = COUNTERS + GAUGES
"""Every canonical sample name the report reads."""


# ------------------------------------------------------------------------------ the window, as columns


def report_window(source: Source, end: float | None = None, start: float | None = None) -> Frame:
    """The report's signals from `source` through `read_window`: a source with its own step (a
    recording) over its whole span at that step; any other (a TSDB, the agent's store) over
    [start, end] (start: two weeks before `end` when None) on `report_step`'s grid. Read the
    source with `carry=False` where it has the option: a grid point then holds only the point
    taken in the step before it, not one carried from further back."""
    natural = source.natural_step()
    if natural:
        return read_window(source, SIGNALS, Span(), natural)
    if end is None:
        raise ValueError(f"{source.description}: the report needs the end of its week")
    start = end - 2 * WEEK_S if start is None else start
    step = report_step(end - start)
    return read_window(source, SIGNALS, Span(math.floor(start / step) * step, end), step)


REPORT_STEP_S = 900.0
"""The coarsest grid of a report read (two weeks are 1,344 points per series whatever the scrape
interval; the timeline's finest bins over a week are 1 h)."""


def report_step(span_s: float) -> float:
    """The grid step for a source without its own: 1,344 points over `span_s`, on whole 15 s, from
    15 s to REPORT_STEP_S."""
    return float(min(REPORT_STEP_S, max(15.0, math.ceil(span_s / 1344 / 15) * 15)))


@dataclass
class Points:
    """Parallel arrays for the points of one sample name, sorted by (sid, ts)."""

    sid: np.ndarray
    ts: np.ndarray
    value: np.ndarray

    @property
    def first(self) -> np.ndarray:
        """True where a point is its series' first."""
        return np.r_[True, self.sid[1:] != self.sid[:-1]] if self.sid.size else np.zeros(0, bool)


@dataclass
class Columns:
    """A Frame's report signals as columns: one row of `series` per Frame row (index = sid, 0..n-1;
    columns name + labels) and, per sample name, its present grid points sorted by (sid, ts)."""

    series: pd.DataFrame
    by_name: dict[str, Points]
    memo: dict = field(default_factory=dict)  # per-name increments / coverage, computed once

    def label(self, label: str, default: str = "") -> np.ndarray:
        """The value of `label` per sid (default where the series lacks it), as an object array."""
        if label not in self.series:
            return np.full(len(self.series), default, dtype=object)
        return self.series[label].fillna(default).replace("", default).to_numpy(dtype=object)

    def of(self, name: str) -> Points:
        """Points of every series of one sample name (empty arrays if none)."""
        empty = np.zeros(0)
        return self.by_name.get(name) or Points(empty.astype(np.int32), empty, empty)

    def first_ts(self) -> float | None:
        firsts = [float(p.ts.min()) for p in self.by_name.values() if p.ts.size]
        return min(firsts) if firsts else None


def columns(frame: Frame) -> Columns:
    """The report's view of `frame` (absent cells left out), built once per frame."""
    cache = frame.cache if frame.cache is not None else {}
    if "report.columns" not in cache:
        series: list[dict[str, str]] = []
        by_name = {}
        for name in sorted(frame.names() & set(SIGNALS)):
            block = frame.blocks[name]
            rows, cells = np.nonzero(~np.isnan(block.values))
            by_name[name] = Points((rows + len(series)).astype(np.int32), frame.ts[cells], block.values[rows, cells])
            series += [{"name": name, **dict(labels)} for labels in block.labels]
        frame_ = pd.DataFrame(series or [{"name": ""}])
        frame_.index.name = "sid"
        cache["report.columns"] = Columns(frame_, by_name)
    return cache["report.columns"]


# ------------------------------------------------------------------------------ maths


def counter_increments(ss: Columns, name: str) -> tuple[Points, np.ndarray]:
    """(points, inc): the increase since the previous point of the same series, resets handled
    the Prometheus way (a drop means the counter restarted from zero)."""
    key = ("inc", name)
    if key not in ss.memo:
        pts = ss.of(name)
        inc = np.empty_like(pts.value)
        inc[1:] = step_increases(pts.value)
        inc[pts.first | np.isnan(inc)] = 0.0  # a NaN reading counts nothing, before or after it
        ss.memo[key] = pts, inc
    return ss.memo[key]


def utilisation_signal(ss: Columns) -> str:
    """The utilisation signal this source has (see UTILISATION_SIGNALS)."""
    return next((n for n in UTILISATION_SIGNALS if ss.of(n).sid.size), UTILISATION_SIGNALS[-1])


def _gap_limit(pts: Points, max_gap_s: float) -> tuple[np.ndarray, float]:
    """(dt, limit): time since each point's predecessor (NaN first) and the longest step that is no
    gap in the data: max_gap_s or twice the typical interval, whichever is larger."""
    dt = np.diff(pts.ts, prepend=np.nan)
    typical = float(np.median(dt[~pts.first])) if (~pts.first).any() else 0.0
    return dt, max(max_gap_s, 2 * typical)


def gauge_coverage(ss: Columns, name: str, max_gap_s: float = MAX_GAP_S) -> tuple[Points, np.ndarray]:
    """(points, dt): each point weighted by the time since the previous point, capped at the
    larger of max_gap_s and twice the typical interval."""
    key = ("cov", name, max_gap_s)
    if key not in ss.memo:
        pts = ss.of(name)
        dt, limit = _gap_limit(pts, max_gap_s)
        dt = np.clip(dt, 0.0, limit)
        dt[pts.first] = 0.0
        ss.memo[key] = pts, dt
    return ss.memo[key]


def _per_sid(ss: Columns, pts: Points, weights: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Sum of weights per sid over the masked points."""
    return np.bincount(pts.sid[mask], weights=weights[mask], minlength=len(ss.series))


def _group(keys: np.ndarray, per_sid: np.ndarray, sids: np.ndarray) -> pd.Series:
    """Sum per-sid totals by a per-sid key, over the given sids."""
    return pd.Series(per_sid[sids]).groupby(keys[sids]).sum()


def pools(ss: Columns) -> np.ndarray:
    """'model / role' per sid (role defaults to unified)."""
    return ss.label("model", "unknown") + " / " + ss.label("role", "unified")


def gpu_pools(ss: Columns) -> np.ndarray:
    """The pool each series' GPU serves: via the engine-GPU join (engine_gpu_memory_used_bytes by
    gpu_uuid), else via a node that runs engines of a single pool; 'unattributed' otherwise."""
    out = np.full(len(ss.series), "unattributed", dtype=object)
    names = ss.series["name"].to_numpy()
    engine = np.array([str(n).startswith("engine_") for n in names]) & (names != "engine_gpu_memory_used_bytes")
    pool = pools(ss)
    inst_pool = dict(zip(ss.label("instance")[engine], pool[engine], strict=True))
    uuid = ss.label("gpu_uuid")
    join = names == "engine_gpu_memory_used_bytes"
    by_uuid = {u: inst_pool.get(i) for u, i in zip(uuid[join], ss.label("instance")[join], strict=True)}
    node = ss.label("node")
    node_pools: dict[str, set[str]] = {}
    for n, p in zip(node[engine], pool[engine], strict=True):
        if n:
            node_pools.setdefault(n, set()).add(p)
    for i in range(len(out)):
        p = by_uuid.get(uuid[i]) if uuid[i] else None
        if p is None and len(node_pools.get(node[i], ())) == 1:
            p = next(iter(node_pools[node[i]]))
        if p is not None:
            out[i] = p
    return out


@dataclass(frozen=True)
class DataCoverage:
    """Where a window actually holds data: `spans` are the stretches with samples (points no
    further apart than the GPU-hour gap limit, see MAX_GAP_S); the rest of the window is a gap."""

    start: float
    end: float
    spans: tuple[tuple[float, float], ...]

    @property
    def held_s(self) -> float:
        """Seconds of data held (the spans' total length)."""
        return float(sum(b - a for a, b in self.spans))

    @property
    def span_s(self) -> float:
        """First sample to last sample (0 with no data)."""
        return self.spans[-1][1] - self.spans[0][0] if self.spans else 0.0

    @property
    def gaps(self) -> list[tuple[float, float]]:
        """Stretches of the window without data: before the first span, between spans, after the last."""
        edges = [self.start] + [t for span in self.spans for t in span] + [self.end]
        pairs = zip(edges[::2], edges[1::2], strict=True)
        return [(a, b) for a, b in pairs if b > a]

    @property
    def inner_gaps(self) -> int:
        """Gaps between the first and the last sample."""
        return max(0, len(self.spans) - 1)


def data_coverage(frame: Frame, start: float, end: float, max_gap_s: float = MAX_GAP_S) -> DataCoverage:
    """The spans of (start, end] that hold samples of any report signal. Consecutive sample
    times further apart than max_gap_s, or twice the typical interval, start a new span."""
    ss = columns(frame)
    parts = [p.ts[_window(p, start, end)] for p in ss.by_name.values()]
    before = [p.ts[p.ts <= start].max() for p in ss.by_name.values() if (p.ts <= start).any()]
    inside = np.unique(np.concatenate(parts)) if parts else np.zeros(0)
    if not inside.size:
        return DataCoverage(start, end, ())
    ts = np.unique(np.r_[max(before), inside]) if before else inside  # data running into the window
    dt = np.diff(ts)
    limit = max(max_gap_s, 2 * float(np.median(dt))) if dt.size else max_gap_s
    breaks = np.flatnonzero(dt > limit)
    spans = [
        (max(start, float(ts[a])), float(ts[b]))
        for a, b in zip(np.r_[0, breaks + 1], np.r_[breaks, ts.size - 1], strict=True)
    ]
    return DataCoverage(start, end, tuple((a, b) for a, b in spans if b > start))


def attribution_note(frame: Frame) -> str:
    """'' when every GPU series is attributed to a pool; else why some are not (which labels the
    source lacks) and the config that fixes it. Fleet totals count those GPUs either way."""
    ss = columns(frame)
    gpu = ss.of(utilisation_signal(ss))
    if not gpu.sid.size:
        return ""
    sids = np.unique(gpu.sid)
    lost = sids[gpu_pools(ss)[sids] == "unattributed"]
    if not lost.size:
        return ""
    uuid, node, gpu_index = ss.label("gpu_uuid"), ss.label("node"), ss.label("gpu")
    devices = {uuid[i] or f"{node[i]}/{gpu_index[i]}" for i in lost}
    nodes = sorted({node[i] for i in lost if node[i]})
    names = ss.series["name"].to_numpy()
    engine = np.array([str(n).startswith("engine_") for n in names])
    engine_nodes = {node[i] for i in np.flatnonzero(engine) if node[i]}
    why = []
    if not (names == "engine_gpu_memory_used_bytes").any():
        pods = "" if (ss.label("pod")[lost] != "").any() else "; the GPU series carry no pod/namespace labels"
        why.append(
            "no engine-GPU join (engine_gpu_memory_used_bytes) in the source (it comes from a "
            f"gpu_mapping, Kubernetes pod labels or the NVML process list{pods})"
        )
    if not engine_nodes:
        why.append("the engine series carry no node label, so a node's GPUs cannot be matched to its engines")
    elif shared := [n for n in nodes if n in engine_nodes]:
        why.append(f"{_few(shared)} run engines of more than one pool, so a node does not name the pool")
    fixes = [
        "map GPUs to engines with gpu_mapping: {<gpu_uuid>: <instance>} (the agent's config, or "
        "--gpu-mapping for this report)"
    ]
    if not engine_nodes:
        fixes.append(
            "give each engine target its node (targets: [{url: ..., labels: {node: <node>}}]; "
            "attributes a node's GPUs where it runs one pool)"
        )
    fixes.append("run dcgm-exporter with Kubernetes pod mapping and scrape engines with their pod/namespace labels")
    where = f" on {_few(nodes)}" if nodes else ""
    return (
        f"{len(devices)} GPU(s){where} are not attributed to a pool (per-pool GPU-hours, tokens per "
        f"GPU-hour and cost are absent; fleet totals count them): {'; '.join(why)}. "
        f"Fix: {', or '.join(fixes)}."
    )


def _few(names: Sequence[str], shown: int = 4) -> str:
    """'a, b, c' or 'a, b, c, d and 9 more'."""
    head = ", ".join(names[:shown])
    return head + (f" and {len(names) - shown} more" if len(names) > shown else "")


@dataclass
class WeekStats:
    """One week's numbers. `pools` is indexed by 'model / role'."""

    start: float
    end: float
    utilisation_signal: str
    pools: pd.DataFrame
    fleet: dict[str, float | None]
    tenants: pd.DataFrame
    coverage: DataCoverage
    timeline: pd.DataFrame
    efficiency: Efficiency | None = None


def _window(pts: Points, start: float, end: float) -> np.ndarray:
    return (pts.ts > start) & (pts.ts <= end)


def _counter_by(ss: Columns, name: str, keys: np.ndarray, start: float, end: float) -> pd.Series | None:
    pts, inc = counter_increments(ss, name)
    if pts.sid.size == 0:
        return None
    return _group(keys, _per_sid(ss, pts, inc, _window(pts, start, end)), np.unique(pts.sid))


def _counters(ss: Columns, keys: np.ndarray, start: float, end: float, **names: str) -> dict[str, pd.Series]:
    """column -> its counter's increase per key, for the counters the source has (absent: no column)."""
    cols = {col: _counter_by(ss, name, keys, start, end) for col, name in names.items()}
    return {col: v for col, v in cols.items() if v is not None}


def compute_week(frame: Frame, start: float, end: float, gpu_hour_cost: float) -> WeekStats:
    """All the week's numbers over (start, end]."""
    ss = columns(frame)
    keys = pools(ss)
    table = pd.DataFrame(
        {
            col: _counter_by(ss, name, keys, start, end)
            for col, name in (
                ("output_tokens", "engine_generation_tokens_total"),
                ("prompt_tokens", "engine_prompt_tokens_total"),
                ("prefill_tokens_saved", "engine_prefix_cache_hits_tokens_total"),
                ("prefix_queries", "engine_prefix_cache_queries_tokens_total"),
            )
        }
    )
    gpu, dt = gauge_coverage(ss, utilisation_signal(ss))
    if gpu.sid.size:
        mask, sids, gkeys = _window(gpu, start, end), np.unique(gpu.sid), gpu_pools(ss)
        hours = _group(gkeys, _per_sid(ss, gpu, dt, mask), sids) / 3600
        busy = _group(gkeys, _per_sid(ss, gpu, dt * gpu.value, mask), sids) / 3600
        table = table.join(pd.DataFrame({"gpu_hours": hours, "gpu_util": busy / hours.where(hours > 0)}), how="outer")
    table = _derive(table, gpu_hour_cost)
    cov = data_coverage(frame, start, end)
    return WeekStats(
        start,
        end,
        utilisation_signal(ss),
        table,
        _fleet(table, gpu_hour_cost),
        _tenants(ss, start, end),
        cov,
        _timeline(ss, start, end, cov),
        efficiency(frame, start, end),
    )


def _derive(pools: pd.DataFrame, cost: float) -> pd.DataFrame:
    pools = pools.reindex(
        columns=["output_tokens", "prompt_tokens", "prefill_tokens_saved", "prefix_queries", "gpu_hours", "gpu_util"]
    )
    hours = pools["gpu_hours"].where(pools["gpu_hours"] > 0)
    out_tok = pools["output_tokens"].where(pools["output_tokens"] > 0)
    pools["tokens_per_gpu_hour"] = pools["output_tokens"] / hours
    pools["cost_usd"] = pools["gpu_hours"] * cost
    pools["usd_per_1m_tokens"] = pools["cost_usd"] / out_tok * 1e6
    pools["hit_ratio"] = pools["prefill_tokens_saved"] / pools["prefix_queries"].where(pools["prefix_queries"] > 0)
    pools["utilisation_trap"] = pools["gpu_util"] < UTILISATION_TRAP
    return pools.sort_index()


def _fleet(pools: pd.DataFrame, cost: float) -> dict[str, float | None]:
    def total(col: str) -> float | None:
        s = pools[col].dropna()
        return float(s.sum()) if not s.empty else None

    out = {
        k: total(k) for k in ("output_tokens", "prompt_tokens", "prefill_tokens_saved", "prefix_queries", "gpu_hours")
    }
    hours, tokens = out["gpu_hours"], out["output_tokens"]
    busy = (pools["gpu_hours"] * pools["gpu_util"]).dropna()
    out["gpu_util"] = float(busy.sum() / hours) if hours and not busy.empty else None
    out["tokens_per_gpu_hour"] = tokens / hours if hours and tokens is not None else None
    out["cost_usd"] = hours * cost if hours else None
    out["usd_per_1m_tokens"] = out["cost_usd"] / tokens * 1e6 if out["cost_usd"] and tokens else None
    q = out["prefix_queries"]
    out["hit_ratio"] = out["prefill_tokens_saved"] / q if q and out["prefill_tokens_saved"] is not None else None
    return out


def _tenants(ss: Columns, start: float, end: float) -> pd.DataFrame:
    keys = ss.label("tenant", "unknown")
    cols = _counters(
        ss,
        keys,
        start,
        end,
        requests="tenant_requests_total",
        prompt_tokens="tenant_prompt_tokens_total",
        cached_tokens="tenant_cached_tokens_total",
    )
    if not cols:
        return pd.DataFrame()
    df = pd.DataFrame(cols)
    if {"prompt_tokens", "cached_tokens"} <= set(df):
        df["hit_ratio"] = df["cached_tokens"] / df["prompt_tokens"].where(df["prompt_tokens"] > 0)
    return df.sort_values(df.columns[0], ascending=False)


@dataclass
class Efficiency:
    """What the engines' own efficiency counters say about a week; each frame is empty where no
    engine exports its signals (absent, never 0). `compute`: per pool and `fleet`, mean estimated
    TFLOP/s and GB/s per GPU (vLLM/SGLang --enable-mfu-metrics; counters that never moved = the
    estimate is off, absent); `recompute`: per pool, preemptions and the prompt tokens they made the
    engine prefill again (SGLang counts them; elsewhere estimated as preemptions x mean prompt
    tokens per request, `estimated`), and their share of all prompt tokens; `tiers`: prompt
    tokens served from each KV tier (by `source`: device = the GPU prefix cache, host, disk, ...;
    HiCache host load-back; LMCache and HiCache storage tiers), tiers that served none left out."""

    compute: pd.DataFrame
    recompute: pd.DataFrame
    tiers: pd.Series


def _pool_rate(ss: Columns, name: str, keys: np.ndarray, start: float, end: float) -> pd.Series | None:
    """Per key, a counter's increase per second of the time its series covered (gaps excluded),
    over the series that moved (one that never did is an estimate switched off); NaN where none did."""
    pts, inc = counter_increments(ss, name)
    if not pts.sid.size:
        return None
    _, dt = gauge_coverage(ss, name)
    mask = _window(pts, start, end) & ~_after_gap(pts)
    per_inc = _per_sid(ss, pts, inc, mask)
    sids = np.unique(pts.sid)
    moved = sids[per_inc[sids] > 0]
    total, secs = _group(keys, per_inc, moved), _group(keys, _per_sid(ss, pts, dt, mask), moved)
    return (total / secs.where(secs > 0)).reindex(pd.unique(keys[sids]))


def efficiency(frame: Frame, start: float, end: float) -> Efficiency:
    """The week's `Efficiency` over (start, end]."""
    ss = columns(frame)
    keys = pools(ss)
    rows = []
    for k in (keys, np.full(len(keys), "fleet", dtype=object)):
        flops = _pool_rate(ss, "engine_estimated_flops_per_gpu_total", k, start, end)
        moved = [_pool_rate(ss, f"engine_estimated_{d}_bytes_per_gpu_total", k, start, end) for d in ("read", "write")]
        cols = {} if flops is None else {"tflops_per_gpu": flops / 1e12}
        if parts := [m for m in moved if m is not None]:
            cols["gb_per_s_per_gpu"] = pd.concat(parts, axis=1).sum(axis=1, min_count=1) / 1e9
        if cols:
            rows.append(pd.DataFrame(cols))
    comp = pd.concat(rows).dropna(how="all") if rows else pd.DataFrame()
    rec = pd.DataFrame(
        _counters(
            ss,
            keys,
            start,
            end,
            preemptions="engine_preemptions_total",
            recomputed_tokens="engine_preempted_prompt_tokens_total",
            prompt_tokens="engine_prompt_tokens_total",
            requests="engine_requests_finished_total",
        )
    )
    if "preemptions" in rec:
        rec = rec.reindex(columns=["preemptions", "recomputed_tokens", "prompt_tokens", "requests"])
        per_request = rec["prompt_tokens"] / rec["requests"].where(rec["requests"] > 0)
        rec["estimated"] = rec["recomputed_tokens"].isna() & per_request.notna()
        rec["recomputed_tokens"] = rec["recomputed_tokens"].fillna(rec["preemptions"] * per_request)
        rec["recompute_share"] = rec["recomputed_tokens"] / rec["prompt_tokens"].where(rec["prompt_tokens"] > 0)
        rec = rec[["preemptions", "recomputed_tokens", "estimated", "recompute_share"]]
    else:
        rec = pd.DataFrame()
    tiers: dict[str, float] = {}
    for name, label, what in (
        ("engine_prompt_tokens_cached_total", "source", "{} (engine cache)"),
        ("engine_kv_offload_loaded_tokens_total", "", "host (HiCache load-back)"),
        ("kv_tier_loaded_tokens_total", "tier", "{} tier (loaded)"),
    ):
        got = _counter_by(ss, name, ss.label(label, "?") if label else np.full(len(keys), "", dtype=object), start, end)
        tiers.update({what.format(k): float(v) for k, v in (got if got is not None else {}).items() if v > 0})
    if not any(k.endswith("(engine cache)") for k in tiers):  # no per-source split: the device hits
        hits = _counter_by(
            ss, "engine_prefix_cache_hits_tokens_total", np.full(len(keys), "", dtype=object), start, end
        )
        if hits is not None and hits.sum() > 0:
            tiers = {"device (GPU prefix cache)": float(hits.sum()), **tiers}
    return Efficiency(comp, rec, pd.Series(tiers, dtype=float))


TIMELINE_STEPS_S = (60.0, 300.0, 900.0, 3600.0)
"""Timeline bin widths to choose from: the smallest that still gives at most TIMELINE_BINS bins
over the data held (a 10-minute recording gets 1-minute bins, a full week 1-hour bins)."""
TIMELINE_BINS = 200


def timeline_step(held_s: float) -> float:
    """The bin width for a window holding `held_s` seconds of data."""
    return next((s for s in TIMELINE_STEPS_S if held_s / s <= TIMELINE_BINS), TIMELINE_STEPS_S[-1])


def _bins(ts: np.ndarray, origin: float, step: float, n: int) -> np.ndarray:
    return np.minimum((ts - origin) // step, n - 1).astype(np.int64)


def _after_gap(pts: Points, max_gap_s: float = MAX_GAP_S) -> np.ndarray:
    """True where a point follows its series' previous point by more than the gap limit: what
    it adds happened somewhere in the gap, so a timeline cannot place it in time."""
    dt, limit = _gap_limit(pts, max_gap_s)
    return ~pts.first & (dt > limit)


def _timeline(ss: Columns, start: float, end: float, cov: DataCoverage) -> pd.DataFrame:
    """Fleet numbers per time bin over the whole window (index: bin start, UTC); a bin without
    data is NaN (absent), never zero. Rates are per second of data held in the bin."""
    step = timeline_step(cov.held_s)
    origin = math.floor(start / step) * step  # bins on round clock times
    n = int(math.ceil((end - origin) / step))
    edges = origin + step * np.arange(n + 1)
    held = np.zeros(n)
    for a, b in cov.spans:
        held += np.clip(np.minimum(edges[1:], b) - np.maximum(edges[:-1], a), 0.0, None)
    cols: dict[str, np.ndarray] = {}
    pts, inc = counter_increments(ss, "engine_generation_tokens_total")
    mask = _window(pts, start, end) & ~_after_gap(pts)
    tokens = None
    if mask.any():
        bins = _bins(pts.ts[mask], origin, step, n)
        rated = np.bincount(bins, weights=(~pts.first[mask]).astype(float), minlength=n) > 0  # first points: no rate
        tokens = np.where(rated, np.bincount(bins, weights=inc[mask], minlength=n), np.nan)
        cols["output_tokens_per_s"] = np.where(held > 0, tokens / np.where(held > 0, held, 1), np.nan)
    gpu, dt = gauge_coverage(ss, utilisation_signal(ss))
    mask = _window(gpu, start, end) & ~_after_gap(gpu)
    if mask.any():
        bins = _bins(gpu.ts[mask], origin, step, n)
        hours = np.bincount(bins, weights=dt[mask], minlength=n) / 3600
        busy = np.bincount(bins, weights=(dt * gpu.value)[mask], minlength=n) / 3600
        cols["gpu_util"] = np.where(hours > 0, busy / np.where(hours > 0, hours, 1), np.nan)
        if tokens is not None:
            cols["tokens_per_gpu_hour"] = np.where(hours > 0, tokens / np.where(hours > 0, hours, 1), np.nan)
    index = pd.to_datetime(edges[:-1], unit="s", utc=True)
    frame = pd.DataFrame(cols, index=index)
    frame.attrs["step_s"] = step
    return frame


# ------------------------------------------------------------------------------ the report

DELTA_KEYS = (
    "output_tokens",
    "gpu_hours",
    "tokens_per_gpu_hour",
    "gpu_util",
    "usd_per_1m_tokens",
    "hit_ratio",
    "prefill_tokens_saved",
)


@dataclass(frozen=True)
class Incident:
    """One line of the week's top findings: a finding with the findings that belong to it, grouped
    the way `kvscope diagnose` groups them. `supporting`: findings at the likely cause's place that
    share its mechanism (`Diagnosis.supporting`); `repeats`: the same rule on other instances
    (`render.group_repeats`)."""

    head: Finding
    supporting: tuple[Finding, ...] = ()
    repeats: tuple[Finding, ...] = ()

    @property
    def members(self) -> tuple[Finding, ...]:
        return (self.head,) + self.supporting + self.repeats

    @property
    def severity(self) -> str:
        """The worst severity among its findings."""
        return max((f.severity for f in self.members), key=SEVERITY_RANK.__getitem__)


def group_incidents(diagnoses: Iterable[Diagnosis]) -> list[Incident]:
    """Each diagnosis' likely cause with its supporting findings, each competing hypothesis, and
    the other findings with repeats across instances collapsed: the order `kvscope diagnose` prints."""
    from kvscope.diagnoser.render import group_repeats

    out: list[Incident] = []
    for d in diagnoses:
        supporting = d.supporting
        if d.likely_cause is not None:
            out.append(Incident(d.likely_cause, supporting))
        out += [Incident(f) for f in d.hypotheses]
        support = {id(f) for f in supporting}
        other = tuple(f for f in d.other if id(f) not in support)
        out += [
            Incident(worst, repeats=tuple(m for m in members if m is not worst))
            for worst, members in group_repeats(other)
        ]
    return out


@dataclass
class WeeklyReport:
    this: WeekStats
    previous: WeekStats | None
    gpu_hour_cost: float
    source: str
    incidents: list[Incident] = field(default_factory=list)
    attribution: str = ""  # why GPUs are not attributed to a pool ('' = all are)

    def deltas(self) -> dict[str, float | None]:
        """Relative week-over-week change per fleet number (None when either week lacks it)."""
        out: dict[str, float | None] = {}
        for k in DELTA_KEYS:
            a = self.this.fleet.get(k)
            b = self.previous.fleet.get(k) if self.previous else None
            out[k] = (a - b) / b if a is not None and b not in (None, 0) else None
        return out


def build_report(
    frame: Frame,
    end: float,
    gpu_hour_cost: float,
    source: str,
    top: int = 10,
    diagnoses: Sequence[Diagnosis] = (),
) -> WeeklyReport:
    """The week ending at `end` and, when the data reaches back, the week before it. The top
    findings are the `top` highest-scoring incidents of `diagnoses` (grouped by `group_incidents`)."""
    this = compute_week(frame, end - WEEK_S, end, gpu_hour_cost)
    first = columns(frame).first_ts()
    previous = None
    if first is not None and first <= end - WEEK_S:
        previous = compute_week(frame, end - 2 * WEEK_S, end - WEEK_S, gpu_hour_cost)
    ranked = sorted(group_incidents(diagnoses), key=lambda i: (-i.head.score, -(i.head.until - i.head.since)))[:top]
    return WeeklyReport(this, previous, gpu_hour_cost, source, ranked, attribution_note(frame))
