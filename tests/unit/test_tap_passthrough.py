"""The tap's pass-through of whole token chunks (forward.Forward.pass_through, sse.count_token_chunks)
against its general path (HTTP parser, SseScanner.feed, re-framing): same bytes to the client,
same token counts, same usage."""

import asyncio
import json

from hypothesis import given, settings
from hypothesis import strategies as st
from kvscope.agent.tap import forward
from kvscope.agent.tap.proxy import RequestTap
from kvscope.agent.tap.sse import SseScanner, count_token_chunks

from tests.unit.test_tap_proxy_wire import SSE_HEAD, _chunked, _with_raw_upstream

TOKEN = b'data: {"id":"c","choices":[{"index":0,"text":" t"}]}\n\n'
USAGE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":9}}\n\n'
DONE = b"data: [DONE]\n\n"
COMMENT = b": keep-alive\n\n"


def test_whole_token_chunks_are_counted_and_anything_else_is_not():
    assert count_token_chunks(_chunked(TOKEN)) == 1
    assert count_token_chunks(_chunked(TOKEN * 3)) == 3
    assert count_token_chunks(_chunked(TOKEN) + _chunked(TOKEN * 2)) == 3
    assert b"%X" % (2 * len(TOKEN)) == b"6C"
    assert count_token_chunks(b"6C\r\n%s\r\n" % (TOKEN * 2)) == 2                 # upper-case hex
    for other in (_chunked(USAGE), _chunked(DONE), _chunked(COMMENT), _chunked(TOKEN + USAGE),
                  _chunked(TOKEN)[:-1],                       # the chunk is not whole
                  _chunked(TOKEN)[:20],
                  _chunked(TOKEN) + b"0\r\n\r\n",               # the stream's end
                  b"0\r\n\r\n", b"",
                  b"%x;ext=1\r\n%s\r\n" % (len(TOKEN), TOKEN),  # a chunk extension
                  b"+%x\r\n%s\r\n" % (len(TOKEN), TOKEN),
                  b" %x\r\n%s\r\n" % (len(TOKEN), TOKEN),
                  _chunked(TOKEN[:-1]),                         # an event without its end
                  _chunked(TOKEN + TOKEN[:10])):
        assert count_token_chunks(other) == 0, other


def _dechunk(data: bytes) -> bytes | None:
    """Reference chunked decoder (test tooling): the payload, None if `data` is not whole chunks."""
    out, pos = b"", 0
    while pos < len(data):
        i = data.find(b"\r\n", pos)
        if i < 0:
            return None
        n = int(data[pos:i], 16)
        if n == 0 or data[i + 2 + n:i + 4 + n] != b"\r\n":
            return None
        out += data[i + 2:i + 2 + n]
        pos = i + 4 + n
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([TOKEN, USAGE, DONE, COMMENT]), min_size=1, max_size=8), st.data())
def test_count_matches_a_reference_decode_and_the_scanners_own_judgement(events, data):
    payload = b"".join(events)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(payload) - 1), max_size=3)))
    pieces = [payload[a:b] for a, b in zip([0, *cuts], [*cuts, len(payload)], strict=True)]
    wire = b"".join(_chunked(p) for p in pieces)
    n = count_token_chunks(wire)
    assert _dechunk(wire) == payload
    whole_events = all(p.endswith(b"\n\n") for p in pieces)
    if n:     # comments may ride along (no token on either path); usage and [DONE] may not
        assert whole_events and USAGE not in events and DONE not in events and n == events.count(TOKEN)
    elif whole_events and all(e == TOKEN for e in events):
        raise AssertionError("a read of whole token chunks was not recognised")
    # what the general path makes of the same bytes: the same number of token events
    s = SseScanner(drop_usage=False)
    s.feed(payload, 1.0)
    if n:
        assert len(s.gaps) + 1 == n


ACCOUNT, PASS_THROUGH = RequestTap.account, forward.Forward.pass_through


def _script(include_usage_event: bool):
    """An upstream that writes a stream in separate reads: single token chunks, two chunks in one
    write, a chunk cut in two, a comment, then the tail (usage when asked, [DONE], the end)."""
    writes = [SSE_HEAD + _chunked(TOKEN)] + [_chunked(TOKEN)] * 4 + [_chunked(TOKEN) + _chunked(TOKEN * 2)]
    cut = _chunked(TOKEN * 2)
    writes += [cut[:30], cut[30:], _chunked(COMMENT), _chunked(TOKEN)] + [_chunked(TOKEN)] * 3
    tail = (_chunked(USAGE) if include_usage_event else b"") + _chunked(DONE) + b"0\r\n\r\n"
    return writes + [tail]


def _run(monkeypatch, general_only: bool, client_asks_usage: bool):
    seen, fast_reads = [], [0]

    def account(self, ex):
        seen.append((ex.first_token is not None, len(ex.gaps), ex.usage, ex.outcome))
        ACCOUNT(self, ex)

    def pass_through(self, data):
        if general_only:
            return False
        took = PASS_THROUGH(self, data)
        fast_reads[0] += took
        return took

    monkeypatch.setattr(RequestTap, "account", account)
    monkeypatch.setattr(forward.Forward, "pass_through", pass_through)

    async def handler(n, head, body, w):
        asks = b"include_usage" in body          # the tap adds it when the client did not
        for piece in _script(asks):
            w.write(piece)
            await w.drain()
            await asyncio.sleep(0.01)            # separate reads on the tap's side
        return True

    async def scenario(tap):
        doc = {"model": "m", "prompt": "p", "stream": True}
        if client_asks_usage:
            doc["stream_options"] = {"include_usage": True}
        body = json.dumps(doc).encode()
        r, w = await asyncio.open_connection("127.0.0.1", tap.port)
        w.write(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            data += await asyncio.wait_for(r.read(1 << 16), 10)
        w.close()
        return data

    data, tap, _ = _with_raw_upstream(handler, scenario)
    head, _, body = data.partition(b"\r\n\r\n")
    return head, _dechunk(body[:-5]), seen, fast_reads[0]


def test_pass_through_gives_the_client_and_the_accounts_what_the_general_path_gives(monkeypatch):
    for client_asks_usage in (False, True):
        fast = _run(monkeypatch, general_only=False, client_asks_usage=client_asks_usage)
        general = _run(monkeypatch, general_only=True, client_asks_usage=client_asks_usage)
        assert fast[3] >= 3 and general[3] == 0                  # the fast path really carried reads
        assert fast[0] == general[0]                             # the same head
        assert fast[1] == general[1] is not None                 # the same body, event for event
        assert fast[2] == general[2] and len(fast[2]) == 1       # same first token, gap count, usage
        assert fast[2][0][:2] == (True, 13) and fast[2][0][2]["completion_tokens"] == 9
        assert (USAGE in fast[1]) == client_asks_usage           # the injected usage event is dropped
        assert fast[1].endswith(DONE) and fast[1].count(TOKEN) == 14
