"""A small HTTP/1.1 GET client for scrapes: asyncio protocols, llhttp parsing, keep-alive per target.

Why not aiohttp: a scrape is one GET of one body on a connection that stays open, and a general
client's per-request objects (request and response classes, stream readers, timers, header
multidicts) cost more CPU than parsing the reply (bench/agent_vs_prometheus.py measured the
difference). Here `httptools` (llhttp) cuts the reply into status, headers and body callbacks,
the body is collected in a list of chunks, and one future per request wakes the caller.

Bounds: the caller's `asyncio.timeout` covers connect, headers and body (the connection is
dropped when it fires); the body is capped on decompressed bytes (gzip/deflate are inflated in
slices of at most the remaining room, so a small bomb never expands past the cap); at most
`max_idle` idle connections are kept per target; a reply header block over 64 KiB is refused.

Failures raise `FetchError` with the same reason tokens as agent/scrape/fetch.py documents.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import zlib
from collections.abc import Iterable
from urllib.parse import urlsplit

import httptools

MAX_HEADER_BYTES = 64 << 10


class FetchError(Exception):
    """A GET failed; `reason` is a scrape reason token (agent/scrape/fetch.py)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class Reply:
    """A complete 200 reply: its body (decompressed) and Content-Type."""

    __slots__ = ("body", "content_type")

    def __init__(self, body: bytes, content_type: str) -> None:
        self.body = body
        self.content_type = content_type


class _Conn(asyncio.Protocol):
    """One keep-alive connection; carries one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.waiter: asyncio.Future[Reply] | None = None
        self.max_bytes = 0
        self._reset()

    def _reset(self) -> None:
        self.got_bytes = False
        self.status_reason = b""
        self.ctype = b""
        self.encoding = b""
        self.length: int | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.inflate: zlib._Decompress | None = None
        self.chunked = False
        self.error: FetchError | None = None  # raised inside a parser callback
        self.head_bytes = 0
        self.in_headers = True
        self.reusable = False

    # -- transport callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            if self.got_bytes and not self.in_headers and self.length is None and not self.chunked:
                self._complete()  # a body delimited by the end of the connection
            else:
                reason = "payload_error" if self.got_bytes and not self.in_headers else "server_disconnected"
                self._fail(FetchError(reason, "connection closed before the reply was complete"))

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        if self.waiter is None or self.waiter.done():
            self.abort()  # bytes nobody asked for: this connection is out of step
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:  # a callback's FetchError arrives wrapped in it
            self._fail(self.error or FetchError("http_protocol_error", str(e)[:200]))
            return
        if self.in_headers:  # still no end of the header block
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEADER_BYTES:
                self._fail(FetchError("http_protocol_error", "reply headers over 64 KiB"))

    # -- parser callbacks
    def on_status(self, status: bytes) -> None:
        self.status_reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.lower()
        if key == b"content-type":
            self.ctype = value
        elif key == b"content-encoding":
            self.encoding = value.strip().lower()
        elif key == b"transfer-encoding":
            self.chunked = b"chunked" in value.lower()
        elif key == b"content-length":
            try:
                self.length = int(value)
            except ValueError:
                self.length = None

    def on_headers_complete(self) -> None:
        self.in_headers = False
        status = self.parser.get_status_code()
        if status != 200:
            self._stop(FetchError(f"http_{status}", self.status_reason.decode("latin-1")[:200]))
        if self.length is not None and self.length > self.max_bytes and not self.encoding:
            self._stop(FetchError("body_too_large", f"Content-Length {self.length} > {self.max_bytes}"))
        if self.encoding in (b"gzip", b"x-gzip"):
            self.inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif self.encoding == b"deflate":
            self.inflate = zlib.decompressobj()
        elif self.encoding not in (b"", b"identity"):
            self._stop(FetchError("payload_error", f"unsupported Content-Encoding {self.encoding.decode('latin-1')}"))

    def on_body(self, body: bytes) -> None:
        if self.inflate is None:
            self._take(body)
            return
        try:
            d = self.inflate
            self._take(d.decompress(body, self.max_bytes - self.size + 1))
            while d.unconsumed_tail:
                self._take(d.decompress(d.unconsumed_tail, self.max_bytes - self.size + 1))
        except zlib.error as e:
            self._stop(FetchError("payload_error", f"cannot inflate the body: {e}"))

    def on_message_complete(self) -> None:
        self.reusable = self.parser.should_keep_alive()
        self._complete()

    # -- helpers
    def _stop(self, error: FetchError) -> None:
        """Stop parsing from inside a callback (httptools wraps what it raises)."""
        self.error = error
        raise error

    def _take(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.max_bytes:
            self._stop(FetchError("body_too_large", f"more than {self.max_bytes} bytes"))
        if data:
            self.chunks.append(data)

    def _complete(self) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self.inflate is not None:
            try:
                self._take(self.inflate.flush())
            except FetchError as e:
                self._fail(e)
                return
        waiter.set_result(Reply(b"".join(self.chunks), self.ctype.decode("latin-1")))

    def _fail(self, exc: FetchError) -> None:
        self.reusable = False
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def request(self, data: bytes, max_bytes: int) -> asyncio.Future[Reply]:
        """Send one request; the future resolves to its Reply or fails with FetchError."""
        self._reset()
        self.max_bytes = max_bytes
        self.parser = httptools.HttpResponseParser(self)
        self.waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(data)
        return self.waiter


class HttpClient:
    """Keep-alive GETs to many targets. Use as `async with HttpClient() as c:` or call `close()`."""

    def __init__(self, max_idle: int = 2, user_agent: str = "kvscope") -> None:
        self.max_idle = max_idle
        self.user_agent = user_agent
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._busy: set[_Conn] = set()
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def get(self, url: str, headers: Iterable[tuple[str, str]], max_bytes: int) -> Reply:
        """GET `url`; the caller bounds the time (asyncio.timeout). Raises FetchError."""
        key, request = self._request(url, headers)
        conn = self._take_idle(key)
        if conn is not None:
            try:
                return await self._exchange(key, conn, request, max_bytes)
            except FetchError as e:
                if e.reason != "server_disconnected":
                    raise
                # the target closed the kept-alive connection meanwhile: once more on a new one
        return await self._exchange(key, await self._connect(key), request, max_bytes)

    async def _exchange(self, key: tuple[str, str, int], conn: _Conn, request: bytes, max_bytes: int) -> Reply:
        self._busy.add(conn)
        try:
            reply = await conn.request(request, max_bytes)
        except BaseException:
            conn.abort()  # timeout, cancellation or failure: the connection's state is unknown
            raise
        finally:
            self._busy.discard(conn)
            conn.waiter = None
        if conn.reusable and not conn.closed and not self._closed:
            idle = self._idle.setdefault(key, [])
            if len(idle) < self.max_idle:
                idle.append(conn)
                return reply
        conn.abort()
        return reply

    def _take_idle(self, key: tuple[str, str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    def _request(self, url: str, headers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str, int], bytes]:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as e:
            raise FetchError("invalid_url", str(e)[:200]) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise FetchError("invalid_url", f"not an http(s) URL: {url[:200]}")
        host = parts.hostname
        port = port or (443 if parts.scheme == "https" else 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_header = parts.netloc.rsplit("@", 1)[-1]
        lines = [
            f"GET {target} HTTP/1.1",
            f"Host: {host_header}",
            f"User-Agent: {self.user_agent}",
            "Accept-Encoding: gzip",
        ]
        lines.extend(f"{k}: {v}" for k, v in headers)
        if any(c <= " " or c == "\x7f" for c in target + host_header):
            raise FetchError("invalid_url", f"space or control character in {url[:200]!r}")
        text = "\r\n".join(lines) + "\r\n\r\n"
        try:
            return (parts.scheme, host, port), text.encode("ascii")
        except UnicodeEncodeError:
            raise FetchError("invalid_url", f"non-ASCII request: {url[:200]}") from None

    async def _connect(self, key: tuple[str, str, int]) -> _Conn:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        ctx = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ctx = self._ssl
        try:
            _, conn = await loop.create_connection(_Conn, host, port, ssl=ctx)
        except socket.gaierror as e:
            raise FetchError("dns_error", str(e)[:200]) from None
        except ConnectionRefusedError as e:
            raise FetchError("connection_refused", str(e)[:200]) from None
        except (OSError, ssl.SSLError) as e:
            raise FetchError("connect_error", str(e)[:200]) from None
        return conn

    async def close(self) -> None:
        """Close every connection (idle and in flight)."""
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.abort()
        self._idle.clear()
        for conn in list(self._busy):
            conn.abort()
