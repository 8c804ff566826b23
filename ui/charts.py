"""Evidence charts: one signal over the window, its unit on the y axis, the incident shaded.

Pure Altair (no Streamlit), so the chart a page shows can be checked as a spec in unit tests.
"""

from __future__ import annotations

from typing import Final

import altair as alt
import pandas as pd

from kvscope.diagnoser.render import fmt_time

BAND_COLOUR = "#d62728"
UTC = alt.Scale(type="utc")
"""Vega-Lite shows times in the browser's zone unless told otherwise; the page says UTC, so must the axis."""
UTC_CLOCK: Final = "utchoursminutesseconds"  # Final: typed as the literal altair expects


def incident_label(since: float, until: float, active: bool) -> str:
    """'07:25:51 → 07:27:05 UTC' (or '07:25:51 UTC → now (still active)'): what the band marks."""
    first = fmt_time(since)[11:19]
    if active:
        return f"{first} UTC → end of window (still active)"
    return f"{first} → {fmt_time(until)[11:]}"


def time_scale(window: tuple[float, float] | None) -> alt.Scale:
    """A UTC time axis; over the whole `window` (unix seconds) when given, so charts stacked on
    one page share their x axis and onsets can be compared by eye."""
    if window is None:
        return UTC
    return alt.Scale(type="utc", domain=[window[0] * 1000.0, window[1] * 1000.0])


def render_series_chart(
    df: pd.DataFrame,
    unit: str,
    since: float | None = None,
    until: float | None = None,
    window: tuple[float, float] | None = None,
) -> alt.LayerChart | alt.Chart:
    """Lines for each column of `df` (index: UTC time; a column may be named "value"), `unit` as the
    y-axis title, and the period [since, until] shaded red with a legend entry ("finding active") so
    cause and timing read together. `window` fixes the x axis."""
    long = df.rename_axis("time").reset_index().melt("time", var_name="series", value_name="reading").dropna()
    lines = (
        alt.Chart(long)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X(
                "time:T",
                title="time (UTC)",
                scale=time_scale(window),
                axis=alt.Axis(format="%H:%M:%S", labelOverlap=True),
            ),
            y=alt.Y("reading:Q", title=unit),
            color=alt.Color("series:N", title=None, legend=alt.Legend(labelLimit=320, orient="top")),
            tooltip=[
                alt.Tooltip("time:T", timeUnit=UTC_CLOCK, title="time (UTC)"),
                "series:N",
                alt.Tooltip("reading:Q", format=".4~g", title=unit),
            ],
        )
    )
    if since is None or until is None:
        return lines.properties(height=200)
    period = pd.DataFrame(
        {
            "since": [pd.to_datetime(since, unit="s", utc=True)],
            "until": [pd.to_datetime(max(until, since), unit="s", utc=True)],
            "marks": ["finding active"],
        }
    )
    band = (
        alt.Chart(period)
        .mark_rect(opacity=0.15)
        .encode(
            x=alt.X("since:T", scale=time_scale(window)),
            x2="until:T",
            fill=alt.Fill(
                "marks:N",
                title=None,
                scale=alt.Scale(range=[BAND_COLOUR]),
                legend=alt.Legend(orient="top", symbolOpacity=0.3),
            ),
            tooltip=[
                alt.Tooltip("since:T", timeUnit=UTC_CLOCK, title="from (UTC)"),
                alt.Tooltip("until:T", timeUnit=UTC_CLOCK, title="to (UTC)"),
            ],
        )
    )
    return alt.layer(band, lines).resolve_scale(color="independent").properties(height=200)
