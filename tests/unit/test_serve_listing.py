"""Issue 57 S4 for `kvscope serve`: a listing is built off the event loop (/-/healthy answers
while it is being built), its page and each webhook's summary are bounded, and queued webhooks
wait in the store, not in memory. Ordering, not wall-clock time, is asserted."""

from __future__ import annotations

import asyncio
import threading

from aiohttp.test_utils import TestClient, TestServer

from kvscope.diagnoser.alertmanager.server import ServeConfig, WebhookServer
from kvscope.diagnoser.alertmanager.store import DiagnosisStore
from tests.unit.test_alertmanager import WEBHOOK, _body
from tests.unit.test_serve_not_diagnosed import _dead_url


class SlowStore(DiagnosisStore):
    """A store whose listing is held until the test lets it finish (a large listing, at will)."""

    def __init__(self) -> None:
        super().__init__(":memory:")
        self.entered, self.release = threading.Event(), threading.Event()
        self.order: list[str] = []

    def list(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        self.entered.set()
        self.release.wait(20)  # on the event loop (the old code) this holds every request
        self.order.append("list built")
        return super().list(*args, **kwargs)


def test_health_answers_while_a_listing_is_being_built():
    store = SlowStore()

    async def scenario() -> tuple[int, int]:
        server = WebhookServer(ServeConfig(prometheus_url=_dead_url()), store)
        async with TestClient(TestServer(server.app())) as client:
            listing = asyncio.create_task(client.get("/api/v1/diagnoses?limit=500"))
            await asyncio.to_thread(store.entered.wait, 20)
            healthy = await client.get("/-/healthy")
            store.order.append("health answered")
            store.release.set()
            return healthy.status, (await listing).status

    healthy, listed = asyncio.run(scenario())
    assert (healthy, listed) == (200, 200)
    assert store.order == ["health answered", "list built"]


def test_a_listing_page_and_each_summary_are_bounded_and_page_on():
    many = {**WEBHOOK, "alerts": [{**WEBHOOK["alerts"][0], "labels": {"alertname": "A" * 1500}}] * 500}

    async def scenario() -> tuple[dict, dict, list]:
        server = WebhookServer(ServeConfig(prometheus_url=_dead_url()), DiagnosisStore(":memory:"))
        async with TestClient(TestServer(server.app())) as client:
            for worker in server._workers:  # the webhooks stay queued: ids only, payloads in the store
                worker.cancel()
            for _ in range(3):
                assert (await client.post("/api/v1/alerts", data=_body(many))).status == 200
            queued = list(server.queue._queue)  # type: ignore[union-attr]
            first = await (await client.get("/api/v1/diagnoses?limit=2")).json()
            second = await (await client.get(first["next"])).json()
        return first, second, queued

    first, second, queued = asyncio.run(scenario())
    assert queued == [1, 2, 3]
    assert [d["id"] for d in first["diagnoses"]] == [3, 2] and [d["id"] for d in second["diagnoses"]] == [1]
    assert "next" not in second
    entry = first["diagnoses"][0]
    assert entry["alerts"] == 500 and len(entry["summary"]) == 50
    assert len(entry["summary"][0]["alertname"]) <= 1001 and len(entry["alertnames"][0]) <= 1001


def test_a_listing_asks_for_at_most_a_page():
    async def scenario() -> list:
        store = DiagnosisStore(":memory:", max_rows=1000)
        for _ in range(150):
            store.update(store.add(WEBHOOK), WEBHOOK)
        server = WebhookServer(ServeConfig(prometheus_url=_dead_url()), store)
        async with TestClient(TestServer(server.app())) as client:
            return (await (await client.get("/api/v1/diagnoses?limit=500")).json())["diagnoses"]

    assert len(asyncio.run(scenario())) == 100


def test_ids_sqlite_cannot_hold_are_a_400_not_a_traceback():
    async def scenario() -> list[int]:
        server = WebhookServer(ServeConfig(prometheus_url=_dead_url()), DiagnosisStore(":memory:"))
        async with TestClient(TestServer(server.app())) as client:
            paths = [f"/api/v1/diagnoses/{10**30}", f"/api/v1/diagnoses?before={10**30}", "/api/v1/diagnoses/-1"]
            return [(await client.get(path)).status for path in paths]

    assert asyncio.run(scenario()) == [400, 400, 400]
