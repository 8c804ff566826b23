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


GOODPUT_KEY = {"tenant": "tenant", "adapter": "model"}
"""The label of the tap's goodput counters (goodput_*_total{tenant,model}) that carries each
grouping: the adapter is the request's `model` there."""


def group_keys(ss: Columns, label: str, by_instance: bool = False) -> np.ndarray:
    """Per sid, the row key of the group table: the value of `label` ("unknown" where a series
    lacks it), joined with the series' instance by a NUL when `by_instance`."""
    keys = ss.label(label, "unknown")
    if not by_instance:
        return keys
    return np.array([f"{k}\0{i}" for k, i in zip(keys, ss.label("instance"), strict=True)], dtype=object)


def group_table(ss: Columns, start: float, end: float, group: str, by_instance: bool = False) -> pd.DataFrame:
    """The one table per value of `group` (`tenant`, `adapter`; per value and instance with
    `by_instance`, keys as `group_keys`) over (start, end]: the tap's counters' increases
    (requests, tokens, errors, in-flight seconds), TTFT/ITL p50/p95 (from the histograms'
    bucket increases), mean TTFT (`_sum` over `_count`), SLO attainment (the share of requests
    with a first token within the TTFT SLO bound, and the share that did not fail upstream:
    SloConfig, as the generated rules), the cache hit ratio (cached over prompt tokens),
    goodput (exact, from the tap's per-request counts) and the GPU-time share. Empty without
    `<group>_*` series; a column without data is absent."""
    keys = group_keys(ss, group, by_instance)
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
        ttft_sum=f"{group}_ttft_seconds_sum",
        ttft_count=f"{group}_ttft_seconds_count",
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
    if group in GOODPUT_KEY:  # per request, as the tap judged it (docs/goodput.md)
        counts = counters_by(
            ss,
            group_keys(ss, GOODPUT_KEY[group], by_instance),
            start,
            end,
            judged="goodput_requests_total",
            good="goodput_good_requests_total",
        )
        if set(counts) == {"judged", "good"}:
            cols["goodput"] = counts["good"] / counts["judged"].where(counts["judged"] > 0)
    cols = {col: got for col, got in cols.items() if got.notna().any()}
    if not cols:
        return pd.DataFrame()
    df = pd.DataFrame(cols)
    if {"ttft_sum", "ttft_count"} <= set(df):
        df["ttft_mean_s"] = df["ttft_sum"] / df["ttft_count"].where(df["ttft_count"] > 0)
    if {"prompt_tokens", "cached_tokens"} <= set(df):
        df["hit_ratio"] = df["cached_tokens"] / df["prompt_tokens"].where(df["prompt_tokens"] > 0)
    if {"errors", "requests"} <= set(df):
        df["error_slo"] = 1 - df["errors"] / df["requests"].where(df["requests"] > 0)
    if "request_seconds" in df:
        df["gpu_time_share"] = gpu_time_share(df["request_seconds"].fillna(0.0))
    return df.drop(columns=[c for c in ("errors", "request_seconds", "ttft_sum", "ttft_count") if c in df])


def group_week(ss: Columns, start: float, end: float, group: str, cost_usd: float | None) -> pd.DataFrame:
    """`group_table` per value of `group` over the week, with each value's GPU cost (`cost_usd`,
    the fleet's GPU cost, times its GPU-time share; absent without GPU series), largest first."""
    df = group_table(ss, start, end, group)
    if df.empty:
        return df
    if "gpu_time_share" in df and cost_usd is not None:
        df["cost_usd"] = df["gpu_time_share"] * cost_usd
    return df.sort_values(df.columns[0], ascending=False)


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
