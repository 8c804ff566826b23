"""kvscope's request tap in front of the replicas of a scenario (test tooling).

One real `RequestTap` (agent/tap/proxy.py) per replica, each forwarding to its replica only, so
the load driver's routing policy (round-robin, sticky by tenant, ...) still decides which replica
serves a request: it sends the request to that replica's tap. All taps share one prefix index, so
the tap layer sees the whole fleet as one tap with several upstreams does: a prompt prefix served
by more than one replica counts as split (`prefix_split_ratio`). Each tap serves its series at
`/kvscope/metrics`, which `kvscope record` scrapes like any target.

With `spans_endpoint`, the taps' own spans (tenant, replica; the engine's span joins the same
trace through `traceparent`) are exported there over OTLP/HTTP.

The taps run on their own event loop in a background thread, so they keep serving while the
caller sleeps or blocks. `close()` stops them, sends the last spans and ends the thread.

    with TapFront([srv.url for srv in servers], tenant_header="X-Tenant-Id") as front:
        front.urls          # send requests here (index i forwards to replica i)
        front.metrics_urls  # scrape targets
"""

from __future__ import annotations

import asyncio
import threading

from kvscope.agent.tap.proxy import TapConfig
from kvscope.agent.traces.export import SpanBatchExporter
from kvscope.commands.tap import build_tap
from kvscope.core.objectives import ObjectiveSet


class TapFront:
    """Taps in front of `upstreams` (one each), one shared prefix index, on a background loop."""

    def __init__(
        self,
        upstreams: list[str],
        tenant_header: str = "X-Tenant-Id",
        prefix_window_s: float = 900.0,
        spans_endpoint: str | None = None,
        objectives: ObjectiveSet | None = None,
    ) -> None:
        if not upstreams:
            raise ValueError("need at least one upstream")
        self.exporter = SpanBatchExporter(spans_endpoint) if spans_endpoint else None
        sink = self.exporter.add if self.exporter else None
        self.taps = [
            build_tap(
                TapConfig(
                    upstreams=(u,),
                    listen="127.0.0.1:0",
                    tenant_header=tenant_header,
                    prefix_window_s=prefix_window_s,
                    service_name=f"kvscope-tap-{i}",
                    objectives=objectives or ObjectiveSet(),
                ),
                span_sink=sink,
            )
            for i, u in enumerate(upstreams)
        ]
        for tap in self.taps[1:]:
            tap.prefixes = self.taps[0].prefixes  # one fleet-wide index
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tapfront", daemon=True)
        self._sender: asyncio.Task[None] | None = None

    def start(self) -> TapFront:
        """Bind every tap (free 127.0.0.1 ports); returns self."""
        self._thread.start()
        try:
            for tap in self.taps:
                asyncio.run_coroutine_threadsafe(tap.start(), self._loop).result(timeout=30)
            if self.exporter is not None:
                self._sender = asyncio.run_coroutine_threadsafe(self._spawn_sender(), self._loop).result(timeout=30)
        except Exception:
            self.close()
            raise
        return self

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{tap.port}" for tap in self.taps]

    @property
    def metrics_urls(self) -> list[str]:
        return [u + "/kvscope/metrics" for u in self.urls]

    def split_ratio(self) -> float | None:
        """The shared index's share of re-seen prefix blocks served by more than one replica."""
        return self.taps[0].prefixes.split_ratio

    def close(self) -> None:
        """Stop the taps and their loop (idempotent)."""
        if not self._thread.is_alive():
            return
        for tap in self.taps:
            try:
                asyncio.run_coroutine_threadsafe(tap.stop(), self._loop).result(timeout=30)
            except Exception:  # noqa: BLE001 - keep stopping the others
                pass
        if self._sender is not None:
            asyncio.run_coroutine_threadsafe(_finish(self._sender), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    async def _spawn_sender(self) -> asyncio.Task[None]:
        assert self.exporter is not None
        return asyncio.create_task(self.exporter.run())

    def __enter__(self) -> TapFront:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _finish(task: asyncio.Task[None]) -> None:
    """Cancel the exporter task and wait for it: its `run()` sends what is buffered on the way out."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
