"""`kvscope demo --check` prints evidence with the units `kvscope diagnose` uses, never raw unit names."""

from __future__ import annotations

from kvscope.commands.demo import render_diagnosis
from kvscope.diagnoser.findings import Diagnosis, Evidence, Finding

T0 = 1_700_000_000.0


def _finding(rule_id: str = "kv_pressure_preemption", levers_md: str = "K1") -> Finding:
    return Finding(
        rule_id=rule_id,
        levers_md=levers_md,
        title="KV cache full and requests are being preempted",
        severity="warning",
        where={"instance": "replica-0"},
        since=T0,
        until=T0 + 90,
        active=False,
        window=(T0 - 60, T0 + 120),
        step_s=15.0,
        score=1.0,
        summary="KV cache at 99% with 4.42 preemptions/s",
        evidence=(
            Evidence("KV cache usage", 0.987, "ratio", "max(engine_kv_cache_usage_ratio)", threshold=0.9, op=">="),
            Evidence("preemptions", 4.42, "per_second", "rate(engine_preemptions_total[1m])"),
            Evidence("mean TTFT", 0.25, "seconds", "ttft_mean"),
            Evidence("waiting requests", 6.0, "count", "engine_requests_waiting"),
        ),
        citations=("002 §7.4",),
    )


def test_evidence_is_printed_with_readable_units_and_thresholds():
    f = _finding()
    text = render_diagnosis(Diagnosis(window=f.window, source="recording:x.om", likely_cause=f, rules_evaluated=1))
    assert "KV cache usage = 98.7% (threshold >= 90.0%)" in text
    assert "preemptions = 4.42 /s  [" in text
    assert "mean TTFT = 250.0 ms  [" in text
    assert "waiting requests = 6  [" in text
    assert "(until 2023-11-14 22:14:50 UTC, 1m30s)" in text
    assert "1 fired, 0 not evaluable" in text


def test_competing_hypotheses_show_labels_not_a_python_dict():
    main, other = _finding(), _finding("eviction_rate_high", "K3")
    text = render_diagnosis(Diagnosis(window=main.window, source="s", likely_cause=main, competing=(other,)))
    assert (
        "competing: KV cache full and requests are being preempted (eviction_rate_high) on instance=replica-0" in text
    )
    assert "{'instance'" not in text


def test_findings_of_the_same_mechanism_print_as_also_fired_not_as_competing():
    from dataclasses import replace

    from kvscope.diagnoser.findings import LeverAdvice

    fp8 = (LeverAdvice("fp8_kv_cache", 1, "enable"),)
    main = replace(_finding("kv_pressure_cascade", "K2"), levers=fp8)
    same = replace(_finding("eviction_rate_high", "K3"), levers=fp8)
    other = replace(
        _finding("queue_growing", "U3"), title="Queue growing", levers=(LeverAdvice("autoscale", 1, "increase"),)
    )
    text = render_diagnosis(Diagnosis(window=main.window, source="s", likely_cause=main, competing=(same, other)))
    assert (
        "also fired (same mechanism and levers): KV cache full and requests are being preempted (eviction_rate_high)"
        in text
    )
    assert "competing: Queue growing (queue_growing) on instance=replica-0" in text
    assert "competing: KV cache full" not in text
