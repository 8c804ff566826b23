"""The agent logs each target's and collector's state changes, rate-limited per target: a real
aiohttp target on an ephemeral port that answers, then 404s, answers again, then is closed."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from aiohttp import web

from kvscope.agent.collectors.base import Collection, Health
from kvscope.agent.collectors.engine import EngineCollector
from kvscope.agent.config import build_config
from kvscope.agent.ratelog import ChangeLog
from kvscope.agent.runtime import AgentRuntime, log

BODY = (Path(__file__).parents[1] / "fixtures" / "scrapes" / "vllm-0.11.0-rendered.txt").read_text()


class Target:
    """A real HTTP /metrics target whose answer the test switches."""

    def __init__(self) -> None:
        self.status = 200
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handler(self, request: web.Request) -> web.Response:
        if self.status != 200:
            return web.Response(status=self.status, text="not here")
        return web.Response(text=BODY)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self.handler)
        self.runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.2)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/metrics"

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == log.name and "target" in r.getMessage()]


async def _cycles(steps: list[int | None], interval_s: float) -> str:
    """Run one agent cycle per step (an HTTP status, or None: the server is closed)."""
    target = Target()
    await target.start()
    config = build_config({"targets": [{"url": target.url}]}, environ={})
    collector = EngineCollector(config)
    rt = AgentRuntime(config, [collector], None)
    rt.changes = ChangeLog(log, interval_s=interval_s)
    try:
        for step in steps:
            if step is None:
                await target.close()
            else:
                target.status = step
            await rt.run_cycle()
    finally:
        await collector.close()
        await target.close()
    return target.url


def test_a_target_down_then_up_then_refused_logs_each_change_once(caplog):
    caplog.set_level(logging.INFO, logger=log.name)
    url = asyncio.run(_cycles([200, 404, 404, 404, 200, 200, None, None, None], interval_s=0.0))
    assert lines(caplog) == [
        (logging.WARNING, f"target {url} (engine) is down: http_404"),
        (logging.INFO, f"target {url} (engine) is up again"),
        (logging.WARNING, f"target {url} (engine) is down: connection_refused"),
    ]


def test_a_flapping_target_is_logged_once_per_interval(caplog):
    caplog.set_level(logging.INFO, logger=log.name)
    url = asyncio.run(_cycles([404, 200, 404, 200, 404, 200, 404], interval_s=3600.0))
    assert lines(caplog) == [(logging.WARNING, f"target {url} (engine) is down: http_404")]


def test_a_held_back_change_is_written_after_the_interval_with_the_count():
    now = [0.0]
    logger = logging.getLogger("kvscope.test.changelog")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger.addHandler(handler := Keep())
    logger.setLevel(logging.INFO)
    try:
        changes = ChangeLog(logger, interval_s=60.0, clock=lambda: now[0])
        for t, up in ((0, False), (1, True), (2, False), (3, True), (30, True), (61, True), (62, True)):
            now[0] = float(t)
            changes.observe("k", "target x", up, "" if up else "timeout")
    finally:
        logger.removeHandler(handler)
    assert seen == ["target x is down: timeout", "target x is up again (3 state changes since the last line)"]


class NvmlMissing:
    name = "nvml"

    async def collect(self) -> Collection:
        return Collection(health=[Health(collector=self.name, up=False, reason="NVMLError_LibraryNotFound")])

    async def close(self) -> None:
        return None


def test_a_collector_down_at_start_is_logged_once(caplog):
    caplog.set_level(logging.INFO, logger=log.name)
    rt = AgentRuntime(build_config({}, environ={}), [NvmlMissing()], None)
    rt.changes = ChangeLog(log, interval_s=0.0)
    for _ in range(3):
        asyncio.run(rt.run_cycle())
    msgs = [r.getMessage() for r in caplog.records if r.name == log.name]
    assert msgs == ["collector nvml is down: NVMLError_LibraryNotFound"]


def test_the_real_nvml_collector_unavailable_here_is_logged_once(caplog):
    from kvscope.agent.collectors.nvml import NvmlCollector

    caplog.set_level(logging.INFO, logger=log.name)
    collector = NvmlCollector(build_config({}, environ={}))
    rt = AgentRuntime(build_config({}, environ={}), [collector], None)
    for _ in range(2):
        asyncio.run(rt.run_cycle())
    up, reason, _ = rt.state.collector_status["nvml"]
    if up:
        pytest.skip("NVML works on this machine")
    msgs = [r.getMessage() for r in caplog.records if r.name == log.name]
    assert msgs == [f"collector nvml is down: {reason}"]
