"""Memory-pressure cascades (sizing field guide §7.4): how far each engine went, when, and the series behind it."""

from __future__ import annotations

import streamlit as st

from kvscope.diagnoser.render import cascade_text, fmt_where
from kvscope.ui.charts import incident_label
from kvscope.ui.data import TriageData, axis_unit, cascade_rows, signal_frame
from kvscope.ui.triage_page import chart_pairs

CASCADE_SIGNALS = (
    "engine_kv_cache_usage_ratio",
    "engine_preemptions_total",
    "engine_requests_running",
    "engine_requests_waiting",
    "request_ttft_seconds",
)
"""The cascade's stages in order: KV full, preemption (or a batch that stops growing), queueing, TTFT."""


def render(data: TriageData) -> None:
    st.title("Memory-pressure cascades")
    st.caption(
        "Sizing LLM Inference for Production §7.4: KV cache full (stage 1) → evictions/preemptions "
        "(2; without a counter: requests wait while "
        "the running batch does not grow) → queue grows (3) → TTFT grows (4), and GPU utilisation drops. "
        "Act at stage 2, before the latency alerts fire."
    )
    table = cascade_rows(data.cascades)
    if table.empty:
        st.info(
            "No cascade state for this source: it is computed from a recording's raw samples (KV usage, "
            "preemptions, waiting requests, TTFT per instance); live sources show the cascade findings only."
        )
    else:
        st.dataframe(table, hide_index=True, width="stretch")
        st.caption(
            "Deepest stage reached: how far the incident went in this window. Stage at end of window: "
            "0 healthy means it is over."
        )
    findings = [f for f in data.diagnosis.findings if f.cascade]
    for f in findings:
        assert f.cascade is not None  # kept above for having one
        st.markdown(
            f"**{f.title}** on `{fmt_where(f.where)}`, {incident_label(f.since, f.until, f.active)}: "
            f"{cascade_text(f.cascade)}"
        )
    band = findings[0] if findings else None
    shown = [
        (s, signal_frame(data.frame, s, band.where if band else None))
        for s in CASCADE_SIGNALS
        if any(n.startswith(s) for n in data.frame.blocks)
    ]
    shown = [(s, df) for s, df in shown if not df.empty and df.notna().any().any()]
    if band is not None and shown:
        st.caption(f"Shaded: the cascade finding's period on `{fmt_where(band.where)}`.")
    chart_pairs([(f"`{signal}`", axis_unit(signal), df) for signal, df in shown], band, data.frame.window)
