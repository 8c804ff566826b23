"""Tenants & fairness, and memory-pressure cascades, from the same frame the rules saw."""

from __future__ import annotations

import pandas as pd
import streamlit as st
from kvscope.ui.data import TriageData, render_when, signal_frame, tenant_table

TENANT_SIGNALS = ("tenant_requests_total", "tenant_prompt_tokens_total", "tenant_cached_tokens_total",
                  "tenant_prefix_hit_ratio", "tenant_lost_reuse_ratio")
FLEET_GAUGES = {"fleet_tenant_hit_jain_ratio": "Jain index of tenant hit ratios (1 = even)",
                "fleet_cold_tenant_ratio": "Share of cold tenants",
                "fleet_tenant_hit_ratio_tail_gap_ratio": "Aggregate minus worst tenant hit ratio"}


def render(data: TriageData) -> None:
    st.title("Tenants & fairness")
    table = tenant_table(data.frame)
    if table.empty:
        st.info("This source has no per-tenant series. vLLM exports no tenant label; kvscope's request tap or "
                "trace receiver produces tenant_* series (docs/requests.md), SGLang does with "
                "--tokenizer-metrics-allowed-custom-labels tenant.")
    else:
        cols = st.columns(len(FLEET_GAUGES))
        for col, (name, label) in zip(cols, FLEET_GAUGES.items(), strict=True):
            latest = _latest(data, name)
            col.metric(label, "absent" if latest is None else f"{latest:.2f}")
        st.dataframe(table, hide_index=True, width="stretch")
    findings = [f for f in data.diagnosis.findings if "tenant" in f.where or f.levers_md.startswith("P8")]
    if findings:
        st.header("Tenant findings")
        for f in findings:
            st.markdown(f"- **{f.title}** `{f.where}` since {render_when(f.since)}: {f.summary}")


def _latest(data: TriageData, name: str) -> float | None:
    block = data.frame.block(name)
    if block is None:
        return None
    last = pd.DataFrame(block.values.T).ffill().iloc[-1]
    return None if last.isna().all() else float(last.min() if "jain" in name else last.max())


def render_cascades(data: TriageData) -> None:
    st.title("Memory-pressure cascades")
    st.caption("002 §7.4: KV full → evictions/preemptions → queue grows → TTFT grows (and GPU utilisation drops). "
               "Act at stage 2, before the latency alerts fire.")
    rows = [{"instance": inst, "stage": r.stage, "stage name": r.stage_name,
             "lead time (s)": r.lead_time_s, "onsets": ", ".join(f"{s}: {render_when(t)}"
                                                                 for s, t in sorted(r.onsets.items())),
             "signals missing": ", ".join(r.signals_missing)} for inst, r in sorted(data.cascades.items())]
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    else:
        st.info("No cascade state computed for this source.")
    for f in data.diagnosis.findings:
        if f.cascade:
            where = ", ".join(f"{k}={v}" for k, v in sorted(f.where.items())) or "fleet"
            lead = "not reached" if f.cascade.lead_time_s is None else f"{f.cascade.lead_time_s:.0f} s"
            st.markdown(f"**{f.title}** on `{where}`: stage {f.cascade.stage}/{f.cascade.stages_total} "
                        f"({f.cascade.stage_name}); the root led the latency symptom by {lead}")
    for signal in ("engine_kv_cache_usage_ratio", "engine_preemptions_total", "engine_requests_waiting",
                   "request_ttft_seconds"):
        df = signal_frame(data.frame, signal) if _has(data, signal) else pd.DataFrame()
        if not df.empty:
            st.markdown(f"`{signal}` ({CHART_UNITS[signal]})")
            st.line_chart(df, height=200)


CHART_UNITS = {"engine_kv_cache_usage_ratio": "ratio of the KV pool", "engine_preemptions_total": "per second",
               "engine_requests_waiting": "requests", "request_ttft_seconds": "mean seconds per grid step"}


def _has(data: TriageData, signal: str) -> bool:
    return any(n.startswith(signal) for n in data.frame.blocks)
