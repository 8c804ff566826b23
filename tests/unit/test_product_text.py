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
import yaml
from streamlit.testing.v1 import AppTest

from kvscope.cli import main
from kvscope.ui import data as ui_data

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "recordings" / "kv-pressure-cascade.om.gz"
OLD_FORMS = re.compile(r"(?<![\w.])00[0-4] (?:§|[A-Za-z\"'])|LEVERS|seeds/|\.\./shared")
"""A source file's prefix followed by a section, the checklist's name, the source folder."""
PREFIX_COLON = re.compile(r"(?<![\w.:])00[0-4]:(?!\d)")
"""A source file's prefix followed by a colon ("001: below a 50% hit rate"), which citations.py
leaves as it is."""


def _old(text: str) -> list[str]:
    return sorted({text[max(0, m.start() - 30) : m.end() + 30] for m in OLD_FORMS.finditer(text)})


def test_the_pattern_catches_the_old_forms_and_spares_numbers():
    assert _old("see 002 §7.4") and _old('(004 "new nodes') and _old("LEVERS.md row K2") and _old("../shared/x")
    assert not _old("0.002 s, 1000 tokens, 2026-11-22 00:00:00 UTC, Sizing LLM Inference for Production §7.4")


ROW_ID = re.compile(r"(?<![\w.-])(?:[KRU]\d{1,2}|P\d|L\d{1,2})(?![\w-])")
"""A row id of the project's own checklist (K1-K8, L1-L14, P1-P9, U1-U11, R1-R8), which users do
not have. Percentiles (P50, P99) and GPU models (L40S) have more characters; "P/D" has no digit."""
MEMORY_TIER = re.compile(r"tier|hierarchy|HiCache|backend")
"""Words beside L1-L3 when they name HiCache's memory tiers (GPU, host, storage), not checklist rows."""
MACHINE_KEYS = {"id", "levers_md"}
"""Rule and lever fields no user reads: the rule id and its checklist row (a cross-reference)."""


def _row_ids(text: str) -> list[str]:
    hits = []
    for m in ROW_ID.finditer(text):
        near = text[max(0, m.start() - 25) : m.end() + 25]
        if m.group() in ("L1", "L2", "L3") and MEMORY_TIER.search(near):
            continue
        hits.append(near)
    return hits


def _texts(node, key: str = "") -> list[tuple[str, str]]:
    """(key, string) for every string value in a parsed rule or lever file, machine keys left out."""
    if isinstance(node, dict):
        return [t for k, v in node.items() if k not in MACHINE_KEYS for t in _texts(v, str(k))]
    if isinstance(node, list):
        return [t for v in node for t in _texts(v, key)]
    return [(key, node)] if isinstance(node, str) else []


def test_the_row_id_pattern_catches_checklist_rows_and_spares_real_names():
    for row in (
        "R3 (scheduler_stuck) reads",
        "P1 (prefix_caching_disabled)",
        "K1/K2 name",
        "is L10's",
        "R8. An",
        "U11's",
    ):
        assert _row_ids(row), row
    assert _row_ids("LEVERS.md R7")
    for text in ("P50, P95 and P99 input", "P/D decode", "an L40S or H100", "000 L1/L2/L3 hierarchy", "host (L2) tier"):
        assert not _row_ids(text), text
    assert not _row_ids("disable the L3 backend; DeepSeek-R1; K8s; vllm PR #15422; Llama-3.1-8B")
    assert PREFIX_COLON.findall("(001: below") and not PREFIX_COLON.findall("00:00:01, 12:00:01, 0.001: x")


def test_rule_and_lever_text_names_no_checklist_row():
    """Descriptions, summaries, parameter help, evidence names, false positives and lever text reach
    alerts, runbooks, docs/levers.md, the CLI, the UI and the webhook: they say what another rule
    reads (or name it), never its checklist row."""
    files = [p for p in sorted((ROOT / "rules" / "diagnosis").glob("*.yaml")) if not p.name.endswith(".test.yaml")]
    files.append(ROOT / "rules" / "levers.yaml")
    assert len(files) > 40
    found = {
        f"{f.name}:{key}": hits
        for f in files
        for key, text in _texts(yaml.safe_load(f.read_text(encoding="utf-8")))
        if (hits := _row_ids(text))
    }
    assert found == {}


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
    # checklist rows and "001:" too
    rows = {
        f.name: hits
        for f in files
        if (hits := _row_ids(text := f.read_text(encoding="utf-8")) + PREFIX_COLON.findall(text))
    }
    assert rows == {}
