"""Usage, latency and cost per value of one grouping label of the request tap's series
(`tenant`, `adapter`): one table for every grouping, and the one method that shares GPU time out
among a grouping's values (`gpu_time_share`; docs/requests.md "Cost per tenant and per adapter")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvscope.core.goodput import attainment
from kvscope.core.quantiles import histogram_quantile
from kvscope.report.weekly.series import TENANT_SLO, Columns, counter_by, counters_by


def gpu_time_share(request_seconds: pd.Series) -> pd.Series:
    """Each value's share of the GPU time of the traffic the tap saw: its requests' in-flight
    seconds (arrival to last byte, `<group>_request_seconds_total`) over all values' (pure).

    A request holds a batch slot, its KV blocks and (for a LoRA adapter) an adapter slot while it
    is in flight, so in-flight time is what the engine's time is shared out by; tokens would miss
    that a decode step costs the same whatever the tokens. Assumes the engines behind the tap
    serve only the tapped traffic. NaN (absent) where no value has any in-flight time."""
    total = float(request_seconds.sum())
    return request_seconds / total if total > 0 else request_seconds * np.nan


QUANTILES = {
    "ttft_p50_s": ("ttft", 0.5),
    "ttft_p95_s": ("ttft", 0.95),
    "itl_p50_s": ("itl", 0.5),
    "itl_p95_s": ("itl", 0.95),
}


def group_week(ss: Columns, start: float, end: float, group: str, cost_usd: float | None) -> pd.DataFrame:
    """Per value of `group` over (start, end]: requests, tokens, hit ratio, TTFT/ITL p50/p95 (from
    the histograms' bucket increases), SLO attainment (the share of requests with a first token
    within the TTFT SLO bound, and the share that did not fail upstream: SloConfig, as the
    generated rules), goodput (exact, from the tap's per-request counts), GPU-time share and
    its cost (`cost_usd`, the fleet's GPU cost, times the share; absent without GPU series).
    Empty without `<group>_*` series; a column without data is absent."""
    keys = ss.label(group, "unknown")
    cols = counters_by(
        ss,
        keys,
        start,
        end,
        requests=f"{group}_requests_total",
        prompt_tokens=f"{group}_prompt_tokens_total",
        completion_tokens=f"{group}_completion_tokens_total",
        cached_tokens=f"{group}_cached_tokens_total",
        errors=f"{group}_request_errors_total",
        request_seconds=f"{group}_request_seconds_total",
    )
    le = ss.label("le", "")
    for hist in ("ttft", "itl"):
        per_key = _buckets(ss, f"{group}_{hist}_seconds_bucket", keys, le, start, end)
        for col, q in ((col, q) for col, (h, q) in QUANTILES.items() if h == hist):
            cols[col] = pd.Series({k: histogram_quantile(q, b) for k, b in per_key.items()}, dtype=float)
        if hist == "ttft":  # the share within the SLO bound, where that bound is a bucket bound
            within = {k: attainment(b, TENANT_SLO.ttft_seconds) for k, b in per_key.items()}
            cols["ttft_slo"] = pd.Series(
                {k: a.good_lo / a.total for k, a in within.items() if a and a.good_lo == a.good_hi}, dtype=float
            )
    cols = {col: got for col, got in cols.items() if got.notna().any()}
    if not cols:
        return pd.DataFrame()
    df = pd.DataFrame(cols)
    if {"prompt_tokens", "cached_tokens"} <= set(df):
        df["hit_ratio"] = df["cached_tokens"] / df["prompt_tokens"].where(df["prompt_tokens"] > 0)
    if {"errors", "requests"} <= set(df):
        df["error_slo"] = 1 - df["errors"] / df["requests"].where(df["requests"] > 0)
    if (good := _goodput(ss, group, start, end)) is not None:
        df["goodput"] = good
    if "request_seconds" in df:
        df["gpu_time_share"] = gpu_time_share(df["request_seconds"].fillna(0.0))
        if cost_usd is not None:
            df["cost_usd"] = df["gpu_time_share"] * cost_usd
    df = df.drop(columns=[c for c in ("errors", "request_seconds") if c in df])
    return df.sort_values(df.columns[0], ascending=False)


GOODPUT_KEY = {"tenant": "tenant", "adapter": "model"}
"""The label of the tap's goodput counters (goodput_*_total{tenant,model}) that carries each
grouping: the adapter is the request's `model` there."""


def _goodput(ss: Columns, group: str, start: float, end: float) -> pd.Series | None:
    """Per value of `group`: the share of the requests the tap judged that met every latency
    objective, counted per request (exact; docs/goodput.md). None without the tap's counts."""
    if group not in GOODPUT_KEY:
        return None
    keys = ss.label(GOODPUT_KEY[group], "unknown")
    cols = counters_by(ss, keys, start, end, judged="goodput_requests_total", good="goodput_good_requests_total")
    if set(cols) != {"judged", "good"}:
        return None
    return cols["good"] / cols["judged"].where(cols["judged"] > 0)


def _buckets(
    ss: Columns, name: str, keys: np.ndarray, le: np.ndarray, start: float, end: float
) -> dict[str, list[tuple[float, float]]]:
    """Per key, the histogram's bucket increases over (start, end] as [(le, increase)], one entry
    per bound ("1" and "1.0" summed); empty without the histogram."""
    both = np.array([f"{k}\0{b}" for k, b in zip(keys, le, strict=True)], dtype=object)
    got = counter_by(ss, name, both, start, end)
    per_key: dict[str, dict[float, float]] = {}
    for idx, inc in () if got is None else got.items():
        key, _, bound = str(idx).rpartition("\0")
        try:
            at = per_key.setdefault(key, {})
            at[float(bound)] = at.get(float(bound), 0.0) + float(inc)
        except ValueError:
            continue
    return {k: sorted(b.items()) for k, b in per_key.items()}
