"""R8 (engine_hung) keeps its durations whatever the window (`durations: absolute`) and does not
judge data sampled more sparsely than `max_sample_interval` (`max_step`): the two ways a short or
sparse source read an engine that was generating as hung (issue 38)."""

from __future__ import annotations

from kvscope.core.signals import Sample, make_labels
from kvscope.diagnoser.evaluate.evaluator import diagnose
from kvscope.diagnoser.evaluate.frame import frame_from_samples
from kvscope.diagnoser.rulebook.rule import read_rules

RULE = next(r for r in read_rules() if r.id == "engine_hung")
LABELS = make_labels({"instance": "e0"})


def _hung(step: float, points: int, progress_until: int) -> list[Sample]:
    out = []
    for i in range(points):
        t = i * step
        out += [
            Sample("engine_requests_running", LABELS, 4.0, t),
            Sample("engine_requests_waiting", LABELS, 0.0, t),
            Sample("engine_generation_tokens_total", LABELS, 100.0 * min(i, progress_until), t),
        ]
    return out


def _found(samples, step, end, time_scale=None):
    d = diagnose(frame_from_samples(samples, 0.0, end, step), rules=[RULE], time_scale=time_scale, workers=1)
    return [f.rule_id for f in d.findings], [s.reason for s in d.skipped]


def test_a_hang_at_a_15s_step_fires_and_a_stall_shorter_than_3m_does_not():
    assert _found(_hung(15.0, 41, 8), 15.0, 600.0)[0] == ["engine_hung"]
    # 2 minutes flat at the end: under the 3m stall, whatever time scale is asked for
    assert _found(_hung(15.0, 41, 32), 15.0, 600.0, time_scale=0.1)[0] == []


def test_data_sparser_than_max_sample_interval_is_not_judged():
    found, skipped = _found(_hung(120.0, 11, 3), 120.0, 1200.0)
    assert found == [] and any("too coarse" in r for r in skipped), skipped
