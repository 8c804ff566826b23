"""Fetch one /metrics payload over HTTP with hard bounds on time and size.

`read_exposition` is the only network read of an exposition in kvscope. It never hangs and never
buffers more than `max_bytes`: the timeout covers connect, headers and the whole body, and the
body is streamed and abandoned as soon as it passes the cap (decompressed bytes are counted, so
a gzip bomb is capped too). Every failure becomes a `ScrapeError` whose `reason` is a short
stable token, used as the `reason` label of `kvscope_scrape_errors_total`:

    timeout, connection_refused, connect_error, dns_error, server_disconnected, payload_error,
    http_<status> (http_503...), body_too_large, decode_error, invalid_url, http_protocol_error,
    client_error
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass

import aiohttp

ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
"""Ask for text 0.0.4 only (the parser reads OpenMetrics too, if a server sends it anyway).
prometheus_client, which vLLM and SGLang serve /metrics with, switches to OpenMetrics whenever
the Accept header mentions it, whatever its q; its OpenMetrics output adds a `_created` line per
counter and histogram series and (0.26) spells `vllm:x` as `vllm_x`."""

_CHUNK = 64 * 1024


class ScrapeError(Exception):
    """A scrape failed; `reason` is a stable token (see the module docstring)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Payload:
    """One successfully read /metrics body."""

    text: str
    openmetrics: bool          # the server said application/openmetrics-text
    size_bytes: int
    duration_s: float


async def read_exposition(session: aiohttp.ClientSession, url: str, timeout_s: float,
                          max_bytes: int) -> Payload:
    """GET `url` and return its decoded body. Raises ScrapeError(reason) on any failure."""
    start = time.monotonic()
    headers = {"Accept": ACCEPT, "X-Prometheus-Scrape-Timeout-Seconds": f"{timeout_s:g}"}
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url, headers=headers, allow_redirects=False) as resp:
                if resp.status != 200:
                    raise ScrapeError(f"http_{resp.status}", resp.reason or "")
                body = await _read_capped(resp, max_bytes)
                ctype = resp.headers.get("Content-Type", "")
    except TimeoutError:
        raise ScrapeError("timeout", f"no complete response within {timeout_s:g}s") from None
    except aiohttp.ClientError as e:
        raise ScrapeError(_client_error_reason(e), str(e)[:200]) from None
    except ValueError as e:  # aiohttp raises it for some malformed URLs
        raise ScrapeError("invalid_url", str(e)[:200]) from None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ScrapeError("decode_error", f"not UTF-8 at byte {e.start}") from None
    return Payload(text=text, openmetrics=ctype.startswith("application/openmetrics-text"),
                   size_bytes=len(body), duration_s=time.monotonic() - start)


async def _read_capped(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    if resp.content_length is not None and resp.content_length > max_bytes:
        raise ScrapeError("body_too_large", f"Content-Length {resp.content_length} > {max_bytes}")
    chunks: list[bytes] = []
    total = 0
    async for chunk in resp.content.iter_chunked(_CHUNK):
        total += len(chunk)
        if total > max_bytes:
            raise ScrapeError("body_too_large", f"more than {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _client_error_reason(e: aiohttp.ClientError) -> str:
    """Map an aiohttp exception to a stable reason token."""
    if isinstance(e, aiohttp.ClientConnectorDNSError):
        return "dns_error"
    if isinstance(e, aiohttp.ClientConnectorError):
        cause = e.os_error
        if isinstance(cause, ConnectionRefusedError):
            return "connection_refused"
        if isinstance(cause, socket.gaierror):
            return "dns_error"
        return "connect_error"
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return "server_disconnected"
    if isinstance(e, aiohttp.ClientPayloadError):
        return "payload_error"
    if isinstance(e, aiohttp.InvalidURL):
        return "invalid_url"
    if isinstance(e, aiohttp.ClientResponseError):
        return "http_protocol_error"
    if isinstance(e, aiohttp.ServerTimeoutError):
        return "timeout"
    return "client_error"


def new_session(max_connections: int = 64) -> aiohttp.ClientSession:
    """A client session for scraping: keep-alive connections, no cookies, no env proxies."""
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=8, ttl_dns_cache=300)
    return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                                 trust_env=False, auto_decompress=True)
