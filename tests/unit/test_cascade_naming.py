"""The memory-pressure cascade (002 §7.4) has one vocabulary: the agent's detector (and the
`engine_cascade_stage_onset_timestamp_seconds{stage}` it exports) and the diagnoser's K2 finding
name the stages alike, so an SRE reading `cascade stage 4/4: latency` in `kvscope diagnose`
finds the same `stage="latency"` series on the agent."""

from __future__ import annotations

from pathlib import Path

from kvscope.agent.derive.cascade import STAGES, evaluate_cascade
from kvscope.agent.recording.replay import replay_recording
from kvscope.diagnoser.rulebook.rule import read_rules
from tests.unit.test_diagnoser_render import _diagnose

RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"


def _k2_doc() -> dict:
    return next(r.doc for r in read_rules() if r.id == "kv_pressure_cascade")


def test_the_diagnoser_cascade_stages_are_the_detectors_stages():
    cascade = _k2_doc()["cascade"]
    assert [s["name"] for s in cascade["stages"]] == list(STAGES[1:])
    assert cascade["root"] == STAGES[1] and cascade["symptom"] == STAGES[4]


def test_both_sides_name_stage_4_of_the_recorded_cascade_alike():
    d = _diagnose("kv-pressure-cascade")
    head = d.likely_cause
    assert head is not None and head.cascade is not None and head.cascade.stage == 4
    reports = evaluate_cascade(replay_recording(RECORDINGS / "kv-pressure-cascade.om.gz").samples)
    deepest = max(n for r in reports.values() for n, t in r.onsets.items() if t is not None)
    assert deepest == 4  # reached, then recovered by the recording's end
    assert head.cascade.stage_name == STAGES[deepest] == "latency"
    assert set(head.cascade.onsets) == set(STAGES[1:])
