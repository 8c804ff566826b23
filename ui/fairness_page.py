"""Tenants & fairness: per-tenant usage and prefix-cache hit ratios, from the same frame the rules saw."""

from __future__ import annotations

import pandas as pd
import streamlit as st
from kvscope.ui.data import TriageData, render_when, tenant_table

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
