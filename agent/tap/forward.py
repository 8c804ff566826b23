"""One request's way through the tap: client -> upstream -> client, measured on the way.

A `Forward` writes the request to a pooled upstream connection and passes every response byte to
the client from the upstream's read callback. An accounted SSE stream goes through `SseScanner`;
an accounted non-streamed answer is copied (bounded) for its usage. Tenant and prefix bookkeeping
run once the request is upstream, accounting once the client has its bytes. Failure modes:
docs/requests.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from kvscope.agent.tap.exchange import Exchange, Tap
from kvscope.agent.tap.http1 import Downstream, Request, Upstream, error_body, filter_headers
from kvscope.agent.tap.sse import SseScanner, parse_json_object, usage_of

log = logging.getLogger("kvscope.tap")
MAX_COPY_BYTES = 16 << 20  # an accounted non-streamed answer is read for usage up to this size


class Forward:
    """Carries one request upstream and its response back (the upstream's `ResponseHandler`)."""

    __slots__ = tuple("tap conn req ex doc injected target wire up scanner copy copied retried over task".split())

    def __init__(
        self,
        tap: Tap,
        conn: Downstream,
        req: Request,
        ex: Exchange | None,
        doc: dict[str, Any] | None,
        injected: bool,
        target: Any,
        wire: bytes,
    ) -> None:
        self.tap, self.conn, self.req, self.ex = tap, conn, req, ex
        self.doc = doc  # the request body: tenant and prefix bookkeeping after sending
        self.injected = injected
        self.target = target  # proxy._Target of the chosen upstream
        self.wire: bytes | None = wire
        self.up: Upstream | None = None
        self.scanner: SseScanner | None = None
        self.copy: list[bytes] | None = None
        self.copied = 0
        self.retried = False
        self.over = False
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.conn.on_lost = self.client_lost
        self.conn.on_drain = self.drain
        up = self.tap.pool.take_idle(self.target.key)
        if up is not None:
            self._send(up)
        else:
            self._connect_later()

    def _connect_later(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._connect())
        self.tap.tasks.add(self.task)
        self.task.add_done_callback(self.tap.tasks.discard)

    async def _connect(self) -> None:
        try:
            up = await self.tap.pool.connect(self.target.key)
        except (OSError, TimeoutError) as e:
            self.on_fail(e, False)
            return
        if self.over:  # the client left while we connected
            self.tap.pool.release(up)
            return
        self._send(up)

    def _send(self, up: Upstream) -> None:
        self.up = up
        up.send(self, self.wire, head_only=self.req.method == "HEAD")  # type: ignore[arg-type]
        if self.doc is not None and self.ex is not None:
            self.tap.identify(self.ex, self.req, self.doc)
            self.tap.observe_prefix(self.ex, self.doc)
            self.doc = None

    # ---------------------------------------------------------------- upstream -> client
    def on_head(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.wire = None
        ex = self.ex
        length: int | None = None
        sse = False
        for k, v in headers:
            lk = k.lower()
            if lk == b"content-length" and v.strip().isdigit():
                length = int(v)
            elif lk == b"content-type":
                sse = v.lstrip().lower().startswith(b"text/event-stream")
        if ex is not None:
            ex.status = status
            if sse:
                self.scanner = SseScanner(drop_usage=self.injected)
                length = None if self.injected else length
            else:
                self.copy = []
        self.conn.send_head(status, reason, filter_headers(headers), length, has_body=status not in (204, 304))

    def on_body(self, data: bytes) -> None:
        if self.over:
            return
        if self.scanner is not None:
            data = self.scanner.feed(data, time.perf_counter())
        elif self.copy is not None:
            self._copy(data)
        self.conn.send_body(data)

    def _copy(self, data: bytes) -> None:
        self.copy.append(data)  # type: ignore[union-attr]
        self.copied += len(data)
        if self.copied > MAX_COPY_BYTES:
            self.copy = None

    def on_end(self, data: bytes) -> None:
        if self.over:
            return
        ex, self.up = self.ex, None
        if self.scanner is not None:
            data = (self.scanner.feed(data, time.perf_counter()) if data else b"") + self.scanner.rest()
        elif self.copy is not None and data:
            self._copy(data)
        self.conn.finish(data)  # the last bytes and the end of the response in one write
        if ex is not None:
            if (s := self.scanner) is not None:
                ex.first_token, ex.gaps, ex.usage = s.first_token, s.gaps, s.usage
            else:
                ex.first_token = time.perf_counter()
                if self.copy is not None:
                    ex.usage = usage_of(parse_json_object(b"".join(self.copy)))
            if ex.status >= 500:
                ex.outcome = f"upstream_{ex.status}"
        self._over()

    def on_fail(self, exc: BaseException | None, responded: bool) -> None:
        if self.over:
            return
        up, self.up = self.up, None
        if (
            not responded
            and up is not None
            and up.reused
            and not self.retried
            and self.wire is not None
            and not isinstance(exc, TimeoutError)
        ):
            self.retried = True  # the engine closed an idle keep-alive connection: once more, fresh
            self._connect_later()
            return
        if not responded:
            self.tap.stats[f"upstream_{type(exc).__name__ if exc is not None else 'closed'}"] += 1
            self._outcome("upstream_unreachable")
            host, port, _ = self.target.key
            self.conn.send_whole(502, error_body(f"upstream {host}:{port} unreachable", "bad_gateway"))
        else:
            # upstream died mid-stream: cut the client connection too rather than end the stream cleanly
            self._outcome("upstream_broken")
            log.debug("upstream stream broke: %r", exc)
            self.conn.abort()
        self._over()

    # ---------------------------------------------------------------- client side events
    def client_lost(self) -> None:
        if self.over:
            return
        self._outcome("client_disconnect")
        if self.up is not None:
            self.up.abort()  # closes the upstream request; the connection is not reused
        if self.task is not None:
            self.task.cancel()
        self._over()

    def drain(self, resume: bool) -> None:
        if self.up is not None:
            self.up.pause(not resume)

    def _outcome(self, outcome: str) -> None:
        if self.ex is not None:
            self.ex.outcome = outcome
        else:
            self.tap.stats[outcome] += 1

    def _over(self) -> None:
        self.over = True
        self.wire = None
        if self.ex is not None:
            if self.doc is not None:  # it never got upstream: still name its tenant
                self.tap.identify(self.ex, self.req, self.doc)
                self.doc = None
            self.tap.account(self.ex)
