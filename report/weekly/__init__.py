"""The weekly efficiency review: what the fleet produced, what it cost, and what went wrong.

From canonical series (a recording, the agent's SQLite store, or Prometheus) it computes per
model/pool (model × role) and for the fleet: output tokens per GPU-hour (002 §9.3), GPU-hours,
mean utilisation and the utilisation trap (002 §9.2), $ per 1M output tokens, prefill tokens
saved by prefix caching, per-tenant usage, the engines' efficiency counters (`Efficiency`),
week-over-week deltas, the week's top findings, and what changed this week with its effect at
matched load (the operating curve's judged changes, `diagnoser/curve/`). It reads one `Frame`
through `read_window` (`report_window`) and holds its points as columns (`Columns`) so the maths
is vectorised; a signal the source lacks stays absent (None), never zero.

One module per concern: series.py (the window, its columns and their primitives), gpus.py (GPU to
pool attribution), coverage.py (data held, the timeline), week.py (a week's numbers), changes.py
(what changed), build.py (top findings and the report). The names imported here are the
package's interface.
"""

from kvscope.report.weekly.build import Incident, WeeklyReport, build_report
from kvscope.report.weekly.changes import WeekChange, WeekChanges
from kvscope.report.weekly.coverage import data_coverage, timeline_step
from kvscope.report.weekly.gpus import attribution_note
from kvscope.report.weekly.series import (
    READ_SIGNALS,
    TENANT_SLO,
    UTILISATION_TRAP,
    WEEK_S,
    columns,
    counter_increments,
    report_step,
    report_window,
)
from kvscope.report.weekly.week import WeekStats, compute_week
