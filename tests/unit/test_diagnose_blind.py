"""Fixes found with the blind incident set (testbed/fleetgen/blind*.py, bench/diagnose_blind.py),
each checked on a small hand-made input where the old behaviour was wrong."""

from __future__ import annotations

from kvscope.diagnoser.evaluate.evaluator import diagnose
from kvscope.diagnoser.evaluate.frame import frame_from_samples
from kvscope.diagnoser.rulebook.rule import read_rule, rules_dir
from testbed.rulecases import Case, case_samples


def _frame(series: list[dict], eval_time: float, interval: float = 60.0):
    case = Case(name="blind", input_series=series, eval_time=eval_time, expect=[], params={}, facts={}, line=0)
    return frame_from_samples(case_samples(case, interval), 0.0, eval_time, interval)


def _rules(*ids: str):
    return [read_rule(rules_dir() / f"{i}.yaml") for i in ids]


def test_autoscaler_on_the_wrong_signal_ranks_above_the_queue_it_lets_grow():
    # blind-vllm-hpa-wrong-signal: a replica was added at minute 5, then the count held while every
    # replica's queue grew for 25 minutes. Both U8 and L12 hold; U8 names why the queue persists.
    series = [
        {"series": 'engine_requests_waiting{instance="e0",model="m"}', "values": "0x20 5+0.5x25"},
        {"series": 'engine_requests_waiting{instance="e1",model="m"}', "values": "_x5 0x15 5+0.5x25"},
        {"series": 'engine_requests_finished_total{instance="e0",model="m"}', "values": "0+300x45"},
        {"series": 'engine_requests_finished_total{instance="e1",model="m"}', "values": "_x5 0+300x40"},
    ]
    d = diagnose(_frame(series, 45 * 60.0), _rules("queue_growing", "scaling_wrong_signal"), time_scale=1.0)
    fired = {f.levers_md for f in d.findings}
    assert fired == {"U8", "L12"}, fired
    assert d.likely_cause.levers_md == "U8"


def _knee_then(second_replica: str) -> list[dict]:
    ttft = 'request_ttft_seconds{instance="e0",model="m"}'
    queue = 'request_queue_seconds{instance="e0",model="m"}'
    return [
        {
            "histogram": ttft,
            "buckets": [0.1, 0.2, 0.5, 1, 2.5],
            "phases": [
                {"steps": 60, "counts": [50, 50, 0, 0, 0, 0]},
                {"steps": 24, "counts": [50, 45, 0, 0, 5, 0]},
                {"steps": 36, "counts": [50, 50, 0, 0, 0, 0]},
            ],
        },
        {
            "histogram": queue,
            "buckets": [0.01, 0.1, 1, 2.5],
            "phases": [
                {"steps": 60, "counts": [100, 0, 0, 0, 0]},
                {"steps": 24, "counts": [95, 0, 0, 5, 0]},
                {"steps": 36, "counts": [100, 0, 0, 0, 0]},
            ],
        },
        {"series": 'engine_requests_waiting{instance="e0",model="m"}', "values": "0x60 3x24 0x36"},
        {"series": 'engine_requests_waiting{instance="e1",model="m"}', "values": second_replica},
    ]


def test_a_knee_the_autoscaler_answered_is_an_info_record_and_says_why():
    # blind-healthy-sglang-autoscaled-ramp: a 3.5-minute knee before a scale-out; it was a warning.
    scaled = diagnose(_frame(_knee_then("_x76 0x44"), 30 * 60.0, 15.0), _rules("ttft_knee"), time_scale=1.0)
    held = diagnose(_frame(_knee_then("0x120"), 30 * 60.0, 15.0), _rules("ttft_knee"), time_scale=1.0)
    assert [f.severity for f in held.findings] == ["warning"]
    (f,) = scaled.findings
    assert f.severity == "info" and not f.active and scaled.exit_status() == 0
    assert f.score < held.findings[0].score
    assert f.summary.endswith("(resolved: the fleet scaled out after the onset and the tail came back)")


def test_itl_up_at_every_percentile_outranks_the_generic_both_slos_degrade_finding():
    # blind-vllm-decode-batch-large (staggered scrapes): L5 (both tails up, prompts 4x outputs) came
    # first over L4 (ITL up at every percentile as the batch grew). L5 observes no mechanism.
    lab = '{instance="e0",model="m"}'
    series = [
        {
            "histogram": f"request_itl_seconds{lab}",
            "buckets": [0.02, 0.04, 0.08, 0.16],
            "phases": [{"steps": 25, "counts": [90, 10, 0, 0, 0]}, {"steps": 15, "counts": [0, 90, 10, 0, 0]}],
        },
        {
            "histogram": f"request_ttft_seconds{lab}",
            "buckets": [0.1, 0.2, 0.4, 0.8],
            "phases": [{"steps": 25, "counts": [95, 5, 0, 0, 0]}, {"steps": 15, "counts": [60, 30, 10, 0, 0]}],
        },
        {"series": f"engine_prompt_tokens_total{lab}", "values": "0+4000x40"},
        {"series": f"engine_generation_tokens_total{lab}", "values": "0+800x40"},
        {"series": f"engine_requests_running{lab}", "values": "30x25 120x15"},
    ]
    d = diagnose(_frame(series, 40 * 60.0), _rules("itl_high_all_percentiles", "ttft_itl_conflict"), time_scale=1.0)
    assert {f.levers_md for f in d.findings} == {"L4", "L5"}
    assert d.likely_cause.levers_md == "L4"


def test_a_target_that_stops_being_scraped_is_gone_not_frozen_for_the_lookback():
    # blind-vllm-replica-flapping: 2 of 6 replicas scaled in every few minutes. Prometheus marks a
    # removed target's series stale at once; the recording source held them for the 5 min lookback,
    # so the replica count never fell and U7 (oscillation) was missed.
    import numpy as np

    from kvscope.diagnoser.evaluate.frame import mark_removed, removed_target_spans

    up = [("a", float(t), True) for t in range(0, 600, 30)]
    up += [("b", float(t), True) for t in range(0, 120, 30)] + [("b", float(t), True) for t in range(300, 600, 30)]
    up += [("c", float(t), t < 200) for t in range(0, 600, 30)]  # failing, still scraped: not removed
    spans = removed_target_spans(up)
    assert spans == {"b": [(120.0, 300.0)]}
    stalled = [(i, float(t), True) for i in "ab" for t in (*range(0, 300, 30), *range(600, 900, 30))]
    assert removed_target_spans(stalled) == {}  # the recorder itself paused: no one is gone
    series = [{"series": f'engine_requests_running{{instance="{i}",model="m"}}', "values": "5x19"} for i in "ab"]
    frame = _frame(series, 570.0, 30.0)
    mark_removed(frame, spans)
    block = next(iter(frame.blocks.values()))
    row = [dict(lb)["instance"] for lb in block.labels].index("b")
    gone = (frame.ts >= 120) & (frame.ts < 300)
    assert np.isnan(block.values[row, gone]).all() and not np.isnan(block.values[row, ~gone]).any()
