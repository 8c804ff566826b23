"""Fetch one /metrics payload over HTTP with hard bounds on time and size.

`read_exposition` is the only network read of an exposition in kvscope. It never hangs and never
buffers more than `max_bytes`: the timeout covers connect, headers and body, and the body is
streamed and abandoned past the cap (decompressed bytes counted, so a gzip bomb is capped too).
Every failure is a `ScrapeError` whose `reason` (the `reason` label of
`kvscope_scrape_errors_total`) is one of: timeout, dns_timeout (the name's lookup had not been
answered when the time was up), connection_refused, connect_error, dns_error,
server_disconnected, payload_error, http_<status>, body_too_large, decode_error, invalid_url,
http_protocol_error. Keep-alive per target; a redirect is not followed (http_30x).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from kvscope.core.net import host_of
from kvscope.core.resolve import Connector, dns_unanswered

ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
"""Ask for text 0.0.4 only (the parser reads OpenMetrics too, if a server sends it anyway).
prometheus_client, which vLLM and SGLang serve /metrics with, switches to OpenMetrics whenever
the Accept header mentions it, whatever its q; its OpenMetrics output adds a `_created` line per
counter and histogram series and (0.26) spells `vllm:x` as `vllm_x`."""
READ_BYTES = 1 << 16


class ScrapeError(Exception):
    """A scrape failed; `reason` is a stable token (see the module docstring)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class Payload:
    """One successfully read /metrics body."""

    text: str
    openmetrics: bool  # the server said application/openmetrics-text


async def read_exposition(session: aiohttp.ClientSession, url: str, timeout_s: float, max_bytes: int) -> Payload:
    """GET `url` and return its decoded body. Raises ScrapeError(reason) on any failure."""
    headers = {"Accept": ACCEPT, "X-Prometheus-Scrape-Timeout-Seconds": f"{timeout_s:g}"}
    try:
        async with asyncio.timeout(timeout_s), session.get(url, headers=headers, allow_redirects=False) as resp:
            ctype = resp.headers.get("Content-Type", "")
            body = await _body(resp, max_bytes)
    except TimeoutError:
        if dns_unanswered(session, host_of(url)):
            raise ScrapeError("dns_timeout", f"the name did not resolve within {timeout_s:g}s") from None
        raise ScrapeError("timeout", f"no complete response within {timeout_s:g}s") from None
    except aiohttp.ClientError as e:
        raise ScrapeError(_reason(e), str(e)[:200]) from None
    except (ValueError, OSError) as e:  # an unparsable URL; a write on a connection the peer reset
        raise ScrapeError("invalid_url" if isinstance(e, ValueError) else "server_disconnected", str(e)[:200]) from None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ScrapeError("decode_error", f"not UTF-8 at byte {e.start}") from None
    return Payload(text, ctype.startswith("application/openmetrics-text"))


async def _body(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    if resp.status != 200:
        raise ScrapeError(f"http_{resp.status}", (resp.reason or "")[:200])
    length = resp.content_length
    if length is not None and length > max_bytes and "Content-Encoding" not in resp.headers:
        raise ScrapeError("body_too_large", f"Content-Length {length} > {max_bytes}")
    chunks, size = [], 0
    while chunk := await resp.content.read(READ_BYTES):
        size += len(chunk)
        if size > max_bytes:
            raise ScrapeError("body_too_large", f"more than {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _reason(e: aiohttp.ClientError) -> str:
    """The reason token of an aiohttp failure."""
    if isinstance(e, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return "invalid_url"
    if isinstance(e, aiohttp.ClientConnectorDNSError):
        return "dns_error"
    if isinstance(e, aiohttp.ClientConnectorError):
        return "connection_refused" if isinstance(e.os_error, ConnectionRefusedError) else "connect_error"
    if isinstance(e, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError):  # e.g. reset by the peer
        return "server_disconnected"
    if isinstance(e, aiohttp.ClientPayloadError):
        return "payload_error"
    if isinstance(e, aiohttp.ClientResponseError):  # a reply aiohttp's parser refused
        return "http_protocol_error"
    return "connect_error"


async def probe_ok(session: aiohttp.ClientSession, url: str, timeout_s: float, max_bytes: int = 64 << 10) -> bool:
    """Whether GET `url` answers 2xx within `timeout_s` (at most `max_bytes` of the body read, then
    discarded). Any failure (timeout, refused, a redirect, a bad URL) is False, never raised."""
    try:
        async with asyncio.timeout(timeout_s), session.get(url, allow_redirects=False) as resp:
            await resp.content.read(max_bytes)
            return 200 <= resp.status < 300
    except (TimeoutError, aiohttp.ClientError, ValueError, OSError):
        return False


def new_session() -> aiohttp.ClientSession:
    """A scrape client: kept-alive connections per target (up to 5 min idle), no connection cap,
    no cookies, no proxies, no redirects; time is bounded by each read's timeout; names looked up
    on bounded threads of their own (core/resolve.py)."""
    return aiohttp.ClientSession(
        connector=Connector(limit=0, keepalive_timeout=300),
        timeout=aiohttp.ClientTimeout(total=None),
        cookie_jar=aiohttp.DummyCookieJar(),
        headers={"User-Agent": "kvscope"},
        max_field_size=64 << 10,
    )
