"""Active findings: kvscope's diagnosis rules as firing alerts, each linking to the triage UI."""

from kvscope.dashboards import queries as q
from kvscope.dashboards.board import Board, Panel, Row
from kvscope.dashboards.style import ui_link

ACTIVE = Row(
    "Findings",
    (
        Panel(
            "Firing now",
            "kvscope diagnosis rules exported as Prometheus alerts (Llm* names), firing now. "
            "Open the triage UI for the likely cause, evidence, levers and citations.",
            (q.FIRING_ALERTS,),
            "count",
            "table",
            width=24,
            links=(ui_link("", "Triage UI"),),
        ),
        Panel(
            "Findings over time",
            "Firing kvscope alerts per rule over the time range.",
            (q.ALERT_HISTORY,),
            "count",
            stack=True,
            width=24,
            links=(ui_link("", "Triage UI"),),
        ),
    ),
)

BOARD = Board(
    "kvscope-findings",
    "kvscope / Active findings",
    "Diagnosis findings firing now, with links to the triage UI.",
    (ACTIVE,),
)
