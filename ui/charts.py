"""Evidence charts: one signal over the window, its unit on the y axis, the incident shaded.

Pure Altair (no Streamlit), so the chart a page shows can be checked as a spec in unit tests.
"""

from __future__ import annotations

from typing import Final

import altair as alt
import pandas as pd

from kvscope.diagnoser.render import fmt_clock

BAND_COLOUR = "#d62728"
UTC = alt.Scale(type="utc")
"""Vega-Lite shows times in the browser's zone unless told otherwise; the page says UTC, so must the axis."""
UTC_CLOCK: Final = "utchoursminutesseconds"  # Final: typed as the literal altair expects


def incident_label(since: float, until: float, active: bool) -> str:
    """'07:25:51 → 07:27:05 UTC' (or '07:25:51 UTC → now (still active)'): what the band marks."""
    first = fmt_clock(since)
    if active:
        return f"{first} UTC → end of window (still active)"
    return f"{first} → {fmt_clock(until)} UTC"


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


SPARSE_SHAPES = alt.Scale(domain=["enough data", "sparse (not used)"], range=["circle", "cross"])
"""A sparse bucket is drawn as measured, as a cross, and no line runs through it (never smoothed)."""
MARK_COLOURS = {"knee": "#9467bd", "C_max": "#d62728", "window peak": "#7f7f7f", "compared here": "#2ca02c"}
VERDICT_COLOURS = {
    "regression": "#d62728",
    "improvement": "#2ca02c",
    "no_change": "#1f77b4",
    "not_comparable": "#7f7f7f",
}


def _curve_layers(rows: pd.DataFrame, colour: alt.Color, dash: alt.StrokeDash | None = None) -> list:
    """Lines through the buckets with enough data, every bucket as a point (sparse ones as crosses),
    and each TTFT p99's 95 % interval as a bar."""
    x = alt.X("concurrency:Q", title="requests in the engine per instance (concurrency)", scale=alt.Scale(zero=True))
    y = alt.Y("seconds:Q", title="TTFT (seconds)")
    tips = [
        alt.Tooltip("series:N", title="curve"),
        alt.Tooltip("concurrency:Q", format=".3~g"),
        alt.Tooltip("seconds:Q", format=".3~g", title="seconds"),
        alt.Tooltip("intervals:Q", title="intervals"),
        alt.Tooltip("requests:Q", format=".0f", title="requests"),
        alt.Tooltip("data:N", title="data"),
    ]
    dense = rows[rows["data"] == "enough data"]
    line_enc = {"x": x, "y": y, "color": colour, "detail": "series:N"}
    if dash is not None:
        line_enc["strokeDash"] = dash
    layers = [alt.Chart(dense).mark_line().encode(**line_enc)]
    ci = rows.dropna(subset=["ci_low", "ci_high"])
    if not ci.empty:
        layers.append(
            alt.Chart(ci)
            .mark_rule(opacity=0.5)
            .encode(x=x, y=alt.Y("ci_low:Q"), y2="ci_high:Q", color=colour, tooltip=tips)
        )
    layers.append(
        alt.Chart(rows)
        .mark_point(size=90, filled=True)
        .encode(
            x=x,
            y=y,
            color=colour,
            shape=alt.Shape("data:N", title=None, scale=SPARSE_SHAPES, legend=alt.Legend(orient="top")),
            tooltip=tips,
        )
    )
    return layers


def _mark_colour(name: str) -> str:
    return next((c for k, c in MARK_COLOURS.items() if name.startswith(k)), "#7f7f7f")


def _marks_layers(marks: pd.DataFrame) -> list:
    """Vertical dashed rules at named concurrencies (knee, C_max, the window's peak), each in its
    own colour with its name written at the top (no colour legend of their own to confuse with the
    curves')."""
    out = []
    for name, group in marks.groupby("mark", sort=False):
        colour = _mark_colour(str(name))
        tip = ["mark:N", alt.Tooltip("concurrency:Q", format=".3~g")]
        out.append(
            alt.Chart(group).mark_rule(strokeDash=[6, 3], size=2, color=colour).encode(x="concurrency:Q", tooltip=tip)
        )
        out.append(
            alt.Chart(group.head(1))
            .mark_text(align="left", dx=4, baseline="top", color=colour, y=4)
            .encode(x="concurrency:Q", text="mark:N")
        )
    return out


def render_curve_chart(
    rows: pd.DataFrame,
    slo_s: float,
    knee: float | None,
    c_max: float | None,
    peak: float | None,
) -> alt.LayerChart:
    """TTFT p50 and p99 against concurrency (ui/operating.curve_rows), the SLO as a horizontal rule,
    the knee, C_max and the window's peak as vertical rules named in the legend."""
    colour = alt.Color(
        "series:N",
        title=None,
        scale=alt.Scale(domain=["TTFT p50", "TTFT p99"], range=["#1f77b4", "#ff7f0e"]),
        legend=alt.Legend(orient="top"),
    )
    layers = _curve_layers(rows, colour)
    slo = pd.DataFrame({"seconds": [slo_s], "mark": [f"SLO: TTFT p99 ≤ {slo_s:g} s"]})
    layers.append(alt.Chart(slo).mark_rule(color=BAND_COLOUR, size=2).encode(y="seconds:Q", tooltip=["mark:N"]))
    layers.append(
        alt.Chart(slo).mark_text(align="left", dx=4, dy=-7, color=BAND_COLOUR).encode(y="seconds:Q", text="mark:N")
    )
    named = [("knee", knee), ("C_max", c_max), ("window peak", peak)]
    marks = pd.DataFrame([{"mark": f"{n} {v:g}", "concurrency": v} for n, v in named if v is not None])
    if not marks.empty:
        layers += _marks_layers(marks)
    return alt.LayerChart(layer=layers, height=320)


def render_change_chart(rows: pd.DataFrame, verdict: str, matched: list[float]) -> alt.LayerChart:
    """A change's curve before (grey) and after (the verdict's colour) overlaid, p50 dashed and p99
    solid, the concurrencies the verdict compared marked."""
    colour = alt.Color(
        "side:N",
        title=None,
        scale=alt.Scale(domain=["before", "after"], range=["#7f7f7f", VERDICT_COLOURS.get(verdict, "#1f77b4")]),
        legend=alt.Legend(orient="top"),
    )
    dash = alt.StrokeDash(
        "statistic:N",
        title=None,
        scale=alt.Scale(domain=["TTFT p50", "TTFT p99"], range=[[4, 3], [1, 0]]),
        legend=alt.Legend(orient="top"),
    )
    layers = _curve_layers(rows, colour, dash)
    if matched:
        marks = pd.DataFrame({"mark": ["compared here"] * len(matched), "concurrency": matched})
        layers = _marks_layers(marks) + layers
    return alt.LayerChart(layer=layers, height=260)
