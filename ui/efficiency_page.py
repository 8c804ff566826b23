"""Efficiency: tokens per GPU-hour, cost per token, the utilisation trap and cache savings."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from kvscope.core.objectives import ObjectiveSet
from kvscope.report.render import fmt, format_table, pool_columns, trap_lines
from kvscope.report.weekly import attribution_note, compute_week
from kvscope.ui.data import TriageData, window_text

NO_GPU = (
    "No GPU series in this source (no DCGM or NVML): GPU-hours, GPU utilisation, tokens per GPU-hour and "
    "cost are absent, not zero. To get them, run the kvscope agent on the GPU node (its NVML collector "
    "reads every local GPU and is on by default; it needs the NVIDIA driver) or add the node's "
    'dcgm-exporter as a target (`{url: "http://NODE:9400/metrics", job: dcgm, engine: dcgm}`, '
    "docs/collectors.md), then record or query that source."
)
"""What the page says when the source has no GPU series, and how to get them."""


def render(data: TriageData, objectives: ObjectiveSet | None = None) -> None:
    """`objectives`: what the goodput column is judged against (`kvscope ui --objectives/--slo-*`;
    None: the generated rules' defaults)."""
    st.title("Efficiency")
    if data.series is None:
        st.info(
            "Efficiency numbers need the raw series (a recording); for Prometheus or the agent use "
            "`kvscope report weekly`."
        )
        return
    cost = st.columns(4)[0].number_input("$ per GPU-hour", 0.01, 1000.0, 2.5, key="gpu_hour_cost")
    start, end = data.frame.window
    week = compute_week(data.series, start - 1e-9, end, cost, objectives)
    f = week.fleet
    cols = st.columns(4)
    cols[0].metric("Output tokens / GPU-hour", fmt(f.get("tokens_per_gpu_hour"), "count"))
    cols[1].metric("$ / 1M output tokens", fmt(f.get("usd_per_1m_tokens"), "usd"))
    cols[2].metric("Mean GPU utilisation", fmt(f.get("gpu_util"), "pct"))
    cols[3].metric("Prefill tokens saved", fmt(f.get("prefill_tokens_saved"), "count"))
    st.caption(
        f"Over the source's window, {window_text(start, end)}. "
        f"Prefix-cache hit ratio {fmt(f.get('hit_ratio'), 'pct')}; "
        f"output tokens {fmt(f.get('output_tokens'), 'count')}."
    )
    if f.get("gpu_util") is None:
        st.info(NO_GPU)
    else:
        basis, *trap = trap_lines(week, attribution_note(data.series))
        st.caption(basis)
        for line in trap:
            st.warning(line)
    if not week.pools.empty:
        head, *rows = format_table(week.pools, pool_columns(objectives), "Pool")
        st.dataframe(pd.DataFrame(rows, columns=head).set_index("Pool"), width="stretch")
