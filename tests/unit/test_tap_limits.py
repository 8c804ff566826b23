"""The tap's connection limits with real sockets against the real tap (issue 25): the request
head timeout counts the whole head however slowly its bytes trickle in, the request timeout the
whole request, the idle timeout a keep-alive connection from the end of its last answer, and a
connection over `max_connections` gets a prompt 503. Each runs on asyncio's loop and on uvloop
(the standalone `kvscope tap` runs on uvloop, whose transports are not asyncio's classes).

No assertion here bounds how long the box takes (a 2-core CI box at load 20 stalls this process
for seconds): elapsed times run from a clock read before the tap can start its timer, so "not
before the limit" holds however slow the box, and "at the limit, not later" is shown by cause (the
tap's reason and counters, bytes not yet sent, the other limits far away). Reads wait up to GUARD_S,
a guard that only turns a broken limit into a failure instead of a hang."""

import asyncio
import time

import pytest
import uvloop

from kvscope.agent.config import ConfigError
from kvscope.agent.tap.collector import parse_tap_config
from kvscope.agent.tap.proxy import RequestTap, TapConfig
from tests.unit.test_tap_proxy import Stub, until

BODY = b'{"model":"m","prompt":"hello"}'
PHASES = ("head", "body", "idle")  # the tap's client timeouts, counted as stats["client_timeout_<phase>"]
# how long a read waits for the tap to close: a hang guard, not a bound under test, 30 s under with_tap's
# and far below the defaults of the request and idle timeouts (60 s, 75 s) a test leaves unset
GUARD_S = 20.0
REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    % (len(BODY), BODY)
)


@pytest.fixture(params=["asyncio", "uvloop"])
def loop(request):
    return request.param


def with_tap(scenario, loop, **cfg):
    async def main():
        stub = Stub()
        await stub.start()
        tap = RequestTap(TapConfig(upstreams=(f"http://127.0.0.1:{stub.port}",), listen="127.0.0.1:0", **cfg))
        await tap.start()
        try:
            return await scenario(tap), tap
        finally:
            await tap.stop()
            await stub.stop()

    # a broken limit fails the test, never hangs it
    return (uvloop.run if loop == "uvloop" else asyncio.run)(asyncio.wait_for(main(), 30))


async def read_until_closed(reader, timeout_s):
    """Everything the tap sends until it closes the connection (TimeoutError if it does not)."""
    out = b""
    async with asyncio.timeout(timeout_s):
        while chunk := await reader.read(65536):
            out += chunk
    return out


async def answer(reader):
    """One whole Content-Length answer: (head, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    return head, await reader.readexactly(length)


async def trickle(writer, data, every_s, sent=None):
    """Send `data` one byte at a time, at least `every_s` apart (a busy loop only spaces them
    more), until done or the tap closes; each byte written is appended to `sent`."""
    sent = bytearray() if sent is None else sent
    try:
        for i in range(len(data)):
            writer.write(data[i : i + 1])
            sent += data[i : i + 1]
            await writer.drain()
            await asyncio.sleep(every_s)
    except ConnectionError:
        pass


def test_a_head_that_trickles_in_byte_by_byte_is_cut_at_the_header_timeout(loop):
    """A byte every 0.05 s never leaves the connection silent for the 0.6 s limit, so only a
    limit on the whole head cuts it, and it does so while the head is still coming in."""
    head_len = REQUEST.index(b"\r\n\r\n") + 4

    async def scenario(tap):
        t0 = time.monotonic()  # before the accept that starts the tap's head timer
        reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
        sent = bytearray()
        sender = asyncio.create_task(trickle(writer, REQUEST, 0.05, sent))  # >= 6 s for the whole head
        got = await read_until_closed(reader, GUARD_S)
        elapsed, sent_then = time.monotonic() - t0, len(sent)
        sender.cancel()
        writer.close()
        return got, elapsed, sent_then

    (got, elapsed, sent), tap = with_tap(scenario, loop, header_timeout_s=0.6)
    assert got.startswith(b"HTTP/1.1 408 ") and b"request not received in time (head)" in got
    assert elapsed >= 0.6 and sent < head_len  # not before the limit, and before the head was whole
    assert tap.stats["client_timeout_head"] == 1


def test_a_connection_that_sends_nothing_is_closed_silently_at_the_header_timeout(loop):
    async def scenario(tap):
        t0 = time.monotonic()  # before the accept that starts the tap's head timer
        reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
        got = await read_until_closed(reader, GUARD_S)
        writer.close()
        return got, time.monotonic() - t0

    (got, elapsed), tap = with_tap(scenario, loop, header_timeout_s=0.5)
    assert got == b"" and elapsed >= 0.5
    # closed by the header timeout, not another limit (the others are 60 s and 75 s, past GUARD_S)
    assert tap.stats["client_timeout_head"] == 1 and sum(tap.stats[f"client_timeout_{p}"] for p in PHASES) == 1


def test_a_body_that_trickles_in_is_cut_at_the_request_timeout(loop):
    """The body's bytes come 0.1 s apart, so the connection is never silent for the 1 s limit
    and the whole body takes >= 2.9 s: only a limit on the whole request cuts it, before the
    body is whole (a 408 says "(body)" only while the tap still waits for body bytes)."""
    head, body = REQUEST.split(b"\r\n\r\n")

    async def scenario(tap):
        t0 = time.monotonic()  # before the accept the request timeout counts from
        reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
        writer.write(head + b"\r\n\r\n")
        sent = bytearray()
        sender = asyncio.create_task(trickle(writer, body, 0.1, sent))
        got = await read_until_closed(reader, GUARD_S)
        elapsed, sent_then = time.monotonic() - t0, len(sent)
        sender.cancel()
        writer.close()
        return got, elapsed, sent_then

    # the head goes in one write; its own limit is long so a stall before the tap reads it is not cut
    (got, elapsed, sent), tap = with_tap(scenario, loop, header_timeout_s=5.0, request_timeout_s=1.0)
    assert got.startswith(b"HTTP/1.1 408 ") and b"(body)" in got
    assert elapsed >= 1.0 and sent < len(body)
    assert tap.stats["client_timeout_body"] == 1


def test_keep_alive_idle_time_counts_from_the_end_of_the_last_answer(loop):
    """A stream longer than the idle timeout leaves the connection usable after it; left idle, it
    is closed once the idle timeout has passed since that answer ended."""
    long = b'{"model":"m","prompt":"long","stream":true}'
    stream_req = REQUEST.replace(b"%d\r\n\r\n%s" % (len(BODY), BODY), b"%d\r\n\r\n%s" % (len(long), long))

    async def scenario(tap):
        reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
        t0 = time.monotonic()
        writer.write(stream_req)
        await reader.readuntil(b"0\r\n\r\n")  # the chunked stream's end
        streamed = time.monotonic() - t0
        await asyncio.sleep(0.2)
        t1 = time.monotonic()  # before the answer whose end starts the idle timer
        writer.write(REQUEST)  # the same connection, after the long stream
        head, body = await answer(reader)
        rest = await read_until_closed(reader, GUARD_S)
        writer.close()
        return streamed, head, body, rest, time.monotonic() - t1

    (streamed, head, body, rest, idle), tap = with_tap(scenario, loop, idle_timeout_s=0.4)
    assert streamed > 0.4  # longer than the idle timeout
    assert head.startswith(b"HTTP/1.1 200 ") and b'"usage"' in body
    assert rest == b"" and idle >= 0.4
    assert tap.stats["client_timeout_idle"] == 1 and sum(tap.stats[f"client_timeout_{p}"] for p in PHASES) == 1


def test_a_connection_over_the_cap_gets_503_at_once_and_the_others_are_served(loop):
    async def scenario(tap):
        held = [await asyncio.open_connection("127.0.0.1", tap.port) for _ in range(3)]
        await until(lambda: len(tap._clients) == 3)
        reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
        writer.write(REQUEST)
        refused = await read_until_closed(reader, GUARD_S)
        # "at once": answered while the three inside the cap all still hold their places (they
        # are silent; the header timeout, 10 s, is the first thing that could free one)
        still_held = len(tap._clients)
        writer.close()
        served = []
        for r, w in held:  # the three inside the cap still work
            w.write(REQUEST)
            served.append((await answer(r))[0])
        held[0][1].close()
        await until(lambda: len(tap._clients) == 2)
        r, w = await asyncio.open_connection("127.0.0.1", tap.port)
        w.write(REQUEST)
        served.append((await answer(r))[0])  # room again: served
        for writer in [w, *(x for _, x in held[1:])]:
            writer.close()
        return refused, still_held, served

    (refused, still_held, served), tap = with_tap(scenario, loop, max_connections=3)
    head, _, body = refused.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in head and b"Connection: close" in head
    assert b"max_connections" in body and still_held == 3
    assert sum(tap.stats[f"client_timeout_{p}"] for p in PHASES) == 0  # none of the three was cut
    assert [h.split(b"\r\n")[0] for h in served] == [b"HTTP/1.1 200 OK"] * 4
    assert tap.stats["connections_refused"] == 1


def test_limits_are_configurable_and_checked():
    cfg = parse_tap_config(
        {
            "upstreams": "http://e:8000",
            "max_connections": 10,
            "header_timeout_s": "5s",
            "request_timeout_s": "2m",
            "idle_timeout_s": 30,
        }
    )["tap"]
    assert (cfg.max_connections, cfg.header_timeout_s, cfg.request_timeout_s, cfg.idle_timeout_s) == (10, 5, 120, 30)
    assert TapConfig().max_connections == 1024 and TapConfig().header_timeout_s == 10
    for bad in ({"max_connections": 0}, {"header_timeout_s": 0}, {"idle_timeout_s": "-1"}):
        with pytest.raises(ConfigError):
            parse_tap_config({"upstreams": "http://e:8000", **bad})


def test_refusals_and_timeouts_reach_the_agents_metrics():
    """A refused connection and a header timeout, on real sockets, read back from the agent's own
    /metrics as kvscope_connections_closed_total (0 for the reasons that did not happen)."""
    from tests.integration.agentharness import fetch_metrics, running_agent, value

    async def main():
        stub = Stub()
        await stub.start()
        tap = {"upstreams": [f"http://127.0.0.1:{stub.port}"], "listen": "127.0.0.1:0"}
        # the held connection must outlast the refused one's accept: 2 s, not a stall's length
        doc = {"targets": [], "tap": {**tap, "max_connections": 1, "header_timeout_s": 2.0}}
        try:
            async with running_agent(doc, only=("tap",)) as (rt, url):
                await rt.run_cycle()
                _, before = await fetch_metrics(url)
                port = rt.collectors[0].tap.port
                held = await asyncio.open_connection("127.0.0.1", port)  # silent: cut at the header timeout
                await until(lambda: len(rt.collectors[0].tap._clients) == 1)
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                refused = await read_until_closed(reader, GUARD_S)
                await read_until_closed(held[0], GUARD_S)  # TimeoutError if the tap never cuts it
                for w in (writer, held[1]):
                    w.close()
                await rt.run_cycle()
                _, after = await fetch_metrics(url)
        finally:
            await stub.stop()
        return before, refused, after

    before, refused, after = asyncio.run(asyncio.wait_for(main(), 30))
    name, reasons = (
        "kvscope_connections_closed_total",
        ("max_connections", "header_timeout", "request_timeout", "idle_timeout"),
    )
    assert refused.startswith(b"HTTP/1.1 503 ")
    assert [value(before, name, collector="tap", reason=r) for r in reasons] == [0, 0, 0, 0]
    assert [value(after, name, collector="tap", reason=r) for r in reasons] == [1, 1, 0, 0]
