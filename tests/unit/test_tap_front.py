"""The native request side (agent/tap/_front.c) against the Python path it short-cuts.

Whenever `render` takes a request, the Python path (llhttp through `Downstream`, msgspec,
`upstream_headers`, `render_with_usage`, `render_request`) must have parsed the same request and
rendered the same upstream bytes with the same ids; when it declines, the Python path handles
the read as before, so declining is always safe. A Hypothesis property checks the first on
random requests and random (often broken) bodies; exact cases check that what must be declined
is, and that realistic requests are taken (a fast path that declines everything would pass the
property)."""

from __future__ import annotations

import json
import re
import shutil

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.agent.tap import native
from kvscope.agent.tap.forward import parse_json_object
from kvscope.agent.tap.http1 import MAX_HEADER_BYTES, Downstream, Request, parse_plain_request, render_request
from kvscope.agent.tap.proxy import ACCOUNTED_PATHS, _asks_usage, _Exchange, render_with_usage, upstream_headers

render = native._render
pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler: the tap runs its pure-Python path")

PREFIX, HOST = b"/engine", b"10.0.0.7:8000"
MAX_BODY = 1 << 20


class _Transport:
    """Enough of a transport for `Downstream` to answer a broken request into."""

    def __init__(self) -> None:
        self.out = b""

    def write(self, data: bytes) -> None:
        self.out += data

    def pause_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def python_parse(data: bytes, max_body: int = MAX_BODY) -> list[Request] | str:
    """What the llhttp path makes of one read: the requests, or the error it answered."""
    got: list[Request] = []
    conn = Downstream(lambda c, r: got.append(r), set(), max_body)
    conn.connection_made(_Transport())
    conn.data_received(data)
    return conn._error[1] if conn._error else got


def python_render(req: Request, trace_id: str, span_id: str, inject: bool) -> tuple[bytes, bool]:
    """The upstream bytes of proxy.py's Python path for an accounted request with these ids."""
    doc = parse_json_object(req.body)
    assert doc is not None, "the C side took a body the Python side does not read as an object"
    ex = _Exchange(tenant="", path=req.path, model=None, start=0.0, trace_id=trace_id, span_id=span_id, parent_id="")
    body, injected = req.body, False
    if doc.get("stream") is True and inject and not _asks_usage(doc):
        body, injected = render_with_usage(req.body, doc), True
    return render_request(req.method, PREFIX + req.target, HOST, upstream_headers(req, ex), body), injected


def http(body: bytes, headers: list[tuple[bytes, bytes]] | None = None, path: bytes = b"/v1/chat/completions",
         method: bytes = b"POST", version: bytes = b"HTTP/1.1", length: bool = True) -> bytes:
    lines = [b"%s %s %s" % (method, path, version)]
    for k, v in headers if headers is not None else [(b"Host", b"tap"), (b"Content-Type", b"application/json")]:
        lines.append(k + b": " + v)
    if length:
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def check(data: bytes, inject: bool = True) -> tuple | None:
    """render(), and when it took the request, the proof that the Python path agrees."""
    got = render(data, PREFIX, HOST, inject, MAX_BODY, MAX_HEADER_BYTES)
    if got is None:
        return None
    wire, trace_id, span_id, injected, keep_alive, head_len = got
    parsed = python_parse(data)
    assert isinstance(parsed, list) and len(parsed) == 1, parsed
    [req] = parsed
    assert req.method == "POST" and req.path in ACCOUNTED_PATHS and req.http11
    mine = parse_plain_request(data, head_len, keep_alive)
    assert (mine.target, mine.raw_headers, mine.body, mine.keep_alive) == \
        (req.target, req.raw_headers, req.body, req.keep_alive)
    assert (wire, injected) == python_render(req, trace_id, span_id, inject)
    return got


# ------------------------------------------------------------------ exact cases
def test_the_extension_is_built_where_a_compiler_is_present():
    assert render is not None, "agent/tap/_front.c was not built: run `make setup` (pip install -e .)"


CHAT = {"model": "m", "messages": [{"role": "user", "content": "héllo \"there\"\n"}], "stream": True}


@pytest.mark.parametrize("body", [
    CHAT,
    {**CHAT, "stream": False},
    {"model": "m", "prompt": "x"},
    {**CHAT, "stream_options": {"include_usage": True}},
    {**CHAT, "stream_options": {"include_usage": True, "continuous_usage_stats": False}},
    {"model": "m", "prompt": "emoji \U0001F600 and 中文", "max_tokens": 12, "temperature": 0.7, "seed": 2**63 + 5,
     "logit_bias": {"50256": -100}, "stop": ["\n\n"], "stream": True, "user": "alice"},
    {},
])
@pytest.mark.parametrize("ascii_only", [True, False])
def test_realistic_requests_are_taken_and_match_the_python_path(body, ascii_only):
    data = http(json.dumps(body, ensure_ascii=ascii_only).encode(), [
        (b"Host", b"tap.local"), (b"User-Agent", b"OpenAI/Python 1.40"), (b"Accept", b"application/json"),
        (b"Accept-Encoding", b"gzip, deflate"), (b"Connection", b"keep-alive"), (b"X-Tenant", b"team-a"),
        (b"Authorization", b"Bearer sk-test"), (b"Content-Type", b"application/json"), (b"x-stainless-os", b"Linux")])
    got = check(data)
    assert got is not None, "a realistic request was declined"
    wire, trace_id, span_id, injected, keep_alive, _ = got
    assert injected == (body.get("stream") is True and "stream_options" not in body)
    assert keep_alive is True
    assert re.fullmatch(rb"POST /engine/v1/chat/completions HTTP/1\.1\r\nHost: 10\.0\.0\.7:8000\r\n.*", wire, re.S)
    assert b"Accept-Encoding" not in wire and b"Connection" not in wire and b"tap.local" not in wire
    assert b"\r\ntraceparent: 00-%s-%s-01\r\n" % (trace_id.encode(), span_id.encode()) in wire


def test_ids_are_w3c_shaped_random_and_never_zero():
    seen = set()
    for _ in range(200):
        _, trace_id, span_id, *_ = render(http(b'{"prompt":"x"}'), b"", HOST, True, MAX_BODY, MAX_HEADER_BYTES)
        assert re.fullmatch("[0-9a-f]{32}", trace_id) and re.fullmatch("[0-9a-f]{16}", span_id)
        assert int(trace_id, 16) and int(span_id, 16)
        seen.add(trace_id)
    assert len(seen) == 200


def test_connection_close_is_kept():
    got = check(http(b'{"prompt":"x"}', [(b"Host", b"t"), (b"Connection", b"Close")]))
    assert got is not None and got[4] is False


@pytest.mark.parametrize("data", [
    http(b'{"prompt":"x"}', method=b"PUT"),
    http(b'{"prompt":"x"}', path=b"/v1/models"),
    http(b'{"prompt":"x"}', path=b"/v1/completions/x"),
    http(b'{"prompt":"x"}', version=b"HTTP/1.0"),
    http(b'{"prompt":"x"}', length=False),
    http(b'{"prompt":"x"}')[:-1],                                        # body not all here yet
    http(b'{"prompt":"x"}') + b"POST",                                  # a pipelined request follows
    http(b'{"prompt":"x"}', [(b"Transfer-Encoding", b"chunked")]),
    http(b'{"prompt":"x"}', [(b"Expect", b"100-continue")]),
    http(b'{"prompt":"x"}', [(b"traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")]),
    http(b'{"prompt":"x"}', [(b"tracestate", b"a=b")]),
    http(b'{"prompt":"x"}', [(b"Upgrade", b"h2c")]),
    http(b'{"prompt":"x"}', [(b"Connection", b"upgrade")]),
    http(b'{"prompt":"x"}', [(b"Connection", b"keep-alive"), (b"Connection", b"close")]),
    http(b'{"prompt":"x"}', [(b"close", b"1")]),
    http(b'{"prompt":"x"}', [(b"Content-Length", b"14")]),                # a second Content-Length
    http(b'{"prompt":"x"}', [(b"X-Space", b"trailing ")]),
    http(b'{"prompt":"x"}', [(b"X-Empty", b"")]),
    http(b'{"prompt":"x"}', [(b"X Bad", b"name")]),
    http(b'{"prompt":"x"}', [(b"X-Ctl", b"a\x01b")]),
    http(b'{"prompt":"x"}', [(b"X-Big", b"v" * MAX_HEADER_BYTES)]),
    http(b'{"prompt":"x"}', [(b"X-%d" % i, b"v") for i in range(101)]),
    http(b"x" * (MAX_BODY + 1)),
    http(b'["not", "an", "object"]'),
    http(b'{"prompt":"x"'),
    http(b'{"prompt":"x"} {}'),
    http(b'{"\\u0073tream":true}'),                                      # an escaped top-level key
    http(b'{"prompt":"\\ud800"}'),                                       # a lone surrogate
    http(b'{"prompt":"\xff"}'),
    http(b'{"prompt":"\xed\xa0\x80"}'),                                  # a surrogate in UTF-8
    http(b'{"n":1e400}'),
    http(b'{"n":01}'),
    http(b'{"n":' + b"[" * 70 + b"]" * 70 + b"}"),
    http(b'{"stream":true,"stream_options":{"continuous_usage_stats":true}}'),   # Python re-encodes it
    http(b'{"stream":true,"stream_options":null}'),
])
def test_what_must_take_the_python_path_is_declined(data):
    assert render(data, PREFIX, HOST, True, MAX_BODY, MAX_HEADER_BYTES) is None


def test_stream_options_that_ask_nothing_are_taken_when_the_tap_injects_nothing():
    body = b'{"stream":true,"stream_options":{"continuous_usage_stats":true}}'
    got = check(http(body), inject=False)
    assert got is not None and got[3] is False and got[0].endswith(body)


def test_last_duplicate_key_wins_as_in_msgspec():
    assert check(http(b'{"stream":true,"stream":false}'))[3] is False
    assert check(http(b'{"stream":false,"stream":true}'))[3] is True
    asks_then_not = b'{"stream":true,"stream_options":{"include_usage":true},"stream_options":{}}'
    assert render(http(asks_then_not), PREFIX, HOST, True, MAX_BODY, MAX_HEADER_BYTES) is None
    assert check(http(b'{"stream":true,"stream_options":{"include_usage":false,"include_usage":true}}'))[3] is False


def test_bad_arguments_raise():
    with pytest.raises(TypeError):
        render("str", PREFIX, HOST, True, MAX_BODY, MAX_HEADER_BYTES)
    with pytest.raises(TypeError):
        render(b"", PREFIX, HOST)


# ------------------------------------------------------------------ property
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
                     st.text(max_size=12))
_json = st.recursive(_scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                      st.dictionaries(st.text(max_size=6), kids, max_size=4)),
                     max_leaves=12)
_keys = st.sampled_from(["model", "prompt", "messages", "stream", "stream_options", "max_tokens", "user", "n"])
_bodies = st.dictionaries(_keys, st.one_of(_json, st.just(True), st.fixed_dictionaries(
    {}, optional={"include_usage": st.sampled_from([True, False, 1, None]), "x": _json})), max_size=5)
_names = st.sampled_from([b"Host", b"HOST", b"Content-Type", b"Accept-Encoding", b"Connection", b"Keep-Alive", b"TE",
                          b"X-Tenant", b"Authorization", b"Proxy-Connection", b"Trailers", b"user-agent", b"X-A"])
_values = st.one_of(st.sampled_from([b"keep-alive", b"close", b"gzip", b"a, b", b"team-\xe9"]),
                    st.binary(min_size=1, max_size=12))


@st.composite
def _requests(draw):
    doc = draw(_bodies)
    if draw(st.booleans()):                                    # a stream, the case the tap injects into
        doc["stream"] = True
        if draw(st.booleans()):
            doc.pop("stream_options", None)
    body = json.dumps(doc, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 1])),
                      separators=draw(st.sampled_from([(",", ":"), (", ", ": ")]))).encode()
    body += draw(st.sampled_from([b"", b" ", b"\n", b"\r\n\t"]))
    mutate = draw(st.integers(0, 3))
    if mutate == 1 and body:                                   # one byte replaced: often no longer JSON
        i = draw(st.integers(0, len(body) - 1))
        body = body[:i] + bytes([draw(st.integers(0, 255))]) + body[i + 1:]
    elif mutate == 2:
        body = body[:draw(st.integers(0, len(body)))]
    headers = draw(st.lists(st.tuples(_names, _values), max_size=6))
    ows = draw(st.sampled_from([b" ", b"", b"\t", b"  "]))
    path = draw(st.sampled_from([b"/v1/completions", b"/v1/chat/completions", b"/v1/completions?x=1"]))
    lines = [b"POST " + path + b" HTTP/1.1"] + [k + b":" + ows + v for k, v in headers]
    lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@settings(max_examples=600, deadline=None)
@given(_requests(), st.booleans())
def test_whatever_c_takes_the_python_path_renders_byte_for_byte(data, inject):
    check(data, inject)


@settings(max_examples=300, deadline=None)
@given(_json)
def test_c_json_never_vouches_for_what_msgspec_rejects(value):
    text = json.dumps({"v": value}).encode()
    for body in (text, text[:-1], text.replace(b":", b"", 1), text + b"x"):
        if render(http(body), PREFIX, HOST, True, MAX_BODY, MAX_HEADER_BYTES) is not None:
            assert isinstance(msgspec.json.decode(body), dict)
