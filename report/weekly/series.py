"""The weekly report's window and its columns: the signals it reads, `report_window` (one Frame
through `read_window`), and the Frame's points as columns (`Columns`) with the vectorised
primitives every section uses: counter increments, gauge coverage, sums per series and per key."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvscope.core.rates import step_increases
from kvscope.diagnoser.curve.window import SIGNALS as CURVE_SIGNALS
from kvscope.diagnoser.evaluate.frame import Frame
from kvscope.diagnoser.goodput import SIGNALS as GOODPUT_SIGNALS
from kvscope.diagnoser.promql.rulefiles import SloConfig
from kvscope.diagnoser.sources.window import Source, Span, read_window

WEEK_S = 7 * 86400.0


UTILISATION_TRAP = 0.4
"""002 §9.3 'Fleet utilization ... below 40 % - you are in the utilization trap'."""


TENANT_SLO = SloConfig()
"""The per-tenant SLO the attainment columns measure: the generated rules' defaults."""


MAX_GAP_S = 300.0
"""A GPU sample covers the time since the previous one, at most this long or twice the typical
sampling interval, whichever is larger (a gap in the data is not a GPU-hour)."""


GROUP_COUNTERS = (
    "requests_total",
    "prompt_tokens_total",
    "completion_tokens_total",
    "cached_tokens_total",
    "request_errors_total",
    "request_seconds_total",
    "ttft_seconds_bucket",  # TTFT SLO attainment and quantiles per tenant / adapter (groups.py)
    "itl_seconds_bucket",
    "ttft_seconds_sum",  # the mean TTFT (the UI's table)
    "ttft_seconds_count",
)
"""The request tap's per-group counters (`<group>_<name>`) the tenant and adapter tables read."""


COUNTERS = (
    "engine_generation_tokens_total",
    "engine_prompt_tokens_total",
    "engine_prefix_cache_hits_tokens_total",
    "engine_prefix_cache_queries_tokens_total",
    "engine_requests_finished_total",
    *(f"{group}_{name}" for group in ("tenant", "adapter") for name in GROUP_COUNTERS),
    "goodput_requests_total",  # the request tap's per-request goodput counts, per tenant and model (exact)
    "goodput_good_requests_total",
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
"""Every canonical sample name the report's tables read (`columns`)."""


READ_SIGNALS = SIGNALS + tuple(sorted((CURVE_SIGNALS | GOODPUT_SIGNALS) - set(SIGNALS)))
"""What `report_window` reads: the tables' signals, the operating curve's (histogram buckets,
concurrency, the config gauges), from which "what changed this week" is judged (changes.py), and
goodput's (the per-objective histograms and the request tap's goodput counters)."""


def report_window(source: Source, end: float | None = None, start: float | None = None) -> Frame:
    """The report's signals from `source` through `read_window`: a source with its own step (a
    recording) over its whole span at that step; any other (a TSDB, the agent's store) over
    [start, end] (start: two weeks before `end` when None) on `report_step`'s grid. Read the
    source with `carry=False` where it has the option: a grid point then holds only the point
    taken in the step before it, not one carried from further back."""
    natural = source.natural_step()
    if natural:
        return read_window(source, READ_SIGNALS, Span(), natural)
    if end is None:
        raise ValueError(f"{source.description}: the report needs the end of its week")
    start = end - 2 * WEEK_S if start is None else start
    step = report_step(end - start)
    return read_window(source, READ_SIGNALS, Span(math.floor(start / step) * step, end), step)


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


def per_sid(ss: Columns, pts: Points, weights: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Sum of weights per sid over the masked points."""
    return np.bincount(pts.sid[mask], weights=weights[mask], minlength=len(ss.series))


def group_sum(keys: np.ndarray, per_sid: np.ndarray, sids: np.ndarray) -> pd.Series:
    """Sum per-sid totals by a per-sid key, over the given sids."""
    return pd.Series(per_sid[sids]).groupby(keys[sids]).sum()


def in_window(pts: Points, start: float, end: float) -> np.ndarray:
    return (pts.ts > start) & (pts.ts <= end)


def counter_by(ss: Columns, name: str, keys: np.ndarray, start: float, end: float) -> pd.Series | None:
    pts, inc = counter_increments(ss, name)
    if pts.sid.size == 0:
        return None
    return group_sum(keys, per_sid(ss, pts, inc, in_window(pts, start, end)), np.unique(pts.sid))


def counters_by(ss: Columns, keys: np.ndarray, start: float, end: float, **names: str) -> dict[str, pd.Series]:
    """column -> its counter's increase per key, for the counters the source has (absent: no column)."""
    cols = {col: counter_by(ss, name, keys, start, end) for col, name in names.items()}
    return {col: v for col, v in cols.items() if v is not None}


def after_gap(pts: Points, max_gap_s: float = MAX_GAP_S) -> np.ndarray:
    """True where a point follows its series' previous point by more than the gap limit: what
    it adds happened somewhere in the gap, so a timeline cannot place it in time."""
    dt, limit = _gap_limit(pts, max_gap_s)
    return ~pts.first & (dt > limit)
