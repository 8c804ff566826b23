"""Issue 41 N2 for `kvscope serve`: a diagnosis against a stalled Prometheus (a real local server
that dribbles one byte at a time) times out, is reported on the stored alert, and the next alert
runs; /-/healthy does not say 200 while a diagnosis thread runs on past its deadline."""

from __future__ import annotations

import asyncio
import threading

from aiohttp.test_utils import TestClient, TestServer

from kvscope.diagnoser.alertmanager.server import ServeConfig, WebhookServer
from kvscope.diagnoser.alertmanager.store import DiagnosisStore
from tests.unit.test_alertmanager import WEBHOOK, _body
from tests.unit.test_hostile_answers import RawServer, _dribble


async def _until_done(client: TestClient, row_id: int, rounds: int = 1200) -> dict:
    for _ in range(rounds):
        row = await (await client.get(f"/api/v1/diagnoses/{row_id}")).json()
        if row["status"] != "pending":
            return row
        await asyncio.sleep(0.05)
    raise AssertionError(f"row {row_id} still pending")


def test_a_stalled_prometheus_times_the_diagnosis_out_on_the_stored_alert_and_the_next_alert_runs():
    prom = RawServer(_dribble)
    try:

        async def scenario() -> tuple[list[dict], str]:
            config = ServeConfig(prometheus_url=prom.url, diagnosis_timeout_s=1.5, query_timeout_s=30.0, workers=1)
            server = WebhookServer(config, DiagnosisStore(":memory:"))
            async with TestClient(TestServer(server.app())) as client:
                ids = []
                for _ in range(2):
                    resp = await client.post("/api/v1/alerts", data=_body(WEBHOOK))
                    ids.append((await resp.json())["id"])
                rows = [await _until_done(client, row_id) for row_id in ids]
                metrics = await (await client.get("/metrics")).text()
            return rows, metrics

        rows, metrics = asyncio.run(scenario())
    finally:
        prom.close()
    for row in rows:  # each one timed out on its own, the second after the first
        ks = row["payload"]["alerts"][0]["kvscope"]
        # the diagnosis given up at 1.5 s (or, on a loop stalled past that, its read cut at 2.5 s)
        assert "did not finish within 1.5 s" in ks["errors"][0] or "no complete answer within" in ks["errors"][0], ks
        assert row["status"] == ks["status"] == "not_diagnosed" and ks["headline"].startswith("not diagnosed: "), ks
    assert "kvscope_webhook_diagnoses_total" in metrics


def test_healthy_is_503_while_a_diagnosis_thread_runs_on_past_its_deadline():
    release = threading.Event()

    class Wedged(WebhookServer):
        async def _diagnose_window(self, start, end, deadline=None, place=None):  # noqa: ANN001, ANN202
            await self._in_thread(deadline, release.wait, 60)  # a call the deadline cannot end
            return {}, {}, []

    async def scenario() -> tuple[int, str, int, int]:
        config = ServeConfig(prometheus_url="http://127.0.0.1:9", diagnosis_timeout_s=0.2, wedged_after_s=0.3)
        server = Wedged(config, DiagnosisStore(":memory:"), rules=[])
        async with TestClient(TestServer(server.app())) as client:
            before = (await client.get("/-/healthy")).status
            row_id = (await (await client.post("/api/v1/alerts", data=_body(WEBHOOK))).json())["id"]
            await _until_done(client, row_id)
            for _ in range(400):
                wedged = await client.get("/-/healthy")
                if wedged.status != 200:
                    break
                await asyncio.sleep(0.05)
            text = await wedged.text()
            release.set()
            for _ in range(400):
                after = (await client.get("/-/healthy")).status
                if after == 200:
                    break
                await asyncio.sleep(0.05)
        return before, text, wedged.status, after

    before, text, wedged, after = asyncio.run(scenario())
    assert before == 200 and wedged == 503 and "wedged" in text and after == 200
