"""One aiohttp application served on host:port: the bind/serve/stop boilerplate of the agent's
HTTP server, the OTLP receiver and `kvscope serve`, in one copy, with the connection limits of
agent/serve/limits.py (a request-head timeout, aiohttp's idle timeout, a connection cap) and a
request-body deadline: a body still arriving `request_timeout_s` after its head (a client that
trickles it a byte at a time) ends its handler, is answered 408 and its connection closed, counted
as `request_timeout`. The body's size is the application's own `client_max_size` (413 past it)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from typing import Any

from aiohttp import web

from kvscope.agent.config import ServerLimits
from kvscope.agent.serve.limits import ConnectionGuard, linger

_LATE = b'{"status":"error","error":"%s: the request body did not arrive whole within %gs (request_timeout_s)"}'


class HttpSite:
    """Serve `app` on one TCP address until `stop()`; `runner_options` go to `web.AppRunner`
    (`keepalive_timeout` there is `limits.idle_timeout_s`)."""

    def __init__(
        self, app: web.Application, limits: ServerLimits | None = None, name: str = "kvscope", **runner_options: Any
    ) -> None:
        """`name` says which listener it is in the log and in the 503 over the cap."""
        self.app, self.name = app, name
        self.limits = limits or ServerLimits()
        self.runner_options = {"keepalive_timeout": self.limits.idle_timeout_s, **runner_options}
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._guard: ConnectionGuard | None = None
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def closed(self) -> Counter[str]:
        """Client connections closed unserved, by reason (agent/serve/limits.py)."""
        return self._guard.closed if self._guard is not None else Counter()

    async def start(self, host: str, port: int, backlog: int = 128) -> int:
        """Bind and serve; the bound port, or OSError (nothing left running) if it is taken."""
        if self._runner is not None:
            raise RuntimeError("HttpSite already started")
        self.app.middlewares.insert(0, self._body_deadline)  # outermost: it ends whatever the handler awaits
        runner = web.AppRunner(self.app, **self.runner_options)
        await runner.setup()
        assert runner.server is not None
        guard = ConnectionGuard(runner.server, self.limits, self.name)
        try:
            server = await asyncio.get_running_loop().create_server(guard, host, port, backlog=backlog)
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._server, self._guard = runner, server, guard
        self._sweeper = asyncio.get_running_loop().create_task(guard.sweep())
        self.port = server.sockets[0].getsockname()[1] if server.sockets else port
        return self.port

    @web.middleware
    async def _body_deadline(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Run `handler`; if the request's body is not whole `request_timeout_s` after its head,
        cancel the handler (it can only be waiting for the body, or ignoring it) and answer 408."""
        if not request.body_exists or request.content.is_eof():
            return await handler(request)
        task = asyncio.current_task()
        assert task is not None
        late = False

        def expire() -> None:
            nonlocal late
            if not request.content.is_eof():
                late = True
                task.cancel()

        limit = self.limits.request_timeout_s
        timer = asyncio.get_running_loop().call_later(limit, expire)
        if self._guard is not None:  # over the connection cap, a body still arriving can be displaced
            self._guard.receiving_body(request.transport, (time.monotonic(), request.content))
        try:
            return await handler(request)
        except asyncio.CancelledError:
            if not late or task.uncancel() > 0:  # not ours, or cancelled for another reason too
                raise
            return await self._late(request, limit)
        finally:
            timer.cancel()
            if self._guard is not None:
                self._guard.receiving_body(request.transport, None)

    async def _late(self, request: web.Request, limit: float) -> web.StreamResponse:
        if self._guard is not None:
            self._guard.count("request_timeout")
        resp = web.Response(status=408, body=_LATE % (self.name.encode(), limit), content_type="application/json")
        resp.force_close()
        await resp.prepare(request)
        await resp.write_eof()
        if request.transport is not None:
            linger(request.transport)
        return resp

    async def stop(self) -> None:
        """Stop accepting, finish or cancel open requests, run the app's cleanup hooks. Idempotent."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            if self._sweeper is not None:
                self._sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._sweeper
            if self._server is not None:
                self._server.close()
            await runner.cleanup()
            if self._guard is not None:
                self._guard.abort_all()  # what aiohttp did not close (connections still sending a head)
