"""One week's numbers: per pool, fleet, tenants, adapters and the engines' efficiency counters."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvscope.core.objectives import ObjectiveSet
from kvscope.diagnoser.evaluate.frame import Frame
from kvscope.diagnoser.goodput import pool_goodput, share_text
from kvscope.report.weekly.coverage import DataCoverage, data_coverage, timeline
from kvscope.report.weekly.gpus import gpu_pools, pools
from kvscope.report.weekly.groups import group_week
from kvscope.report.weekly.series import (
    TENANT_SLO,
    UTILISATION_TRAP,
    Columns,
    after_gap,
    columns,
    counter_by,
    counter_increments,
    counters_by,
    gauge_coverage,
    group_sum,
    in_window,
    per_sid,
    utilisation_signal,
)


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
    adapters: pd.DataFrame = field(default_factory=pd.DataFrame)  # as `tenants`, per requested model


def compute_week(
    frame: Frame, start: float, end: float, gpu_hour_cost: float, objectives: ObjectiveSet | None = None
) -> WeekStats:
    """All the week's numbers over (start, end]; goodput against `objectives` (default: the
    generated rules' defaults, TENANT_SLO.objectives)."""
    ss = columns(frame)
    keys = pools(ss)
    table = pd.DataFrame(
        {
            col: counter_by(ss, name, keys, start, end)
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
        mask, sids, gkeys = in_window(gpu, start, end), np.unique(gpu.sid), gpu_pools(ss)
        hours = group_sum(gkeys, per_sid(ss, gpu, dt, mask), sids) / 3600
        busy = group_sum(gkeys, per_sid(ss, gpu, dt * gpu.value, mask), sids) / 3600
        table = table.join(pd.DataFrame({"gpu_hours": hours, "gpu_util": busy / hours.where(hours > 0)}), how="outer")
    table = _derive(table, gpu_hour_cost)
    table["goodput"] = _goodput(frame, table.index, start, end, objectives or TENANT_SLO.objectives)
    cov = data_coverage(frame, start, end)
    fleet = _fleet(table, gpu_hour_cost)
    return WeekStats(
        start,
        end,
        utilisation_signal(ss),
        table,
        fleet,
        group_week(ss, start, end, "tenant", fleet["cost_usd"]),
        cov,
        timeline(ss, start, end, cov),
        efficiency(frame, start, end),
        group_week(ss, start, end, "adapter", fleet["cost_usd"]),
    )


def _goodput(frame: Frame, keys: pd.Index, start: float, end: float, objectives: ObjectiveSet) -> list[str | None]:
    """Per 'model / role' row, its model's goodput over the week against `objectives` (each
    pool's own where they set one): exact from the request tap, else the histograms' bounds."""
    by_model = {g.pool: g for g in pool_goodput(frame, objectives, (start, end))}
    return [share_text(by_model.get(str(k).split(" / ", 1)[0])) for k in keys]


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
    mask = in_window(pts, start, end) & ~after_gap(pts)
    per_inc = per_sid(ss, pts, inc, mask)
    sids = np.unique(pts.sid)
    moved = sids[per_inc[sids] > 0]
    total, secs = group_sum(keys, per_inc, moved), group_sum(keys, per_sid(ss, pts, dt, mask), moved)
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
        counters_by(
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
        got = counter_by(ss, name, ss.label(label, "?") if label else np.full(len(keys), "", dtype=object), start, end)
        tiers.update({what.format(k): float(v) for k, v in (got if got is not None else {}).items() if v > 0})
    if not any(k.endswith("(engine cache)") for k in tiers):  # no per-source split: the device hits
        hits = counter_by(ss, "engine_prefix_cache_hits_tokens_total", np.full(len(keys), "", dtype=object), start, end)
        if hits is not None and hits.sum() > 0:
            tiers = {"device (GPU prefix cache)": float(hits.sum()), **tiers}
    return Efficiency(comp, rec, pd.Series(tiers, dtype=float))
