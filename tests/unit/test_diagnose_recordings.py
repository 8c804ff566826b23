"""`kvscope diagnose` on the real vLLM incident library (tests/recordings/).

Each scenario YAML names the LEVERS.md rows a correct diagnosis points at (`expected`); healthy
scenarios expect nothing. The recordings are real vLLM runs; nothing here was tuned on them
beyond what the rule files say.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvscope.diagnoser.engine import diagnose, sample_names
from kvscope.diagnoser.rule import read_rules
from kvscope.diagnoser.sources.recording import RecordingSource

LIBRARY = Path(__file__).resolve().parents[1] / "recordings"
SCENARIOS = sorted(LIBRARY.glob("*.yaml"))


def _diagnose(meta_path: Path):
    meta = yaml.safe_load(meta_path.read_text())
    source = RecordingSource(LIBRARY / meta["recording"])
    rules = read_rules()
    names = set().union(*(sample_names(r) for r in rules))
    frame = source.read_frame(names, None, None, source.natural_step())
    return meta, diagnose(frame, rules, source=source.description)


@pytest.mark.parametrize("meta_path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_recording_diagnosis_matches_the_scenario(meta_path):
    meta, d = _diagnose(meta_path)
    expected = meta.get("expected") or []
    if not expected or expected == "no warning":
        assert d.exit_status() == 0, [(f.levers_md, f.rule_id, f.summary) for f in d.findings]
        return
    rows = {row for item in expected for row in item["levers"]}
    assert d.likely_cause is not None, f"nothing fired; skipped: {[(s.rule_id, s.reason) for s in d.skipped]}"
    assert d.likely_cause.levers_md in rows, (
        f"likely cause {d.likely_cause.levers_md} {d.likely_cause.rule_id}; expected one of {sorted(rows)}; "
        f"all: {[(f.levers_md, f.rule_id) for f in d.findings]}")
    assert d.likely_cause.levers, "the likely cause must name levers"
