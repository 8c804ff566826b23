"""The engine collector probes /health beside each /metrics scrape of an engine that serves one
(agent/collectors/engine.py): engine_health_probe_up is 1 on a 2xx, 0 on anything else, absent for
targets that are not such engines, and off with `health_probe: false`. Real aiohttp servers on
127.0.0.1 port 0."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web

from kvscope.agent.collectors.engine import HEALTH_SIGNAL, EngineCollector, health_url
from kvscope.agent.config import build_config

SCRAPES = Path(__file__).resolve().parents[1] / "fixtures" / "scrapes"
VLLM = (SCRAPES / "vllm-0.32.0-cpu-after-load.txt").read_text()
DCGM = (SCRAPES / "dcgm-exporter-4.5.3-constructed-2gpu.txt").read_text()


async def _serve(body: str, health_status: int | None) -> tuple[web.AppRunner, str]:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=body)

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=health_status or 200)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    if health_status is not None:
        app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/metrics"


def _probe_values(targets: list[tuple[str, int | None]], options: dict | None = None) -> list[dict[str, float]]:
    """Two collections against one server per (body, /health status; None = no /health route);
    per collection, instance -> probe value."""

    async def run() -> list[dict[str, float]]:
        servers = [await _serve(body, status) for body, status in targets]
        doc: dict = {"targets": [url for _, url in servers], "scrape": {"timeout_s": 5}}
        if options is not None:
            doc["collectors"] = {"engine": options}
        collector = EngineCollector(build_config(doc, environ={}, flags=[]))
        try:
            out = []
            for _ in range(2):
                got = await collector.collect()
                out.append({s.label("instance") or "": s.value for s in got.samples if s.name == HEALTH_SIGNAL})
            return out
        finally:
            await collector.close()
            for runner, _ in servers:
                await runner.cleanup()

    return asyncio.run(run())


def test_health_url_keeps_host_and_port_only():
    assert health_url("http://10.0.0.1:8000/metrics?x=1") == "http://10.0.0.1:8000/health"
    assert health_url("https://h/a/b/metrics") == "https://h/health"


def test_probe_records_2xx_as_1_and_an_error_or_missing_route_as_0():
    first, second = _probe_values([(VLLM, 200), (VLLM, 503), (VLLM, None)])
    assert first == second
    assert sorted(first.values()) == [0.0, 0.0, 1.0]


def test_no_probe_for_targets_that_are_not_engines_and_none_when_switched_off():
    (values, _) = _probe_values([(DCGM, 200)])
    assert values == {}
    (values, _) = _probe_values([(VLLM, 200)], options={"health_probe": False})
    assert values == {}
