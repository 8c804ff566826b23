"""read_exposition against real local aiohttp servers: every failure maps to a stable reason."""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from kvscope.agent.scrape.fetch import ScrapeError, new_session, read_exposition

BODY = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 3.0\n'
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _serve(handler: Handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}/metrics"


def scrape(handler: Handler, timeout_s: float = 60.0, max_bytes: int = 1 << 20):
    """Serve `handler`, scrape it once, stop the server; returns the Payload or raises ScrapeError.
    The default deadline is a hang guard only (a scrape ends at the reply); tests of the timeout
    itself pass a short one to a handler that never answers in time."""

    async def main():
        runner, url = await _serve(handler)
        try:
            async with new_session() as session:
                return await read_exposition(session, url, timeout_s, max_bytes)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def reason_of(handler: Handler, **kw) -> str:
    with pytest.raises(ScrapeError) as info:
        scrape(handler, **kw)
    return info.value.reason


def test_read_exposition_returns_text():
    async def ok(request):
        return web.Response(text=BODY, content_type="text/plain")

    payload = scrape(ok)
    assert payload.text == BODY
    assert payload.openmetrics is False


def test_read_exposition_recognizes_openmetrics_content_type():
    async def om(request):
        return web.Response(
            body=(BODY + "# EOF\n").encode(),
            headers={"Content-Type": "application/openmetrics-text; version=1.0.0; charset=utf-8"},
        )

    assert scrape(om).openmetrics is True


def test_read_exposition_sends_accept_and_timeout_headers():
    seen = {}

    async def echo(request):
        seen.update(request.headers)
        return web.Response(text=BODY)

    scrape(echo, timeout_s=59.5)  # generous: a stalled box must not time the scrape out
    assert "text/plain;version=0.0.4" in seen["Accept"]
    assert seen["X-Prometheus-Scrape-Timeout-Seconds"] == "59.5"


@pytest.mark.parametrize("status", [404, 500, 503])
def test_read_exposition_reports_http_status(status):
    async def fail(request):
        return web.Response(status=status, text="no")

    assert reason_of(fail) == f"http_{status}"


def test_read_exposition_times_out_on_a_hanging_target():
    async def hang(request):
        await asyncio.sleep(30)
        return web.Response(text=BODY)

    assert reason_of(hang, timeout_s=0.3) == "timeout"


def test_read_exposition_timeout_covers_a_slow_body():
    async def dribble(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(50):
            await resp.write(b"# slow\n")
            await asyncio.sleep(0.05)
        return resp

    assert reason_of(dribble, timeout_s=0.5) == "timeout"


def test_read_exposition_refuses_a_declared_large_body():
    async def big(request):
        return web.Response(body=b"x 1\n" * 100_000)

    assert reason_of(big, max_bytes=64 * 1024) == "body_too_large"


def test_read_exposition_caps_a_streamed_body_without_length():
    async def stream(request):
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for _ in range(100):
            await resp.write(b"a 1\n" * 4096)
        return resp

    assert reason_of(stream, max_bytes=256 * 1024) == "body_too_large"


def test_read_exposition_counts_decompressed_bytes_against_the_cap():
    raw = b"a 1\n" * 250_000  # 1 MB that gzips to a few KB
    packed = gzip.compress(raw)
    assert len(packed) < 64 * 1024

    async def bomb(request):
        return web.Response(body=packed, headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"})

    assert reason_of(bomb, max_bytes=512 * 1024) == "body_too_large"


def test_read_exposition_decompresses_gzip():
    async def gz(request):
        return web.Response(
            body=gzip.compress(BODY.encode()), headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"}
        )

    assert scrape(gz).text == BODY


def test_read_exposition_reports_non_utf8():
    async def latin(request):
        return web.Response(body=b'm{a="\xff"} 1\n', content_type="text/plain")

    assert reason_of(latin) == "decode_error"


def test_read_exposition_reports_a_dropped_connection():
    async def drop(request):
        request.transport.close()
        await asyncio.sleep(0.1)
        return web.Response(text=BODY)

    assert reason_of(drop) in ("server_disconnected", "payload_error")


def test_read_exposition_reports_connection_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the scrape: nothing listens there

    async def main():
        async with new_session() as session:
            await read_exposition(session, f"http://127.0.0.1:{port}/metrics", 1.0, 1024)

    with pytest.raises(ScrapeError) as info:
        asyncio.run(main())
    assert info.value.reason == "connection_refused"


def test_read_exposition_does_not_follow_redirects():
    async def moved(request):
        raise web.HTTPFound("/elsewhere")

    assert reason_of(moved) == "http_302"


def test_a_prometheus_client_server_answers_in_text_format():
    """vLLM serves /metrics with prometheus_client, which picks the format from our Accept."""
    from prometheus_client import CollectorRegistry, Counter
    from prometheus_client.exposition import choose_encoder

    registry = CollectorRegistry()
    Counter("vllm:prompt_tokens", "Prompt tokens.", registry=registry).inc(7)

    async def negotiated(request):
        encoder, ctype = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(registry), headers={"Content-Type": ctype})

    payload = scrape(negotiated)
    assert payload.openmetrics is False
    assert "vllm:prompt_tokens_total 7.0" in payload.text and "# EOF" not in payload.text


def test_a_payload_the_reader_fails_on_costs_only_its_own_target():
    """Two real HTTP targets serving a real vLLM payload; reading target b's payload raises (a
    reader bug, forced here by a subclass): a stays up with its series, b is down with reason
    parse_<error>, counted; before, the whole collection raised and both were lost every cycle."""
    from pathlib import Path

    from kvscope.agent.collectors.engine import EngineCollector
    from kvscope.agent.config import build_config

    body = (Path(__file__).parents[1] / "fixtures" / "scrapes" / "vllm-0.11.0-rendered.txt").read_text()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=body)

    async def main():
        (ra, url_a), (rb, url_b) = await _serve(handler), await _serve(handler)

        class Broken(EngineCollector):
            def _normalize(self, scrape, engine, deadline):
                if scrape.target.url == url_b:
                    raise IndexError("reader bug on this payload")
                return super()._normalize(scrape, engine, deadline)

        try:
            coll = Broken(build_config({"targets": [{"url": url_a}, {"url": url_b}]}, environ={}))
            try:
                return await coll.collect(), coll.config.targets
            finally:
                await coll.close()
        finally:
            await ra.cleanup()
            await rb.cleanup()

    out, (a, b) = asyncio.run(main())
    health = {h.target: h for h in out.health}
    assert health[a.instance].up and health[a.instance].series > 0
    assert {s.label("instance") for s in out.samples} == {a.instance}
    assert not health[b.instance].up and health[b.instance].reason == "parse_IndexError"
    assert health[b.instance].errors == {"parse_IndexError": 1}
