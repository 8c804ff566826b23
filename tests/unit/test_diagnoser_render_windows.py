"""Windows, offsets and ranges as printed by `kvscope diagnose` never claim data a short window
does not hold: a comparison window longer than the recording says it was clipped, and a series'
range is no longer than the data the evaluator's trailing windows can reach."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from kvscope.diagnoser.expr import promql
from kvscope.diagnoser.findings import Finding
from kvscope.diagnoser.render import baseline_lines
from kvscope.diagnoser.rule import parse_duration, parse_yaml, rule_from_doc

from tests.unit.test_diagnoser_render import T0, _diagnose, _finding

_RULE = ("id: r\nby: [instance]\nseries:\n  u: {gauge: gpu_utilization_ratio, agg: avg}\n"
         "  u_avg: {over_time: avg, of: u, range: 1h}\n  p: {rate: engine_preemptions_total, range: 5m}\n"
         "  u_before: {over_time: avg, of: u, range: 15m, offset: 5m}\n")


def _rule(time_scale: float):
    return rule_from_doc(parse_yaml(_RULE), "r.yaml").scaled(time_scale)


def _hit_collapse(window: tuple[float, float]) -> Finding:
    f = _finding("hit_collapse_after_scaling", "P3", ("router.consistent_hashing",), where={"model": "m"})
    return replace(f, params={"baseline_range": "10m", "baseline_offset": "2m", "drop_factor": 0.7},
                   step_s=10.0, window=window)


def test_a_range_is_clipped_to_the_data_held():
    # a 9m50s window scales 1h by x0.6555 to 39m20s; the evaluator's window reaches back 9m50s at most
    assert "[39m20s:]" in promql(_rule(0.6555), "u_avg", step=10.0)            # no window given: as scaled
    assert "[9m50s:]" in promql(_rule(0.6555), "u_avg", step=10.0, held=590.0)
    assert "rate(engine_preemptions_total[2m])" in promql(_rule(1.0), "p", step=10.0, held=120.0)
    assert "rate(engine_preemptions_total[5m])" in promql(_rule(1.0), "p", step=10.0, held=3600.0)


def test_an_offset_range_is_clipped_to_the_data_held_before_the_offset():
    # x0.15 on a 2 s grid: 15m -> 136 s, 5m -> 44 s; 132 s held leave 88 s before the offset
    text = promql(_rule(0.15), "u_before", step=2.0, held=132.0)
    assert "[1m28s:] offset 44s" in text
    assert "[15m:] offset 5m" in promql(_rule(1.0), "u_before", step=10.0, held=7200.0)
    assert "[2s:] offset 44s" in promql(_rule(0.15), "u_before", step=2.0, held=30.0)   # never below a step


def test_a_baseline_longer_than_the_window_says_it_is_clipped():
    long = _hit_collapse((T0 - 3600, T0 + 120))
    assert baseline_lines(long) == ["fleet hit rate < 0.7 x its avg over the 10m00s ending 2m00s earlier"]
    short = _hit_collapse((T0 - 300, T0 + 120))                                     # 7m held
    assert baseline_lines(short) == ["fleet hit rate < 0.7 x its avg over all data held up to 2m00s earlier "
                                     "(at most the first 5m00s of the 7m00s held; the rule's 10m00s range "
                                     "reaches back before the data)"]
    tiny = _hit_collapse((T0, T0 + 90))
    assert baseline_lines(tiny) == ["fleet hit rate < 0.7 x its avg ending 2m00s earlier: none held, the window "
                                    "is only 1m30s long (the comparison cannot hold)"]


def test_kv_pressure_cascade_recording_baseline_reads_as_the_data_held():
    d = _diagnose("kv-pressure-cascade")
    assert d.likely_cause is not None and d.likely_cause.levers_md == "K2"
    lines = baseline_lines(d.likely_cause, d.time_scale)
    assert len(lines) == 1 and "over the 2m12s ending" not in lines[0]
    assert lines[0].startswith("mean TTFT > 1.5 x its avg over all data held up to 44s earlier "
                               "(at most the first 1m28s of the 2m12s held")


@pytest.mark.parametrize("name", ["kv-pressure-cascade", "fleet-dcgm-utilization-trap", "replica-restart-cold-cache"])
def test_no_evidence_series_range_is_longer_than_the_recording(name):
    d = _diagnose(name)
    held = d.window[1] - d.window[0]
    findings = [f for f in (d.likely_cause, *d.competing, *d.other) if f is not None]
    ranges = [m for f in findings for ev in f.evidence for m in re.findall(r"\[(\w+?):?\]", ev.series)]
    assert ranges, "the recording's findings print no ranges"
    too_long = sorted({r for r in ranges if parse_duration(r) > held + 1e-6})
    assert too_long == [], f"{name}: ranges {too_long} exceed the {held:.0f} s held"
