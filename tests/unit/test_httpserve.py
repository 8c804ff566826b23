"""HttpSite: bind, report the port, stop cleanly; a taken port leaves nothing running."""

from __future__ import annotations

import asyncio
import errno
import socket

import aiohttp
import pytest
from aiohttp import web

from kvscope.agent.serve.site import HttpSite
from kvscope.agent.traces.receiver import OtlpConfig, OtlpTraceReceiver


def _app(events: list[str]) -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    async def on_cleanup(app: web.Application) -> None:
        events.append("cleanup")

    app = web.Application()
    app.router.add_get("/", hello)
    app.on_cleanup.append(on_cleanup)
    return app


async def _get(port: int) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/") as resp:
        return await resp.text()


def test_port_zero_reports_the_bound_port_and_stop_releases_it():
    events: list[str] = []

    async def run() -> int:
        site = HttpSite(_app(events), access_log=None)
        port = await site.start("127.0.0.1", 0)
        assert port > 0 and site.port == port
        assert await _get(port) == "hello"
        await site.stop()
        await site.stop()  # idempotent
        with pytest.raises(aiohttp.ClientConnectionError):
            await _get(port)
        return port

    asyncio.run(run())
    assert events == ["cleanup"]


def test_a_taken_port_raises_and_leaves_nothing_running():
    events: list[str] = []
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]

        async def run() -> HttpSite:
            site = HttpSite(_app(events))
            with pytest.raises(OSError) as exc:
                await site.start("127.0.0.1", port)
            assert exc.value.errno == errno.EADDRINUSE
            return site

        site = asyncio.run(run())
    assert site.port is None
    assert events == ["cleanup"]  # the app's cleanup hooks ran on the failed start


def test_otlp_receiver_reports_a_taken_port_on_every_cycle_until_it_binds():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rx = OtlpTraceReceiver(OtlpConfig(listen=f"127.0.0.1:{port}"))

        async def two_cycles() -> list[tuple[bool, str | None]]:
            out = []
            for _ in range(2):
                health = (await rx.collect()).health[0]
                out.append((health.up, health.reason))
            return out

        assert asyncio.run(two_cycles()) == [(False, f"bind_{errno.EADDRINUSE}")] * 2
    assert rx.port is None
