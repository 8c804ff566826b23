"""The weekly report: this week, the week before when the data reaches back, the deltas and the
top findings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvscope.diagnoser.evaluate.frame import Frame
from kvscope.diagnoser.findings import Diagnosis
from kvscope.report.weekly.gpus import attribution_note
from kvscope.report.weekly.incidents import Incident, group_incidents
from kvscope.report.weekly.series import WEEK_S, columns
from kvscope.report.weekly.week import WeekStats, compute_week

DELTA_KEYS = (
    "output_tokens",
    "gpu_hours",
    "tokens_per_gpu_hour",
    "gpu_util",
    "usd_per_1m_tokens",
    "hit_ratio",
    "prefill_tokens_saved",
)


@dataclass
class WeeklyReport:
    this: WeekStats
    previous: WeekStats | None
    gpu_hour_cost: float
    source: str
    incidents: list[Incident] = field(default_factory=list)
    attribution: str = ""  # why GPUs are not attributed to a pool ('' = all are)

    def deltas(self) -> dict[str, float | None]:
        """Relative week-over-week change per fleet number (None when either week lacks it)."""
        out: dict[str, float | None] = {}
        for k in DELTA_KEYS:
            a = self.this.fleet.get(k)
            b = self.previous.fleet.get(k) if self.previous else None
            out[k] = (a - b) / b if a is not None and b not in (None, 0) else None
        return out


def build_report(
    frame: Frame,
    end: float,
    gpu_hour_cost: float,
    source: str,
    top: int = 10,
    diagnoses: Sequence[Diagnosis] = (),
) -> WeeklyReport:
    """The week ending at `end` and, when the data reaches back, the week before it. The top
    findings are the `top` highest-scoring incidents of `diagnoses` (grouped by `group_incidents`)."""
    this = compute_week(frame, end - WEEK_S, end, gpu_hour_cost)
    first = columns(frame).first_ts()
    previous = None
    if first is not None and first <= end - WEEK_S:
        previous = compute_week(frame, end - 2 * WEEK_S, end - WEEK_S, gpu_hour_cost)
    ranked = sorted(group_incidents(diagnoses), key=lambda i: (-i.head.score, -(i.head.until - i.head.since)))[:top]
    return WeeklyReport(this, previous, gpu_hour_cost, source, ranked, attribution_note(frame))
