"""Operating point: each pool's measured latency-concurrency curve, its knee and C_max, where the
window's peak sits, and every change in the window with its curves before and after.

The numbers are `kvscope curve`'s (diagnoser/curve, read through ui/operating.py); this module only
lays them out. Method: docs/curve.md.
"""

from __future__ import annotations

import streamlit as st

from kvscope.core.objectives import Objectives, ObjectiveSet
from kvscope.diagnoser.curve.operating import DEFAULT_SLO_TTFT_P99_S
from kvscope.diagnoser.curve.report import SETTLE_S, PoolCurve, c_max_text, headroom_text, knee_text, pool_name
from kvscope.ui.charts import render_change_chart, render_curve_chart
from kvscope.ui.operating import at_slo, change_view, curve_rows, fleet_ttft, points_table, pool_objectives

VERDICT_BOX = {"regression": st.error, "improvement": st.success, "no_change": st.info, "not_comparable": st.warning}


def render(curves: list[PoolCurve], source: str, objectives: ObjectiveSet | None = None) -> None:
    """`objectives`: what C_max is judged at (`kvscope ui --objectives/--slo-*`; None: the defaults)."""
    objectives = objectives or ObjectiveSet()
    st.title("Operating point")
    st.caption(
        f"{source} · each pool's TTFT p50 and p99 against the requests in its engines, read passively "
        "from the traffic it served (what `kvscope curve` prints; Sizing LLM Inference for Production "
        "§8.1, §8.3, §8.5). Crosses are sparse buckets (too few intervals or requests): shown as measured, "
        "not used for the knee, C_max or verdicts, and no line is drawn through them."
    )
    slo = st.number_input(
        "TTFT p99 SLO (seconds), for C_max",
        min_value=0.001,
        max_value=3600.0,
        value=fleet_ttft(objectives),
        key="curve_slo",
        help="starts at the fleet's TTFT objective (kvscope ui --objectives/--slo-ttft); changed, it is "
        "every pool's TTFT bound. TPOT and e2e objectives are judged where the engines measure them",
    )
    if not curves:
        st.info(
            "No pool reports engine_requests_running in this window: no curve. The curve needs the "
            "engines' running-requests gauge and their TTFT histogram."
        )
        return
    for pc in curves:
        render_pool(pc, pool_objectives(objectives, pc, float(slo)))


def render_pool(pc: PoolCurve, objectives: Objectives) -> None:
    """One pool: the chart, the statements, the points, then its changes; C_max at `objectives`."""
    slo_s = objectives.ttft if objectives.ttft is not None else DEFAULT_SLO_TTFT_P99_S
    op = at_slo(pc, slo_s, objectives)
    st.header(f"Pool {pool_name(pc)}")
    st.caption(
        f"Concurrency per instance: {pc.signal}; {pc.intervals} scrape intervals"
        + (f" of {pc.step:g} s" if pc.step else "")
        + f". Objectives: {objectives.describe()}."
    )
    st.markdown("\n".join(f"- {line}" for line in (knee_text(op), c_max_text(op, slo_s), headroom_text(op))))
    if op.littles_law_gap is not None:
        st.caption(f"Little's Law gap at C_max: {op.littles_law_gap:.2f}x (over 2: far from the SLO at C_max, §8.3).")
    for note in op.notes:
        st.caption(f"Note: {note}")
    if (share := pc.coarse_share or 0.0) > 0.25:
        st.warning(
            f"{100 * share:.0f}% of busy intervals are left out: the concurrency swung faster than it "
            "was scraped (scrape more often)."
        )
    rows = curve_rows(pc.points)
    if rows.empty:
        st.info("No bucket has a TTFT histogram: the engines export no TTFT, so there is no curve to draw.")
    else:
        st.altair_chart(
            render_curve_chart(rows, slo_s, op.knee_concurrency, op.c_max, op.peak_concurrency), width="stretch"
        )
    with st.expander(f"The curve's {len(pc.points)} points (per concurrency bucket)"):
        st.dataframe(points_table(pc.points), hide_index=True, width="stretch")
    render_changes(pc)


def render_changes(pc: PoolCurve) -> None:
    st.subheader("What changed in this window, and did it help")
    if not pc.changes:
        st.caption(
            "No change in this window: no config change, restart or replica-count change, and the curve did not "
            "shift between the window's halves at matched load."
        )
        return
    st.caption(
        f"Each change: the curve before it against the curve after it (the first {SETTLE_S:g} s after it left "
        "out: a restarted engine warms up), compared only at the concurrency buckets both sides measured "
        "with enough data."
    )
    for j in pc.changes:
        view = change_view(j)
        VERDICT_BOX.get(view.verdict, st.info)(
            f"**{view.heading}**  \n{view.verdict_words}" + (f"  \n{view.notes}" if view.notes else "")
        )
        if not view.deltas.empty:
            st.dataframe(view.deltas, hide_index=True, width="stretch")
        if not view.rows.empty:
            st.altair_chart(render_change_chart(view.rows, view.verdict, j.matched_concurrency), width="stretch")
