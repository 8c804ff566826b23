"""Triage: the likely-cause card, competing hypotheses, and the timeline of findings."""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import pandas as pd
import streamlit as st

from kvscope.diagnoser.actions import KIND_HELP, KIND_LABEL, change_text, lever_heading, plan
from kvscope.diagnoser.findings import Finding
from kvscope.diagnoser.render import (
    baseline_lines,
    cascade_text,
    confidence_text,
    fact_rows,
    fmt_duration,
    fmt_time,
    fmt_where,
    group_repeats,
    render_line,
    render_not_fired,
    scale_note,
    what_text,
)
from kvscope.diagnoser.routing import router_line
from kvscope.ui.alert_link import AlertLink, at_labels, serve_url, stored_diagnosis, stored_text
from kvscope.ui.charts import UTC_CLOCK, incident_label, render_series_chart, time_scale
from kvscope.ui.data import (
    TriageData,
    counts_caption,
    evidence_charts,
    evidence_table,
    timeline,
    when_text,
    window_text,
)

CARDS_SHOWN = 20
"""Cards per section (a finding and its repeats on other instances are one); the rest are a table
with a picker (`render_cards`)."""
SEVERITY_ICON = {"critical": ":red[CRITICAL]", "warning": ":orange[WARNING]", "info": ":blue[INFO]"}
"""Severity as coloured text (Streamlit markdown), readable without an emoji font."""


def render(data: TriageData, link: AlertLink | None = None) -> None:
    """The triage page: the alert a link named, the likely cause, what changed, routers,
    hypotheses, the timeline, other findings and the rules not evaluated, in that order."""
    d = data.diagnosis
    st.title("kvscope triage")
    st.caption(f"{d.source} · window {window_text(*d.window)} · {counts_caption(d)}")
    if link is not None:
        render_alert(data, link)
    if scale_note(d):
        st.caption(scale_note(d))
    for note in data.notes:
        st.warning(note)
    render_cause(data)
    render_changes(data)
    render_routers(data)
    if d.hypotheses:
        st.header("Competing hypotheses")
        render_cards(data, d.hypotheses, "hypothesis")
    if d.findings:
        st.header("Timeline")
        render_timeline(d)
    if d.other_than_supporting:
        st.header("Other findings")
        render_cards(data, d.other_than_supporting, "other")
    if d.skipped:
        with st.expander(f"Rules not evaluated ({len(d.skipped)})"):
            st.dataframe(
                pd.DataFrame([{"rule": s.rule_id, "why": s.reason} for s in d.skipped]),
                hide_index=True,
                width="stretch",
            )


def render_cards(data: TriageData, findings: Sequence[Finding], key: str) -> None:
    """Findings in ranked order, one per rule and place with repeats on several instances collapsed
    (the worst shown, as `kvscope diagnose` lists them): the first CARDS_SHOWN as collapsed cards,
    the rest as one table with a picker that opens a card (a fleet's window holds hundreds; a page
    of hundreds of cards is neither readable nor quick)."""
    groups = group_repeats(tuple(findings))
    for worst, members in groups[:CARDS_SHOWN]:
        with st.expander(f"{SEVERITY_ICON.get(worst.severity, '')} {worst.title} — {group_where(worst, members)}"):
            if len(members) > 1:
                st.caption(instances_text(members))
            render_card(data, worst, charts=False)
    rest = groups[CARDS_SHOWN:]
    if not rest:
        return
    st.markdown(f"**{len(rest)} more**, in ranked order:")
    st.dataframe(finding_rows(rest), hide_index=True, width="stretch")
    labels = [f"{i + 1}. {worst.title} — {group_where(worst, members)}" for i, (worst, members) in enumerate(rest)]
    picked = st.selectbox(
        "Show the card of", range(len(rest)), format_func=labels.__getitem__, index=None, key=f"card-{key}"
    )
    if picked is not None:
        worst, members = rest[picked]
        if len(members) > 1:
            st.caption(instances_text(members))
        render_card(data, worst, charts=False)


def group_where(worst: Finding, members: list[Finding]) -> str:
    """Where a group of repeats is: the one place, or how many instances and the worst one."""
    return fmt_where(worst.where) if len(members) == 1 else f"{len(members)} instances, worst {fmt_where(worst.where)}"


def instances_text(members: list[Finding], most: int = 50) -> str:
    """The instances a finding repeats on, the first `most` named."""
    names = [m.where["instance"] for m in members]
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return f"The same finding on {len(names)} instances: {', '.join(names[:most])}{more}. The card shows the worst."


def finding_rows(groups: Sequence[tuple[Finding, list[Finding]]]) -> pd.DataFrame:
    """One row per finding (repeats collapsed): severity, what, where, when, rule."""
    return pd.DataFrame(
        [
            {
                "severity": worst.severity,
                "finding": worst.title,
                "where": group_where(worst, members),
                "since": fmt_time(worst.since),
                "for": fmt_duration(worst.until - worst.since),
                "rule": worst.rule_id,
            }
            for worst, members in groups
        ]
    )


def render_cause(data: TriageData) -> None:
    """The likely cause's card with its charts and what else fired beside it; else that nothing
    fired, or which rules could not be judged."""
    d = data.diagnosis
    if d.likely_cause is None and d.skipped:
        st.info(render_not_fired(d) + " The full list is at the bottom.")
    elif d.likely_cause is None:
        st.success("No rule fired in this window.")
    else:
        st.header("Likely cause")
        render_card(data, d.likely_cause, charts=True)
        if d.supporting:
            st.markdown(
                "**Also fired (supporting evidence, same mechanism and levers):**\n"
                + "\n".join(f"- {render_line(f)}" for f in d.supporting)
            )


def render_changes(data: TriageData) -> None:
    """What changed in the window (a config change, an upgrade, a restart, replicas, or the curve's
    own shift) and each change's verdict at matched load: `kvscope diagnose`'s section of the same
    name, from the same `Diagnosis.changes`. The fleet path (Prometheus) does not read them; the
    Operating point page does."""
    d = data.diagnosis
    if not d.changes:
        if data.source.kind == "prometheus":
            st.caption(
                "What changed in this window is not read here (the fleet path reads only the candidates' evidence): "
                "the Operating point page reads each pool's curve and its changes."
            )
        return
    st.header("What changed in this window")
    st.caption(
        "Each change with the curve before it against the curve after it, compared only at the concurrency "
        "both sides measured (the Operating point page draws both curves)."
    )
    rows = [
        {
            "time (UTC)": fmt_time(c["time"]),
            "kind": c["kind"],
            "verdict": c["verdict"].replace("_", " "),
            "change": c["text"],
            "lever follow-up": c.get("text_follow_up", ""),
        }
        for c in d.changes
    ]
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")


def render_routers(data: TriageData) -> None:
    """What each router decided over the window, where a router exports its decisions."""
    if routers := data.router_rows():
        st.header("Router decisions")
        st.caption(
            "What each router decided over the window, from its own series (what it does not export is not shown): "
            "decisions by policy and branch, kept on the worker holding the prefix or given away, load-only routing."
        )
        st.markdown("\n".join(f"- {router_line(r)}" for r in routers))


def render_alert(data: TriageData, link: AlertLink) -> None:
    """The alert a runbook_url named: its labels and window, the findings at its labels, and the
    diagnosis `kvscope serve` stored for it (when the UI knows serve's address)."""
    st.header(f"Alert {link.alertname}")
    window = f"last {link.window}" if link.window else "the source's window"
    st.markdown(f"**Labels:** {link.label_text()}  \n**Window:** {window}")
    here = at_labels(data.diagnosis.findings, link)
    if here:
        st.markdown("**Findings at these labels:**\n" + "\n".join(f"- {render_line(f)}" for f in here))
    else:
        st.caption("No finding of this window is located at the alert's labels; the fleet view follows.")
    base = serve_url()
    if base is None:
        st.caption("Start the UI with --serve-url to show the diagnosis kvscope serve stored for this alert.")
        return
    row, where = stored_diagnosis(base, link)
    if row is None:
        st.caption(f"kvscope serve: {where}")
        return
    line, diagnosed = stored_text(row)
    (st.markdown if diagnosed else st.warning)(line)
    st.caption(where)


def render_card(data: TriageData, f: Finding, charts: bool) -> None:
    """What, where, when, the first lever to pull, evidence (table and charts with the finding's
    period shaded), every lever with the config to change, citations. The first screen answers
    "what is wrong, where, since when, what do I change"."""
    st.subheader(f"{SEVERITY_ICON.get(f.severity, '')} {f.title}")
    st.markdown(f"**What:** {what_text(f)}")
    confidence = f"**Confidence:** {confidence_text(f)}"
    (st.warning if f.confidence != "high" else st.markdown)(confidence)
    st.markdown(f"**Where:** `{fmt_where(f.where)}` · **When:** {when_text(f)} · **Rule:** `{f.rule_id}`")
    if f.cascade:
        st.markdown(
            f"**Cascade:** {cascade_text(f.cascade)} (on the path KV full → preemption → queueing → TTFT, "
            "Sizing LLM Inference for Production §7.4)."
        )
    render_actions(f)
    if f.evidence:
        st.markdown("**Evidence** (values over the finding's period; `taken` says how and when)")
        st.dataframe(evidence_table(f), hide_index=True, width="stretch")
    for name, value, how in fact_rows(f):
        st.markdown(f"**{name}:** `{value}` ({how})")
    for line in baseline_lines(f, data.diagnosis.time_scale):
        st.caption(f"Compared with its earlier level: {line}")
    if charts:
        render_charts(data, f)
    if f.citations:
        shown = [c.markdown() for c in f.sources] or list(f.citations)
        st.markdown("**Sources:** " + "; ".join(shown))
        st.caption("What each source is and what the cited sections say: docs/sources.md in the kvscope repository.")
    if f.false_positives:
        st.caption("Could also be: " + " · ".join(f.false_positives))


def render_actions(f: Finding) -> None:
    """'Do now' (mitigations) then 'Fix for good', each lever with its costs (restart, quality
    risk, capacity) and one line per system and product with the exact setting."""
    boxes = {"mitigate": st.warning, "fix": st.info}
    for kind, levers in zip(KIND_LABEL, plan(f), strict=True):
        if not levers:
            continue
        lines = [f"**{KIND_LABEL[kind]}** — {KIND_HELP[kind]}"]
        for lv in levers:
            lines.append(f"- **{lv.rank}. {lever_heading(lv)}**")
            lines += [f"    - {change_text(c, '`')}" for c in lv.changes]
        boxes[kind]("\n".join(lines))


def render_charts(data: TriageData, f: Finding) -> None:
    """One chart per series the evidence reads (the rule's own values), two to a row, the period shaded."""
    shown = evidence_charts(data, f)
    if not shown:
        return
    st.markdown(
        f"**Evidence over time** — shaded: the finding's period, {incident_label(f.since, f.until, f.active)} "
        "(each line is the series the rule itself evaluated, at this place, so the evidence table's numbers "
        "can be read off the lines)"
    )
    chart_pairs([(f"**{name}**", unit, df) for name, unit, df in shown], f, data.frame.window)


def chart_pairs(charts: list[tuple[str, str, pd.DataFrame]], band: Finding | None, window: tuple[float, float]) -> None:
    """Charts two to a row over the x axis `window`: per (heading in Markdown, y-axis unit, series)
    the heading, then the series with `band`'s period shaded (None: none)."""
    since, until = (band.since, band.until) if band else (None, None)
    for i in range(0, len(charts), 2):
        for col, (heading, unit, df) in zip(st.columns(2), charts[i : i + 2], strict=False):
            col.markdown(heading)
            col.altair_chart(render_series_chart(df, unit, since, until, window), width="stretch")


def render_timeline(d) -> None:
    df = timeline(d)
    chart = (
        alt.Chart(df)
        .mark_bar()
        .encode(
            x=alt.X("since:T", title="time (UTC)", scale=time_scale(d.window), axis=alt.Axis(format="%H:%M:%S")),
            x2="until:T",
            y=alt.Y("rule:N", sort=list(df["rule"].unique()), title=None, axis=alt.Axis(labelLimit=320)),
            color=alt.Color(
                "severity:N",
                scale=alt.Scale(domain=["critical", "warning", "info"], range=["#d62728", "#ff7f0e", "#1f77b4"]),
            ),
            tooltip=[
                "rule",
                "title",
                "where",
                alt.Tooltip("since:T", timeUnit=UTC_CLOCK, title="since (UTC)"),
                alt.Tooltip("until:T", timeUnit=UTC_CLOCK, title="until (UTC)"),
                "active",
            ],
        )
    )
    st.altair_chart(chart, width="stretch")
    clock = {"since": df["since"].dt.strftime("%H:%M:%S"), "until": df["until"].dt.strftime("%H:%M:%S")}
    st.dataframe(
        df.drop(columns=["title"]).assign(**clock).rename(columns={"since": "since (UTC)", "until": "until (UTC)"}),
        hide_index=True,
        width="stretch",
    )
