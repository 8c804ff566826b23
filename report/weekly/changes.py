"""What changed this week and its effect at matched load: the changes `kvscope curve` finds in the
report's window (`diagnoser.curve.report.pool_curves` on the report's own Frame, or the curve's
records in the TSDB where it keeps them: `kvscope curve --recorded`), kept where they happened
inside the week. A change is judged against the curve since the previous change, so one on
Monday is compared with the end of the week before when the data reaches back (docs/curve.md)."""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.diagnoser.curve.report import JudgedChange, PoolCurve, pool_curves
from kvscope.diagnoser.evaluate.frame import Frame


@dataclass(frozen=True)
class WeekChange:
    """One change of one pool (`pool`: its model and engine labels), as the curve judged it."""

    pool: dict[str, str]
    judged: JudgedChange


@dataclass(frozen=True)
class WeekChanges:
    """The week's changes, oldest first, and what they were read from: the grid step and the
    number of scrape intervals the pools' curves hold (a coarse grid over little data places no
    short-lived change: the report says so rather than "no change" alone)."""

    changes: list[WeekChange]
    step_s: float
    intervals: int


def week_changes(frame: Frame, start: float, end: float) -> WeekChanges | None:
    """The changes of every pool in (start, end] from the frame's curves (`changes_of`)."""
    return changes_of(pool_curves(frame), frame.step, start, end)


def changes_of(curves: list[PoolCurve], step: float, start: float, end: float) -> WeekChanges | None:
    """The changes of these pools' curves in (start, end]; None when there is no pool (no pool
    reports the curve's concurrency signal in the window: nothing could be judged, not "no change").
    `step`: the interval the curves were read at."""
    if not curves:
        return None
    out = [WeekChange(pc.labels, j) for pc in curves for j in pc.changes if start < j.change.time <= end]
    out.sort(key=lambda c: c.judged.change.time)
    return WeekChanges(out, step, sum(pc.intervals for pc in curves))
