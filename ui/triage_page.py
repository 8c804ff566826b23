"""Triage: the likely-cause card, competing hypotheses, and the timeline of findings."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st
from kvscope.diagnoser.findings import Finding
from kvscope.diagnoser.render import baseline_lines, fact_rows, missing_summary, render_line, render_summary
from kvscope.ui.data import TriageData, counts_caption, evidence_charts, evidence_table, render_when, timeline

SEVERITY_ICON = {"critical": ":red[CRITICAL]", "warning": ":orange[WARNING]", "info": ":blue[INFO]"}
"""Severity as coloured text (Streamlit markdown), readable without an emoji font."""


def render(data: TriageData) -> None:
    d = data.diagnosis
    st.title("kvscope triage")
    st.caption(f"{d.source} · window {render_when(d.window[0])} → {render_when(d.window[1])} · "
               f"{counts_caption(d)}")
    if d.likely_cause is None and d.skipped:
        missing = missing_summary(d)
        st.info(f"No rule fired among the {d.rules_evaluated - len(d.skipped)} rules this source could feed; "
                f"{len(d.skipped)} could not be evaluated because their signals are missing"
                f"{f' ({missing})' if missing else ''}; the full list is at the bottom. "
                "Missing signals are unknown, not healthy.")
    elif d.likely_cause is None:
        st.success("No rule fired in this window.")
    else:
        st.header("Likely cause")
        render_card(data, d.likely_cause, charts=True)
        if d.supporting:
            st.markdown("**Also fired (supporting evidence, same mechanism and levers):**\n"
                        + "\n".join(f"- {render_line(f)}" for f in d.supporting))
    if d.hypotheses:
        st.header("Competing hypotheses")
        for f in d.hypotheses:
            with st.expander(f"{SEVERITY_ICON.get(f.severity, '')} {f.title} — {_where(f)}"):
                render_card(data, f, charts=False)
    if d.findings:
        st.header("Timeline")
        render_timeline(d)
    support = set(id(f) for f in d.supporting)
    other = [f for f in d.other if id(f) not in support]
    if other:
        st.header("Other findings")
        for f in other:
            with st.expander(f"{SEVERITY_ICON.get(f.severity, '')} {f.title} — {_where(f)}"):
                render_card(data, f, charts=False)
    if d.skipped:
        with st.expander(f"Rules not evaluated ({len(d.skipped)})"):
            st.dataframe(pd.DataFrame([{"rule": s.rule_id, "why": s.reason} for s in d.skipped]),
                         hide_index=True, width="stretch")


def _where(f: Finding) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(f.where.items())) or "fleet"


def render_card(data: TriageData, f: Finding, charts: bool) -> None:
    """What, where, since when, evidence, levers with the config to change, citations."""
    st.subheader(f"{SEVERITY_ICON.get(f.severity, '')} {f.title}")
    if f.summary.strip() != f.title.strip():
        st.markdown(f"**What:** {render_summary(f)}")
    state = "still active" if f.active else f"ended {render_when(f.until)}"
    st.markdown(f"**Where:** `{_where(f)}` · **Since:** {render_when(f.since)} ({state}) · "
                f"**Severity:** {f.severity} · **Rule:** `{f.rule_id}` (LEVERS {f.levers_md})")
    if f.cascade:
        c = f.cascade
        lead = f"{c.lead_time_s:.0f} s" if c.lead_time_s is not None else "symptom not reached"
        st.markdown(f"**Cascade:** stage {c.stage}/{c.stages_total} ({c.stage_name}); root led the symptom by "
                    f"{lead}")
    if f.evidence:
        st.markdown("**Evidence**")
        st.dataframe(evidence_table(f), hide_index=True, width="stretch")
    for name, value, how in fact_rows(f):
        st.markdown(f"**{name}:** `{value}` ({how})")
    for line in baseline_lines(f, data.diagnosis.time_scale):
        st.caption(f"Compared with its earlier level: {line}")
    if charts:
        for signal, unit, df in evidence_charts(data, f):
            st.markdown(f"`{signal}` ({unit}); shaded: the finding's active period")
            st.altair_chart(render_evidence_chart(df, f), width="stretch")
    render_levers(f)
    if f.citations:
        st.markdown("**Sources:** " + "; ".join(f.citations))
    if f.false_positives:
        st.caption("Could also be: " + " · ".join(f.false_positives))


def render_evidence_chart(df: pd.DataFrame, f: Finding) -> alt.LayerChart:
    """The series with the finding's active period shaded, so cause and timing read together."""
    long = df.rename_axis("time").reset_index().melt("time", var_name="series", value_name="value").dropna()
    period = pd.DataFrame({"since": [pd.to_datetime(f.since, unit="s", utc=True)],
                           "until": [pd.to_datetime(f.until, unit="s", utc=True)]})
    band = alt.Chart(period).mark_rect(opacity=0.15, color="#d62728").encode(x="since:T", x2="until:T")
    lines = alt.Chart(long).mark_line().encode(
        x=alt.X("time:T", title=None), y=alt.Y("value:Q", title=None),
        color=alt.Color("series:N", title=None, legend=alt.Legend(labelLimit=320)),
        tooltip=["time:T", "series:N", "value:Q"])
    return (band + lines).properties(height=220)


def render_levers(f: Finding) -> None:
    if not f.levers:
        return
    st.markdown("**Levers**")
    for lever in sorted(f.levers, key=lambda x: x.rank):
        st.markdown(f"{lever.rank}. **{lever.title or lever.id}** (`{lever.id}`, {lever.direction})"
                    + (f" — cost: {lever.cost}" if lever.cost else ""))
        st.markdown("\n".join(f"- {c.system}: `{c.change}`" for c in lever.changes))
        if lever.citations:
            st.caption("Cited: " + "; ".join(lever.citations))


def render_timeline(d) -> None:
    df = timeline(d)
    chart = alt.Chart(df).mark_bar().encode(
        x=alt.X("since:T", title="time (UTC)"), x2="until:T",
        y=alt.Y("rule:N", sort=list(df["rule"].unique()), title=None, axis=alt.Axis(labelLimit=320)),
        color=alt.Color("severity:N", scale=alt.Scale(domain=["critical", "warning", "info"],
                                                      range=["#d62728", "#ff7f0e", "#1f77b4"])),
        tooltip=["rule", "title", "where", "since:T", "until:T", "active"])
    st.altair_chart(chart, width="stretch")
    st.dataframe(df.drop(columns=["title"]), hide_index=True, width="stretch")
