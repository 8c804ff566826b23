"""A target whose scrapes fail has no values there (Prometheus staleness), so counter rates
neither sink toward zero during an outage nor jump after it."""

from __future__ import annotations

import math

import numpy as np

from kvscope.core.signals import Sample, make_labels
from kvscope.diagnoser.evaluate import grid
from kvscope.diagnoser.evaluate.frame import failed_scrape_spans, frame_from_samples, mark_stale
from kvscope.diagnoser.sources.recording import RecordingSource


def test_failed_scrape_spans_run_from_a_failure_to_the_next_success():
    up = [
        ("a", 0.0, True),
        ("a", 10.0, False),
        ("a", 20.0, False),
        ("a", 30.0, True),
        ("a", 40.0, False),
        ("b", 0.0, True),
        ("b", 10.0, True),
    ]
    assert failed_scrape_spans(up) == {"a": [(10.0, 30.0), (40.0, math.inf)]}


def _counter_frame(outage: tuple[float, float]) -> tuple:
    """Two instances counting 10/s, scraped every 10 s; `a`'s scrapes fail during `outage`."""
    samples, up = [], []
    for t in range(0, 301, 10):
        for inst in ("a", "b"):
            ok = not (inst == "a" and outage[0] <= t < outage[1])
            up.append((inst, float(t), ok))
            if ok:
                samples.append(
                    Sample("engine_prompt_tokens_total", make_labels({"instance": inst}), 10.0 * t, float(t))
                )
    return frame_from_samples(samples, 0.0, 300.0, 10.0), up


def test_an_outage_leaves_the_rate_of_the_down_target_absent_then_right():
    frame, up = _counter_frame((100.0, 160.0))
    block = frame.block("engine_prompt_tokens_total")
    before = grid.counter_rate(block.values, 6, 10.0)
    # without staleness the lookback carries the frozen counter: the rate sinks during the outage
    assert before[0, 15] < 5.0
    mark_stale(frame, failed_scrape_spans(up))
    rate = grid.counter_rate(block.values, 6, 10.0)
    a, b = rate[0], rate[1]
    assert np.isnan(a[10:16]).all()  # down at 100..150: absent, not slow
    assert np.allclose(a[17:], 10.0)  # back: the true rate, no jump
    assert np.allclose(b[1:], 10.0)  # the healthy target is untouched


def test_a_recording_with_a_failed_scrape_is_read_with_staleness(tmp_path):
    from kvscope.agent.recording.omfile import RecordingWriter
    from kvscope.agent.scrape.exposition import parse_exposition

    payload = '# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total{{model_name="m"}} {v}\n'
    writer = RecordingWriter(tmp_path / "r.om")
    for t in range(0, 301, 10):
        down = 100 <= t < 160
        expo = None if down else parse_exposition(payload.format(v=10.0 * t))
        writer.add_scrape("vllm", "e0", 1_000_000.0 + t, expo)
    path = writer.close()
    frame = RecordingSource(path).read_frame({"engine_prompt_tokens_total"}, None, None, 10.0)
    values = frame.block("engine_prompt_tokens_total").values[0]
    assert np.isnan(values[10:16]).all()
    assert not np.isnan(values[:10]).any() and not np.isnan(values[16:]).any()


def test_a_replica_whose_scrapes_fail_still_counts_as_a_replica():
    from kvscope.diagnoser.evaluate.expr import SeriesEvaluator
    from kvscope.diagnoser.rulebook.rule import parse_yaml, rule_from_doc

    doc = parse_yaml("""
id: count_probe
levers_md: P2
title: probe
status: experimental
severity: info
specificity: 1
description: counts replicas
by: []
series:
  replicas: {count: engine_prompt_tokens_total}
  rate: {rate: engine_prompt_tokens_total, range: 1m}
when:
  all: [{series: replicas, op: ">", value: 0}]
""")
    frame, up = _counter_frame((100.0, 160.0))
    mark_stale(frame, failed_scrape_spans(up))
    ev = SeriesEvaluator(rule_from_doc(doc, "count_probe.yaml"), frame)
    assert ev.get("replicas").values[0, 1:].tolist() == [2.0] * 30  # an outage is not a scale-down
    assert np.isnan(frame.block("engine_prompt_tokens_total").values[0, 10:16]).all()


def _rate_rule(threshold: float, for_: str):
    from kvscope.diagnoser.rulebook.rule import parse_yaml, rule_from_doc

    doc = parse_yaml(f"""
id: rate_probe
levers_md: P2
title: probe
status: experimental
severity: warning
specificity: 1
description: a counter rate above a threshold
by: [instance]
series:
  rate: {{rate: engine_prompt_tokens_total, range: 1m}}
when:
  all: [{{series: rate, op: ">", value: {threshold}}}]
  for: {for_}
summary: rate
""")
    return rule_from_doc(doc, "rate_probe.yaml")


def test_an_outage_inside_a_condition_does_not_cut_its_for_run():
    from kvscope.diagnoser.evaluate.evaluator import evaluate_rule

    frame, up = _counter_frame((100.0, 160.0))
    mark_stale(frame, failed_scrape_spans(up))
    findings = evaluate_rule(_rate_rule(5.0, "4m"), frame, {})
    # 10..300 s true with the 60 s outage bridged; the runs around it are 90 and 130 s
    assert sorted(f.where["instance"] for f in findings) == ["a", "b"]
    assert evaluate_rule(_rate_rule(50.0, "0s"), frame, {}) == []  # an outage alone is nothing
    frame.down.clear()
    assert [f.where["instance"] for f in evaluate_rule(_rate_rule(5.0, "4m"), frame, {})] == ["b"]
