"""The agent's HTTP server (aiohttp.web, same asyncio loop as the collectors); routes in README.md.

GET only: request bodies are refused, query strings bounded. `/metrics` is rendered once per cycle
(agent/serve/export.py). `/api/v1/samples?match=<names>&start=&end=` (unix s; default the last
hour; `match` is exact names, `|` alternatives and `.*`/`.+` wildcards, matched in linear time by
agent/namematch.py, never a regular expression) answers `{"status": "success", "data": {"series":
[{"name", "labels", "points": [[ts, value]...]}], "truncated": bool}}`, at most `MAX_POINTS`
points; errors are `{"status": "error", "error": "..."}` (400 names the parameter). Queries run on the API's own threads
(`QUERY_THREADS`, at most `MAX_WAITING` waiting, more are answered 503), so the collectors' threads
and the agent loop never wait on a request.
"""

from __future__ import annotations

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from kvscope.agent.namematch import NameMatcher, compile_pattern
from kvscope.agent.runtime import AgentRuntime
from kvscope.agent.serve.export import CONTENT_TYPE, render_metrics
from kvscope.agent.serve.site import HttpSite
from kvscope.core.signals import Catalog, load_catalog

MAX_POINTS = 500_000
"""Points one /api/v1/samples answer may carry (about 20 MB of JSON)."""
MAX_RANGE_S = 31 * 86400
MAX_QUERY_CHARS = 2048
QUERY_THREADS = 2
MAX_WAITING = 8
"""Sample queries running or waiting on the API's threads; more are answered 503."""


class AgentServer:
    """Serves the state of one AgentRuntime and the samples of its store."""

    def __init__(self, runtime: AgentRuntime, catalog: Catalog | None = None) -> None:
        self.runtime = runtime
        self.catalog = catalog or load_catalog()
        self._cache: tuple[int, bytes] | None = None
        self._site: HttpSite | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._queries = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=4096, middlewares=[_bounded])
        app.add_routes(
            [
                web.get("/metrics", self.metrics),
                web.get("/api/v1/samples", self.samples),
                web.get("/api/v1/facts", self.facts),
                web.get("/api/v1/health", self.health),
                web.get("/-/ready", self.ready),
                web.get("/-/healthy", self.healthy),
            ]
        )
        return app

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (port 0 picks a free one). Returns the bound port."""
        limits = getattr(self.runtime.config, "server_limits", None)
        self._site = HttpSite(
            self.app(), limits, name="agent", access_log=None, handle_signals=False, shutdown_timeout=2.0
        )
        return await self._site.start(host, port, backlog=64)

    async def stop(self) -> None:
        if self._site is not None:
            await self._site.stop()
            self._site = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # ---------------------------------------------------------------------------------- routes

    async def metrics(self, request: web.Request) -> web.Response:
        state = self.runtime.state
        if self._site is not None and self._site.closed:  # this server's own unserved connections
            where = self.runtime.config.listen_address
            closed = {("agent", where, reason): n for reason, n in self._site.closed.items()}
            if any(state.closed.get(k) != n for k, n in closed.items()):
                state.closed.update(closed)
                state.version += 1
        if self._cache is None or self._cache[0] != state.version:
            self._cache = (state.version, render_metrics(state, self.catalog).encode())
        return web.Response(body=self._cache[1], headers={"Content-Type": CONTENT_TYPE})

    async def samples(self, request: web.Request) -> web.Response:
        store = self.runtime.store
        if store is None:
            return _error(503, "no store configured")
        try:
            pattern, start, end = _samples_params(request.query)
        except ValueError as e:
            return _error(400, str(e))
        if self._queries >= MAX_WAITING:
            return _error(503, f"{MAX_WAITING} sample queries already running or waiting; retry later")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(QUERY_THREADS, thread_name_prefix="kvscope-api")
        self._queries += 1
        try:
            loop = asyncio.get_running_loop()
            data = await loop.run_in_executor(self._pool, _query_store, store, pattern, start, end)
        finally:
            self._queries -= 1
        return web.json_response({"status": "success", "data": data})

    async def facts(self, request: web.Request) -> web.Response:
        st = self.runtime.state
        data = {
            inst: {"engine": st.engines.get(inst), "job": st.jobs.get(inst), "facts": st.facts.get(inst, {})}
            for inst in sorted(st.engines)
        }
        return web.json_response({"status": "success", "data": data})

    async def health(self, request: web.Request) -> web.Response:
        st = self.runtime.state
        collectors = {
            name: {"up": up, "reason": reason, "duration_s": dur}
            for name, (up, reason, dur) in sorted(st.collector_status.items())
        }
        over_budget = getattr(st.store_stats, "over_budget", {})
        targets = [
            {
                "job": st.jobs.get(h.target, h.collector),
                "instance": h.target,
                "up": h.up,
                "reason": h.reason or "ok",
                "duration_s": h.duration_s,
                "series": h.series,
                "engine": st.engines.get(h.target),
                "dropped": dict(h.dropped),
                "store_series_dropped": over_budget.get(h.target, 0),  # its series budget used up
            }
            for hs in st.health.values()
            for h in hs
            if h.target
        ]
        closed = [
            {"collector": c, "instance": i, "reason": r, "total": n} for (c, i, r), n in sorted(st.closed.items())
        ]
        data = {
            "cycles": st.cycles,
            "cycles_skipped": st.cycles_skipped,
            "last_cycle_s": st.last_cycle_s,
            "last_cycle_end": st.last_cycle_end,
            "collectors": collectors,
            "targets": targets,
            "connections_closed": closed,
        }
        return web.json_response({"status": "success", "data": data})

    async def ready(self, request: web.Request) -> web.Response:
        if self.runtime.state.cycles:
            return web.Response(text="ready\n")
        return web.Response(status=503, text="first collection cycle not finished\n")

    async def healthy(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")


@web.middleware
async def _bounded(request: web.Request, handler: Any) -> web.StreamResponse:
    """Refuse request bodies and oversized query strings before any handler runs."""
    if request.content_length:
        return _error(413, "requests must not carry a body")
    if len(request.query_string) > MAX_QUERY_CHARS:
        return _error(414, f"query string longer than {MAX_QUERY_CHARS} characters")
    return await handler(request)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"status": "error", "error": message}, status=status)


def _samples_params(query: Any) -> tuple[NameMatcher, float, float]:
    """Validate match/start/end. Raises ValueError naming the parameter."""
    raw = query.get("match")
    if not raw:
        raise ValueError("match: required, canonical names with '|' and '.*' wildcards (e.g. engine_kv_.*)")
    try:
        pattern = compile_pattern(raw)
    except ValueError as e:
        raise ValueError(f"match: not a supported pattern: {e}") from None
    end = _time_param(query, "end", time.time())
    start = _time_param(query, "start", end - 3600.0)
    if start > end:
        raise ValueError("start: must not be after end")
    if end - start > MAX_RANGE_S:
        raise ValueError(f"start: range longer than {MAX_RANGE_S} s")
    return pattern, start, end


def _time_param(query: Any, name: str, default: float) -> float:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}: must be unix seconds, got {raw[:40]!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name}: must be finite")
    return value


def _query_store(store: Any, pattern: NameMatcher, start: float, end: float) -> dict[str, Any]:
    """Runs on an API thread: the store is thread-safe and may block on disk."""
    series: list[dict[str, Any]] = []
    budget = MAX_POINTS
    for name in pattern.filter(store.names()):
        for labels, points in sorted(store.query(name, start, end).items()):
            if points:
                series.append({"name": name, "labels": dict(labels), "points": [list(p) for p in points[:budget]]})
                budget -= len(points)
                if budget <= 0:  # the answer stops here
                    return {"series": series, "truncated": True}
    return {"series": series, "truncated": False}
