"""kvscope triage UI (Streamlit). Run with `kvscope ui --recording f | --prometheus URL | --agent URL`.

The source comes from the environment (`KVSCOPE_UI_*`, set by `kvscope ui`), so the script has
no command line of its own. The triage page comes first.
"""

from __future__ import annotations

import streamlit as st
from kvscope.ui import cascade_page, catalog_page, efficiency_page, fairness_page, sizing_page, triage_page
from kvscope.ui.data import SourceError, TriageData, load_triage, source_from_env

PAGES = {
    "Triage": triage_page.render,
    "Tenants & fairness": fairness_page.render,
    "Cascades": cascade_page.render,
    "Efficiency": efficiency_page.render,
    "Sizing calculator": sizing_page.render,
    "Rules & levers": catalog_page.render,
}
NEEDS_DATA = {"Triage", "Tenants & fairness", "Cascades", "Efficiency"}


@st.cache_resource(show_spinner="Reading the source and running the diagnoser…", max_entries=4, ttl=60)
def _load(kind: str, location: str, since_s: float, end: float | None) -> TriageData:
    from kvscope.ui.data import Source
    return load_triage(Source(kind, location, since_s, end))


def main() -> None:
    st.set_page_config(page_title="kvscope", layout="wide")
    page = st.sidebar.radio("Page", list(PAGES), key="page")
    source = source_from_env()
    st.sidebar.caption(source.describe() if source else "no source: start with kvscope ui --recording FILE")
    if page not in NEEDS_DATA:
        PAGES[page]()
        return
    if source is None:
        st.error("No source. Start the UI with `kvscope ui --recording FILE`, `--prometheus URL` or `--agent URL`.")
        return
    try:
        data = _load(source.kind, source.location, source.since_s, source.end)
    except SourceError as exc:
        st.error(str(exc))
        return
    PAGES[page](data)


main()
