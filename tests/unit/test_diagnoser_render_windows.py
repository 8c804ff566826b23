"""Windows, offsets and ranges as printed by `kvscope diagnose` never claim data a short window
does not hold: a comparison window longer than the recording says it was clipped, and a series'
range is no longer than the data the evaluator's trailing windows can reach."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from kvscope.diagnoser.evaluate.expr import promql
from kvscope.diagnoser.findings import Finding
from kvscope.diagnoser.render import baseline_lines
from kvscope.diagnoser.rulebook.rule import parse_duration, parse_yaml, rule_from_doc
from tests.unit.test_diagnoser_render import T0, _diagnose, _finding

_RULE = (
    "id: r\nby: [instance]\nseries:\n  u: {gauge: gpu_utilization_ratio, agg: avg}\n"
    "  u_avg: {over_time: avg, of: u, range: 1h}\n  p: {rate: engine_preemptions_total, range: 5m}\n"
    "  u_before: {over_time: avg, of: u, range: 15m, offset: 5m}\n"
)


def _rule(time_scale: float):
    return rule_from_doc(parse_yaml(_RULE), "r.yaml").scaled(time_scale)


def _hit_collapse(window: tuple[float, float]) -> Finding:
    f = _finding("hit_collapse_after_scaling", "P3", ("router.consistent_hashing",), where={"model": "m"})
    return replace(
        f, params={"baseline_range": "10m", "baseline_offset": "2m", "drop_factor": 0.7}, step_s=10.0, window=window
    )


def test_a_range_is_clipped_to_the_data_held():
    # a 9m50s window scales 1h by x0.6555 to 39m20s; the evaluator's window reaches back 9m50s at most
    assert "[39m20s:10s]" in promql(_rule(0.6555), "u_avg", step=10.0)  # no window given: as scaled
    assert "[9m50s:10s]" in promql(_rule(0.6555), "u_avg", step=10.0, held=590.0)
    assert "rate(engine_preemptions_total[2m])" in promql(_rule(1.0), "p", step=10.0, held=120.0)
    assert "rate(engine_preemptions_total[5m])" in promql(_rule(1.0), "p", step=10.0, held=3600.0)


def test_an_offset_range_is_clipped_to_the_data_held_before_the_offset():
    # x0.15 on a 2 s grid: 15m -> 136 s, 5m -> 44 s; 132 s held leave 88 s before the offset
    text = promql(_rule(0.15), "u_before", step=2.0, held=132.0)
    assert "[1m28s:2s] offset 44s" in text
    assert "[15m:10s] offset 5m" in promql(_rule(1.0), "u_before", step=10.0, held=7200.0)
    assert "[2s:2s] offset 44s" in promql(_rule(0.15), "u_before", step=2.0, held=30.0)  # never below a step


def test_a_baseline_longer_than_the_window_says_it_is_clipped():
    long = _hit_collapse((T0 - 3600, T0 + 120))
    assert baseline_lines(long) == ["fleet hit rate < 0.7 x its avg over the 10m00s ending 2m00s earlier"]
    short = _hit_collapse((T0 - 300, T0 + 120))  # 7m held
    assert baseline_lines(short) == [
        "fleet hit rate < 0.7 x its avg over all data held up to 2m00s earlier "
        "(at most the first 4m00s of the 7m00s held; the rule's 10m00s range "
        "reaches back before the data)"
    ]  # it ended 6m in
    active = replace(short, until=T0 + 120, active=True)
    assert "(at most the first 5m00s of the 7m00s held;" in baseline_lines(active)[0]
    tiny = _hit_collapse((T0, T0 + 90))
    assert baseline_lines(tiny) == [
        "fleet hit rate < 0.7 x its avg ending 2m00s earlier: none held, the window "
        "is only 1m30s long (the comparison cannot hold)"
    ]


def test_kv_pressure_cascade_recording_baseline_reads_as_the_data_held():
    d = _diagnose("kv-pressure-cascade")
    assert d.likely_cause is not None and d.likely_cause.levers_md == "K2"
    lines = baseline_lines(d.likely_cause, d.time_scale)
    assert len(lines) == 1 and "over the 2m12s ending" not in lines[0]
    # it fired until 1m52s into the 2m12s: its last comparison averaged the first 1m08s at most
    assert lines[0].startswith(
        "mean TTFT > 1.5 x its avg over all data held up to 44s earlier (at most the first 1m08s of the 2m12s held"
    )


def test_a_baseline_that_starts_before_the_data_when_the_finding_fired_says_so():
    """A long window, but the finding fired early: the comparison's range began before the data
    at the onset (and throughout, or only at first), though it would fit at the window's end."""
    window = (T0 - 3600, T0 + 120)  # 62m held
    early = replace(_hit_collapse(window), since=window[0] + 300, until=window[0] + 420)  # 5m..7m in
    assert baseline_lines(early) == [
        "fleet hit rate < 0.7 x its avg over all data held up to 2m00s earlier "
        "(at most the first 5m00s of the 1h02m held; the rule's 10m00s range "
        "reaches back before the data)"
    ]
    onset_only = replace(early, until=window[0] + 900)  # 5m..15m in
    assert baseline_lines(onset_only) == [
        "fleet hit rate < 0.7 x its avg over the 10m00s ending 2m00s earlier "
        "(at the onset only 3m00s of it was held: the data starts later)"
    ]
    fitting = replace(early, since=window[0] + 720, until=window[0] + 900)  # 12m in: 10m + 2m held
    assert baseline_lines(fitting) == ["fleet hit rate < 0.7 x its avg over the 10m00s ending 2m00s earlier"]
    none = replace(early, since=window[0] + 60, until=window[0] + 90)
    assert baseline_lines(none) == [
        "fleet hit rate < 0.7 x its avg ending 2m00s earlier: none held while it "
        "fired (it ended 1m30s into the 1h02m held; the comparison cannot hold)"
    ]


def test_scale_out_recording_baseline_reads_as_the_data_held_at_the_onset():
    """The 11m50s scale-out recording: hit_collapse's 10m baseline ending 2m earlier, scaled x0.79
    to 7m50s ending 1m30s, fired 5m10s..5m50s in, when at most 4m20s were held before the offset."""
    d = _diagnose("fleet-scale-out-hash-mod")
    f = next(f for f in (d.likely_cause, *d.competing, *d.other) if f and f.rule_id == "hit_collapse_after_scaling")
    assert (f.since - f.window[0], f.until - f.window[0], f.window[1] - f.window[0]) == (310.0, 350.0, 710.0)
    assert baseline_lines(f, d.time_scale) == [
        "fleet hit rate < 0.7 x its avg over all data held up to 1m30s earlier (at most the first 4m20s of the "
        "11m50s held; the rule's 7m50s range reaches back before the data)"
    ]


@pytest.mark.parametrize("name", ["kv-pressure-cascade", "fleet-dcgm-utilization-trap", "replica-restart-cold-cache"])
def test_no_evidence_series_range_is_longer_than_the_recording(name):
    d = _diagnose(name)
    held = d.window[1] - d.window[0]
    findings = [f for f in (d.likely_cause, *d.competing, *d.other) if f is not None]
    ranges = [m for f in findings for ev in f.evidence for m in re.findall(r"\[(\w+?)(?::\w+)?\]", ev.series)]
    assert ranges, "the recording's findings print no ranges"
    too_long = sorted({r for r in ranges if parse_duration(r) > held + 1e-6})
    assert too_long == [], f"{name}: ranges {too_long} exceed the {held:.0f} s held"
