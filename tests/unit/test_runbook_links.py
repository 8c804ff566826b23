"""runbook_url on generated alerts (diagnoser/promql/runbooklinks.py), the triage link's parsing
(ui/alert_link.py) and the stable address of a stored diagnosis (`kvscope serve`
/api/v1/diagnoses/latest). The link opened in a real browser: tests/e2e/test_ui_browser.py."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
import yaml
from test_alertmanager import WEBHOOK

from kvscope.diagnoser.alertmanager.store import DiagnosisStore
from kvscope.diagnoser.findings import Finding
from kvscope.diagnoser.promql.build import build_all
from kvscope.diagnoser.promql.runbooklinks import link_alerts
from kvscope.ui.alert_link import AlertLink, at_labels, from_query, windowed
from kvscope.ui.data import SourceSpec

BASE = "https://ui.example:8501/"


def _alerts(files: dict[str, str]) -> list[dict]:
    return [
        rule
        for text in files.values()
        for group in yaml.safe_load(text)["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def test_every_generated_alert_links_to_its_triage_page_only_when_a_base_is_given():
    linked = _alerts(build_all(runbook_base_url=BASE).rule_files)
    plain = _alerts(build_all().rule_files)
    assert len(linked) == len(plain) > 50
    assert not [a["alert"] for a in plain if "runbook_url" in a.get("annotations", {})]
    for a in linked:
        url = a["annotations"]["runbook_url"]
        assert url.startswith(f"https://ui.example:8501/?page=Triage&alertname={a['alert']}&window="), url
        assert "&label.{{ $k | urlquery }}={{ $v | urlquery }}" in url
    slo = next(a for a in linked if a["alert"] == "LlmTtftSloBurnRate" and a["labels"]["window"] == "6h/30m")
    assert "&window=6h{{" in slo["annotations"]["runbook_url"]  # the long window of the pair
    absent = next(a for a in linked if a["alert"] == "LlmEngineMetricsAbsent")
    assert "&window=1h{{" in absent["annotations"]["runbook_url"]


def test_link_alerts_leaves_recording_rules_alone():
    rules = [{"record": "x", "expr": "1"}, {"alert": "A", "expr": "1", "annotations": {"runbook_url": "docs/a.md"}}]
    link_alerts(rules, None)
    assert rules == [{"record": "x", "expr": "1"}, {"alert": "A", "expr": "1", "annotations": {}}]


def test_the_link_is_read_back_and_what_a_url_cannot_be_trusted_with_is_dropped():
    link = from_query(
        {
            "page": "Triage",
            "alertname": "LlmTenantTtftSloBurnRate",
            "window": "6h",
            "label.tenant": "team a&b",
            "label.severity": "critical",
            "label.bad-name": "x",
            "label.empty": "",
        }
    )
    assert link == AlertLink(
        "LlmTenantTtftSloBurnRate", (("severity", "critical"), ("tenant", "team a&b")), 6 * 3600.0, "6h"
    )
    assert link.query() == "alertname=LlmTenantTtftSloBurnRate&label.severity=critical&label.tenant=team+a%26b"
    assert from_query({"alertname": "<script>"}) is None and from_query({}) is None
    assert from_query({"alertname": "A", "window": "0s"}).window_s is None
    assert from_query({"alertname": "A", "window": "9" * 400 + "d"}).window_s is None
    live = SourceSpec("prometheus", "http://p:9090", 1800.0, 123.0)
    assert windowed(live, link) == SourceSpec("prometheus", "http://p:9090", 6 * 3600.0, None)
    rec = SourceSpec("recording", "/r.om")
    assert windowed(rec, link) is rec


@pytest.mark.parametrize("window", ["31d", "25h", "99999d"])
def test_a_link_window_past_a_day_is_clamped_and_says_so(window):
    """Issue 57 S9: window=31d made the triage page read 31 days of a live source."""
    link = from_query({"alertname": "A", "window": window})
    assert link.window_s == 86400.0 and link.window == f"24h (the link asked {window}: a link reads at most 24h)"
    live = SourceSpec("prometheus", "http://p:9090", 1800.0, None)
    assert windowed(live, link).since_s == 86400.0
    assert from_query({"alertname": "A", "window": "24h"}).window == "24h"


def _finding(rule_id: str, **where: str) -> Finding:
    return Finding(rule_id, "", rule_id, "warning", where, 0.0, 1.0, True, (0.0, 1.0), 1.0, 1.0, "")


def test_findings_at_the_alerts_labels():
    link = AlertLink("A", (("instance", "e0"), ("model", "m")))
    found = [_finding("here", instance="e0"), _finding("there", instance="e1"), _finding("fleet")]
    found.append(_finding("same_model", model="m", role="decode"))
    assert [f.rule_id for f in at_labels(found, link)] == ["here", "same_model"]


def test_serve_answers_the_newest_stored_diagnosis_of_an_alert_at_a_stable_address():
    from aiohttp.test_utils import TestClient, TestServer

    from kvscope.diagnoser.alertmanager.server import ServeConfig, WebhookServer

    store = DiagnosisStore(":memory:")
    old = store.add(WEBHOOK)
    other = copy.deepcopy(WEBHOOK)
    other["alerts"][0]["labels"]["instance"] = "e1:8000"
    store.add(other)
    done = copy.deepcopy(WEBHOOK)
    done["alerts"][0]["kvscope"] = {"status": "diagnosed", "likely_cause": {"rule_id": "kv_pressure_preemption"}}
    new = store.add(WEBHOOK)
    store.update(new, done)
    assert store.latest("LlmKvPressurePreemption", {"instance": "e0:8000"})["id"] == new > old
    assert store.latest("LlmKvPressurePreemption", {"instance": "e9:8000"}) is None

    async def scenario():
        server = WebhookServer(ServeConfig(prometheus_url="http://127.0.0.1:9"), store)
        async with TestClient(TestServer(server.app())) as client:
            ok = await client.get(
                "/api/v1/diagnoses/latest",
                params={"alertname": "LlmKvPressurePreemption", "label.instance": "e0:8000", "label.job": "vllm"},
            )
            missing = await client.get("/api/v1/diagnoses/latest", params={"alertname": "Nope"})
            bad = await client.get("/api/v1/diagnoses/latest")
            return ok.status, json.loads(await ok.text()), missing.status, bad.status

    status, row, missing, bad = asyncio.run(scenario())
    assert (status, missing, bad) == (200, 404, 400)
    assert row["id"] == new and row["alert"]["kvscope"]["likely_cause"]["rule_id"] == "kv_pressure_preemption"
