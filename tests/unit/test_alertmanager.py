"""Alertmanager webhook parsing, finding selection and the bounded store (the real chain runs in
tests/integration/test_alertmanager_chain.py)."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest

from kvscope.commands._params import parse_params
from kvscope.diagnoser.alertmanager.payload import (
    WebhookError,
    diagnosis_window,
    instance_places,
    parse_alert,
    parse_webhook,
    select_findings,
)
from kvscope.diagnoser.alertmanager.store import DiagnosisStore
from kvscope.diagnoser.findings import same_place

# Shape of a real Alertmanager 0.25 webhook (../shared/research/toolchain-probe.md).
WEBHOOK = {
    "receiver": "kvscope",
    "status": "firing",
    "version": "4",
    "groupKey": '{}:{alertname="X"}',
    "truncatedAlerts": 0,
    "externalURL": "http://127.0.0.1:9093",
    "groupLabels": {"alertname": "LlmKvPressurePreemption"},
    "commonLabels": {},
    "commonAnnotations": {},
    "alerts": [
        {
            "status": "firing",
            "labels": {
                "alertname": "LlmKvPressurePreemption",
                "instance": "e0:8000",
                "rule_id": "kv_pressure_preemption",
                "severity": "warning",
                "job": "vllm",
            },
            "annotations": {"summary": "KV cache full"},
            "startsAt": "2026-11-22T05:07:47.169Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://127.0.0.1:9090/graph",
            "fingerprint": "8e9b249c8f3b53af",
        }
    ],
}


def _body(doc) -> bytes:
    return json.dumps(doc).encode()


def test_parse_webhook_accepts_an_alertmanager_v4_payload():
    doc = parse_webhook(_body(WEBHOOK))
    alert = parse_alert(doc["alerts"][0])
    assert alert.labels["alertname"] == "LlmKvPressurePreemption"
    assert alert.starts_at == pytest.approx(1795324067.169)
    assert alert.ends_at is None  # the zero time means "still firing"
    assert alert.place() == {"instance": "e0:8000"}  # job, severity, rule_id do not locate a finding


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{oops", "not JSON"),
        (b"[]", "Expected `object`"),
        (_body({**WEBHOOK, "version": "3"}), "version"),
        (_body({**WEBHOOK, "alerts": []}), "length >= 1"),
        (_body({**WEBHOOK, "alerts": [{**WEBHOOK["alerts"][0], "labels": {"a": 1}}]}), "labels"),
        (_body({**WEBHOOK, "alerts": [{**WEBHOOK["alerts"][0], "status": "odd"}]}), "status"),
        (_body({**WEBHOOK, "alerts": [{**WEBHOOK["alerts"][0], "startsAt": "yesterday"}]}), "timestamp"),
    ],
)
def test_parse_webhook_rejects_malformed_bodies_with_a_reason(body, message):
    with pytest.raises(WebhookError, match=message):
        parse_webhook(body)


def test_the_schema_types_every_field_and_what_is_stored_keeps_fields_it_does_not_know():
    """msgspec structs of the v4 schema check the fields Alertmanager sends (here an annotation
    that is not a string, a groupKey that is not one), naming the field; fields the schema lacks
    (a later Alertmanager's) stay in the decoded document that is stored and forwarded."""
    odd = {**WEBHOOK["alerts"][0], "annotations": {"summary": 1}}
    with pytest.raises(WebhookError, match=r"\$\.alerts\[0\]\.annotations"):
        parse_webhook(_body({**WEBHOOK, "alerts": [odd]}))
    with pytest.raises(WebhookError, match=r"\$\.groupKey"):
        parse_webhook(_body({**WEBHOOK, "groupKey": 7}))
    later = {**WEBHOOK, "newField": {"a": [1]}, "alerts": [{**WEBHOOK["alerts"][0], "silencedBy": ["x"]}]}
    doc = parse_webhook(_body(later))
    assert doc == later


def test_window_starts_before_the_alert_and_is_bounded():
    alert = parse_alert(WEBHOOK["alerts"][0])
    start, end = diagnosis_window(alert, now=alert.starts_at + 600, before_s=1800, max_s=3600)
    assert (start, end) == (alert.starts_at - 1800, alert.starts_at + 600)
    start, end = diagnosis_window(alert, now=alert.starts_at + 86400, before_s=1800, max_s=3600)
    assert end - start == 3600


def _finding(rule_id, where, score):
    return {"rule_id": rule_id, "where": where, "score": score, "summary": rule_id}


def test_select_findings_keeps_the_alerts_place_and_matches_its_rule():
    diagnosis = {
        "likely_cause": _finding("queue_growing", {"instance": "e0:8000"}, 300),
        "competing": [_finding("kv_pressure_preemption", {"instance": "e0:8000"}, 250)],
        "other": [
            _finding("kv_pressure_preemption", {"instance": "e1:8000"}, 240),
            _finding("fleet_oversized", {}, 100),
        ],
        "skipped": [{"rule_id": "x", "reason": "absent"}],
    }
    out = select_findings(diagnosis, parse_alert(WEBHOOK["alerts"][0]))
    assert out["likely_cause"]["rule_id"] == "queue_growing"
    assert out["matched"]["where"] == {"instance": "e0:8000"}
    assert [f["rule_id"] for f in out["findings"]] == ["queue_growing", "kv_pressure_preemption", "fleet_oversized"]
    assert out["skipped"] == 1


def test_an_instance_alert_gets_its_model_so_other_models_findings_stay_out():
    places = instance_places(
        [
            {"instance": "e0:8000", "model": "llama", "dp_rank": "0"},
            {"instance": "e0:8000", "model": "llama", "dp_rank": "1"},
            {"instance": "e1:8000", "model": "qwen"},
        ]
    )
    assert places["e0:8000"] == {"instance": "e0:8000", "model": "llama"}  # dp_rank differs: not a place
    diagnosis = {
        "likely_cause": _finding("cold_replica", {"model": "qwen"}, 300),
        "other": [_finding("hit_collapse_after_scaling", {"model": "llama"}, 200)],
    }
    out = select_findings(diagnosis, parse_alert(WEBHOOK["alerts"][0]), places)
    assert [f["rule_id"] for f in out["findings"]] == ["hit_collapse_after_scaling"]


def test_a_place_ignores_labels_the_alert_does_not_carry():
    assert same_place({"model": "m"}, {"instance": "e0"})
    assert not same_place({"instance": "e1"}, {"instance": "e0"})


def test_store_is_bounded_and_lists_newest_first():
    store = DiagnosisStore(":memory:", max_rows=3)
    ids = []
    for _ in range(5):  # each diagnosed before the next arrives (a pending row is never trimmed)
        ids.append(store.add(WEBHOOK))
        store.update(ids[-1], WEBHOOK)
    assert store.count() == 3
    assert store.get(ids[0]) is None
    assert [d["id"] for d in store.list()] == ids[:1:-1]
    store.update(
        ids[-1],
        {
            **WEBHOOK,
            "alerts": [
                {
                    **WEBHOOK["alerts"][0],
                    "kvscope": {"likely_cause": {"rule_id": "kv_pressure_preemption", "summary": "KV at 97%"}},
                }
            ],
        },
    )
    assert store.list(1)[0]["summary"][0]["likely_cause"] == "kv_pressure_preemption"
    assert store.get(ids[-1])["status"] == "done"
    assert store.list(alertname="LlmKvPressurePreemption") and not store.list(alertname="Other")


def test_pending_webhooks_survive_a_restart(tmp_path):
    path = str(tmp_path / "d.sqlite")
    store = DiagnosisStore(path)
    done, waiting = store.add(WEBHOOK), store.add(WEBHOOK)
    store.update(done, WEBHOOK)
    store.close()
    reopened = DiagnosisStore(path)
    assert reopened.pending(10) == [waiting]
    reopened.close()


def test_parse_params_reads_rule_dot_name_pairs():
    known = {"kv_pressure_preemption": ("for", "kv_full")}
    assert parse_params(["kv_pressure_preemption.for=5s", "kv_pressure_preemption.kv_full=0.95"], known) == {
        "kv_pressure_preemption": {"for": "5s", "kv_full": 0.95}
    }
    with pytest.raises(ValueError, match="RULE.NAME=VALUE"):
        parse_params(["kv_full=0.9"], known)
    with pytest.raises(ValueError, match="unknown rule.*kv_pressure_preemptoin"):
        parse_params(["kv_pressure_preemptoin.kv_full=0.9"], known)


def test_unreachable_prometheus_is_recorded_on_the_row_and_the_receiver_keeps_serving(caplog):
    import asyncio
    import logging

    caplog.set_level(logging.INFO, logger="kvscope.serve")

    from aiohttp.test_utils import TestClient, TestServer

    from kvscope.diagnoser.alertmanager.server import ServeConfig, WebhookServer

    async def scenario() -> tuple[dict, int]:
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        server = WebhookServer(ServeConfig(prometheus_url=dead), DiagnosisStore(":memory:"))
        async with TestClient(TestServer(server.app())) as client:
            resp = await client.post("/api/v1/alerts", data=_body(WEBHOOK))
            row_id = (await resp.json())["id"]
            for _ in range(200):
                row = await (await client.get(f"/api/v1/diagnoses/{row_id}")).json()
                if row["status"] != "pending":
                    break
                await asyncio.sleep(0.05)
            healthy = (await client.get("/-/healthy")).status
        return row, healthy

    row, healthy = asyncio.run(scenario())
    ks = row["payload"]["alerts"][0]["kvscope"]
    assert row["status"] == "not_diagnosed" and healthy == 200  # never `done`: nothing was read
    assert ks["matched"] is None and ks["errors"] and "prometheus" in ks["errors"][0]
    assert ks["status"] == "not_diagnosed" and ks["headline"] == f"not diagnosed: {ks['errors'][0]}"
    lines = [r.getMessage() for r in caplog.records if r.name == "kvscope.serve"]
    assert any(f"webhook {row['id']} received: 1 alert(s), status firing" in line for line in lines)
    alert_line = next(line for line in lines if line.startswith("alert LlmKvPressurePreemption {instance=e0:8000}"))
    assert (
        ": not_diagnosed, " in alert_line and " s, error: " in alert_line and "prometheus" in alert_line
    )  # one line per alert, timed, with the error
    assert any(line.startswith("shutting down: 0 webhook(s) not yet diagnosed") for line in lines)


def test_a_window_no_rule_could_look_at_is_no_data_not_diagnosed():
    """Every rule skipped for absent signals: `no_data` (the CLI's exit 4), not an empty all-clear."""
    from kvscope.diagnoser.alertmanager.payload import window_status
    from kvscope.diagnoser.findings import Diagnosis, Skipped

    blind = Diagnosis(
        window=(0.0, 60.0),
        source="prometheus",
        likely_cause=None,
        skipped=(Skipped("a", "signal(s) absent: x"), Skipped("b", "signal(s) absent: y")),
        rules_evaluated=2,
    )
    assert window_status(blind.to_dict()) == "no_data"
    looked = Diagnosis(window=(0.0, 60.0), source="p", likely_cause=None, skipped=blind.skipped[:1], rules_evaluated=2)
    assert window_status(looked.to_dict()) == "diagnosed"  # one rule looked and found nothing
    assert window_status({"likely_cause": None, "skipped": []}) == "not_diagnosed"  # unread: never an all-clear


def test_nested_json_at_any_depth_is_a_400_and_every_answer_is_counted():
    """Through real HTTP against the real receiver: nesting at 100, 10k and 500k levels is a 400
    naming the limit (it was a 500 with a traceback); an internal error (its store gone) is a 500
    that the request counter counts too; the receiver keeps serving."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from kvscope.diagnoser.alertmanager.server import ServeConfig, WebhookServer

    def nested(depth: int) -> bytes:
        return (
            json.dumps({**WEBHOOK, "commonLabels": "PLACEHOLDER"})
            .encode()
            .replace(b'"PLACEHOLDER"', b"[" * depth + b"]" * depth)
        )

    async def scenario():
        server = WebhookServer(
            ServeConfig(prometheus_url="http://127.0.0.1:9", max_body_bytes=2 << 20),
            DiagnosisStore(":memory:"),
            rules=[],
        )
        async with TestClient(TestServer(server.app())) as client:
            answers = []
            for depth in (100, 10_000, 500_000):
                resp = await client.post("/api/v1/alerts", data=nested(depth))
                answers.append((resp.status, (await resp.json())["error"]))
            ok = (await client.post("/api/v1/alerts", data=_body(WEBHOOK))).status
            server.store.close()  # the store fails from now on (under its lock: no read is cut mid-statement)
            broken = await client.post("/api/v1/alerts", data=_body(WEBHOOK))
            metrics = await (await client.get("/metrics")).text()
            for _ in range(100):  # the accepted one failed to store: the worker goes on
                if server.counters["kvscope_webhook_diagnoses_total", "error"]:
                    break
                await asyncio.sleep(0.05)
            healthy = [(await client.get("/-/healthy")).status]
            server._workers[0].cancel()  # a worker that ended shows in /-/healthy
            await asyncio.sleep(0.05)
            healthy.append((await client.get("/-/healthy")).status)
        return answers, ok, broken.status, metrics, healthy

    answers, ok, broken, metrics, healthy = asyncio.run(scenario())
    assert healthy == [200, 503]
    assert [s for s, _ in answers] == [400, 400, 400] and all("nested deeper than 64" in e for _, e in answers)
    assert ok == 200 and broken == 500
    assert 'kvscope_webhook_requests_total{code="400"} 3' in metrics
    assert 'kvscope_webhook_requests_total{code="500"} 1' in metrics


def test_the_likely_cause_comes_with_do_now_before_fix():
    """`actions` splits the likely cause's levers by kind, each with its exact setting per system."""
    import msgspec

    from kvscope.diagnoser.rulebook.levers import load_levers

    levers = load_levers()
    cause = {
        **_finding("kv_pressure_cascade", {"instance": "e0:8000"}, 300),
        "levers": [
            msgspec.to_builtins(levers["vllm.kv_cache_dtype"].advice(1, "set")),
            msgspec.to_builtins(levers["vllm.max_num_seqs"].advice(2, "decrease")),
        ],
    }
    out = select_findings({"likely_cause": cause}, parse_alert(WEBHOOK["alerts"][0]))
    assert [lv["id"] for lv in out["actions"]["do_now"]] == ["vllm.max_num_seqs"]
    assert [lv["id"] for lv in out["actions"]["fix"]] == ["vllm.kv_cache_dtype"]
    fix = out["actions"]["fix"][0]
    assert fix["restart"] and fix["quality_risk"] and fix["kind"] == "fix"
    assert {"system": "vllm", "set": "--kv-cache-dtype fp8"}.items() <= fix["how"][0].items()
    assert out["actions"]["do_now"][0]["how"][0]["text"].startswith("vLLM: --max-num-seqs N (lower than now")
    assert out["confidence"].startswith("measured, high confidence")  # the CLI's and UI's words
    moderate = {**cause, "confidence": "moderate", "confirm": "the request tap would confirm it"}
    words = select_findings({"likely_cause": moderate}, parse_alert(WEBHOOK["alerts"][0]))["confidence"]
    assert words == "likely, moderate confidence (inferred from indirect evidence): the request tap would confirm it"
    assert select_findings({"likely_cause": None}, parse_alert(WEBHOOK["alerts"][0]))["actions"] == {
        "do_now": [],
        "fix": [],
    }


def _change(kind, t, verdict, instances=(), model="llama"):
    """One entry of `Diagnosis.changes` as `curve.report.attach` writes it."""
    return {
        "pool": {"model": model, "engine": "vllm"},
        "time": t,
        "kind": kind,
        "diff": {"kv_capacity_tokens": [8192.0, 640.0]} if kind == "config" else {},
        "instances": list(instances),
        "verdict": verdict,
        "deltas": {},
        "text": f"{kind} at {t:g}: {verdict}",
    }


def test_a_change_to_the_engines_leads_the_alerts_payload_before_its_findings():
    """The change to read first leads: an engine change (config, version, restart) before replica
    counts and curve shifts, a regression first, then the nearest before the alert began; changes
    of another instance or model are not this alert's."""
    alert = parse_alert(WEBHOOK["alerts"][0] | {"labels": WEBHOOK["alerts"][0]["labels"] | {"model": "llama"}})
    t0 = alert.starts_at
    changes = [
        _change("restart", t0 - 600, "no_change", ["e0:8000"]),
        _change("config", t0 - 300, "regression", ["e0:8000"]),
        _change("replicas", t0 - 60, "regression"),
        _change("config", t0 - 100, "regression", ["e1:8000"]),
        _change("restart", t0 + 120, "regression", ["e0:8000"]),
        _change("curve", t0 - 30, "regression", model="qwen"),
        _change("restart", t0 - 10, "no_change", ["e0:8000"]),
    ]
    likely = _finding("kv_pressure_preemption", {"instance": "e0:8000"}, 250) | {"title": "KV cache full"}
    diagnosis = {"likely_cause": likely, "changes": changes}
    out = select_findings(diagnosis, alert)
    assert list(out)[:2] == ["changes", "headline"]  # before rule_id, matched, likely_cause, findings
    assert [(c["kind"], c["time"] - t0) for c in out["changes"]] == [
        ("config", -300),
        ("restart", 120),
        ("restart", -10),
        ("restart", -600),
        ("replicas", -60),
    ]
    assert out["headline"] == (
        f"what changed: config at {t0 - 300:g}: regression; likely cause: KV cache full (kv_pressure_preemption)"
    )


def test_without_an_engine_change_the_headline_is_the_likely_cause():
    alert = parse_alert(WEBHOOK["alerts"][0])
    t0 = alert.starts_at
    diagnosis = {"likely_cause": None, "changes": [_change("replicas", t0 - 60, "no_change")]}
    out = select_findings(diagnosis, alert)
    assert [c["kind"] for c in out["changes"]] == ["replicas"]
    assert out["headline"] == "no change to the engines and no finding at this place"
    assert select_findings({"likely_cause": None}, alert)["changes"] == []


@pytest.mark.parametrize("fault", ["read", "compute", "attach"])
def test_a_failed_curve_read_costs_the_changes_not_the_findings(monkeypatch, fault):
    """The findings of the fleet path stay when what changed cannot be read (a stalled Prometheus
    past the curve's own deadline), computed, or attached to the findings; `errors` says which."""
    import asyncio
    from types import SimpleNamespace

    from kvscope.diagnoser.alertmanager import server as server_mod
    from kvscope.diagnoser.curve import recorded as curve_recorded
    from kvscope.diagnoser.curve import report as curve_report
    from kvscope.diagnoser.evaluate.frame import Frame
    from kvscope.diagnoser.findings import Diagnosis, Finding
    from kvscope.diagnoser.pushdown import run as pushdown_run
    from kvscope.diagnoser.sources import SourceError

    found = Finding(
        "kv_pressure_preemption",
        "K1",
        "KV cache full",
        "warning",
        {"instance": "e0:8000"},
        0.0,
        60.0,
        True,
        (0.0, 60.0),
        15.0,
        250.0,
        "KV cache at 97%",
    )
    diagnosis = Diagnosis((0.0, 60.0), "prometheus", found)
    monkeypatch.setattr(pushdown_run, "diagnose_fleet", lambda *a, **k: (diagnosis, SimpleNamespace(fetched=None)))
    monkeypatch.setattr(server_mod, "read_window", lambda *a, **k: Frame(ts=np.arange(0.0, 60.0, 15.0)))

    def broken(*args, **kwargs):
        raise SourceError("prometheus: read timed out") if fault == "read" else ZeroDivisionError("bucket")

    monkeypatch.setattr(curve_recorded, "recorded_interval", lambda *a, **k: None)  # no curve records
    if fault == "attach":
        monkeypatch.setattr(curve_report, "window_curves", lambda *a, **k: [])
    monkeypatch.setattr(curve_report, "attach" if fault == "attach" else "window_curves", broken)
    server = server_mod.WebhookServer(
        server_mod.ServeConfig(prometheus_url="http://127.0.0.1:9"), DiagnosisStore(":memory:")
    )
    alert = server_mod.Alert("firing", {"alertname": "KvCacheFull"}, "1970-01-01T00:00:30Z")
    out = asyncio.run(server._diagnose_alert(alert, 60.0, {}))
    assert out["likely_cause"]["rule_id"] == "kv_pressure_preemption" and out["changes"] == []
    errors = out["errors"]
    word = {
        "read": "could not be read: prometheus: read timed out",
        "compute": "could not be computed: ZeroDivisionError",
        "attach": "could not be computed: ZeroDivisionError",
    }
    assert len(errors) == 1 and errors[0].startswith(f"what changed in the window {word[fault]}")
