"""KV pressure is named first, at the stage the cascade reached (issue 26, 002 §7.4 Figure 7.4).

The inputs are the cascade rule's own test cases (rules/diagnosis/kv_pressure_cascade.test.yaml),
judged by every rule together as `kvscope diagnose` does: before TTFT moved K1 leads (it names
stage 2, where 002 §7.4 acts) and K2 follows as the same mechanism; once the cascade reached
latency K2 leads. A growing queue with the KV pool full is not read as L12.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvscope.diagnoser.evaluate.evaluator import diagnose
from kvscope.diagnoser.evaluate.frame import frame_from_samples
from testbed.rulecases import case_samples, read_test_file

CASES = Path(__file__).resolve().parents[2] / "rules" / "diagnosis" / "kv_pressure_cascade.test.yaml"


def diagnose_case(name: str):
    tf = read_test_file(CASES)
    case = next(c for c in tf.cases if c.name.startswith(name))
    frame = frame_from_samples(case_samples(case, tf.interval), 0.0, case.eval_time, tf.interval)
    return diagnose(frame, time_scale=1.0, workers=1)


@pytest.mark.parametrize("name", ["stops at stage 2", "without a preemption counter and with TTFT unmoved"])
def test_k1_leads_an_incomplete_cascade(name):
    d = diagnose_case(name)
    assert d.likely_cause is not None and d.likely_cause.rule_id == "kv_pressure_preemption"
    k2 = next(f for f in d.findings if f.rule_id == "kv_pressure_cascade")
    assert k2.cascade is not None and k2.cascade.lead_time_s is None
    assert "queue_growing" not in {f.rule_id for f in d.findings}


@pytest.mark.parametrize("name", ["full cascade in order", "without a preemption counter, running requests"])
def test_k2_leads_once_latency_moved(name):
    d = diagnose_case(name)
    assert d.likely_cause is not None and d.likely_cause.rule_id == "kv_pressure_cascade"
    assert d.likely_cause.severity == "critical" and d.likely_cause.cascade.stage_name == "latency"


# ------------------------------------------------------------ recordings without the counter
def _drop_preemption_counters(rec, meta):
    from dataclasses import replace

    keep = lambda name: "preemption" not in name and "retract" not in name  # noqa: E731
    return replace(rec, scrapes=[replace(sc, samples=[x for x in sc.samples if keep(x.name)]) for sc in rec.scrapes])


@pytest.mark.parametrize("scenario", ["kv-pressure-cascade", "blind-vllm-kv-too-small"])
def test_kv_pressure_recordings_without_a_preemption_counter_still_name_kv_pressure(scenario, tmp_path):
    """The library's KV-pressure incidents with every preemption / retraction series removed
    (an engine that exports none, or a log without the warnings): KV pressure is still the
    likely cause, inferred from the queues at moderate confidence, and no growing queue (L12)."""
    import yaml

    from kvscope.diagnoser.evaluate.evaluator import sample_names
    from kvscope.diagnoser.rulebook.rule import read_rules
    from kvscope.diagnoser.sources.recording import RecordingSource
    from testbed.recording_variants import Variant, write_variant

    library = Path(__file__).resolve().parents[1] / "recordings"
    meta = yaml.safe_load((library / f"{scenario}.yaml").read_text())
    variant = Variant(
        "no_preemption_counter", "preemption counters removed", _drop_preemption_counters, keeps_spans=False
    )
    out = write_variant(library / meta["recording"], variant, meta, tmp_path / scenario, None)
    source = RecordingSource(out)
    rules = read_rules()
    frame = source.read_frame(set().union(*(sample_names(r) for r in rules)), None, None, source.natural_step())
    assert "engine_preemptions_total" not in frame.names()
    d = diagnose(frame, rules, source=str(out))
    assert d.likely_cause is not None and d.likely_cause.levers_md in ("K1", "K2"), [
        (f.levers_md, f.rule_id) for f in d.findings
    ]
    k1 = [f for f in d.findings if f.rule_id == "kv_pressure_preemption"]
    assert k1 and all(f.confidence == "moderate" for f in k1)
    assert "queue_growing" not in {f.rule_id for f in d.findings}


# ------------------------------------------------------------ a batch preempted into the queue
def test_a_batch_preempted_into_the_queue_names_kv_pressure_not_a_stuck_scheduler():
    """KV full, then the whole running batch moved to waiting (running 8 -> 0, waiting 0 -> 8) and
    the freed pool reads nearly empty: R3 (scheduler_stuck, critical) defers while the pool was full
    within its kv_lookback, so KV pressure is the likely cause (issue 38, item 4). The input is R3's
    own quiet case (rules/diagnosis/scheduler_stuck.test.yaml)."""
    tf = read_test_file(CASES.parent / "scheduler_stuck.test.yaml")
    case = next(c for c in tf.cases if c.name.startswith("quiet while the KV pool was full"))
    frame = frame_from_samples(case_samples(case, tf.interval), 0.0, case.eval_time, tf.interval)
    d = diagnose(frame, time_scale=1.0, workers=1)
    assert d.likely_cause is not None and d.likely_cause.levers_md in ("K1", "K2", "K3"), [
        (f.rule_id, f.severity) for f in d.findings
    ]
    assert "scheduler_stuck" not in {f.rule_id for f in d.findings}
