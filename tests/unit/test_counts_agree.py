"""One count, one vocabulary: the CLI header, the UI caption, the webhook answer and the weekly
report give the same rule counts, from the same Diagnosis fields (`findings.count`), on library
recordings (ones without request spans, which the weekly report does not read)."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvscope.cli import main
from kvscope.diagnoser.alertmanager.payload import parse_alert, select_findings
from kvscope.diagnoser.findings import count
from kvscope.ui import data as ui_data

RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"


@pytest.mark.parametrize("name", ["metrics-only-round-robin-2-steady", "blind-vllm-kv-too-small"])
def test_counts_are_the_same_everywhere(name, tmp_path, capsys, monkeypatch):
    rec = RECORDINGS / f"{name}.om.gz"
    diagnosis = ui_data.load_triage(ui_data.SourceSpec("recording", str(rec))).diagnosis
    c = count(diagnosis)
    assert c.rules > 0 and c.not_evaluable == len(diagnosis.skipped) - c.mechanism_off - c.overruled
    words = c.text()

    monkeypatch.setenv("COLUMNS", "400")
    main(["diagnose", "--recording", str(rec)])
    assert words in capsys.readouterr().out.splitlines()[0]

    for var in ui_data.ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(ui_data.ENV["recording"], str(rec))
    at = AppTest.from_file(
        str(Path(ui_data.__file__).with_name("app.py")), default_timeout=300
    ).run()  # a hang guard only (slow on a loaded 2-core box)
    assert not at.exception
    assert any(words in cap.value for cap in at.caption)

    alert = parse_alert(
        {"status": "firing", "labels": {"alertname": "X"}, "startsAt": "2026-11-23T12:04:00Z", "endsAt": ""}
    )
    answer = select_findings(diagnosis.to_dict(), alert)
    assert answer["counts_text"] == words and answer["counts"]["not_evaluable"] == c.not_evaluable

    out = tmp_path / "w.md"
    assert main(["report", "weekly", "--recording", str(rec), "--markdown", str(out), "--no-progress"]) == 0
    assert f"Diagnosis over the window: {words}." in out.read_text()


def test_a_derived_series_is_named_in_words_not_by_its_identifier():
    """routing_ignores_cache_locality compares a derived series (hit rate x replicas, on the same
    workload) with the fleet hit rate: the card says it in words, never `hit_times_n_same_workload`."""
    import re

    from kvscope.diagnoser.render import baseline_lines

    d = ui_data.load_triage(
        ui_data.SourceSpec("recording", str(RECORDINGS / "metrics-only-round-robin-2-steady.om.gz"))
    )
    likely = d.diagnosis.likely_cause
    assert likely is not None and likely.rule_id == "routing_ignores_cache_locality"
    lines = baseline_lines(likely, d.diagnosis.time_scale)
    assert lines and "the fleet hit rate" in lines[0]
    assert not re.search(r"\b[a-z]+_[a-z_]+\b", " ".join(lines)), lines
