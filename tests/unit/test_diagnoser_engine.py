"""Engine: ranking (likely cause, competing, other), JSON round trip, skips, time scale, CLI."""

from __future__ import annotations

import json

from kvscope.cli import main
from kvscope.diagnoser.evaluate.evaluator import auto_time_scale, diagnose, sample_names
from kvscope.diagnoser.evaluate.frame import frame_from_samples
from kvscope.diagnoser.rulebook.rule import read_rules
from testbed.rulecases import Case, case_samples

CASCADE_INPUT = [
    {"series": 'engine_kv_cache_usage_ratio{instance="e0"}', "values": "0.5x23 0.95x33"},
    {"series": 'engine_preemptions_total{instance="e0"}', "values": "0x27 0+1x28"},
    {"series": 'engine_requests_running{instance="e0"}', "values": "8x56"},
    {"series": 'engine_requests_waiting{instance="e0"}', "values": "0x31 5x25"},
    {
        "histogram": 'request_ttft_seconds{instance="e0"}',
        "buckets": [0.1, 0.5, 1, 2.5],
        "phases": [{"steps": 36, "counts": [9, 1, 0, 0, 0]}, {"steps": 20, "counts": [0, 2, 6, 2, 0]}],
    },
]


def _frame(inputs, minutes=14):
    case = Case("x", inputs, minutes * 60.0, [], {}, 0, {})
    return frame_from_samples(case_samples(case, 15.0), 0.0, minutes * 60.0, 15.0)


def test_cascade_is_the_likely_cause_with_stage_and_lead_time():
    d = diagnose(_frame(CASCADE_INPUT), time_scale=1.0, source="test")
    head = d.likely_cause
    assert head is not None and head.rule_id == "kv_pressure_cascade"
    assert head.severity == "critical" and head.where == {"instance": "e0"}
    assert head.cascade.stage_name == "latency" and head.cascade.stage == 4
    onsets = head.cascade.onsets
    assert onsets["kv_high"] <= onsets["evicting"] <= onsets["queueing"] <= onsets["latency"]
    assert head.cascade.lead_time_s == onsets["latency"] - onsets["kv_high"] > 0
    assert head.levers[0].id == "vllm.kv_cache_dtype"
    assert any(c.system == "vllm" and "--kv-cache-dtype fp8" in c.change for c in head.levers[0].changes)
    assert "Sizing LLM Inference for Production §7.4" in head.citations
    fired = {f.rule_id for f in d.findings}
    assert "kv_pressure_preemption" in fired and "eviction_rate_high" not in fired  # 0.8%/s < 5%
    assert d.exit_status() == 2
    kv = next(e for e in head.evidence if e.name == "KV cache usage")
    assert kv.value == 0.95 and "engine_kv_cache_usage_ratio" in kv.series


def test_competing_hypotheses_share_the_place_of_the_likely_cause():
    d = diagnose(_frame(CASCADE_INPUT), time_scale=1.0)
    for f in d.competing:
        assert f.specificity >= 2
        assert all(d.likely_cause.where.get(k, v) == v for k, v in f.where.items())


def test_diagnosis_json_carries_the_cascade():
    d = diagnose(_frame(CASCADE_INPUT), time_scale=1.0, source="test")
    assert json.loads(d.to_json())["likely_cause"]["cascade"]["stage_name"] == "latency"


def test_healthy_window_fires_nothing_and_reports_absent_signals_as_skipped():
    inputs = [
        {"series": 'engine_kv_cache_usage_ratio{instance="e0"}', "values": "0.4x56"},
        {"series": 'engine_preemptions_total{instance="e0"}', "values": "0x56"},
        {"series": 'engine_requests_running{instance="e0"}', "values": "4x56"},
        {"series": 'engine_requests_waiting{instance="e0"}', "values": "0x56"},
    ]
    d = diagnose(_frame(inputs), time_scale=1.0)
    assert d.likely_cause is None and d.exit_status() == 0
    reasons = {s.rule_id: s.reason for s in d.skipped}
    assert "gpu_utilization_ratio" in reasons["fleet_util_low"]
    assert "parameter(s) not set" in reasons["prod_vs_benchmark"]


def test_parameter_override_changes_the_outcome():
    inputs = [
        {"series": 'engine_kv_cache_usage_ratio{instance="e0"}', "values": "0.85x56"},
        {"series": 'engine_preemptions_total{instance="e0"}', "values": "0+1x56"},
    ]
    rules = [r for r in read_rules() if r.id == "kv_pressure_preemption"]
    assert diagnose(_frame(inputs), rules, time_scale=1.0).likely_cause is None
    d = diagnose(_frame(inputs), rules, params={"kv_pressure_preemption": {"kv_full": 0.8}}, time_scale=1.0)
    assert d.likely_cause is not None and d.likely_cause.params["kv_full"] == 0.8


def test_short_windows_scale_durations():
    assert auto_time_scale(3600) == 1.0
    assert auto_time_scale(90) == 0.1


def test_sample_names_expand_histograms():
    rule = next(r for r in read_rules() if r.id == "ttft_knee")
    assert {"request_ttft_seconds_bucket", "request_queue_seconds_bucket"} <= sample_names(rule)


def test_cli_usage_errors_exit_3(capsys):
    assert main(["diagnose"]) == 3
    assert main(["diagnose", "--recording", "x.om", "--param", "nonsense"]) == 3
    assert main(["diagnose", "--recording", "x.om", "--param", "no_such_rule.x=1"]) == 3


def test_cli_missing_recording_exits_4(tmp_path, capsys):
    assert main(["diagnose", "--recording", str(tmp_path / "missing.om")]) == 4
    err = capsys.readouterr().err
    assert "missing.om" in err and ("does not exist" in err or "cannot read recording" in err)


def _write_recording(path, inputs):
    lines = [
        "# TYPE vllm:kv_cache_usage_perc gauge",
        "# TYPE vllm:num_preemptions counter",
        "# TYPE vllm:num_requests_running gauge",
    ]
    body = {"vllm:kv_cache_usage_perc": [], "vllm:num_preemptions_total": [], "vllm:num_requests_running": []}
    for i, (kv, pre, run) in enumerate(inputs):
        ts = 1_800_000_000 + 2 * i
        labels = '{engine="0",instance="r0",job="vllm",model_name="m"}'
        body["vllm:kv_cache_usage_perc"].append(f"vllm:kv_cache_usage_perc{labels} {kv} {ts}")
        body["vllm:num_preemptions_total"].append(f"vllm:num_preemptions_total{labels} {pre} {ts}")
        body["vllm:num_requests_running"].append(f"vllm:num_requests_running{labels} {run} {ts}")
    out = []
    for (_name, rows), head in zip(body.items(), lines, strict=True):
        out.append(head)
        out.extend(rows)
    path.write_text("\n".join(out) + "\n# EOF\n")


def test_cli_json_on_a_short_recording_scales_time_and_exits_with_severity(tmp_path, capsys):
    rec = tmp_path / "k.om"
    _write_recording(rec, [(0.4, 0, 4)] * 20 + [(0.97, 2 * i, 16) for i in range(40)])
    status = main(["diagnose", "--recording", str(rec), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["time_scale"] < 1
    assert out["likely_cause"]["levers_md"] in {"K1", "K2", "K3"}
    assert status in (1, 2)
