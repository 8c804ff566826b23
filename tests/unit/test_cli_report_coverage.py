"""`kvscope report weekly` says when its data covers only part of the week, so a short
recording's totals are not read as a week's."""

from __future__ import annotations

from kvscope.commands.report import coverage_note
from kvscope.core.signals import Sample
from kvscope.diagnoser.sources.samples import SamplesSource
from kvscope.report.weekly import WEEK_S, columns, data_coverage, report_window


def report_frame(samples):
    """The report's window of canonical samples, read as `kvscope report weekly --recording` reads."""
    return report_window(SamplesSource(list(samples), carry=False))


END = 1_800_000_000.0
LABELS = (("instance", "a"),)


def _note(frame) -> str:
    """The note on the week ending at END (the report's `WeekStats.coverage` of it)."""
    return coverage_note(data_coverage(frame, END - WEEK_S, END))


def _series(start: float, stop: float, step: float = 600.0):
    n = int((stop - start) // step) + 1
    return report_frame(
        [Sample("engine_generation_tokens_total", LABELS, float(i), start + i * step) for i in range(n)]
    )


def test_a_ten_minute_source_is_named_as_ten_minutes():
    note = _note(_series(END - 600, END, step=15.0))
    assert "covers only 10m00s of the 7 days" in note
    assert "not a full week" in note


def test_a_full_week_needs_no_note():
    assert _note(_series(END - WEEK_S, END)) == ""


def test_only_the_part_inside_the_week_counts():
    ss = _series(END - 3 * WEEK_S, END - WEEK_S + 3600)  # ends one hour into the week
    assert "covers only 1h00m" in _note(ss)


def test_two_recordings_nine_hours_apart_name_the_data_held_not_just_the_span():
    """Two 6-minute recordings 9 h apart hold 12 minutes of data: the note says 12m, the 9h span
    and the gap between them (it once said 'covers 9h00m')."""
    early = _series(END - 9 * 3600 - 360, END - 9 * 3600, step=15.0)
    late = _series(END - 360, END, step=15.0)
    samples = [Sample(n, labels, v, t) for ss in (early, late) for n, labels, v, t in _points(ss)]
    note = _note(report_frame(samples))
    assert "covers only 12m00s of the 7 days, spread across 9h06m" in note
    assert "1 gap without data" in note
    cov = data_coverage(report_frame(samples), END - WEEK_S, END)
    assert cov.held_s == 720.0 and cov.inner_gaps == 1
    assert cov.gaps[1] == (END - 9 * 3600, END - 360)


def _points(ss):
    pts = columns(ss).of("engine_generation_tokens_total")
    for t, v in zip(pts.ts, pts.value, strict=True):
        yield "engine_generation_tokens_total", LABELS, float(v), float(t)
