"""Fetch one /metrics payload over HTTP with hard bounds on time and size.

`read_exposition` is the only network read of an exposition in kvscope. It never hangs and never
buffers more than `max_bytes`: the timeout covers connect, headers and the whole body, and the
body is streamed and abandoned as soon as it passes the cap (decompressed bytes are counted, so
a gzip bomb is capped too). Every failure becomes a `ScrapeError` whose `reason` is a short
stable token, used as the `reason` label of `kvscope_scrape_errors_total`:

    timeout, connection_refused, connect_error, dns_error, server_disconnected, payload_error,
    http_<status> (http_503...), body_too_large, decode_error, invalid_url, http_protocol_error

The HTTP/1.1 client is agent/scrape/httpclient.py (llhttp via httptools, keep-alive per target); a
redirect is not followed (it is reported as http_30x).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from kvscope.agent.scrape.httpclient import FetchError, HttpClient

ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
"""Ask for text 0.0.4 only (the parser reads OpenMetrics too, if a server sends it anyway).
prometheus_client, which vLLM and SGLang serve /metrics with, switches to OpenMetrics whenever
the Accept header mentions it, whatever its q; its OpenMetrics output adds a `_created` line per
counter and histogram series and (0.26) spells `vllm:x` as `vllm_x`."""


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
    openmetrics: bool  # the server said application/openmetrics-text
    size_bytes: int
    duration_s: float


async def read_exposition(session: HttpClient, url: str, timeout_s: float, max_bytes: int) -> Payload:
    """GET `url` and return its decoded body. Raises ScrapeError(reason) on any failure."""
    start = time.monotonic()
    headers = (("Accept", ACCEPT), ("X-Prometheus-Scrape-Timeout-Seconds", f"{timeout_s:g}"))
    try:
        async with asyncio.timeout(timeout_s):
            reply = await session.get(url, headers, max_bytes)
    except TimeoutError:
        raise ScrapeError("timeout", f"no complete response within {timeout_s:g}s") from None
    except FetchError as e:
        raise ScrapeError(e.reason, e.detail) from None
    except OSError as e:  # a write on a connection the peer reset
        raise ScrapeError("server_disconnected", str(e)[:200]) from None
    try:
        text = reply.body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ScrapeError("decode_error", f"not UTF-8 at byte {e.start}") from None
    return Payload(
        text=text,
        openmetrics=reply.content_type.startswith("application/openmetrics-text"),
        size_bytes=len(reply.body),
        duration_s=time.monotonic() - start,
    )


def new_session() -> HttpClient:
    """A scrape client: keep-alive connections per target, no cookies, no proxies, no redirects."""
    return HttpClient()
