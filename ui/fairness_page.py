"""Tenants & fairness: per-tenant usage and prefix-cache hit ratios, from the same frame the rules saw."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from kvscope.diagnoser.render import fmt_time, fmt_where
from kvscope.ui.data import TriageData, tenant_table

FLEET_GAUGES = {
    "fleet_tenant_hit_jain_ratio": ("Jain index of tenant hit ratios (1 = even)", lambda v: f"{v:.2f}"),
    "fleet_cold_tenant_ratio": ("Share of cold tenants", lambda v: f"{v:.0%}"),
    "fleet_tenant_hit_ratio_tail_gap_ratio": ("Aggregate minus worst tenant hit ratio", lambda v: f"{v * 100:.0f} pp"),
}
"""Gauge -> (label, format). The Jain index is a number in (0, 1]; a share is a percent; a gap of
two ratios is percentage points."""


def render(data: TriageData) -> None:
    st.title("Tenants & fairness")
    table = tenant_table(data.frame)
    if table.empty:
        st.info(
            "This source has no per-tenant series. vLLM exports no tenant label; kvscope's request tap or "
            "trace receiver produces tenant_* series (docs/requests.md), SGLang does with "
            "--tokenizer-metrics-allowed-custom-labels tenant."
        )
    else:
        cols = st.columns(len(FLEET_GAUGES))
        for col, (name, (label, show)) in zip(cols, FLEET_GAUGES.items(), strict=True):
            latest = _latest(data, name)
            col.metric(label, "absent" if latest is None else show(latest))
        pct = st.column_config.NumberColumn(format="percent")
        st.dataframe(
            table,
            hide_index=True,
            width="stretch",
            column_config={
                "requests/s": st.column_config.NumberColumn(format="%.2f"),
                "prompt tok/s": st.column_config.NumberColumn(format="%.0f"),
                "cached tok/s": st.column_config.NumberColumn(format="%.0f"),
                "hit ratio (latest)": pct,
                "lost reuse (latest)": pct,
                "mean TTFT (s)": st.column_config.NumberColumn(format="%.3f"),
                "TTFT p95 (s)": st.column_config.NumberColumn(format="%.3f"),
            },
        )
        st.caption(
            "Rates are means over the window; hit ratio = cached / prompt tokens and lost reuse = reusable "
            "prefix tokens the cache did not deliver / prompt tokens, both over the fairness window at its "
            "end. TTFT is what the request tap measured (client side, network to the engine included; "
            "from traces, the engine's own), mean and p95 over the window. A tenant served by several "
            "instances has a row per instance."
        )
    findings = [f for f in data.diagnosis.findings if "tenant" in f.where or f.levers_md.startswith("P8")]
    if findings:
        st.header("Tenant findings")
        for f in findings:
            st.markdown(f"- **{f.title}** on `{fmt_where(f)}` since {fmt_time(f.since)}: {f.summary}")


def _latest(data: TriageData, name: str) -> float | None:
    block = data.frame.block(name)
    if block is None:
        return None
    last = pd.DataFrame(block.values.T).ffill().iloc[-1]
    return None if last.isna().all() else float(last.min() if "jain" in name else last.max())
