"""kvscope triage UI (Streamlit). Run with `kvscope ui --recording f | --prometheus URL | --agent URL`.

The source comes from the environment (`KVSCOPE_UI_*`, set by `kvscope ui`), so the script has
no command line of its own. The triage page comes first.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import streamlit as st

from kvscope.core.objectives import ObjectiveSet
from kvscope.diagnoser.curve.report import PoolCurve
from kvscope.ui import (
    alert_link,
    cascade_page,
    catalog_page,
    efficiency_page,
    fairness_page,
    operating_page,
    sizing_page,
    triage_page,
)
from kvscope.ui.data import (
    LIVE_TTL_S,
    SourceError,
    SourceSpec,
    TriageData,
    live_curves,
    load_triage,
    objectives_from_env,
    source_from_env,
    take_preloaded,
)

PAGES: dict[str, Callable[..., None]] = {  # render() or, for NEEDS_DATA, render(data)
    "Triage": triage_page.render,
    "Tenants & fairness": fairness_page.render,
    "Cascades": cascade_page.render,
    "Efficiency": efficiency_page.render,
    "Operating point": operating_page.render,
    "Sizing calculator": sizing_page.render,
    "Rules & levers": catalog_page.render,
}
NEEDS_DATA = {"Triage", "Tenants & fairness", "Cascades", "Efficiency", "Operating point"}


@st.cache_resource(show_spinner="Reading the recording and running the diagnoser…", max_entries=4)
def _load_recording(location: str, stamp: tuple[int, int] | None) -> TriageData:
    """A recording does not change while it is shown: cached until the file does (`stamp` is its
    mtime and size), and read by the launcher's background thread when that has started it."""
    source = SourceSpec("recording", location)
    return take_preloaded(source) or load_triage(source)


@st.cache_resource(show_spinner="Querying the source and running the diagnoser…", max_entries=4, ttl=LIVE_TTL_S)
def _load_live(kind: str, location: str, since_s: float, end: float | None) -> TriageData:
    """Prometheus or an agent: the window ends now, so it is read again after 60 s (the first
    view takes the read the launcher started, while it is that young)."""
    source = SourceSpec(kind, location, since_s, end)
    return take_preloaded(source) or load_triage(source)


@st.cache_resource(show_spinner="Reading each pool's operating curve…", max_entries=4, ttl=LIVE_TTL_S)
def _live_curves(
    kind: str, location: str, since_s: float, end: float | None, recorded: bool = False
) -> list[PoolCurve]:
    return live_curves(SourceSpec(kind, location, since_s, end), recorded=recorded)


def _curves(source: SourceSpec, recorded: bool = False) -> list[PoolCurve]:
    """Each pool's curve over the source's window: a recording's and an agent's were read with
    the diagnosis (the triage page's changes come from them); Prometheus' (the fleet path reads
    none) are read when a page asks, from kvscope's curve records where `recorded`."""
    if source.kind != "prometheus":
        return _load(source).curves or []
    return _live_curves(source.kind, source.location, source.since_s, source.end, recorded)


def _sizing(source: SourceSpec | None, objectives: ObjectiveSet) -> None:
    """The sizing calculator, its C_max and usable RPS filled from the measured curve at the
    objectives when there is a source (the user can type over them); the typed defaults when there
    is none or it fails."""
    if source is None:
        sizing_page.render(objectives=objectives)
        return
    try:
        sizing_page.render(_curves(source), source.describe(), objectives=objectives)
    except SourceError as exc:
        sizing_page.render(None, source.describe(), str(exc), objectives)


def _load(source: SourceSpec) -> TriageData:
    if source.kind != "recording":
        return _load_live(source.kind, source.location, source.since_s, source.end)
    try:
        st_ = os.stat(source.location)
        stamp = (st_.st_mtime_ns, st_.st_size)
    except OSError:
        stamp = None
    return _load_recording(source.location, stamp)


def main() -> None:
    st.set_page_config(page_title="kvscope", layout="wide")
    # Streamlit's default top padding (6rem) pushes the lever off a laptop's first screen
    st.html("<style>[data-testid='stMainBlockContainer']{padding-top:2rem}</style>")
    link = alert_link.from_query(st.query_params.to_dict())  # an alert's runbook_url opened this page
    asked = st.query_params.get("page")
    start = list(PAGES).index(asked) if asked in PAGES else 0
    page = st.sidebar.radio("Page", list(PAGES), key="page", index=start)
    source = source_from_env()
    if source is not None:
        source = alert_link.windowed(source, link)
    st.sidebar.caption(source.describe() if source else "no source: start with kvscope ui --recording FILE")
    try:
        objectives = objectives_from_env()
    except ValueError as exc:  # the objectives file changed since `kvscope ui` read it
        st.error(f"The latency objectives do not read: {exc}")
        return
    st.sidebar.caption(f"Objectives: {objectives.default.describe()} (kvscope ui --objectives, --slo-*)")
    if page == "Sizing calculator":
        _sizing(source, objectives)
        return
    if page not in NEEDS_DATA:
        PAGES[page]()
        return
    if source is None:
        st.error("No source. Start the UI with `kvscope ui --recording FILE`, `--prometheus URL` or `--agent URL`.")
        return
    try:
        if page == "Operating point":  # the curve alone: a live source's diagnosis is not needed for it
            recorded = source.kind == "prometheus" and st.sidebar.toggle(
                "Curve from kvscope's records",
                key="curve_recorded",
                help="Read each pool's curve from the TSDB's kvscope:curve_* records (kvscope-curve.yml from "
                "`kvscope rules build`): a week of a large fleet in seconds, intervals of the rules' interval, "
                "no changes judged. Off: every engine's histograms over the window, with the changes.",
            )
            operating_page.render(_curves(source, recorded), source.describe(), objectives)
            return
        data = _load(source)
    except SourceError as exc:  # not read: said as such, never an empty page that reads healthy
        st.error(f"Not diagnosed: {exc}")
        return
    if page == "Triage":
        triage_page.render(data, link)
        return
    if page == "Efficiency":
        efficiency_page.render(data, objectives)
        return
    PAGES[page](data)


main()
