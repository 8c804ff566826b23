"""The fleet path's contract with the full fetch (testbed/diagnoses.py): the same findings with
the same evidence values; the skipped list may be worded and classified differently.

Checked on a real diagnosis (the kv-too-small incident recording, judged by the evaluator): the
comparison passes for the diagnosis itself and a rewording of its skipped list, and fails for
one evidence value moved in its last digit, one severity, one lever or one finding dropped.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvscope.diagnoser.evaluate.evaluator import diagnose, sample_names
from kvscope.diagnoser.findings import Skipped
from kvscope.diagnoser.rulebook.rule import read_rules
from kvscope.diagnoser.sources.recording import RecordingSource
from testbed.diagnoses import assert_same_diagnosis, findings_differ

RECORDING = Path(__file__).resolve().parents[1] / "recordings" / "blind-vllm-kv-too-small.om.gz"


@pytest.fixture(scope="module")
def full():
    source = RecordingSource(RECORDING)
    rules = read_rules()
    frame = source.read_frame(set().union(*(sample_names(r) for r in rules)), None, None, source.natural_step())
    d = diagnose(frame, rules, source="p", time_scale=1.0)
    assert d.likely_cause is not None and d.likely_cause.evidence and d.skipped
    return d


def test_the_same_diagnosis_and_a_reworded_skipped_list_pass(full, capsys):
    assert_same_diagnosis(full, full)
    reworded = replace(full, skipped=(Skipped(full.skipped[0].rule_id, "mechanism off: reworded"),) + full.skipped[2:])
    assert_same_diagnosis(reworded, full)
    out = capsys.readouterr().out
    assert f"* {full.skipped[0].rule_id}: fleet: mechanism off: reworded | full:" in out
    assert f"* {full.skipped[1].rule_id}: fleet: (evaluated) | full:" in out


def _json(d) -> dict:
    return json.loads(d.to_json())


def test_an_evidence_value_severity_lever_or_finding_that_differs_fails(full):
    base = _json(full)
    evidence = copy.deepcopy(base)
    ev = evidence["likely_cause"]["evidence"][0]
    ev["value"] = ev["value"] * (1 + 1e-12) if ev["value"] else 1e-12
    severity = copy.deepcopy(base)
    severity["likely_cause"]["severity"] = "info" if base["likely_cause"]["severity"] != "info" else "warning"
    lever = copy.deepcopy(base)
    lever["likely_cause"]["levers"] = lever["likely_cause"]["levers"][1:] + [{"id": "another"}]
    dropped = copy.deepcopy(base)
    dropped["likely_cause"] = None
    for changed in (evidence, severity, lever, dropped):
        assert findings_differ(changed, base) == ["likely_cause"]
    assert findings_differ(base, copy.deepcopy(base)) == []


def test_a_finding_worded_differently_with_the_same_values_passes(full):
    """The contract is the findings and their evidence values, not their sentences."""
    base = _json(full)
    reworded = copy.deepcopy(base)
    reworded["likely_cause"]["summary"] = "the same numbers, said another way"
    reworded["likely_cause"]["title"] = "another title"
    reworded["likely_cause"]["evidence"][0]["series"] = "another spelling of the same query"
    assert findings_differ(reworded, base) == []
