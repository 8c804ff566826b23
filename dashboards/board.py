"""Dashboard specs (plain data) and their rendering to Grafana JSON through grafanalib.

A dashboard module declares a `Board` of `Row`s of `Panel`s whose targets come from
dashboards/queries.py. The lint (dashboards/lint.py) and the Prometheus proof test read the
same specs, so what is checked is exactly what is shipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import attr
from attr.validators import instance_of
from grafanalib._gen import DashboardEncoder
from grafanalib.core import (
    Dashboard,
    GridPos,
    Repeat,
    RowPanel,
    Stat,
    Table,
    Target,
    Templating,
    Time,
    TimeSeries,
)
from grafanalib.core import Panel as GrafanaPanel

from kvscope.dashboards import style
from kvscope.dashboards.queries import KVSCOPE_PREFIX, Query

KINDS = ("timeseries", "stat", "table", "xychart")


@dataclass(frozen=True)
class Panel:
    """One panel. `unit` is a meaning from style.UNITS; `width` is in grid columns (of 24)."""

    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str
    kind: str = "timeseries"
    palette: str = "none"
    width: int = 8
    stack: bool = False
    links: tuple[dict, ...] = ()
    repeat: str = ""  # a template variable: one copy of the panel per selected value

    def signals(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for q in self.queries:
            seen.update(dict.fromkeys(q.signals))
        return tuple(seen)

    def full_description(self) -> str:
        """The description plus the exported series it reads, so a reader can find them."""
        names = ", ".join(exported_name(s) for s in self.signals())
        return f"{self.description.strip()}\n\nReads: {names}."


def exported_name(signal: str) -> str:
    """The series a panel reads for a signal: the agent's kvscope_<signal>, a recorded
    level:signal:op series, or Prometheus' own (up, ALERTS)."""
    if signal in ("ALERTS", "up") or ":" in signal:
        return signal
    return KVSCOPE_PREFIX + signal


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]
    collapsed: bool = False


@dataclass(frozen=True)
class Board:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    tenant_var: bool = False
    slo_vars: bool = False
    cost_var: bool = False

    def panels(self) -> list[Panel]:
        return [p for r in self.rows for p in r.panels]

    def variables(self) -> list:
        """The board's template variables."""
        return style.variables(self.tenant_var, self.slo_vars, self.cost_var)


def render_board(board: Board) -> Dashboard:
    """The grafanalib Dashboard for a spec, laid out left to right, top to bottom."""
    panels, y = [], 0
    next_id = iter(range(1, 10_000))
    for row in board.rows:
        laid, y_after = _layout(row.panels, y + 1, next_id)
        inside = laid if row.collapsed else []  # a collapsed row holds its panels; an open one precedes them
        grid = GridPos(h=1, w=24, x=0, y=y)
        panels.append(RowPanel(title=row.title, collapsed=row.collapsed, panels=inside, id=next(next_id), gridPos=grid))
        panels.extend([] if row.collapsed else laid)
        y = y_after
    return Dashboard(
        title=board.title,
        uid=board.uid,
        description=board.description,
        panels=panels,
        tags=[style.TAG],
        timezone="utc",
        refresh="30s",
        time=Time("now-1h", "now"),
        graphTooltip=1,
        links=style.dashboard_links(),
        editable=True,
        templating=Templating(list=board.variables()),
    )


def _layout(specs: tuple[Panel, ...], y: int, next_id) -> tuple[list, int]:
    out, x, row_h = [], 0, 0
    for spec in specs:
        h = 4 if spec.kind == "stat" else 8
        if x + spec.width > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append(_render_panel(spec, GridPos(h=h, w=spec.width, x=x, y=y), next(next_id)))
        x, row_h = x + spec.width, max(row_h, h)
    return out, y + row_h


def _targets(spec: Panel) -> list[Target]:
    return [
        Target(
            expr=q.expr,
            legendFormat=q.legend,
            refId=chr(ord("A") + i),
            instant=q.instant,
            datasource=style.DATASOURCE,
            format="table" if spec.kind == "table" else "time_series",
        )
        for i, q in enumerate(spec.queries)
    ]


def _render_panel(spec: Panel, pos: GridPos, pid: int):
    if spec.kind not in KINDS:
        raise ValueError(f"panel {spec.title!r}: kind {spec.kind!r} not in {KINDS}")
    common = dict(
        title=spec.title,
        description=spec.full_description(),
        dataSource=style.DATASOURCE,
        targets=_targets(spec),
        gridPos=pos,
        id=pid,
        links=list(spec.links),
    )
    if spec.repeat:
        common["repeat"] = Repeat("h", spec.repeat, 24 // spec.width)
    unit = style.UNITS[spec.unit]
    steps = style.thresholds(spec.palette)
    if spec.kind == "stat":
        return Stat(
            **common,
            format=unit,
            reduceCalc="lastNotNull",
            graphMode="area",
            thresholds=steps,
            noValue="absent",
            mappings=[{"type": "special", "options": {"match": "nan", "result": {"text": "No traffic"}}}],
        )
    if spec.kind == "table":
        return Table(**common, unit=unit, transformations=[{"id": "merge", "options": {}}])
    if spec.kind == "xychart":
        return XYChart(**common, unit=unit, x_name=spec.queries[0].legend)
    return TimeSeries(
        **common,
        unit=unit,
        thresholds=steps,
        legendDisplayMode="table",
        legendPlacement="bottom",
        legendCalcs=["mean", "max", "lastNotNull"],
        stacking={"mode": "normal" if spec.stack else "none", "group": "A"},
        thresholdsStyleMode="off" if spec.palette == "none" else "line",
        fillOpacity=10 if spec.stack else 0,
        tooltipMode="multi",
    )


@attr.s
class XYChart(GrafanaPanel):
    """Grafana's built-in XY chart: the queries joined on time into one frame, the first query's
    field on the x axis and the others against it, as points. Options in the panel's first format
    (`seriesMapping: auto`, `dims`), which Grafana 10.4 and later migrate to theirs."""

    unit = attr.ib(default="", validator=instance_of(str))
    x_name = attr.ib(default="", validator=instance_of(str))  # the x field's display name (its legend)

    def to_json_data(self) -> dict:
        hidden = {"legend": False, "tooltip": False, "viz": False}
        x_unit = {"matcher": {"id": "byName", "options": self.x_name}, "properties": [{"id": "unit", "value": "none"}]}
        return self.panel_json(
            {
                "type": "xychart",
                "transformations": [{"id": "joinByField", "options": {"byField": "Time", "mode": "outer"}}],
                "fieldConfig": {
                    "defaults": {
                        "unit": self.unit,
                        "color": {"mode": "palette-classic"},
                        "custom": {"show": "points", "pointSize": {"fixed": 5}, "hideFrom": hidden},
                    },
                    "overrides": [x_unit],
                },
                "options": {
                    "seriesMapping": "auto",
                    "dims": {"frame": 0},
                    "series": [],
                    "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom", "calcs": []},
                    "tooltip": {"mode": "single", "sort": "none"},
                },
            }
        )


def render_json(board: Board) -> str:
    """Deterministic Grafana JSON text for a spec (sorted keys, trailing newline)."""
    data = json.loads(json.dumps(render_board(board).to_json_data(), cls=DashboardEncoder))
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
