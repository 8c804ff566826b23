"""The weekly efficiency review: what the fleet produced, what it cost, and what went wrong.

From canonical series (a recording, the agent's SQLite store, or Prometheus scraping the agent's
`kvscope_*` re-export) it computes, per model/pool (model × role) and for the fleet:

* output tokens per GPU-hour (002 §9.3's core efficiency number) and GPU-hours;
* mean GPU utilisation and the utilisation trap (002 §9.2: below 40 % the fleet pays 2.5× the
  efficient cost per token; cost per token scales with 1 / utilisation);
* $ per 1M output tokens at a configured $/GPU-hour (idle GPU-hours count);
* prefill tokens saved by prefix caching (tokens served from the cache instead of recomputed);
* per-tenant requests, prompt tokens and cache hit ratio;
* week-over-week deltas, and the week's top findings.

Series are held columnar (`SeriesSet`: one row per series, one row per point) so the maths is
vectorised pandas/numpy; a signal the source lacks stays absent (None), never zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from kvscope.agent.signals import Sample
from kvscope.diagnoser.findings import Finding

WEEK_S = 7 * 86400.0
UTILISATION_TRAP = 0.4
"""002 §9.3 'Fleet utilization ... below 40 % - you are in the utilization trap'."""
MAX_GAP_S = 300.0
"""A GPU sample covers the time since the previous one, at most this long or twice the typical
sampling interval, whichever is larger (a gap in the data is not a GPU-hour)."""

COUNTERS = ("engine_generation_tokens_total", "engine_prompt_tokens_total", "engine_prefix_cache_hits_tokens_total",
            "engine_prefix_cache_queries_tokens_total", "engine_requests_finished_total",
            "tenant_requests_total", "tenant_prompt_tokens_total", "tenant_cached_tokens_total")
GAUGES = ("gpu_utilization_ratio", "engine_gpu_memory_used_bytes", "engine_requests_running")
SIGNALS = COUNTERS + GAUGES
"""Every canonical sample name the report reads."""


# ------------------------------------------------------------------------------ columnar series

@dataclass
class SeriesSet:
    """series: one row per series (index = sid; columns name + labels). points: sid, ts, value,
    sorted by (sid, ts)."""

    series: pd.DataFrame
    points: pd.DataFrame

    def label(self, sid_column: pd.Series, label: str, default: str = "") -> pd.Series:
        """The value of `label` for each sid in a column (default where the series lacks it)."""
        col = self.series[label] if label in self.series else pd.Series(default, index=self.series.index)
        return sid_column.map(col.fillna(default)).fillna(default)

    def of(self, name: str) -> pd.DataFrame:
        """Points of every series of one sample name."""
        sids = self.series.index[self.series["name"] == name]
        return self.points[self.points["sid"].isin(sids)]


def series_set_from_arrays(series: Sequence[dict[str, str]], sids: np.ndarray, ts: np.ndarray,
                           values: np.ndarray) -> SeriesSet:
    """Build from a list of label dicts (each with 'name') and parallel point arrays."""
    frame = pd.DataFrame(list(series))
    frame.index.name = "sid"
    points = pd.DataFrame({"sid": sids.astype(np.int32), "ts": ts.astype(float), "value": values.astype(float)})
    points = points.sort_values(["sid", "ts"], kind="stable", ignore_index=True)
    return SeriesSet(frame, points)


def series_set_from_samples(samples: Iterable[Sample], names: Iterable[str] = SIGNALS) -> SeriesSet:
    """Columnar series from canonical samples (a replayed recording), keeping only `names`."""
    wanted, ids = set(names), {}
    series: list[dict[str, str]] = []
    sids, ts, values = [], [], []
    for s in samples:
        if s.name not in wanted or s.timestamp is None:
            continue
        key = (s.name, s.labels)
        sid = ids.get(key)
        if sid is None:
            sid = ids[key] = len(series)
            series.append({"name": s.name, **dict(s.labels)})
        sids.append(sid)
        ts.append(s.timestamp)
        values.append(s.value)
    return series_set_from_arrays(series or [{"name": ""}], np.array(sids, dtype=np.int32),
                                  np.array(ts, dtype=float), np.array(values, dtype=float))


def read_store_series(path: str, start: float, end: float) -> SeriesSet:
    """The report's signals from an agent SQLite store."""
    from kvscope.agent.store import SqliteStore

    store = SqliteStore(path, background=False)
    try:
        samples = [Sample(name, labels, v, t) for name in sorted(store.names() & set(SIGNALS))
                   for labels, points in store.query(name, start, end).items() for t, v in points]
    finally:
        store.close()
    return series_set_from_samples(samples)


def read_prometheus_series(url: str, start: float, end: float, timeout_s: float = 30.0) -> SeriesSet:
    """The report's signals as `kvscope_<signal>` from a Prometheus that scrapes the agent."""
    import json
    import urllib.parse
    import urllib.request

    step = max(15.0, math.ceil((end - start) / 10_000))      # Prometheus caps 11,000 points per series
    samples: list[Sample] = []
    for name in SIGNALS:
        query = urllib.parse.urlencode({"query": f"kvscope_{name}", "start": start, "end": end, "step": step})
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query_range?{query}", timeout=timeout_s) as resp:
            body = json.loads(resp.read(64 << 20))
        if body.get("status") != "success":
            raise ValueError(f"Prometheus query for {name} failed: {body.get('error')}")
        for res in body["data"]["result"]:
            labels = tuple(sorted((k, v) for k, v in res["metric"].items() if k != "__name__"))
            samples += [Sample(name, labels, float(v), float(t)) for t, v in res["values"]]
    return series_set_from_samples(samples)


# ------------------------------------------------------------------------------ maths

def counter_increments(ss: SeriesSet, name: str) -> pd.DataFrame:
    """sid, ts, inc: the increase since the previous point of the same series, resets handled
    the Prometheus way (a drop means the counter restarted from zero)."""
    pts = ss.of(name)
    if pts.empty:
        return pts.assign(inc=[])
    v, sid = pts["value"].to_numpy(), pts["sid"].to_numpy()
    d = np.diff(v, prepend=np.nan)
    inc = np.where(d >= 0, d, v)
    inc[np.r_[True, sid[1:] != sid[:-1]]] = 0.0
    return pd.DataFrame({"sid": sid, "ts": pts["ts"].to_numpy(), "inc": inc})


def gauge_coverage(ss: SeriesSet, name: str, max_gap_s: float = MAX_GAP_S) -> pd.DataFrame:
    """sid, ts, value, dt: each point weighted by the time since the previous point (capped)."""
    pts = ss.of(name)
    if pts.empty:
        return pts.assign(dt=[])
    t, sid = pts["ts"].to_numpy(), pts["sid"].to_numpy()
    dt = np.diff(t, prepend=np.nan)
    first = np.r_[True, sid[1:] != sid[:-1]]
    typical = float(np.median(dt[~first])) if (~first).any() else 0.0
    dt = np.clip(dt, 0.0, max(max_gap_s, 2 * typical))
    dt[first] = 0.0
    return pd.DataFrame({"sid": sid, "ts": t, "value": pts["value"].to_numpy(), "dt": dt})


def pool_of(ss: SeriesSet, sids: pd.Series) -> pd.Series:
    """'model / role' for engine series (role defaults to unified)."""
    model = ss.label(sids, "model", "unknown").replace("", "unknown")
    role = ss.label(sids, "role", "unified").replace("", "unified")
    return model + " / " + role


def gpu_pools(ss: SeriesSet, gpu_sids: pd.Series) -> pd.Series:
    """The pool each GPU series serves: via the engine↔GPU join (engine_gpu_memory_used_bytes),
    else via a node that runs engines of a single pool; 'unattributed' otherwise."""
    out = pd.Series("unattributed", index=gpu_sids.index)
    engine_pool = _instance_pools(ss)
    join = ss.series[ss.series["name"] == "engine_gpu_memory_used_bytes"]
    if not join.empty and "gpu_uuid" in ss.series:
        by_uuid = {u: engine_pool.get(i) for u, i in zip(join["gpu_uuid"], join["instance"], strict=True)}
        out = ss.label(gpu_sids, "gpu_uuid").map(by_uuid).fillna(out)
    if "node" in ss.series:
        node_pool = _node_pools(ss)
        rest = out == "unattributed"
        out[rest] = ss.label(gpu_sids[rest], "node").map(node_pool).fillna("unattributed")
    return out


def _instance_pools(ss: SeriesSet) -> dict[str, str]:
    eng = ss.series[ss.series["name"].str.startswith("engine_") & (ss.series["name"] != "engine_gpu_memory_used_bytes")]
    if eng.empty or "instance" not in eng:
        return {}
    pools = pool_of(ss, pd.Series(eng.index, index=eng.index))
    return dict(zip(eng["instance"], pools, strict=True))


def _node_pools(ss: SeriesSet) -> dict[str, str]:
    eng = ss.series[ss.series["name"].str.startswith("engine_")]
    if eng.empty or "node" not in eng:
        return {}
    frame = pd.DataFrame({"node": eng["node"], "pool": pool_of(ss, pd.Series(eng.index, index=eng.index))}).dropna()
    single = frame.groupby("node")["pool"].nunique()
    frame = frame[frame["node"].isin(single[single == 1].index)]
    return dict(zip(frame["node"], frame["pool"], strict=True))


@dataclass
class WeekStats:
    """One week's numbers. `pools` is indexed by 'model / role'."""

    start: float
    end: float
    pools: pd.DataFrame
    fleet: dict[str, float | None]
    tenants: pd.DataFrame
    daily: pd.DataFrame


def _in(df: pd.DataFrame, start: float, end: float) -> pd.DataFrame:
    return df[(df["ts"] > start) & (df["ts"] <= end)]


def compute_week(ss: SeriesSet, start: float, end: float, gpu_hour_cost: float) -> WeekStats:
    """All the week's numbers over (start, end]."""
    sums = {}
    for name in ("engine_generation_tokens_total", "engine_prompt_tokens_total",
                 "engine_prefix_cache_hits_tokens_total", "engine_prefix_cache_queries_tokens_total"):
        inc = _in(counter_increments(ss, name), start, end)
        sums[name] = inc.groupby(pool_of(ss, inc["sid"]).to_numpy())["inc"].sum() if not inc.empty else None
    gpu = _in(gauge_coverage(ss, "gpu_utilization_ratio"), start, end)
    pools = pd.DataFrame({
        "output_tokens": sums["engine_generation_tokens_total"], "prompt_tokens": sums["engine_prompt_tokens_total"],
        "prefill_tokens_saved": sums["engine_prefix_cache_hits_tokens_total"],
        "prefix_queries": sums["engine_prefix_cache_queries_tokens_total"]})
    if not gpu.empty:
        gp = gpu.assign(pool=gpu_pools(ss, gpu["sid"]).to_numpy(), busy=gpu["value"] * gpu["dt"])
        g = gp.groupby("pool")[["dt", "busy"]].sum()
        pools = pools.join(pd.DataFrame({"gpu_hours": g["dt"] / 3600, "gpu_util": g["busy"] / g["dt"]}), how="outer")
    pools = _derive(pools, gpu_hour_cost)
    return WeekStats(start, end, pools, _fleet(pools, gpu_hour_cost), _tenants(ss, start, end),
                     _daily(ss, gpu, start, end))


def _derive(pools: pd.DataFrame, cost: float) -> pd.DataFrame:
    pools = pools.reindex(columns=["output_tokens", "prompt_tokens", "prefill_tokens_saved", "prefix_queries",
                                   "gpu_hours", "gpu_util"])
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

    out = {k: total(k) for k in ("output_tokens", "prompt_tokens", "prefill_tokens_saved", "prefix_queries",
                                 "gpu_hours")}
    hours, tokens = out["gpu_hours"], out["output_tokens"]
    busy = (pools["gpu_hours"] * pools["gpu_util"]).dropna()
    out["gpu_util"] = float(busy.sum() / hours) if hours and not busy.empty else None
    out["tokens_per_gpu_hour"] = tokens / hours if hours and tokens is not None else None
    out["cost_usd"] = hours * cost if hours else None
    out["usd_per_1m_tokens"] = out["cost_usd"] / tokens * 1e6 if out["cost_usd"] and tokens else None
    q = out["prefix_queries"]
    out["hit_ratio"] = out["prefill_tokens_saved"] / q if q and out["prefill_tokens_saved"] is not None else None
    return out


def _tenants(ss: SeriesSet, start: float, end: float) -> pd.DataFrame:
    cols = {}
    for name, col in (("tenant_requests_total", "requests"), ("tenant_prompt_tokens_total", "prompt_tokens"),
                      ("tenant_cached_tokens_total", "cached_tokens")):
        inc = _in(counter_increments(ss, name), start, end)
        if not inc.empty:
            cols[col] = inc.groupby(ss.label(inc["sid"], "tenant", "unknown").to_numpy())["inc"].sum()
    if not cols:
        return pd.DataFrame()
    df = pd.DataFrame(cols)
    if {"prompt_tokens", "cached_tokens"} <= set(df):
        df["hit_ratio"] = df["cached_tokens"] / df["prompt_tokens"].where(df["prompt_tokens"] > 0)
    return df.sort_values(df.columns[0], ascending=False)


def _daily(ss: SeriesSet, gpu: pd.DataFrame, start: float, end: float) -> pd.DataFrame:
    inc = _in(counter_increments(ss, "engine_generation_tokens_total"), start, end)
    day = lambda ts: pd.to_datetime(ts, unit="s", utc=True).dt.floor("D")  # noqa: E731
    parts = {}
    if not inc.empty:
        parts["output_tokens"] = inc.groupby(day(inc["ts"]))["inc"].sum()
    if not gpu.empty:
        g = gpu.assign(busy=gpu["value"] * gpu["dt"]).groupby(day(gpu["ts"]))[["dt", "busy"]].sum()
        parts["gpu_hours"] = g["dt"] / 3600
        parts["gpu_util"] = g["busy"] / g["dt"].where(g["dt"] > 0)
    df = pd.DataFrame(parts)
    if {"output_tokens", "gpu_hours"} <= set(df):
        df["tokens_per_gpu_hour"] = df["output_tokens"] / df["gpu_hours"].where(df["gpu_hours"] > 0)
    return df


# ------------------------------------------------------------------------------ the report

DELTA_KEYS = ("output_tokens", "gpu_hours", "tokens_per_gpu_hour", "gpu_util", "usd_per_1m_tokens",
              "hit_ratio", "prefill_tokens_saved")


@dataclass
class WeeklyReport:
    this: WeekStats
    previous: WeekStats | None
    gpu_hour_cost: float
    source: str
    findings: list[Finding] = field(default_factory=list)

    def deltas(self) -> dict[str, float | None]:
        """Relative week-over-week change per fleet number (None when either week lacks it)."""
        out: dict[str, float | None] = {}
        for k in DELTA_KEYS:
            a = self.this.fleet.get(k)
            b = self.previous.fleet.get(k) if self.previous else None
            out[k] = (a - b) / b if a is not None and b not in (None, 0) else None
        return out


def build_report(ss: SeriesSet, end: float, gpu_hour_cost: float, source: str,
                 findings: Sequence[Finding] = (), top: int = 10) -> WeeklyReport:
    """The week ending at `end` and, when the data reaches back, the week before it."""
    this = compute_week(ss, end - WEEK_S, end, gpu_hour_cost)
    first = float(ss.points["ts"].min()) if not ss.points.empty else end
    previous = compute_week(ss, end - 2 * WEEK_S, end - WEEK_S, gpu_hour_cost) if first <= end - WEEK_S else None
    ranked = sorted(findings, key=lambda f: (-f.score, -(f.until - f.since)))[:top]
    return WeeklyReport(this, previous, gpu_hour_cost, source, ranked)
