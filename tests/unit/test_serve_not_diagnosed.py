"""Issue 57 for `kvscope serve`: a webhook whose Prometheus could not be read (nothing listening,
a server that stalls) is stored, listed, linked and forwarded as "not diagnosed: <reason>", never
as the all-clear headline; hostile labels (newline, escape codes, 1 MiB, a lone surrogate) reach
the log escaped and cut; a full queue's 503 says when to retry; --max-stored below the queue's
size is a usage error. Real HTTP throughout: the receiver, a forward target and the Prometheus
stand-ins are real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kvscope.diagnoser.alertmanager.server import ServeConfig, WebhookServer
from kvscope.diagnoser.alertmanager.store import DiagnosisStore
from tests.unit.test_alertmanager import WEBHOOK, _body
from tests.unit.test_hostile_answers import RawServer, _dribble
from tests.unit.test_serve_deadlines import _until_done

ALL_CLEAR = "no change to the engines and no finding at this place"


def _dead_url() -> str:
    """A port nothing listens on: bound by the kernel, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def _served(prometheus_url: str, doc: dict, **config: float) -> dict:
    """POST `doc` to a real receiver that forwards to a real sink; every surface's answer."""
    forwarded: list[dict] = []

    async def sink(request: web.Request) -> web.Response:
        forwarded.append(await request.json())
        return web.Response()

    app = web.Application()
    app.router.add_post("/hook", sink)
    async with TestServer(app) as target:
        cfg = ServeConfig(prometheus_url=prometheus_url, forward_url=str(target.make_url("/hook")), **config)
        server = WebhookServer(cfg, DiagnosisStore(":memory:"))
        async with TestClient(TestServer(server.app())) as client:
            row_id = (await (await client.post("/api/v1/alerts", data=_body(doc))).json())["id"]
            row = await _until_done(client, row_id)
            for _ in range(400):  # the forward follows the stored row
                if forwarded:
                    break
                await asyncio.sleep(0.05)
            listing = await (await client.get("/api/v1/diagnoses")).json()
            latest = await (
                await client.get("/api/v1/diagnoses/latest", params={"alertname": "LlmKvPressurePreemption"})
            ).json()
            metrics = await (await client.get("/metrics")).text()
    return {"row": row, "listing": listing, "latest": latest, "forwarded": forwarded, "metrics": metrics}


def _assert_not_diagnosed(got: dict, reason: str) -> None:
    row = got["row"]
    assert row["status"] == "not_diagnosed", row["status"]
    for ks in (row["payload"]["alerts"][0]["kvscope"], got["latest"]["alert"]["kvscope"]):
        assert ks["status"] == "not_diagnosed" and list(ks)[:2] == ["status", "headline"], ks
        assert ks["headline"].startswith("not diagnosed: ") and reason in ks["headline"], ks["headline"]
        assert ks["errors"] and ks["likely_cause"] is None and ks["matched"] is None
    brief = got["listing"]["diagnoses"][0]
    assert brief["status"] == "not_diagnosed" and brief["summary"][0]["diagnosis"] == "not_diagnosed"
    assert brief["summary"][0]["headline"].startswith("not diagnosed: ")
    (sent,) = got["forwarded"]
    first = sent["alerts"][0]["kvscope"]
    assert first["status"] == "not_diagnosed" and first["headline"].startswith("not diagnosed: ")
    for surface in (row, got["latest"], got["listing"], sent):
        assert ALL_CLEAR not in json.dumps(surface)
    assert 'kvscope_webhook_diagnoses_total{result="done"}' not in got["metrics"]


def test_an_unreachable_prometheus_is_stored_listed_and_forwarded_as_not_diagnosed():
    from kvscope.ui.alert_link import stored_text

    got = asyncio.run(_served(_dead_url(), WEBHOOK))
    _assert_not_diagnosed(got, "cannot connect")
    assert 'kvscope_webhook_diagnoses_total{result="not_diagnosed"} 1' in got["metrics"]
    line, diagnosed = stored_text(got["latest"])  # the triage page's line for the alert's stable link
    assert not diagnosed and "not_diagnosed): not diagnosed: " in line and "no rule fired" not in line


def test_a_stalled_prometheus_is_not_diagnosed_whether_its_read_or_the_diagnosis_times_out():
    prom = RawServer(_dribble)  # a real server that answers one byte at a time
    try:
        read_cut = asyncio.run(_served(prom.url, WEBHOOK, query_timeout_s=1.0, diagnosis_timeout_s=60.0))
        given_up = asyncio.run(_served(prom.url, WEBHOOK, query_timeout_s=30.0, diagnosis_timeout_s=1.5))
    finally:
        prom.close()
    _assert_not_diagnosed(read_cut, "prometheus")
    _assert_not_diagnosed(given_up, "did not finish within 1.5 s")
    assert 'kvscope_webhook_diagnoses_total{result="timeout"} 1' in given_up["metrics"]


def test_hostile_labels_reach_the_log_escaped_and_cut(caplog):
    """A newline would forge a log line, ESC sequences would reach the terminal, a 1 MiB label
    would be a 1 MiB line; a lone surrogate made the log handler print a traceback."""
    caplog.set_level(logging.INFO, logger="kvscope.serve")
    forged = "A\x1b[31mRED\x1b[0m\nFAKE LOG LINE"
    alert = {**WEBHOOK["alerts"][0], "labels": {"alertname": forged, "instance": "i\x1b]0;pwned\x07" + "x" * 500_000}}
    body = _body({**WEBHOOK, "status": "firing\n2026 INFO forged", "alerts": [alert]})
    surrogate = _body({**WEBHOOK, "alerts": [{**alert, "labels": {"alertname": "B", "instance": "X"}}]})
    surrogate = surrogate.replace(b'"X"', b'"\\ud800"')

    async def scenario() -> None:
        server = WebhookServer(ServeConfig(prometheus_url=_dead_url()), DiagnosisStore(":memory:"))
        async with TestClient(TestServer(server.app())) as client:
            for doc in (body, surrogate):
                row_id = (await (await client.post("/api/v1/alerts", data=doc)).json())["id"]
                await _until_done(client, row_id)

    asyncio.run(scenario())
    lines = [r.getMessage() for r in caplog.records if r.name == "kvscope.serve"]
    assert lines and all("\n" not in line and "\x1b" not in line and "\x07" not in line for line in lines)
    assert all(len(line) < 2000 for line in lines), max(map(len, lines))
    for line in lines:
        line.encode("utf-8")  # a lone surrogate made this raise in the log handler
    assert any(line.startswith("alert A?[31mRED?[0m FAKE LOG LINE {instance=i?]0;pwned?xxx") for line in lines), lines
    assert any(line.startswith("alert B {instance=\\ud800}") for line in lines), lines


def test_a_full_queue_answers_503_with_retry_after_and_concurrent_webhooks_never_overfill_it():
    """Five webhooks at once for one place: one is queued, four get 503 with Retry-After (none a
    500 from a queue overfilled while the others were being stored)."""

    async def scenario() -> list[tuple[int, str | None]]:
        config = ServeConfig(prometheus_url=_dead_url(), queue_size=1, workers=1)
        server = WebhookServer(config, DiagnosisStore(":memory:"))
        async with TestClient(TestServer(server.app())) as client:
            for worker in server._workers:  # nothing takes from the queue: it fills
                worker.cancel()

            async def post() -> tuple[int, str | None]:
                resp = await client.post("/api/v1/alerts", data=_body(WEBHOOK))
                return resp.status, resp.headers.get("Retry-After")

            return sorted(await asyncio.gather(*(post() for _ in range(5))), key=lambda r: r[0])

    answers = asyncio.run(scenario())
    assert [status for status, _ in answers] == [200, 503, 503, 503, 503], answers
    assert all(int(after) > 0 for status, after in answers if status == 503)


@pytest.mark.parametrize("n", ["0", "-5", "99"])
def test_max_stored_below_the_queue_size_is_a_usage_error(n):
    """It was accepted (every webhook answered 200 and an id, then deleted): in a child process, so
    a serve that starts anyway is stopped at the time limit instead of holding the test."""
    argv = ["serve", "--prometheus", "http://127.0.0.1:9090", "--store", ":memory:", "--listen", "127.0.0.1:0"]
    done = subprocess.run(
        [sys.executable, "-m", "kvscope", *argv, "--max-stored", n], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3, done.stderr
    assert "--max-stored: at least 100, the diagnosis queue's size" in done.stderr and f"got {n}" in done.stderr


def test_a_pending_webhook_is_never_trimmed_from_the_store():
    store = DiagnosisStore(":memory:", max_rows=2)
    waiting = store.add(WEBHOOK)  # queued, or its diagnosis running
    for _ in range(4):
        store.update(store.add(WEBHOOK), WEBHOOK)
    assert store.get(waiting) is not None and store.count() == 3


@pytest.mark.prometheus
@pytest.mark.needs("prometheus")
def test_a_lone_surrogate_in_a_label_is_diagnosed_in_full_against_a_real_prometheus(tmp_path, caplog):
    """`"\\ud800"` (valid JSON, no valid text) made the read of what changed raise
    UnicodeEncodeError (a traceback in the log; `changes_read` "none"); now that label is written
    out as text and the alert is diagnosed with every section, no error and no traceback."""
    from testbed.prometheus import running_prometheus

    caplog.set_level(logging.INFO, logger="kvscope.serve")
    (tmp_path / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    body = _body(WEBHOOK).replace(b'"e0:8000"', b'"\\ud800"')

    async def scenario(url: str) -> dict:
        server = WebhookServer(ServeConfig(prometheus_url=url), DiagnosisStore(":memory:"))
        async with TestClient(TestServer(server.app())) as client:
            row_id = (await (await client.post("/api/v1/alerts", data=body)).json())["id"]
            return await _until_done(client, row_id)

    with running_prometheus(tmp_path / "prometheus.yml", tmp_path / "data") as prom:
        row = asyncio.run(scenario(prom.url))
    ks = row["payload"]["alerts"][0]["kvscope"]
    assert ks["errors"] == [] and ks["changes_read"] == "every pool", ks
    assert ks["status"] == "no_data" and ks["headline"].startswith("no data: "), ks  # an empty TSDB: not an all-clear
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


@pytest.mark.parametrize("value", ["0s", "abc"])
def test_a_read_timeout_that_is_not_a_positive_duration_is_a_usage_error(value):
    """The read timeout that an unread alert's reason tells the user to raise is serve's --timeout."""
    argv = ["serve", "--prometheus", "http://127.0.0.1:9090", "--store", ":memory:", "--listen", "127.0.0.1:0"]
    done = subprocess.run(
        [sys.executable, "-m", "kvscope", *argv, "--timeout", value], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3, done.stderr
    assert "--timeout" in done.stderr
