"""Fixes found with the blind incident set (testbed/fleetgen/blind*.py, bench/diagnose_blind.py),
each checked on a small hand-made input where the old behaviour was wrong."""

from __future__ import annotations

from kvscope.diagnoser.engine import diagnose
from kvscope.diagnoser.frame import frame_from_samples
from kvscope.diagnoser.rule import read_rule, rules_dir
from kvscope.diagnoser.testcases import Case, case_samples


def _frame(series: list[dict], eval_time: float, interval: float = 60.0):
    case = Case(name="blind", input_series=series, eval_time=eval_time, expect=[], params={}, facts={}, line=0)
    return frame_from_samples(case_samples(case, interval), 0.0, eval_time, interval)


def _rules(*ids: str):
    return [read_rule(rules_dir() / f"{i}.yaml") for i in ids]


def test_autoscaler_on_the_wrong_signal_ranks_above_the_queue_it_lets_grow():
    # blind-vllm-hpa-wrong-signal: a replica was added at minute 5, then the count held while every
    # replica's queue grew for 25 minutes. Both U8 and L12 hold; U8 names why the queue persists.
    series = [{"series": 'engine_requests_waiting{instance="e0",model="m"}', "values": "0x20 5+0.5x25"},
              {"series": 'engine_requests_waiting{instance="e1",model="m"}', "values": "_x5 0x15 5+0.5x25"},
              {"series": 'engine_requests_finished_total{instance="e0",model="m"}', "values": "0+300x45"},
              {"series": 'engine_requests_finished_total{instance="e1",model="m"}', "values": "_x5 0+300x40"}]
    d = diagnose(_frame(series, 45 * 60.0), _rules("queue_growing", "scaling_wrong_signal"), time_scale=1.0)
    fired = {f.levers_md for f in d.findings}
    assert fired == {"U8", "L12"}, fired
    assert d.likely_cause.levers_md == "U8"


def _knee_then(second_replica: str) -> list[dict]:
    ttft = 'request_ttft_seconds{instance="e0",model="m"}'
    queue = 'request_queue_seconds{instance="e0",model="m"}'
    return [{"histogram": ttft, "buckets": [0.1, 0.2, 0.5, 1, 2.5],
             "phases": [{"steps": 60, "counts": [50, 50, 0, 0, 0, 0]}, {"steps": 24, "counts": [50, 45, 0, 0, 5, 0]},
                        {"steps": 36, "counts": [50, 50, 0, 0, 0, 0]}]},
            {"histogram": queue, "buckets": [0.01, 0.1, 1, 2.5],
             "phases": [{"steps": 60, "counts": [100, 0, 0, 0, 0]}, {"steps": 24, "counts": [95, 0, 0, 5, 0]},
                        {"steps": 36, "counts": [100, 0, 0, 0, 0]}]},
            {"series": 'engine_requests_waiting{instance="e0",model="m"}', "values": "0x60 3x24 0x36"},
            {"series": 'engine_requests_waiting{instance="e1",model="m"}', "values": second_replica}]


def test_a_knee_the_autoscaler_answered_is_an_info_record_and_says_why():
    # blind-healthy-sglang-autoscaled-ramp: a 3.5-minute knee before a scale-out; it was a warning.
    from kvscope.diagnoser.render import render_summary
    scaled = diagnose(_frame(_knee_then("_x76 0x44"), 30 * 60.0, 15.0), _rules("ttft_knee"), time_scale=1.0)
    held = diagnose(_frame(_knee_then("0x120"), 30 * 60.0, 15.0), _rules("ttft_knee"), time_scale=1.0)
    assert [f.severity for f in held.findings] == ["warning"]
    (f,) = scaled.findings
    assert f.severity == "info" and not f.active and scaled.exit_status() == 0
    assert f.score < held.findings[0].score
    assert render_summary(f).endswith("(resolved: the fleet scaled out after the onset and the tail came back)")
