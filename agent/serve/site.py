"""One aiohttp application served on host:port: the bind/serve/stop boilerplate of the agent's
HTTP server, the OTLP receiver and `kvscope serve`, in one copy."""

from __future__ import annotations

from typing import Any

from aiohttp import web


class HttpSite:
    """Serve `app` on one TCP address until `stop()`; `runner_options` go to `web.AppRunner`."""

    def __init__(self, app: web.Application, **runner_options: Any) -> None:
        self.app = app
        self.runner_options = runner_options
        self.port: int | None = None
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int, backlog: int = 128) -> int:
        """Bind and serve; the bound port, or OSError (nothing left running) if it is taken."""
        if self._runner is not None:
            raise RuntimeError("HttpSite already started")
        runner = web.AppRunner(self.app, **self.runner_options)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port, backlog=backlog).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        bound = runner.addresses
        self.port = bound[0][1] if bound else port
        return self.port

    async def stop(self) -> None:
        """Stop accepting, finish or cancel open requests, run the app's cleanup hooks. Idempotent."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
