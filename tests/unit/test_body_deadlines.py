"""Issue 41, request bodies: a client that sends a request head and then trickles the body one
byte at a time is cut off `request_timeout_s` after the head (408, connection closed, counted
as `request_timeout`) by every aiohttp listener, while other requests are served. Real servers
(the OTLP receiver in-process, the agent API, a real `kvscope serve` process) on ephemeral ports,
real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys

import aiohttp

from kvscope.agent.api import AgentServer
from kvscope.agent.config import build_config
from kvscope.agent.runtime import AgentRuntime

BODY = 400  # bytes declared; at one every 0.5 s the trickle would last 200 s
HANG_GUARD_S = 150  # only turns a hang into a failure; the deadline under test is 1 s


async def _trickle(port: int, head: bytes) -> bytes:
    """Send `head`, then one body byte every 0.5 s until the server closes; all it answered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)

    async def drip() -> None:
        with contextlib.suppress(OSError):
            for _ in range(BODY):
                await asyncio.sleep(0.5)
                writer.write(b"x")
                await writer.drain()

    dripping = asyncio.create_task(drip())
    try:
        return await asyncio.wait_for(reader.read(), HANG_GUARD_S)
    finally:
        dripping.cancel()
        writer.close()


def _post_head(path: str, content_type: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nContent-Length: {BODY}\r\n\r\n"
    ).encode()


def test_otlp_receiver_cuts_off_a_trickled_body_and_serves_others_meanwhile():
    from kvscope.agent.traces.receiver import OtlpTraceReceiver, parse_otlp_config

    config = build_config({"server": {"request_timeout_s": "1s"}}, environ={}, flags=[])
    config.extensions["otlp"] = parse_otlp_config({"listen": "127.0.0.1:0"})
    receiver = OtlpTraceReceiver(config)

    async def main():
        await receiver.start()
        try:
            slow = asyncio.create_task(_trickle(receiver.port, _post_head("/v1/traces", "application/json")))
            await asyncio.sleep(0.2)
            async with aiohttp.ClientSession() as s:
                url = f"http://127.0.0.1:{receiver.port}/v1/traces"
                async with s.post(
                    url, data=b'{"resourceSpans": []}', headers={"Content-Type": "application/json"}
                ) as r:
                    meanwhile = r.status
            answer = await slow
            return meanwhile, answer, (await receiver.collect()).health[0].closed
        finally:
            await receiver.stop()

    meanwhile, answer, closed = asyncio.run(main())
    assert meanwhile == 200
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout_s" in answer, answer[:300]
    assert closed["request_timeout"] == 1, closed


def test_agent_api_bounds_a_trickled_body_too():
    """The agent's routes take no body: a declared one is refused at once (413), a chunked one is
    never read; either way the connection ends instead of lasting as long as the trickle."""
    doc = {"server": {"request_timeout_s": "1s"}}

    async def main():
        server = AgentServer(AgentRuntime(build_config(doc, environ={}, flags=[]), [], None))
        port = await server.start("127.0.0.1", 0)
        try:
            chunked = b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1000\r\n"
            return await asyncio.gather(
                _trickle(port, _post_head("/api/v1/samples", "text/plain").replace(b"POST", b"GET")),
                _trickle(port, chunked),
            )
        finally:
            await server.stop()

    declared, chunked = asyncio.run(main())
    assert declared.startswith(b"HTTP/1.1 413"), declared[:200]
    assert chunked.startswith(b"HTTP/1.1 "), chunked[:200]


def test_kvscope_serve_cuts_off_a_trickled_webhook_and_accepts_others_meanwhile(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvscope", "serve", "--listen", "127.0.0.1:0", "--store", ":memory:",
         "--prometheus", "http://127.0.0.1:9", "--request-timeout", "1s"],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        port = None
        for line in proc.stderr:
            if m := re.search(r"listening on http://127.0.0.1:(\d+)", line):
                port = int(m.group(1))
                break
        assert port, "kvscope serve did not start"
        webhook = {"version": "4", "status": "firing", "receiver": "kvscope", "groupKey": "g", "alerts": []}

        async def main():
            slow = asyncio.create_task(_trickle(port, _post_head("/api/v1/alerts", "application/json")))
            await asyncio.sleep(0.2)
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{port}/-/healthy") as r:
                    healthy = r.status
                async with s.post(f"http://127.0.0.1:{port}/api/v1/alerts", data=json.dumps(webhook)) as r:
                    accepted = r.status, await r.text()
            answer = await slow
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                    metrics = await r.text()
            return healthy, accepted, answer, metrics

        healthy, accepted, answer, metrics = asyncio.run(main())
    finally:
        proc.terminate()
        log = proc.stderr.read()
        proc.wait(60)
        proc.stderr.close()
    assert healthy == 200
    assert accepted[0] in (200, 400), accepted  # answered (an empty alert list may be refused as such)
    assert answer.startswith(b"HTTP/1.1 408") and b"kvscope serve" in answer, answer[:300]
    assert "1 client connection(s) closed unserved (request_timeout)" in log, log[-2000:]
    assert 'kvscope_connections_closed_total{reason="request_timeout"} 1' in metrics, metrics


def test_body_tricklers_at_the_cap_are_displaced_by_a_new_connection():
    """Every connection slot held by a client trickling its request body (each sent a whole head):
    a new connection displaces the one whose body has been arriving longest instead of being
    answered 503, and the request on it is served. Before, it was refused until the tricklers'
    request deadline (60 s by default) cut them."""
    from kvscope.agent.traces.receiver import OtlpTraceReceiver, parse_otlp_config

    doc = {"server": {"request_timeout_s": "10m", "max_connections": 3}}
    config = build_config(doc, environ={}, flags=[])
    config.extensions["otlp"] = parse_otlp_config({"listen": "127.0.0.1:0"})
    receiver = OtlpTraceReceiver(config)

    async def main():
        await receiver.start()
        try:
            slow = []
            for _ in range(3):
                slow.append(asyncio.create_task(_trickle(receiver.port, _post_head("/v1/traces", "application/json"))))
                await asyncio.sleep(0.3)  # in order: the first is the one whose body has been arriving longest
            async with aiohttp.ClientSession() as s:
                url = f"http://127.0.0.1:{receiver.port}/v1/traces"
                async with s.post(
                    url, data=b'{"resourceSpans": []}', headers={"Content-Type": "application/json"}
                ) as r:
                    meanwhile = r.status
            first = await asyncio.wait_for(slow[0], HANG_GUARD_S)  # displaced: closed with no answer
            closed = (await receiver.collect()).health[0].closed
            for task in slow[1:]:
                task.cancel()
            return meanwhile, first, closed, [t.done() for t in slow[1:]]
        finally:
            await receiver.stop()

    meanwhile, first, closed, others_done = asyncio.run(main())
    assert meanwhile == 200
    assert first == b"", first[:200]
    assert closed["displaced"] == 1 and closed["max_connections"] == 0, closed
