"""The scrape client (agent/scrape/fetch.py) on the wire: raw asyncio servers send exactly the bytes
each case needs (keep-alive, EOF-delimited and chunked bodies, compression, bad replies)."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import Callable

import pytest

from kvscope.agent.scrape.fetch import ScrapeError, new_session, read_exposition

BODY = b'vllm:num_requests_running{engine="0"} 3.0\n'


def ok(body: bytes = BODY, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def serve(answer: Callable[[int], bytes | None], close_after: bool = False):
    """A server that answers the n-th request (over all connections) with answer(n) and then
    closes the connection if `close_after` (or if answer gives None: close without a word)."""
    state = {"requests": 0, "connections": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state["connections"] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                state["last_request"] = head
                state["requests"] += 1
                data = answer(state["requests"])
                if data is None:
                    break
                writer.write(data)
                await writer.drain()
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:  # also when asyncio.run cancels this handler at the end of a test
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/metrics", state


def fetch(
    answer: Callable[[int], bytes | None],
    times: int = 1,
    max_bytes: int = 1 << 20,
    close_after: bool = False,
    between: float = 0.0,
):
    async def main():
        server, url, state = await serve(answer, close_after)
        try:
            async with new_session() as client:
                bodies = []
                for _ in range(times):
                    bodies.append(await read_exposition(client, url, 2.0, max_bytes))
                    await asyncio.sleep(between)
                return bodies, state
        finally:
            server.close()
            await server.wait_closed()

    return asyncio.run(main())


def reason(answer: Callable[[int], bytes | None], **kw) -> str:
    with pytest.raises(ScrapeError) as info:
        fetch(answer, **kw)
    return info.value.reason


def test_keep_alive_reuses_one_connection_and_sends_the_headers():
    replies, state = fetch(lambda n: ok(b"n %d\n" % n), times=3)
    assert [r.text for r in replies] == ["n 1\n", "n 2\n", "n 3\n"]
    assert state["connections"] == 1
    head = state["last_request"]
    assert head.startswith(b"GET /metrics HTTP/1.1\r\n") and b"\r\nAccept: text/plain;version=0.0.4" in head
    assert b"\r\nHost: 127.0.0.1:" in head and b"Accept-Encoding: gzip" in head


def test_a_connection_the_server_closed_is_replaced():
    replies, state = fetch(lambda n: ok(), times=3, close_after=True, between=0.05)
    assert [r.text for r in replies] == [BODY.decode()] * 3
    assert state["connections"] == 3


def test_a_body_delimited_by_the_end_of_the_connection():
    replies, _ = fetch(lambda n: b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY, close_after=True)
    assert replies[0].text == BODY.decode()


def test_a_chunked_body():
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nvllm:\r\n%x\r\n%s\r\n0\r\n\r\n" % (
        len(BODY) - 5,
        BODY[5:],
    )
    replies, state = fetch(lambda n: chunked, times=2)
    assert [r.text for r in replies] == [BODY.decode()] * 2 and state["connections"] == 1


@pytest.mark.parametrize("pack", [gzip.compress, zlib.compress])
def test_gzip_and_deflate_bodies_are_inflated(pack):
    encoding = b"gzip" if pack is gzip.compress else b"deflate"
    replies, _ = fetch(lambda n: ok(pack(BODY), b"Content-Encoding: " + encoding + b"\r\n"))
    assert replies[0].text == BODY.decode()


def test_the_cap_counts_inflated_bytes_and_a_declared_length():
    bomb = gzip.compress(b"a 1\n" * 250_000)
    assert reason(lambda n: ok(bomb, b"Content-Encoding: gzip\r\n"), max_bytes=100_000) == "body_too_large"
    assert reason(lambda n: ok(b"a 1\n" * 1000), max_bytes=1000) == "body_too_large"
    replies, _ = fetch(lambda n: ok(b"a 1\n" * 250), max_bytes=1000)  # exactly the cap is fine
    assert len(replies[0].text.encode()) == 1000


@pytest.mark.parametrize(
    ("wire", "want"),
    [
        (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", "http_503"),
        (b"HTTP/1.1 301 Moved\r\nLocation: /x\r\nContent-Length: 0\r\n\r\n", "http_301"),
        (b"NOT HTTP AT ALL\r\n\r\n", "http_protocol_error"),
        (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000, "http_protocol_error"),  # endless header block
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 3\r\n\r\nabc", "http_protocol_error"),  # unasked
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 5\r\n\r\nabcde", "payload_error"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", "payload_error"),  # then the server closes
        (None, "server_disconnected"),  # closes without a word
    ],
)
def test_failures_have_their_reason(wire, want):
    assert reason(lambda n: wire, close_after=True) == want


@pytest.mark.parametrize(
    "url",
    [
        "ftp://127.0.0.1/metrics",
        "http://[::1/metrics",
        "http:///metrics",
        "http://127.0.0.1:99999/metrics",
        "http://127.0.0.1:8x/metrics",
    ],
)
def test_bad_urls(url):
    async def main():
        async with new_session() as client:
            await read_exposition(client, url, 1.0, 1024)

    with pytest.raises(ScrapeError) as info:
        asyncio.run(main())
    assert info.value.reason == "invalid_url"


def test_a_timeout_drops_the_connection_and_the_next_get_works():
    async def main():
        gate = asyncio.Event()

        async def handle(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            if not gate.is_set():
                gate.set()
                await asyncio.sleep(5)  # the first request hangs
            else:
                writer.write(ok())
                await writer.drain()
            writer.close()

        async def guarded(reader, writer):
            try:
                await handle(reader, writer)
            finally:
                writer.close()

        server = await asyncio.start_server(guarded, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics"
        try:
            async with new_session() as client:
                with pytest.raises(ScrapeError, match="timeout"):
                    await read_exposition(client, url, 0.2, 1024)
                return await read_exposition(client, url, 60.0, 1024)  # ends at the reply; a hang guard
        finally:
            server.close()

    assert asyncio.run(main()).text == BODY.decode()
