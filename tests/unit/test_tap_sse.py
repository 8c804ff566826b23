"""SseScanner: the tap's per-read SSE handling (pure; the caller passes the clock)."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.agent.tap.sse import SseScanner, parse_json_object


def tok(text="t"):
    return (
        b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"'
        + text.encode()
        + b'"}}]}\n\n'
    )


USAGE = (
    b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,'
    b'"prompt_tokens_details":{"cached_tokens":8}}}\n\n'
)
DONE = b"data: [DONE]\n\n"


def test_whole_stream_in_one_read_drops_only_the_injected_usage_event():
    s = SseScanner(drop_usage=True)
    out = s.feed(tok("a") + tok("b") + USAGE + DONE, 1.0) + s.rest()
    assert out == tok("a") + tok("b") + DONE
    assert s.usage["prompt_tokens_details"]["cached_tokens"] == 8
    assert s.first_token == 1.0 and s.gaps == [0.0]


def test_usage_the_client_asked_for_passes_and_is_still_read():
    s = SseScanner(drop_usage=False)
    assert s.feed(tok() + USAGE + DONE, 1.0) == tok() + USAGE + DONE
    assert s.usage["prompt_tokens"] == 12


def test_first_token_and_gaps_follow_the_reads():
    s = SseScanner(drop_usage=True)
    assert s.feed(b": keep-alive comment\n\n", 0.5) == b": keep-alive comment\n\n"
    assert s.first_token is None  # a comment is not a token
    s.feed(tok(), 1.0)
    s.feed(tok() + tok() + tok(), 1.25)  # fast path: three token events in one read
    s.feed(tok(), 2.0)
    assert s.first_token == 1.0 and s.last_token == 2.0
    assert s.gaps == [0.25, 0.0, 0.0, 0.75]


def test_a_partial_event_waits_for_its_end_and_crlf_framing_works():
    s = SseScanner(drop_usage=True)
    ev = tok("x").replace(b"\n\n", b"\r\n\r\n")
    assert s.feed(ev[:10], 1.0) == b""
    assert s.feed(ev[10:] + USAGE[:20], 2.0) == ev  # the usage event's start is held back ...
    assert s.feed(USAGE[20:], 3.0) == b""  # ... and dropped once complete
    assert s.first_token == 2.0 and s.usage is not None


def test_non_sse_bytes_are_not_held_forever():
    s = SseScanner(drop_usage=True, max_event_bytes=100)
    assert s.feed(b"x" * 60, 1.0) == b""
    assert s.feed(b"y" * 60, 1.0) == b"x" * 60 + b"y" * 60
    assert s.first_token is None and s.rest() == b""


def test_pretty_printed_or_multi_line_events_take_the_decoding_path():
    s = SseScanner(drop_usage=True)
    s.feed(tok(), 1.0)
    spaced = b'data: {"choices": [{"index": 0, "text": "a"}]}\n\n'
    multi = b'data: {"choices":[],\ndata: "usage":{"prompt_tokens":5}}\n\n'
    assert s.feed(spaced + multi, 2.0) == spaced  # multi-line usage-only event is dropped too
    assert s.gaps == [1.0] and s.usage == {"prompt_tokens": 5}


def test_deeply_nested_json_is_passed_on_as_not_an_object():
    # msgspec raises RecursionError past its depth limit; it must not escape the upstream read
    deep = b"data: " + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"\n\n"
    s = SseScanner(drop_usage=True)
    assert s.feed(deep + tok(), 1.0) == deep + tok()
    assert s.usage is None and s.first_token == 1.0
    assert parse_json_object(b"[" * 5000 + b"]" * 5000) is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["tok", "usage", "done", "comment", "tok_crlf", "multi", "named", "pair"]), max_size=12),
    st.lists(st.integers(min_value=1, max_value=400), max_size=30),
    st.booleans(),
)
def test_any_read_split_gives_the_same_bytes_and_counts(kinds, cuts, drop):
    """However the upstream's bytes are cut into reads, the client gets the same bytes."""
    parts = {
        "tok": tok(),
        "usage": USAGE,
        "done": DONE,
        "comment": b": c\n\n",
        "tok_crlf": tok().replace(b"\n\n", b"\r\n\r\n"),  # token events, other framings:
        "multi": b'data: {"choices":[{"index":0,\ndata: "text":"a"}]}\n\n',  # two data lines
        "named": b"event: message\n" + tok(),  # an event line first
        "pair": tok()[:-1] + tok(),
    }  # two JSON lines in one event: not a token (invalid JSON)
    stream = b"".join(parts[k] for k in kinds)
    expected = b"".join(parts[k] for k in kinds if not (drop and k == "usage"))
    s = SseScanner(drop_usage=drop)
    out, pos = [], 0
    for c in cuts:
        out.append(s.feed(stream[pos : pos + c], float(pos)))
        pos += c
    out.append(s.feed(stream[pos:], float(pos)))
    out.append(s.rest())
    assert b"".join(out) == expected
    n_tok = sum(kinds.count(k) for k in ("tok", "tok_crlf", "multi", "named"))
    assert len(s.gaps) == max(0, n_tok - 1)
    assert (s.usage is not None) == ("usage" in kinds)
    if "usage" in kinds:
        assert s.usage == json.loads(USAGE[6:])["usage"]
