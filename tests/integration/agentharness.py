"""Run the real agent (runtime + HTTP server) and real local target servers in one asyncio loop.

Shared by the agent integration tests. Everything binds 127.0.0.1 on a free port and is
stopped when the `async with` block ends.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from kvscope.agent.api import AgentServer
from kvscope.agent.config import build_config
from kvscope.agent.derive.hooks import derive_hooks
from kvscope.agent.runtime import AgentRuntime, build_collectors, load_collector_modules
from kvscope.agent.scrape.exposition import Exposition, parse_exposition
from kvscope.agent.serve.site import HttpSite
from testbed.procs import start_reporting_port

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def target_server(routes: dict[str, Handler]) -> AsyncIterator[str]:
    """Serve `routes` (path -> handler); yields the base URL."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    site = HttpSite(app, handle_signals=False, shutdown_timeout=0.2, access_log=None)
    port = await site.start("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await site.stop()


@contextlib.asynccontextmanager
async def running_agent(
    doc: dict, store=None, collectors=None, only: tuple[str, ...] = ("engine",)
) -> AsyncIterator[tuple[AgentRuntime, str]]:
    """An AgentRuntime plus its AgentServer on a free port; yields (runtime, base URL).

    Cycles are driven by the test (`await runtime.run_cycle()`), so assertions see a known
    number of scrapes. Collectors come from the registry, limited to the names in `only`
    (host and GPU readings would make the output machine-dependent), unless given. The derive
    hooks are the agent's own (agent/derive/hooks.py).
    """
    load_collector_modules()  # as `kvscope agent` does: the otlp, tap and kv_events sections register
    config = build_config(doc, environ={}, flags=[])
    if collectors is None:
        collectors = [c for c in build_collectors(config) if c.name in only]
    runtime = AgentRuntime(config, collectors, store, derive=derive_hooks(config))
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
    hits = [
        s.value for s in expo.samples if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items())
    ]
    assert len(hits) <= 1, f"{name}{labels} matches {len(hits)} samples"
    return hits[0] if hits else None


# ------------------------------------------------------------------------------ real processes


def start_target_process(root: Path) -> tuple[subprocess.Popen, str]:
    """`python -m http.server` on a free port serving `root`; returns (process, base URL)."""
    proc, port = start_reporting_port(
        [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", str(root)],
        r"port (\d+)",
        stream="stdout",
    )
    return proc, f"http://127.0.0.1:{port}"


def start_agent_process(args: list[str]) -> tuple[subprocess.Popen, str]:
    """`kvscope agent ARGS --web.listen-address 127.0.0.1:0`; returns (process, base URL).

    Stop it with `testbed.procs.stop_process`; its stderr lines are `proc.output_lines`."""
    proc, port = start_reporting_port(
        [sys.executable, "-m", "kvscope", "agent", *args, "--web.listen-address", "127.0.0.1:0"],
        r"listening on http://127\.0\.0\.1:(\d+)/metrics",
    )
    return proc, f"http://127.0.0.1:{port}"
