"""Evidence says the range the evaluation used: a label's `{range}` is written from the scaled,
whole-step range its series was read over (never "a minute" over an 8 s range), and PromQL ranges
are written as Prometheus writes durations (`1m30s`, `7s500ms`, `1d`)."""

from __future__ import annotations

import re

import pytest

from kvscope.diagnoser.evaluate.expr import duration_words, evidence_name, promql, range_used
from kvscope.diagnoser.promql.series import prom_duration
from kvscope.diagnoser.rulebook.rule import parse_duration, parse_yaml, rule_from_doc
from kvscope.diagnoser.rulebook.validate import check_evidence
from tests.unit.test_diagnoser_render import _diagnose

_RULE = (
    "id: r\nby: [instance]\nseries:\n  w: {gauge: engine_requests_waiting, agg: sum}\n"
    "  w_avg: {over_time: avg, of: w, range: 1m}\n  slope: {deriv: w_avg, range: 2m}\n"
    "evidence:\n  - {series: w_avg, name: 'waiting (mean over {range})', unit: count, stat: max}\n"
    "  - {series: w, name: 'waiting now ({range})', unit: count, stat: max}\n"
)


def _rule(time_scale: float = 1.0):
    return rule_from_doc(parse_yaml(_RULE), "r.yaml").scaled(time_scale)


def test_the_kv_pressure_recording_says_the_8s_it_averaged_not_a_minute():
    d = _diagnose("kv-pressure-cascade")  # 2 s grid, rules scaled x0.147: 1m -> 4 steps = 8 s
    f = next(f for f in d.findings if f.rule_id == "kv_pressure_preemption")
    waiting = next(e for e in f.evidence if e.key == "waiting")
    assert waiting.name == "waiting requests (mean over 8 s)"
    assert "[8s:2s]" in waiting.series
    names = [e.name for f in d.findings for e in f.evidence]
    assert not [n for n in names if "{" in n or "a minute" in n]


@pytest.mark.parametrize(
    ("scale", "step", "held", "words"),
    [
        (1.0, None, None, "1 min"),  # as written
        (0.15, 2.0, None, "8 s"),  # 9 s in whole 2 s steps, as the evaluator reads it: 4
        (0.15, 5.0, None, "10 s"),
        (0.15, 10.001, None, "10 s"),  # a jittery grid step reads as its whole second
        (1.0, 15.0, 30.0, "30 s"),  # no longer than the data held
        (0.5, 2.5, None, "30 s"),
        (0.05, 1.0, None, "3 s"),
    ],
)
def test_range_words_follow_the_range_used(scale, step, held, words):
    rule = _rule(scale)
    assert evidence_name(rule, rule.tree.evidence[0], step, held) == f"waiting (mean over {words})"


def test_range_used_matches_the_promql_range():
    for scale, step, held in ((0.15, 2.0, None), (0.15, 10.001, None), (1.0, 7.0, None), (1.0, 15.0, 45.0)):
        rule = _rule(scale)
        text = promql(rule, "w_avg", step, held)
        shown = re.search(r"\[(\w+):", text)
        assert shown and parse_duration(shown.group(1)) == pytest.approx(range_used(rule, "w_avg", step, held))
    # a slope reads at least three steps, as the evaluator does
    assert range_used(_rule(0.01), "slope", 2.0) == 6.0


def test_a_slope_prints_the_three_steps_the_evaluator_reads():
    # 2m at x0.01 is 1.2 s: on a 2 s grid the evaluator fits the slope over 3 steps, and so does
    # the PromQL text (it printed `deriv(...[2s:2s])`)
    rule = _rule(0.01)
    assert "[6s:2s]" in promql(rule, "slope", 2.0)
    assert range_used(rule, "slope", 2.0) == 6.0


def test_a_grid_step_off_the_second_renders_as_prometheus_writes_it():
    text = promql(_rule(0.15), "w_avg", step=10.001)  # --step 10.001: a step no recording is read at
    assert "[10s1ms:10s1ms]" in text
    assert prom_duration(90.0) == "1m30s" and prom_duration(10.0) == "10s" and prom_duration(0.0) == "0s"
    assert parse_duration(prom_duration(10.001)) == pytest.approx(10.001)


# What a real Prometheus prints for these durations: 2.42.0 (Debian 12), /api/v1/format_query of
# `rate(x[<ms>ms])` (model.Duration.String); tests/integration/test_diagnose_sources.py asks it again.
PROMETHEUS_WRITES = [
    (10.001, "10s1ms"),
    (28.035, "28s35ms"),
    (2.003, "2s3ms"),
    (7.5, "7s500ms"),
    (0.5, "500ms"),
    (90, "1m30s"),
    (3600, "1h"),
    (86400, "1d"),
    (604800, "1w"),
    (93784.005, "1d2h3m4s5ms"),
]


@pytest.mark.parametrize(("seconds", "text"), PROMETHEUS_WRITES)
def test_durations_are_written_as_prometheus_writes_them(seconds, text):
    assert prom_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("name", "ranges"),
    [("spec-decode-poor-acceptance", "[28s:2s]"), ("kv-pressure-cascade", "[8s:2s]")],
)
def test_library_recordings_scraped_with_jitter_print_whole_second_ranges(name, ranges):
    # spec-decode-poor-acceptance was scraped every 2.0025 s (median): it printed [28035ms:2003ms]
    d = _diagnose(name)
    series = " ".join(e.series for f in d.findings for e in f.evidence)
    assert ranges in series
    assert not re.search(r"\[[^\]]*\dms", series), series


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(2.5, "2.5 s"), (5, "5 s"), (10.001, "10 s"), (59.6, "1 min"), (90, "1 min 30 s"), (3900, "1 h 5 min")],
)
def test_duration_words(seconds, words):
    assert duration_words(seconds) == words


def test_validation_refuses_range_words_on_a_series_without_a_range():
    issues = [i.message for i in check_evidence(_rule(), None)]  # type: ignore[arg-type]
    assert any("'w' has no range" in m for m in issues), issues
    assert not any("'w_avg'" in m for m in issues)
