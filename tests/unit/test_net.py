"""core/net.py, the one outbound HTTP client: synchronous reads share one client loop, and a
compressed answer is capped by the bytes it decodes to, not the bytes on the wire."""

from __future__ import annotations

import gzip
import threading

import pytest

from kvscope.core import net
from kvscope.core.net import FetchError
from testbed.answers import answer_from_bytes


def _answer(body: bytes, headers: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (len(body), headers) + body


def test_reads_from_many_threads_run_on_one_client_loop():
    got: list[bytes] = []

    def read(i: int) -> None:
        got.append(bytes(answer_from_bytes(_answer(b"ok%d" % i), "t", 100)))

    readers = [threading.Thread(target=read, args=(i,)) for i in range(8)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(120)
    assert sorted(got) == sorted(b"ok%d" % i for i in range(8))
    assert [t.name for t in threading.enumerate()].count("kvscope net") == 1


def test_a_compressed_answer_is_capped_by_what_it_decodes_to():
    bomb = gzip.compress(b"0" * (4 << 20))  # 4 MiB of zeros, about 4 KiB on the wire
    assert len(bomb) < 1 << 20
    with pytest.raises(FetchError, match=r"^t: the answer is larger than the 1 MiB read at most"):
        answer_from_bytes(_answer(bomb, b"Content-Encoding: gzip\r\n"), "t", 1 << 20)


def test_an_error_status_quotes_the_servers_error_printable():
    body = b'{"status":"error","error":"bad query \\u001b[31mred"}'
    raw = b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    with pytest.raises(FetchError) as caught:
        answer_from_bytes(raw, "t", 1 << 20)
    assert caught.value.status == 400 and str(caught.value) == "t: HTTP 400: bad query ?[31mred"
    assert net.printable("a\nb\x07") == "a b?"
