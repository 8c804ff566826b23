"""HTTP/1.1 for the tap on plain asyncio protocols (llhttp via `httptools`; docs/requests.md §2, Hot path).

`Downstream` is one client connection: it parses requests (head and body size capped), hands
each to `on_request(conn, request)`, answers them in order (`send_head`, `send_body`, `finish`,
`send_whole`) and tells the sweeper which timeout applies (`phase`: "head", "body" or "idle",
since `since`; none while `busy`). `UpstreamPool` keeps connections to the engines; an
`Upstream` feeds a response to a `ResponseHandler`. A slow client pauses its upstream.
"""

from __future__ import annotations

import asyncio
import http
import ipaddress
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httptools

from kvscope.agent.serve.limits import linger
from kvscope.core.resolve import ThreadResolver

MAX_HEADER_BYTES = 64 << 10
HOP_BY_HOP = frozenset(
    b"connection keep-alive proxy-authenticate proxy-authorization te trailers transfer-encoding upgrade "
    b"host content-length expect proxy-connection".split()
)
_REASONS = {s.value: s.phrase.encode() for s in http.HTTPStatus}


class Headers(dict):
    """Request headers by lower-cased name (last value wins); `get` ignores case."""

    def get(self, key: str, default: Any = None) -> Any:
        return dict.get(self, key.lower(), default)


@dataclass(slots=True)
class Request:
    """One complete client request; `target` is its path and query as sent."""

    method: str
    target: bytes
    raw_headers: list[tuple[bytes, bytes]]
    body: bytes
    keep_alive: bool
    http11: bool
    path: str = field(init=False)
    headers: Headers = field(init=False)

    def __post_init__(self) -> None:
        self.path = self.target.split(b"?", 1)[0].decode("latin-1")
        self.headers = Headers({k.decode("latin-1").lower(): v.decode("latin-1") for k, v in self.raw_headers})


class ResponseHandler(Protocol):
    """What an `Upstream` tells about the response to the request it carries."""

    def on_head(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]) -> None: ...
    def on_body(self, data: bytes) -> None: ...
    def on_end(self, data: bytes) -> None: ...  # data: the last body bytes (b"" if none)
    def on_fail(self, exc: BaseException | None, responded: bool) -> None: ...


class Downstream(asyncio.Protocol):
    """One client connection (server side)."""

    def __init__(
        self, on_request: Callable[[Downstream, Request], None], registry: set[Downstream], max_body: int
    ) -> None:
        self.on_request = on_request
        self.registry = registry
        self.max_body = max_body
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.phase = "head"  # "head", "body" or "idle": what the connection waits for
        self.since = time.monotonic()  # when that wait began (see the module docstring)
        self.busy = False  # a response is being written
        self.on_lost: Callable[[], None] | None = None  # set by whoever answers the current request
        self.on_drain: Callable[[bool], None] | None = None  # called with False on pause, True on resume
        self._pending: deque[Request] = deque()
        self._reset()
        self._head: bytes | None = None
        self._chunked = False
        self._close_after = False
        self._discard = False  # lingering after an error answer: reads are dropped

    def _reset(self) -> None:
        self._url = b""
        self._hdrs: list[tuple[bytes, bytes]] = []
        self._hsize = 0
        self._body: list[bytes] = []
        self._bsize = 0
        self._began = False  # a byte of the current request has arrived
        self._error: tuple[int, str] | None = None

    # ---------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.registry.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.registry.discard(self)
        self.transport = None
        self._pending.clear()
        if self.busy and self.on_lost is not None:
            cb, self.on_lost = self.on_lost, None
            cb()

    def data_received(self, data: bytes) -> None:
        if self._discard:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self.busy:  # the request went upstream without its Upgrade: no switch
                self._close_after = True
                if self.transport is not None:
                    self.transport.pause_reading()
                return
            self._error = self._error or (501, "protocol upgrade is not supported by the tap")
        except (httptools.HttpParserError, httptools.HttpParserCallbackError):
            self._error = self._error or (400, "malformed HTTP request")
        if self._error is not None:
            if self.transport is not None:
                self.transport.pause_reading()
            if not self.busy:
                self._reject()

    def pause_writing(self) -> None:
        if self.on_drain is not None:
            self.on_drain(False)

    def resume_writing(self) -> None:
        if self.on_drain is not None:
            self.on_drain(True)

    # ---------------------------------------------------------------- httptools callbacks
    def on_message_begin(self) -> None:
        self._began = True
        if self.phase == "idle":  # a fresh connection's head timer runs from the accept
            self.phase, self.since = "head", time.monotonic()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._hsize += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._hsize += len(name) + len(value)
        if self._hsize > MAX_HEADER_BYTES:
            self._error = (431, "request header fields too large")
            raise ValueError("headers too large")
        self._hdrs.append((name, value))

    def on_headers_complete(self) -> None:
        self.phase = "body"
        for k, v in self._hdrs:
            lk = k.lower()
            if lk == b"content-length" and v.strip().isdigit() and int(v) > self.max_body:
                self._error = (413, f"request body over {self.max_body} bytes")
                raise ValueError("body too large")
            if lk == b"expect" and v.strip().lower() == b"100-continue" and self.transport is not None:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._bsize += len(body)
        if self._bsize > self.max_body:
            self._error = (413, f"request body over {self.max_body} bytes")
            raise ValueError("body too large")
        self._body.append(body)

    def on_message_complete(self) -> None:
        p = self.parser
        req = Request(
            p.get_method().decode("latin-1"),
            self._url,
            self._hdrs,
            b"".join(self._body),
            p.should_keep_alive(),
            p.get_http_version() == "1.1",
        )
        self._reset()
        self.phase = "idle"
        if self.busy or self._pending:
            self._pending.append(req)  # pipelined: read no further until its turn
            if self.transport is not None:
                self.transport.pause_reading()
            return
        self._dispatch(req)

    # ---------------------------------------------------------------- answering
    def _dispatch(self, req: Request) -> None:
        self.busy = True
        self._close_after = not req.keep_alive
        self._http11 = req.http11
        self._head_request = req.method == "HEAD"
        self.on_request(self, req)

    def send_head(
        self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]], length: int | None, has_body: bool = True
    ) -> None:
        """Start the response; it goes out with the first body bytes (or at `finish`).

        `length` None means the body length is unknown: chunked for HTTP/1.1 clients, else the
        connection is closed at the end."""
        out = [b"HTTP/1.1 %d %s\r\n" % (status, reason or _REASONS.get(status, b"Unknown"))]
        out.extend(b"%s: %s\r\n" % kv for kv in headers)
        self._chunked = length is None and has_body and not self._head_request and self._http11
        if length is not None:
            out.append(b"Content-Length: %d\r\n" % length)
        elif self._chunked:
            out.append(b"Transfer-Encoding: chunked\r\n")
        elif has_body and not self._head_request:
            self._close_after = True
        if self._close_after:
            out.append(b"Connection: close\r\n")
        out.append(b"\r\n")
        self._head = b"".join(out)

    def send_body(self, data: bytes) -> None:
        """Pass body bytes on now (framed as the head said)."""
        if self.transport is None or not data or self._head_request:
            return
        if self._chunked:
            data = b"%x\r\n%s\r\n" % (len(data), data)
        if self._head is not None:
            data, self._head = self._head + data, None
        self.transport.write(data)

    def finish(self, data: bytes = b"") -> None:
        """End the response, its last body bytes `data` in the same write as the end marker (one
        system call and one wake-up of the client instead of two); keep the connection for the next
        request unless it must close."""
        tr = self.transport
        self.on_lost = self.on_drain = None
        self.busy = False
        if tr is None:
            return
        if tail := self._last_write(data):
            tr.write(tail)
        self.since = time.monotonic()  # the idle (or the next head's) timer starts now
        if self._close_after and self._error is not None:
            linger(tr)
            self._discard = True
        elif self._close_after:
            tr.close()
        elif self._error is not None:
            self._reject()
        elif self._pending:
            self._dispatch(self._pending.popleft())
            if not self._pending and self.transport is not None:
                self.transport.resume_reading()

    def _last_write(self, data: bytes) -> bytes:
        """The response's last bytes on the wire: `data` (none for HEAD), chunked with the end
        marker when chunked, after a head not yet written."""
        if self._head_request:
            data = b""
        if self._chunked:
            tail = b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data) if data else b"0\r\n\r\n"
        else:
            tail = data
        if self._head is not None:
            tail, self._head = self._head + tail, None
        return tail

    def abort(self) -> None:
        """Cut the connection without ending the response (the client sees a broken stream)."""
        self.on_lost = self.on_drain = None
        self.busy = False
        if self.transport is not None:
            self.transport.abort()

    def send_whole(self, status: int, body: bytes, content_type: bytes = b"application/json") -> None:
        """A complete response with a body the tap made itself."""
        self.send_head(status, b"", [(b"Content-Type", content_type)], len(body))
        self.send_body(body)
        self.finish()

    def time_out(self) -> None:
        """The request did not arrive in time: 408 when part of it came, else just close."""
        if self.transport is None or self.busy:
            return
        if not self._began:
            self.transport.close()
            return
        self._error = (408, f"request not received in time ({self.phase})")
        self.transport.pause_reading()
        self._reject()

    def _reject(self) -> None:
        status, message = self._error or (400, "bad request")
        self.busy = True
        self._close_after = True
        self._http11 = True
        self._head_request = False
        self.send_whole(status, error_body(message))


class Upstream(asyncio.Protocol):
    """One keep-alive connection to an engine; carries one request at a time."""

    def __init__(self, pool: UpstreamPool, key: tuple[str, int, bool]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.handler: ResponseHandler | None = None
        self.last_active = time.monotonic()  # set per request; the sweeper advances it while `reads` moves
        self.reads = 0  # reads so far (cheaper per read than a clock call)
        self.swept_reads = 0  # `reads` at the sweeper's last look
        self.reused = False
        self.paused = False
        self._head_only = False
        self._begin()

    def _begin(self) -> None:
        self._body: list[bytes] = []  # body pieces of the current read, passed on together
        self._hdrs: list[tuple[bytes, bytes]] = []
        self._reason = b""
        self._framed = False  # Content-Length or chunked: the end is known without EOF
        self.responded = False

    def send(self, handler: ResponseHandler, data: bytes, head_only: bool) -> None:
        """Write a complete request; its response goes to `handler`."""
        self.handler = handler
        self._head_only = head_only
        self.last_active = time.monotonic()
        self._begin()
        self.transport.write(data)  # type: ignore[union-attr]

    def pause(self, paused: bool) -> None:
        """Stop (or resume) reading the response: the client it goes to is not keeping up."""
        if paused != self.paused and self.transport is not None and not self.transport.is_closing():
            self.paused = paused
            (self.transport.pause_reading if paused else self.transport.resume_reading)()

    def abort(self) -> None:
        self.handler = None
        if self.transport is not None:
            self.transport.abort()

    # ---------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserCallbackError) as e:
            self._fail(e)
            return
        # the body bytes of this read go to the handler at once: one write to the client per
        # upstream read, however many chunks of the upstream's framing it held
        if self._body and self.handler is not None:
            self.handler.on_body(self._take_body())

    def _take_body(self) -> bytes:
        body = self._body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        return data

    def active_since(self, now: float) -> float:
        """When this connection last moved: per sweep, a connection that read anything since the
        previous sweep counts as active now (`now`)."""
        if self.reads != self.swept_reads:
            self.swept_reads = self.reads
            self.last_active = now
        return self.last_active

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.discard(self)
        self.transport = None
        h = self.handler
        if h is None:
            return
        data, self.handler = self._take_body(), None
        if self.responded and not self._framed and exc is None:
            h.on_end(data)  # a response delimited by closing the connection
            return
        if data:
            h.on_body(data)
        h.on_fail(exc, self.responded)

    def fail_timeout(self) -> None:
        self._fail(TimeoutError("upstream read timeout"))

    def _fail(self, exc: BaseException) -> None:
        h, self.handler = self.handler, None
        if self.transport is not None:
            self.transport.abort()
        if h is not None:
            h.on_fail(exc, self.responded)

    # ---------------------------------------------------------------- httptools callbacks
    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._hdrs.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200 or self.handler is None:
            return
        for k, v in self._hdrs:
            lk = k.lower()
            if lk == b"content-length" or lk == b"transfer-encoding" and b"chunked" in v.lower():
                self._framed = True
        self.responded = True
        self.handler.on_head(status, self._reason, self._hdrs)
        if self._head_only:  # a HEAD response has no body whatever its headers say
            self._framed = True
            self.on_message_complete(head_only=True)

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self, head_only: bool = False) -> None:
        if self.parser.get_status_code() < 200 and not head_only:
            self._begin()
            return
        h, self.handler = self.handler, None
        data = self._take_body()
        if h is None:
            return
        h.on_end(data)
        if not head_only and self.parser.should_keep_alive():
            self.pool.release(self)
        elif self.transport is not None:
            self.transport.close()


class UpstreamPool:
    """Keep-alive connections per (host, port, TLS): idle ones are reused, at most `max_idle` kept each."""

    def __init__(self, connect_timeout_s: float = 10.0, max_idle: int = 1024) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle
        self.resolver = ThreadResolver()  # not the loop's: a lookup that hangs holds neither its executor nor its close
        self.idle: dict[tuple[str, int, bool], list[Upstream]] = {}
        self.busy: set[Upstream] = set()

    def take_idle(self, key: tuple[str, int, bool]) -> Upstream | None:
        """An idle open connection to key, or None."""
        idle = self.idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.transport is not None and not conn.transport.is_closing():
                conn.reused = True
                self.busy.add(conn)
                return conn
        return None

    async def connect(self, key: tuple[str, int, bool]) -> Upstream:
        """A new connection to key, the name looked up and every address tried within the connect
        timeout (raises OSError / TimeoutError when it cannot be had)."""
        _, conn = await asyncio.wait_for(self._dial(key), self.connect_timeout_s)
        self.busy.add(conn)
        return conn

    async def _dial(self, key: tuple[str, int, bool]) -> tuple[asyncio.BaseTransport, Upstream]:
        host, port, tls = key
        loop = asyncio.get_running_loop()
        try:
            addresses = [str(ipaddress.ip_address(host))]
        except ValueError:  # a name
            found = await self.resolver.resolve(host, port, socket.AF_UNSPEC)
            addresses = list(dict.fromkeys(str(r["host"]) for r in found))
        error: OSError | None = None
        for address in addresses:
            try:
                return await loop.create_connection(
                    lambda: Upstream(self, key),
                    address,
                    port,
                    ssl=True if tls else None,
                    server_hostname=host if tls else None,
                )
            except OSError as exc:
                error = exc
        raise error or OSError(f"no address for {host}")

    def release(self, conn: Upstream) -> None:
        self.busy.discard(conn)
        conn.pause(False)
        idle = self.idle.setdefault(conn.key, [])
        if len(idle) < self.max_idle:
            idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()

    def discard(self, conn: Upstream) -> None:
        self.busy.discard(conn)
        idle = self.idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def close(self) -> None:
        """Close every connection, idle or busy."""
        for conn in [c for idle in self.idle.values() for c in idle] + list(self.busy):
            if conn.transport is not None:
                conn.transport.abort()
        self.idle.clear()
        self.busy.clear()


def filter_headers(raw: list[tuple[bytes, bytes]], drop: frozenset[bytes] = HOP_BY_HOP) -> list[tuple[bytes, bytes]]:
    """Headers minus `drop` (lower-case names) and those a Connection header names (pure)."""
    named = {t.strip().lower() for k, v in raw if k.lower() == b"connection" for t in v.split(b",")}
    return [(k, v) for k, v in raw if (lk := k.lower()) not in drop and lk not in named]


def render_request(method: str, target: bytes, host: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    """The request as bytes on the wire (body with Content-Length)."""
    out = [b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (method.encode(), target, host)]
    out.extend(b"%s: %s\r\n" % kv for kv in headers)
    if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        out.append(b"Content-Length: %d\r\n" % len(body))
    out += (b"\r\n", body)
    return b"".join(out)


def error_body(message: str, kind: str = "invalid_request") -> bytes:
    """An OpenAI-style JSON error body naming the tap."""
    return b'{"error":{"message":"kvscope tap: %s","type":"%s"}}' % (message.encode(), kind.encode())
