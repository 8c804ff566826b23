"""Weekly report rendering: where fleet-wide findings are, how HTML table cells align, and the
plots' shared UTC time axis, units, percentages and gaps."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from kvscope.diagnoser.curve.changes import Change
from kvscope.diagnoser.curve.report import JudgedChange
from kvscope.diagnoser.findings import Finding
from kvscope.diagnoser.render import fmt_where
from kvscope.diagnoser.sources.samples import SamplesSource
from kvscope.report.render import (
    TIME_PLOTS,
    is_numeric_cell,
    render_figures,
    render_html,
    render_markdown,
)
from kvscope.report.weekly import WEEK_S, Incident, WeekChange, WeekChanges, build_report, report_window, timeline_step
from tests.unit.test_report import END, _fleet


def report_frame(samples):
    """The report's window of canonical samples, read as `kvscope report weekly --recording` reads."""
    return report_window(SamplesSource(list(samples), carry=False))


def _finding(where: dict[str, str]) -> Finding:
    return Finding(
        rule_id="fleet_util_low",
        levers_md="U1",
        title="Fleet GPU utilisation is low",
        severity="warning",
        where=where,
        since=END - 3600,
        until=END,
        active=True,
        window=(END - 7200, END),
        step_s=900.0,
        score=1.0,
        summary="s",
    )


def test_a_fleet_wide_finding_says_fleet_and_a_placed_one_its_labels():
    assert fmt_where({}) == "fleet"
    assert fmt_where({"model": "m1", "instance": "a"}) == "instance=a, model=m1"
    report = replace(
        build_report(report_frame(_fleet()), END, 2.0, "test"),
        incidents=[Incident(_finding({})), Incident(_finding({"model": "m1"}))],
    )
    md = render_markdown(report)
    rows = [line for line in md.splitlines() if "fleet_util_low" in line]
    assert "| fleet |" in rows[0] and "| model=m1 |" in rows[1]


def test_html_right_aligns_numbers_only():
    for text in ("1,234", "12.5%", "$3.10", "+4.0%", "absent", "n/a", "0.5"):
        assert is_numeric_cell(text), text
    for text in (
        "warning",
        "Fleet GPU utilisation is low (fleet_util_low)",
        "model=m1",
        "2026-11-22 07:00 UTC",
        "k8s.colocation, k8s.replicas",
        "fleet",
    ):
        assert not is_numeric_cell(text), text
    report = replace(build_report(report_frame(_fleet()), END, 2.0, "test"), incidents=[Incident(_finding({}))])
    page = render_html(report)
    assert "td.num{text-align:right}" in page and "text-align:left" in page
    assert re.search(r'<td class="num">[\d,]+</td>', page)
    assert "<td>fleet</td>" in page and "<td>warning</td>" in page


def _with_a_gap():
    """The test fleet with one day of this week missing (all series)."""
    hole = (END - 3 * 86400, END - 2 * 86400)
    samples = [s for s in _fleet() if not hole[0] < s.timestamp < hole[1]]
    return build_report(report_frame(samples), END, 2.0, "test"), hole


def test_every_time_plot_spans_the_report_window_in_utc_with_units_and_percent():
    from matplotlib import dates as mdates
    from matplotlib import pyplot as plt

    short = build_report(report_frame([s for s in _fleet() if s.timestamp > END - 3600]), END, 2.0, "t")
    for report in (short, _with_a_gap()[0]):  # an hour of data still gets the week's axis
        figures = render_figures(report)
        for (title, fig), (_, _, unit) in zip(figures[:3], TIME_PLOTS, strict=True):
            ax = fig.axes[0]
            lo, hi = (mdates.num2date(x).timestamp() for x in ax.get_xlim())
            assert (lo, hi) == pytest.approx((report.this.start, report.this.end), abs=1.0), title
            assert ax.get_ylabel() == unit and ("/" in unit or "%" in unit)
            assert ax.get_xlabel() == "time (UTC)"
            plt.close(fig)
    figures = render_figures(report)
    titles = [t for t, _ in figures]
    assert titles == [t for _, t, _ in TIME_PLOTS] + ["Prefix-cache hit ratio by tenant"]
    util_ax = figures[2][1].axes[0]
    util_ax.figure.canvas.draw()
    ticks = [t.get_text() for t in util_ax.get_yticklabels() if t.get_text()]
    assert ticks and all(t.endswith("%") for t in ticks) and "100%" in ticks
    tenant_ax = figures[3][1].axes[0]
    tenant_ax.figure.canvas.draw()
    assert all(t.get_text().endswith("%") for t in tenant_ax.get_xticklabels() if t.get_text())
    for _, fig in figures:
        plt.close(fig)


def test_a_gap_is_shaded_and_absent_not_zero():
    from matplotlib import dates as mdates
    from matplotlib import pyplot as plt

    report, hole = _with_a_gap()
    timeline = report.this.timeline
    starts = np.array([t.timestamp() for t in timeline.index])
    inside = (starts > hole[0] + 3600) & (starts < hole[1] - 3600)
    assert inside.any() and timeline[inside].isna().all().all()  # absent, not zero
    assert (timeline[~inside]["gpu_util"].dropna() > 0).all()
    gaps = report.this.coverage.gaps
    assert len(gaps) == 1 and hole[0] - 900 <= gaps[0][0] and gaps[0][1] <= hole[1] + 900
    for _, fig in render_figures(report)[:3]:
        shaded = [p for p in fig.axes[0].patches if p.get_label() == "no data"]
        assert len(shaded) == 1
        x0 = mdates.num2date(shaded[0].get_x()).timestamp()
        assert x0 == pytest.approx(gaps[0][0])
        plt.close(fig)


def test_timeline_bins_fit_the_data_held():
    assert timeline_step(600) == 60.0
    assert timeline_step(WEEK_S) == 3600.0
    assert timeline_step(2 * 86400) == 900.0


def _placed(rule: str, instance: str, levers: tuple[str, ...], score: float, row: str = "K2") -> Finding:
    from kvscope.diagnoser.findings import LeverAdvice

    return replace(
        _finding({"instance": instance}),
        rule_id=rule,
        levers_md=row,
        score=score,
        title=f"{rule} title",
        levers=tuple(LeverAdvice(id=lv, rank=i + 1, direction="increase") for i, lv in enumerate(levers)),
    )


def test_findings_of_one_incident_are_one_row_as_diagnose_groups_them():
    from kvscope.diagnoser.findings import Diagnosis

    cause = _placed("kv_pressure_cascade", "r0", ("kv_dtype", "gpu_mem", "max_seqs"), 9.0)
    preempt = _placed("kv_pressure_preemption", "r0", ("kv_dtype", "gpu_mem"), 8.0)
    eviction = replace(_placed("eviction_rate_high", "r0", ("kv_dtype",), 7.0), severity="critical")
    queue_a = _placed("queue_high", "r1", ("replicas",), 3.0, row="Q1")
    queue_b = _placed("queue_high", "r2", ("replicas",), 2.0, row="Q1")
    d = Diagnosis(
        window=(END - 7200, END),
        source="t",
        likely_cause=cause,
        competing=(preempt,),
        other=(eviction, queue_a, queue_b),
    )
    report = build_report(report_frame(_fleet()), END, 2.0, "test", diagnoses=[d])
    assert [i.head.rule_id for i in report.incidents] == ["kv_pressure_cascade", "queue_high"]
    md = render_markdown(report)
    rows = [line for line in md.split("## Top findings")[1].splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 2
    assert "supported by: kv_pressure_preemption title (kv_pressure_preemption); eviction_rate_high title" in rows[0]
    assert rows[0].startswith("| critical |")  # the worst severity of the incident
    assert "| 2 instances: r1, r2 |" in rows[1]


def test_a_short_real_recording_keeps_the_week_axis_and_adds_a_zoom_onto_its_data():
    """The real vLLM CPU recording holds 2.5 minutes: the first panel still spans the week, a
    second panel zooms onto the data (so it is readable), and rendering raises no warning."""
    from pathlib import Path

    from matplotlib import dates as mdates
    from matplotlib import pyplot as plt

    from kvscope.agent.recording.replay import replay_recording

    path = Path(__file__).resolve().parents[2] / "ui" / "recordings" / "vllm-0.32.0-cpu-kv-pressure.om.gz"
    replay = replay_recording(path)
    report = build_report(report_frame(replay.samples), replay.end, 2.5, "real")
    figures = render_figures(report)
    assert figures and [t for t, _ in figures][0] == "Output token throughput"
    for _, fig in figures:
        week_ax, zoom_ax = fig.axes
        lo, hi = (mdates.num2date(x).timestamp() for x in week_ax.get_xlim())
        assert (lo, hi) == pytest.approx((report.this.start, report.this.end), abs=1.0)
        zlo, zhi = (mdates.num2date(x).timestamp() for x in zoom_ax.get_xlim())
        assert zlo <= replay.start + 60 and zhi >= replay.end - 60 and zhi - zlo < 3600
        fig.canvas.draw()  # tick placement warns at draw time
        plt.close(fig)


def test_a_change_given_no_verdict_shows_its_own_reason_not_non_overlap():
    """Regression: every not_comparable change read 'the load did not overlap', whatever its reason."""
    reason = (
        "undecided: no metric cleared the thresholds, and the interval of TTFT p99 +5..+40% still reaches past them"
    )
    change = Change(END - 3600, "config", {"kv_capacity_tokens": [8192.0, 640.0]}, ["a"])
    judged = JudgedChange(change, "not_comparable", {}, [], [], [4.0], reason=reason)
    report = build_report(report_frame(_fleet()), END, 2.0, "test")
    report.changes = WeekChanges([WeekChange({"model": "m1"}, judged)], 900.0, 10)
    (row,) = [line for line in render_markdown(report).splitlines() if "kv_capacity_tokens" in line]
    assert f"not comparable: no verdict ({reason})" in row
    assert "did not overlap" not in row
