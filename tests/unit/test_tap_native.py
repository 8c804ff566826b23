"""The native stream relay (agent/tap/_relay.c) against the pure-Python scanner it replaces.

The relay must give the client exactly the bytes `SseScanner` would pass on, whatever the
upstream's chunk sizes and read boundaries, count the same token events and keep the same
usage; the chunked decoder must refuse broken framing once and keep nothing after.
"""

import json
import shutil
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.agent.tap import native
from kvscope.agent.tap.native import SpecialEvents
from kvscope.agent.tap.sse import SseScanner

Relay = native._Relay
pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler: the tap runs its pure-Python path")


def test_the_extension_is_built_where_a_compiler_is_present():
    assert Relay is not None, "agent/tap/_relay.c was not built: run `make setup` (pip install -e .)"

USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 8}}


def token(text="t", nl=b"\n\n"):
    return b'data: {"id":"c1","choices":[{"index":0,"text":%s}]}' % json.dumps(text).encode() + nl


EVENTS = st.sampled_from([
    token(), token("data: inside the text"), token("x", b"\r\n\r\n"), token("usage"),
    b'data:{"choices":[{"text":"no space"}]}\n\n',
    b'data: {"id":"c1","choices":[],"usage":' + json.dumps(USAGE).encode() + b"}\n\n",
    b'data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":5,"completion_tokens":1}}\n\n',
    b": keep-alive comment\n\n", b"event: ping\ndata: {}\n\n", b"data: [DONE]\n\n",
    b'data: {"choices":\ndata: [{"text":"two data lines"}]}\n\n',
])


def chunked(body: bytes, sizes: list[int], ext: bool = False) -> bytes:
    out, i, k = [], 0, 0
    while i < len(body):
        n = max(1, sizes[k % len(sizes)])
        part = body[i:i + n]
        out.append(b"%x%s\r\n%s\r\n" % (len(part), b";x=y" if ext else b"", part))
        i, k = i + n, k + 1
    out.append(b"0\r\n\r\n")
    return b"".join(out)


def cut(wire: bytes, sizes: list[int]) -> list[bytes]:
    out, i, k = [], 0, 0
    while i < len(wire):
        n = max(1, sizes[k % len(sizes)])
        out.append(wire[i:i + n])
        i, k = i + n, k + 1
    return out


def unframe(data: bytes) -> bytes:
    """The payload of a client write: one chunk in chunked coding."""
    size, _, rest = data.partition(b"\r\n")
    n = int(size, 16)
    assert rest[n:] == b"\r\n"
    return rest[:n]


class Client:
    """What the relay writes and ends with."""

    def __init__(self):
        self.writes, self.end, self.errors = [], None, []

    def relay(self, drop_usage, head=None, **kw):
        self.events = SpecialEvents(drop_usage)
        return Relay(self.writes.append, self.events, self._end, self.errors.append, head=head, **kw)

    def _end(self, head, body):
        assert self.end is None
        self.end = (head, body)


def python_path(body_reads: list[bytes], drop_usage: bool) -> tuple[bytes, SseScanner]:
    s = SseScanner(drop_usage=drop_usage)
    out = b"".join(s.feed(b, time.perf_counter()) for b in body_reads) + s.rest()
    return out, s


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, min_size=0, max_size=25), st.binary(max_size=5).filter(lambda b: b"\n" not in b),
       st.lists(st.integers(1, 97), min_size=1, max_size=6), st.lists(st.integers(1, 131), min_size=1, max_size=6),
       st.booleans(), st.booleans())
def test_relay_passes_exactly_what_the_python_scanner_passes(events, tail, chunk_sizes, read_sizes, drop, ext):
    body = b"".join(events) + tail                  # a tail without terminator is passed at the end
    wire = chunked(body, chunk_sizes, ext)
    c = Client()
    relay = c.relay(drop)
    reads = cut(wire, read_sizes)
    for r in reads:
        relay.feed(r)
    assert c.errors == [] and relay.done and not relay.trailing
    head, rest = c.end
    got = b"".join(unframe(w) for w in c.writes) + rest
    want, scanner = python_path([body], drop)
    assert head is None and got == want
    assert c.events.usage == scanner.usage
    assert (relay.first_token is None) == (scanner.first_token is None)
    assert len(relay.gaps()) == len(scanner.gaps) and min(relay.gaps(), default=0.0) >= 0.0
    assert relay.reads == len(reads)


def test_token_times_are_perf_counter_times_and_same_read_tokens_are_zero_apart():
    c = Client()
    relay = c.relay(False)
    before = time.perf_counter()
    relay.feed(chunked(token() + token(), [1000])[:-5])     # two tokens in one read, no end yet
    mid = time.perf_counter()
    time.sleep(0.01)
    relay.feed(chunked(token(), [1000]))                     # one more token, then the end
    after = time.perf_counter()
    assert before <= relay.first_token <= mid <= relay.last_token <= after
    gaps = relay.gaps()
    assert gaps[0] == 0.0 and gaps[1] >= 0.01 and len(gaps) == 2 and relay.tokens == 3


def test_head_goes_out_with_the_first_body_bytes_or_back_at_the_end():
    c = Client()
    relay = c.relay(False, head=b"HTTP/1.1 200 OK\r\n\r\n")
    relay.feed(b"6\r\n: pi")                                  # no complete event yet: nothing written
    assert c.writes == []
    relay.feed(b"ng\r\n")
    relay.feed(b"2\r\n\n\n\r\n")
    assert c.writes == [b"HTTP/1.1 200 OK\r\n\r\n8\r\n: ping\n\n\r\n"]
    relay.feed(b"0\r\n\r\n")
    assert c.end == (None, b"")

    c2 = Client()
    c2.relay(False, head=b"H\r\n\r\n").feed(b"0\r\n\r\n")     # an empty body: the head comes back
    assert c2.writes == [] and c2.end == (b"H\r\n\r\n", b"")


def test_the_last_read_is_not_written_but_handed_to_on_end_with_the_unterminated_tail():
    c = Client()
    relay = c.relay(True)
    usage = b'data: {"choices":[],"usage":' + json.dumps(USAGE).encode() + b"}\n\n"
    relay.feed(chunked(token(), [1000])[:-5])
    relay.feed(chunked(usage + b"data: [DONE]\n\nleftover", [7]))
    assert [unframe(w) for w in c.writes] == [token()]
    assert c.end == (None, b"data: [DONE]\n\nleftover") and c.events.usage == USAGE


@pytest.mark.parametrize("wire", [b"zz\r\n", b"5\r\nhello\r\r", b"5\nhello", b"\r\n", b"5\r\nhelloX",
                                  b"12345678901\r\n"])
def test_broken_framing_is_reported_once_and_nothing_more_is_written(wire):
    c = Client()
    relay = c.relay(False)
    relay.feed(wire)
    relay.feed(chunked(token(), [100]))
    assert len(c.errors) == 1 and "chunked" in c.errors[0]
    assert c.writes == [] and c.end is None and not relay.done


def test_trailers_are_skipped_and_bytes_after_the_end_mark_the_connection_unusable():
    c = Client()
    relay = c.relay(False)
    relay.feed(b"%x\r\n%s\r\n0\r\nX-Trailer: 1\r\n\r\nHTTP/1.1 200" % (len(token()), token()))
    assert c.end == (None, token()) and relay.done and relay.trailing


def test_an_event_longer_than_the_limit_is_passed_on_unparsed():
    c = Client()
    relay = c.relay(False, max_event_bytes=64)
    blob = b"x" * 100
    relay.feed(b"%x\r\n%s\r\n" % (len(blob), blob))
    assert [unframe(w) for w in c.writes] == [blob] and relay.pending == 0


def test_a_callback_that_closes_the_relay_stops_it_without_a_crash():
    writes = []
    holder = {}

    def special(event):
        holder["relay"].close()
        return 0

    relay = holder["relay"] = Relay(writes.append, special, lambda h, b: None, lambda m: None)
    relay.feed(chunked(b": comment\n\n" + token(), [1000]))
    relay.feed(b"more")
    assert writes == []


def test_a_failing_callback_raises_from_feed():
    def special(event):
        raise RuntimeError("classifier broke")

    relay = Relay(lambda b: None, special, lambda h, b: None, lambda m: None)
    with pytest.raises(RuntimeError, match="classifier broke"):
        relay.feed(chunked(b": comment\n\n", [100]))


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError):
        Relay(print, print, print, print, head="not bytes")
    with pytest.raises(ValueError):
        Relay(print, print, print, print, max_event_bytes=0)


def test_native_status_names_the_loop_in_use():
    assert native.native_status() in ("native (C) request side and stream relay",
                                      "pure-Python request side and stream relay (KVSCOPE_TAP_NATIVE=0)")
