"""Tenants & fairness: per-tenant usage and prefix-cache hit ratios, from the same frame the rules saw."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from kvscope.diagnoser.render import fmt_time, fmt_where
from kvscope.report.render import NO_ADAPTERS, NO_TENANTS
from kvscope.ui.data import GROUP_COLUMNS, TriageData, group_table

FLEET_GAUGES = {
    "fleet_tenant_hit_jain_ratio": ("Jain index of tenant hit ratios (1 = even)", lambda v: f"{v:.2f}"),
    "fleet_cold_tenant_ratio": ("Share of cold tenants", lambda v: f"{v:.0%}"),
    "fleet_tenant_hit_ratio_tail_gap_ratio": ("Aggregate minus worst tenant hit ratio", lambda v: f"{v * 100:.0f} pp"),
}
"""Gauge -> (label, format). The Jain index is a number in (0, 1]; a share is a percent; a gap of
two ratios is percentage points."""


def render(data: TriageData) -> None:
    st.title("Tenants & fairness")
    table = group_table(data.frame, "tenant")
    if table.empty:
        st.info(NO_TENANTS)
    else:
        cols = st.columns(len(FLEET_GAUGES))
        for col, (name, (label, show)) in zip(cols, FLEET_GAUGES.items(), strict=True):
            latest = _latest(data, name)
            col.metric(label, "absent" if latest is None else show(latest))
        _table(table)
        st.caption(
            "Rates are means over the window; hit ratio = cached / prompt tokens and lost reuse = reusable "
            "prefix tokens the cache did not deliver / prompt tokens, both over the fairness window at its "
            "end. TTFT is what the request tap measured (client side, network to the engine included; "
            "from traces, the engine's own), mean, p50 and p95 over the window, ITL the gaps between streamed "
            "chunks. The SLO columns: the share of requests with a first token within the bound, and without an "
            "upstream error, as the generated alerts count them. GPU-time share = the tenant's in-flight seconds "
            "at the tap over all tenants' (docs/requests.md). A tenant served by several instances has a row "
            "per instance. The weekly report's tenant table is this one, over the week."
        )
    st.header("Adapters")
    slots, in_flight = _peak(data, "engine_lora_max_adapters"), _peak(data, "engine_lora_in_flight_adapters")
    if slots is not None:  # the engine serves LoRA (vLLM lora_requests_info, SGLang's LoRA pool)
        left, right = st.columns(2)
        left.metric("Adapter slots per batch (engine, max)", f"{slots:.0f}")
        right.metric("Adapters in flight at once (engine, max)", "absent" if in_flight is None else f"{in_flight:.0f}")
    adapters = group_table(data.frame, "adapter")
    if adapters.empty:
        fleet = "In Prometheus mode this page reads only the series the rules' candidates held. "
        st.info(fleet * (data.source.kind == "prometheus") + NO_ADAPTERS)
    else:
        _table(adapters)
        st.caption(
            "adapter = the request's model (a LoRA adapter's name, or the base model's), top-K by traffic + "
            "other. GPU-time share = the rows' in-flight seconds at the tap over all rows' (docs/requests.md)."
        )
    findings = [f for f in data.diagnosis.findings if "tenant" in f.where or f.levers_md.startswith("P8")]
    if findings:
        st.header("Tenant findings")
        for f in findings:
            st.markdown(f"- **{f.title}** on `{fmt_where(f.where)}` since {fmt_time(f.since)}: {f.summary}")


PERCENT = ("prefix_hit_ratio", "lost_reuse_ratio", "ttft_slo", "error_slo", "goodput", "gpu_time_share")


def _table(table: pd.DataFrame) -> None:
    """One group table (tenants or adapters) with its columns formatted."""
    pct = st.column_config.NumberColumn(format="percent")
    seconds = st.column_config.NumberColumn(format="%.3f")
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            "requests/s": st.column_config.NumberColumn(format="%.2f"),
            "prompt tok/s": st.column_config.NumberColumn(format="%.0f"),
            "completion tok/s": st.column_config.NumberColumn(format="%.0f"),
            "cached tok/s": st.column_config.NumberColumn(format="%.0f"),
            **dict.fromkeys((GROUP_COLUMNS[c] for c in PERCENT), pct),
            **{c: seconds for c in table.columns if c.endswith("(s)")},
        },
    )


def _peak(data: TriageData, name: str) -> float | None:
    """The largest value of a gauge over the window and its series; None where it is absent."""
    block = data.frame.block(name)
    if block is None or np.isnan(block.values).all():
        return None
    return float(np.nanmax(block.values))


def _latest(data: TriageData, name: str) -> float | None:
    block = data.frame.block(name)
    if block is None:
        return None
    last = pd.DataFrame(block.values.T).ffill().iloc[-1]
    return None if last.isna().all() else float(last.min() if "jain" in name else last.max())
