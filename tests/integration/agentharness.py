"""Run the real agent (runtime + HTTP server) and real local target servers in one asyncio loop.

Shared by the agent integration tests. Everything binds 127.0.0.1 on a free port and is
stopped when the `async with` block ends.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

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


# ------------------------------------------------------------------------------ real processes

def start_process_on_free_port(argv: list[str], pattern: str, timeout_s: float = 60.0,
                               stream: str = "stderr", **kw) -> tuple[subprocess.Popen, int]:
    """Start a server told to bind port 0 and read the port it got from its output.

    Asking the kernel for the port avoids the race of picking a free port first: on a shared
    machine another process may take it in between, and a readiness probe would then talk to
    the wrong server. `pattern` is a regex with one group: the port.
    """
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if stream == "stdout" else \
        {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE}
    proc = subprocess.Popen(argv, text=True, **pipes, **kw)
    out = proc.stdout if stream == "stdout" else proc.stderr
    found: list[int] = []
    seen: list[str] = []

    def read() -> None:
        for line in out:
            seen.append(line)
            m = re.search(pattern, line)
            if m and not found:
                found.append(int(m.group(1)))
        # keep draining so the child never blocks on a full pipe

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    while not found and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.reader = reader        # type: ignore[attr-defined]  (join it to read the last lines)
    if not found:
        stop_process(proc, signal.SIGKILL)
        raise AssertionError(f"{argv[:4]} did not report its port:\n{''.join(seen)[-2000:]}")
    proc.output_lines = seen    # type: ignore[attr-defined]
    return proc, found[0]


def start_target_process(root: Path) -> tuple[subprocess.Popen, str]:
    """`python -m http.server` on a free port serving `root`; returns (process, base URL)."""
    proc, port = start_process_on_free_port(
        [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", str(root)],
        r"port (\d+)", stream="stdout")
    return proc, f"http://127.0.0.1:{port}"


def start_agent_process(args: list[str]) -> tuple[subprocess.Popen, str]:
    """`kvscope agent ARGS --web.listen-address 127.0.0.1:0`; returns (process, base URL)."""
    proc, port = start_process_on_free_port(
        [sys.executable, "-m", "kvscope", "agent", *args, "--web.listen-address", "127.0.0.1:0"],
        r"listening on http://127\.0\.0\.1:(\d+)/metrics")
    return proc, f"http://127.0.0.1:{port}"


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
    """Signal the process and wait; kill it if it does not stop. Returns its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    reader = getattr(proc, "reader", None)
    if reader is not None:
        reader.join(10)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return rc
