"""The tap's HTTP/1.1 handling (agent/tap/http1.py, forward.py) against local stub upstreams."""

import asyncio
import json
import socket
import subprocess
import sys

import aiohttp
import pytest

from kvscope.agent.tap import eventloop
from kvscope.agent.tap.http1 import filter_headers
from kvscope.agent.tap.proxy import RequestTap, TapConfig, parse_upstream, render_with_usage
from tests.unit.test_tap_proxy import Stub, _raw, run, until

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _exchange(port: int, raw: bytes, until: bytes = b"\x00", timeout_s: float = 60.0) -> bytes:
    """Send raw bytes to the tap; read until `until` appeared once per request sent, or the tap closes.
    `timeout_s` per read is a hang guard only (a loaded box is slow)."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(raw)
    want = max(1, raw.count(b" HTTP/1.1\r\n"))
    buf = b""
    try:
        while buf.count(until) < want:
            data = await asyncio.wait_for(r.read(65536), timeout_s)
            if not data:
                break
            buf += data
    finally:
        w.close()
    return buf


class RawUpstream:
    """An upstream written with plain asyncio, to misbehave in exact ways (test tooling)."""

    def __init__(self, handler):
        self.handler, self.connections, self.requests = handler, 0, []

    async def start(self):
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _conn(self, r, w):
        self.connections += 1
        n = 0
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                length = [int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")]
                body = await r.readexactly(length[0]) if length else b""
                self.requests.append((head, body))
                n += 1
                if not await self.handler(n, head, body, w):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the tap went away, or stop()
        finally:
            w.close()

    async def stop(self):
        self.server.close()


def _with_raw_upstream(handler, scenario, **cfg):
    async def main():
        up = RawUpstream(handler)
        await up.start()
        tap = RequestTap(TapConfig(upstreams=(f"http://127.0.0.1:{up.port}",), listen="127.0.0.1:0", **cfg))
        await tap.start()
        try:
            return await scenario(tap), tap, up
        finally:
            await tap.stop()
            await up.stop()

    return asyncio.run(main())


def test_upstream_connections_are_kept_alive_and_reused():
    async def scenario(s, tap, direct):
        return [await _raw(s, tap, {"model": "m", "prompt": f"p{i}", "stream": i % 2 == 0}) for i in range(6)]

    seen = {}
    out, tap, stub, _ = run(scenario, poll=lambda t: seen.update(idle=sum(map(len, t.pool.idle.values()))) or True)
    assert [status for status, _ in out] == [200] * 6
    assert seen["idle"] == 1  # six requests, one upstream connection


def test_request_body_over_the_cap_gets_413_and_the_tap_keeps_serving():
    async def scenario(s, tap, direct):
        big = await _raw(s, tap, {"model": "m", "prompt": "x" * 5000})
        ok = await _raw(s, tap, {"model": "m", "prompt": "small"})
        return big, ok

    (big, ok), tap, stub, _ = run(scenario, max_request_bytes=4096)
    assert big[0] == 413 and b"4096" in big[1]
    assert ok[0] == 200 and len(stub.bodies) == 1  # the big one never reached the engine


def test_chunked_client_body_and_pipelined_requests_are_answered_in_order():
    body = json.dumps({"model": "m", "prompt": "one", "stream": True}).encode()
    second = json.dumps({"model": "m", "prompt": "two"}).encode()
    raw = (
        b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/json\r\n\r\n"
        + _chunked(body[:10])
        + _chunked(body[10:])
        + b"0\r\n\r\n"
        + b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
        % (len(second), second)
    )

    async def scenario(s, tap, direct):
        return await _exchange(int(tap.rsplit(":", 1)[1]), raw)

    out, tap, stub, _ = run(scenario, poll=lambda t: t.stats["requests"] == 2)
    assert [b["prompt"] for b in stub.bodies] == ["one", "two"]
    assert out.index(b"data: [DONE]") < out.index(b'"abc"')  # the stream's answer comes first
    assert tap.stats["requests"] == 2 and out.endswith(b"}") and b"Connection: close" in out


def test_head_and_unknown_paths_pass_through():
    async def scenario(s, tap, direct):
        async with s.head(tap + "/v1/models") as r:
            head = r.status, await r.read()
        async with s.get(tap + "/nope") as r:
            missing = r.status
        async with s.get(tap + "/v1/models") as r:
            after = r.status, await r.json()
        return head, missing, after

    (head, missing, after), tap, *_ = run(scenario)
    assert head == (200, b"") and missing == 404 and after == (200, {"data": [{"id": "m"}]})


def test_stale_keep_alive_connection_is_retried_once_on_a_new_one():
    """The engine closes an idle kept-alive connection just as the tap reuses it (nginx retries too)."""

    async def handler(n, head, body, w):
        if n == 2:
            return False  # second request on this connection: close, no answer
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        await w.drain()
        return True

    async def scenario(tap):
        async with aiohttp.ClientSession() as s:
            return [await _raw(s, f"http://127.0.0.1:{tap.port}", {"model": "m", "prompt": "x"}) for _ in range(2)]

    out, tap, up = _with_raw_upstream(handler, scenario)
    assert out == [(200, b"{}"), (200, b"{}")]
    assert up.connections == 2 and tap.stats["upstream_unreachable"] == 0


def test_upstream_that_stalls_mid_stream_is_timed_out_and_the_client_cut():
    async def handler(n, head, body, w):
        w.write(SSE_HEAD + _chunked(b'data: {"choices":[{"text":"a"}]}\n\n'))
        await w.drain()
        await asyncio.sleep(30)
        return False

    async def scenario(tap):
        async with aiohttp.ClientSession() as s:
            try:
                await _raw(s, f"http://127.0.0.1:{tap.port}", {"model": "m", "prompt": "x", "stream": True})
            except aiohttp.ClientPayloadError:
                return "cut"
            return "ended cleanly"

    out, tap, up = _with_raw_upstream(handler, scenario, read_timeout_s=0.3)
    assert out == "cut" and tap.stats["upstream_broken"] == 1


def test_malformed_request_gets_400():
    async def scenario(s, tap, direct):
        return await _exchange(int(tap.rsplit(":", 1)[1]), b"NOT HTTP AT ALL\r\n\r\n", until=b"}")

    out, tap, *_ = run(scenario)
    assert out.startswith(b"HTTP/1.1 400 ") and b"Connection: close" in out


def test_the_taps_own_endpoints_answer():
    async def scenario(s, tap, direct):
        await _raw(s, tap, {"model": "m", "prompt": "p", "user": "alice"})
        async with s.get(tap + "/kvscope/metrics") as r:
            metrics = await r.text()
        async with s.get(tap + "/kvscope/fairness") as r:
            fairness = await r.json()
        return metrics, fairness

    (metrics, fairness), *_ = run(scenario)
    assert 'tenant_requests_total{tenant="alice"} 1' in metrics
    assert fairness["tenants"]["alice"]["requests"] == 1


def test_usage_request_keeps_the_clients_bytes_and_appends_the_option():
    body = b'{"model": "m", "stream": true, "prompt": "x"}  '
    assert (
        render_with_usage(body, json.loads(body))
        == b'{"model": "m", "stream": true, "prompt": "x","stream_options":{"include_usage":true}}'
    )
    other = b'{"stream":true,"stream_options":{"continuous_usage_stats":false}}'
    assert json.loads(render_with_usage(other, json.loads(other)))["stream_options"] == {
        "continuous_usage_stats": False,
        "include_usage": True,
    }


def test_the_tap_streams_the_same_on_uvloop_and_falls_back_without_it(monkeypatch):
    async def main():
        stub = Stub()
        await stub.start()
        tap = RequestTap(TapConfig(upstreams=(f"http://127.0.0.1:{stub.port}",), listen="127.0.0.1:0"))
        await tap.start()
        try:
            async with aiohttp.ClientSession() as s:
                out = await _raw(s, f"http://127.0.0.1:{tap.port}", {"model": "m", "prompt": "p", "stream": True})
            return type(asyncio.get_running_loop()).__module__, out, tap.stats["requests"]
        finally:
            await tap.stop()
            await stub.runner.cleanup()

    module, (status, body), n = eventloop.run_event_loop(main())
    assert module.startswith("uvloop") and eventloop.loop_name() == "uvloop"
    assert status == 200 and body.endswith(b"data: [DONE]\n\n") and b'"usage"' not in body and n == 1
    monkeypatch.setitem(sys.modules, "uvloop", None)  # not installed
    assert eventloop.loop_name() == "asyncio"
    assert eventloop.run_event_loop(main())[0] == "asyncio.unix_events"


def test_a_slow_client_pauses_the_upstream_and_still_gets_every_byte():
    events = [b'data: {"choices":[{"text":"%s"}]}\n\n' % (b"x" * 1000) for _ in range(8000)]  # ~8 MB

    async def handler(n, head, body, w):
        w.write(SSE_HEAD)
        for i in range(0, len(events), 100):
            w.write(_chunked(b"".join(events[i : i + 100])))
            await w.drain()
        w.write(_chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await w.drain()
        return True

    async def scenario(tap):
        body = json.dumps({"model": "m", "prompt": "x", "stream": True}).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # before connect: a small window
        sock.connect(("127.0.0.1", tap.port))
        r, w = await asyncio.open_connection(sock=sock, limit=1 << 16)
        w.write(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        # the client does not read for a while: the kernel buffers (tap -> client send buffer at most
        # tcp_wmem's 4 MiB) fill up, then the tap's own buffer, then the tap stops reading upstream
        await until(lambda: any(u.paused for u in tap.pool.busy), timeout_s=120)  # hang guard only
        paused = [u.paused for u in tap.pool.busy]
        data = bytearray()
        while not data.endswith(b"0\r\n\r\n"):
            data += await asyncio.wait_for(r.read(1 << 16), 10)
        w.close()
        idle = [u.paused for v in tap.pool.idle.values() for u in v]
        return paused, data, idle

    (paused, data, idle), tap, up = _with_raw_upstream(handler, scenario)
    assert paused == [True]  # back-pressure reached the engine side
    assert idle == [False]  # ... and the pooled connection reads again
    assert data.count(b"data: {") == len(events) and b"data: [DONE]" in data and data.count(b"x" * 1000) == len(events)
    assert tap.stats["requests"] == 1 and tap.stats["client_disconnect"] == 0


def test_hop_by_hop_headers_and_those_connection_names_are_not_forwarded():
    raw = [
        (b"Host", b"a"),
        (b"Connection", b"keep-alive, X-Secret-Hop"),
        (b"X-Secret-Hop", b"1"),
        (b"Transfer-Encoding", b"chunked"),
        (b"X-Tenant", b"t1"),
        (b"Content-Type", b"application/json"),
    ]
    assert filter_headers(raw) == [(b"X-Tenant", b"t1"), (b"Content-Type", b"application/json")]


def test_an_upgrade_request_is_answered_once_without_switching_protocols():
    raw = b"GET /v1/models HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"

    async def scenario(s, tap, direct):
        return await _exchange(int(tap.rsplit(":", 1)[1]), raw)

    out, tap, *_ = run(scenario)
    assert out.startswith(b"HTTP/1.1 200 OK") and out.count(b"HTTP/1.1 ") == 1 and out.endswith(b'"m"}]}')


def test_upstream_urls_are_parsed_for_the_wire_and_bad_ones_refused():
    t = parse_upstream("https://user@engine.local:8443/prefix/")
    assert t.key == ("engine.local", 8443, True) and t.host == b"engine.local:8443" and t.prefix == b"/prefix"
    assert parse_upstream("http://10.0.0.5").key == ("10.0.0.5", 80, False)
    for bad in ("ftp://x", "10.0.0.5:8000", "http://"):
        with pytest.raises(ValueError):
            parse_upstream(bad)
    r = subprocess.run(
        [sys.executable, "-m", "kvscope", "tap", "--upstream", "10.0.0.5:8000"],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only (slow on a loaded 2-core box)
    )
    assert r.returncode == 2 and "bad argument" in r.stdout and "http(s)://" in r.stdout


def test_many_concurrent_streams_each_get_exactly_the_direct_bytes():
    async def scenario(s, tap, direct):
        body = {"model": "m", "prompt": "p", "stream": True}
        want = await _raw(s, direct, body)
        got = await asyncio.gather(*(_raw(s, tap, {**body, "user": f"u{i % 3}"}) for i in range(100)))
        return want, got

    seen = {}
    (want, got), tap, stub, _ = run(
        scenario, poll=lambda t: seen.update(conns=sum(map(len, t.pool.idle.values())) + len(t.pool.busy)) or True
    )
    assert want[0] == 200 and all(g == want for g in got)
    assert tap.stats["requests"] == 100 and 1 <= seen["conns"] <= 100
    counts = {x.label("tenant"): x.value for x in tap.render_samples() if x.name == "tenant_ttft_seconds_count"}
    assert counts == {"u0": 34, "u1": 33, "u2": 33}
    assert all(b.get("stream_options") == {"include_usage": True} for b in stub.bodies[1:])


def test_session_turns_are_tracked_through_the_tap():
    """Turn 2 of a conversation (X-Session-ID) is linked to turn 1 and judged on its cached tokens."""

    async def scenario(s, tap, direct):
        for text in ("turn one", "turn two, a different prompt"):
            await _raw(s, tap, {"model": "m", "prompt": text, "user": "alice"}, {"X-Session-ID": "conv-1"})
        await _raw(s, tap, {"model": "m", "prompt": "no session, unrelated", "user": "alice"})

    _, tap, stub, _ = run(scenario)
    rows = {
        (x.name, x.label("tenant"), x.label("instance")): x.value
        for x in tap.render_samples()
        if x.name.startswith("session_")
    }
    # the stub reports prompt 12 / cached 8: 8 >= 12 - 32 slack, so the follow-up kept its context
    assert rows == {("session_turns_total", "alice", f"127.0.0.1:{stub.port}"): 1.0}
    assert f'session_turns_total{{instance="127.0.0.1:{stub.port}",tenant="alice"}} 1' in tap.render_metrics_text()
