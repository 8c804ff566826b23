"""The weekly report: this week, the week before when the data reaches back, the deltas and the
top findings, grouped the way `kvscope diagnose` groups them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvscope.core.objectives import ObjectiveSet
from kvscope.diagnoser.evaluate.frame import Frame
from kvscope.diagnoser.findings import SEVERITY_RANK, Counts, Diagnosis, Finding, count
from kvscope.report.weekly.changes import WeekChanges, week_changes
from kvscope.report.weekly.gpus import attribution_note
from kvscope.report.weekly.series import WEEK_S, columns
from kvscope.report.weekly.week import WeekStats, compute_week


@dataclass(frozen=True)
class Incident:
    """One line of the week's top findings: a finding with the findings that belong to it, grouped
    the way `kvscope diagnose` groups them. `supporting`: findings at the likely cause's place that
    share its mechanism (`Diagnosis.supporting`); `repeats`: the same rule on other instances
    (`render.group_repeats`)."""

    head: Finding
    supporting: tuple[Finding, ...] = ()
    repeats: tuple[Finding, ...] = ()

    @property
    def members(self) -> tuple[Finding, ...]:
        return (self.head,) + self.supporting + self.repeats

    @property
    def severity(self) -> str:
        """The worst severity among its findings."""
        return max((f.severity for f in self.members), key=SEVERITY_RANK.__getitem__)


def group_incidents(diagnoses: Iterable[Diagnosis]) -> list[Incident]:
    """Each diagnosis' likely cause with its supporting findings, each competing hypothesis, and
    the other findings with repeats across instances collapsed: the order `kvscope diagnose` prints."""
    from kvscope.diagnoser.render import group_repeats

    out: list[Incident] = []
    for d in diagnoses:
        if d.likely_cause is not None:
            out.append(Incident(d.likely_cause, d.supporting))
        out += [Incident(f) for f in d.hypotheses]
        out += [
            Incident(worst, repeats=tuple(m for m in members if m is not worst))
            for worst, members in group_repeats(d.other_than_supporting)
        ]
    return out


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
    counts: tuple[Counts, ...] = ()  # per diagnosis: the CLI header's numbers (findings.count)
    changes: WeekChanges | None = None  # what changed this week (None: no curve could be read)
    objectives: ObjectiveSet | None = None  # what goodput was judged against (None: TENANT_SLO.objectives)

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
    changes: WeekChanges | None = None,
    objectives: ObjectiveSet | None = None,
) -> WeeklyReport:
    """The week ending at `end` and, when the data reaches back, the week before it. The top
    findings are the `top` highest-scoring incidents of `diagnoses` (grouped by `group_incidents`);
    the week's changes are judged on the operating curve of the whole frame (`week_changes`) unless
    `changes` gives them (judged from the TSDB's curve records: `changes_of`). Goodput is judged
    against `objectives` (None: the generated rules' defaults, TENANT_SLO.objectives)."""
    this = compute_week(frame, end - WEEK_S, end, gpu_hour_cost, objectives)
    first = columns(frame).first_ts()
    previous = None
    if first is not None and first <= end - WEEK_S:
        previous = compute_week(frame, end - 2 * WEEK_S, end - WEEK_S, gpu_hour_cost, objectives)
    ranked = sorted(group_incidents(diagnoses), key=lambda i: (-i.head.score, -(i.head.until - i.head.since)))[:top]
    counts = tuple(count(d) for d in diagnoses)
    changes = changes or week_changes(frame, end - WEEK_S, end)
    return WeeklyReport(
        this, previous, gpu_hour_cost, source, ranked, attribution_note(frame), counts, changes, objectives
    )
