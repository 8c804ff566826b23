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

from kvscope.report.weekly.build import DELTA_KEYS, Incident, WeeklyReport, build_report, group_incidents
from kvscope.report.weekly.changes import WeekChange, WeekChanges, week_changes
from kvscope.report.weekly.coverage import DataCoverage, data_coverage, timeline_step
from kvscope.report.weekly.gpus import attribution_note, gpu_pools, pools
from kvscope.report.weekly.series import (
    COUNTERS,
    GAUGES,
    MAX_GAP_S,
    READ_SIGNALS,
    SIGNALS,
    TENANT_SLO,
    UTILISATION_SIGNALS,
    UTILISATION_TRAP,
    WEEK_S,
    Columns,
    Points,
    columns,
    counter_increments,
    gauge_coverage,
    report_step,
    report_window,
    utilisation_signal,
)
from kvscope.report.weekly.week import Efficiency, WeekStats, compute_week, efficiency
