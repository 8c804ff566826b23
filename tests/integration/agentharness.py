"""Run the real agent (runtime + HTTP server) and real local target servers in one asyncio loop.

Shared by the agent integration tests. Everything binds 127.0.0.1 on a free port and is
stopped when the `async with` block ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web
from kvscope.agent.config import build_config
from kvscope.agent.exposition import Exposition, parse_exposition
from kvscope.agent.runtime import AgentRuntime, build_collectors
from kvscope.agent.server import AgentServer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def target_server(routes: dict[str, Handler]) -> AsyncIterator[str]:
    """Serve `routes` (path -> handler); yields the base URL."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.2, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def running_agent(doc: dict, store=None, collectors=None,
                        only: tuple[str, ...] = ("engine",)) -> AsyncIterator[tuple[AgentRuntime, str]]:
    """An AgentRuntime plus its AgentServer on a free port; yields (runtime, base URL).

    Cycles are driven by the test (`await runtime.run_cycle()`), so assertions see a known
    number of scrapes. Collectors come from the registry, limited to the names in `only`
    (host and GPU readings would make the output machine-dependent), unless given.
    """
    config = build_config(doc, environ={}, flags=[])
    if collectors is None:
        collectors = [c for c in build_collectors(config) if c.name in only]
    runtime = AgentRuntime(config, collectors, store)
    server = AgentServer(runtime)
    port = await server.start("127.0.0.1", 0)
    try:
        yield runtime, f"http://127.0.0.1:{port}"
    finally:
        await server.stop()
        await runtime.close()


async def fetch_text(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.text()


async def fetch_metrics(base: str) -> tuple[str, Exposition]:
    status, text = await fetch_text(base + "/metrics")
    assert status == 200
    return text, parse_exposition(text)


def value(expo: Exposition, name: str, **labels: str) -> float | None:
    """The value of the one sample named `name` whose labels include `labels`, or None."""
    hits = [s.value for s in expo.samples
            if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items())]
    assert len(hits) <= 1, f"{name}{labels} matches {len(hits)} samples"
    return hits[0] if hits else None
