"""Every product output cites sources as a user can open them: a source's public title and
section ("Sizing LLM Inference for Production §7.4"), never a source document's file prefix
("002 §7.4"), the project checklist ("LEVERS.md row K2") or a file outside the repository.

Outputs checked on the library's KV-pressure recording: CLI text and JSON, the webhook's answer,
the weekly report, the UI's triage and catalog pages; and the generated files (runbooks,
Prometheus rules, dashboards, docs/levers.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvscope.cli import main
from kvscope.ui import data as ui_data

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "recordings" / "kv-pressure-cascade.om.gz"
OLD_FORMS = re.compile(r"(?<![\w.])00[0-4] (?:§|[A-Za-z\"'])|LEVERS|seeds/|\.\./shared")
"""A source file's prefix followed by a section, the checklist's name, the source folder."""


def _old(text: str) -> list[str]:
    return sorted({text[max(0, m.start() - 30) : m.end() + 30] for m in OLD_FORMS.finditer(text)})


def test_the_pattern_catches_the_old_forms_and_spares_numbers():
    assert _old("see 002 §7.4") and _old('(004 "new nodes') and _old("LEVERS.md row K2") and _old("../shared/x")
    assert not _old("0.002 s, 1000 tokens, 2026-11-22 00:00:00 UTC, Sizing LLM Inference for Production §7.4")


def test_cli_text_and_json(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    main(["diagnose", "--recording", str(RECORDING)])
    text = capsys.readouterr().out
    assert "Sizing LLM Inference for Production §7.4" in text
    main(["diagnose", "--recording", str(RECORDING), "--json"])
    doc = capsys.readouterr().out
    assert "Sizing LLM Inference for Production §7.4" in doc
    assert _old(text) == [] and _old(doc) == []


def test_webhook_answer():
    from kvscope.diagnoser.alertmanager.payload import parse_alert, select_findings

    diagnosis = ui_data.load_triage(ui_data.SourceSpec("recording", str(RECORDING))).diagnosis
    assert diagnosis.likely_cause is not None
    alert = parse_alert(
        {
            "status": "firing",
            "labels": {
                "alertname": "LlmKvPressureCascade",
                "rule_id": "kv_pressure_cascade",
                **diagnosis.likely_cause.where,
            },
            "annotations": {},
            "startsAt": "2026-11-22T07:26:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
        }
    )
    answer = json.dumps(select_findings(diagnosis.to_dict(), alert), ensure_ascii=False)
    assert "Sizing LLM Inference for Production §7.4" in answer
    assert _old(answer) == []


def test_weekly_report(tmp_path):
    out = tmp_path / "w.md"
    assert main(["report", "weekly", "--recording", str(RECORDING), "--markdown", str(out), "--no-progress"]) == 0
    assert _old(out.read_text()) == []


@pytest.mark.parametrize("page", ["Triage", "Rules & levers"])
def test_ui_pages(monkeypatch, page):
    for var in ui_data.ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(ui_data.ENV["recording"], str(RECORDING))
    at = AppTest.from_file(
        str(Path(ui_data.__file__).with_name("app.py")), default_timeout=300
    ).run()  # a hang guard only (slow on a loaded 2-core box)
    if page != "Triage":
        at.sidebar.radio[0].set_value(page).run()
    assert not at.exception
    kinds = ("title", "header", "subheader", "markdown", "caption", "info", "warning", "success")
    texts = [str(e.value) for kind in kinds for e in getattr(at, kind)]
    texts += [e.value.to_string() for e in at.dataframe]
    shown = "\n".join(texts)
    assert "Sizing LLM Inference for Production" in shown
    assert _old(shown) == []


def test_generated_files():
    files = [
        *sorted((ROOT / "docs" / "runbooks").glob("*.md")),
        *sorted((ROOT / "rules" / "prometheus").glob("*.yml")),
        *sorted((ROOT / "dashboards" / "build").glob("*.json")),
        ROOT / "docs" / "levers.md",
    ]
    assert len(files) > 40
    found = {f.name: hits for f in files if (hits := _old(f.read_text(encoding="utf-8")))}
    assert found == {}
