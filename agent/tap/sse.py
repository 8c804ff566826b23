"""Server-sent events of an OpenAI-compatible stream, handled as bytes so they pass unchanged:
`SseScanner` times token events, keeps usage and drops the usage-only event the tap caused."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

_DECODER = msgspec.json.Decoder()


def split_events(data: bytes) -> list[bytes]:
    """The events in `data`, each with its blank-line terminator, exactly as received (bytes after
    the last terminator, if any, come last)."""
    out, start = [], 0
    while True:
        i = data.find(b"\n\n", start)
        j = data.find(b"\r\n\r\n", start)
        if i < 0 and j < 0:
            break
        end = j + 4 if j >= 0 and (i < 0 or j < i) else i + 2
        out.append(data[start:end])
        start = end
    return out + [data[start:]] if start < len(data) else out


class Event(NamedTuple):
    """What one SSE event carries."""

    kind: str  # token | usage_only | done | other
    usage: dict[str, Any] | None = None


_TOKEN, _OTHER, _DONE = Event("token"), Event("other"), Event("done")


def classify_event(event: bytes) -> Event:
    """What one SSE event carries. Only `data:` events with a JSON object are decoded."""
    if b'"usage":{' not in event and event.startswith(b"data: {") and event.count(b"data:") == 1:
        # fast path for the common token chunk, no JSON decode: vLLM and SGLang write one compact
        # JSON object per `data:` line. Anything spelled otherwise takes the decoding path.
        if b'"choices":[{' in event:
            return _TOKEN
        if b'"choices":[]' in event:
            return _OTHER
    data = _data(event)
    if data == b"[DONE]":
        return _DONE
    doc = parse_json_object(data) if data is not None else None
    if doc is None:
        return _OTHER
    usage = usage_of(doc)
    if doc.get("choices") == [] and usage is not None:
        return Event("usage_only", usage)
    return Event("token" if doc.get("choices") else "other", usage)


def parse_json_object(body: bytes) -> dict[str, Any] | None:
    """The JSON object in body, None if it is not one, nested past msgspec's depth limit included
    (pure)."""
    try:
        doc = _DECODER.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def usage_of(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The OpenAI `usage` object of a response or chunk, None if it has none."""
    usage = doc.get("usage") if doc is not None else None
    return usage if isinstance(usage, dict) else None


def _data(event: bytes) -> bytes | None:
    """The event's data: its `data:` lines' values joined by line feeds, stripped; None if none."""
    line = event.rstrip()
    if line.startswith(b"data:") and b"\n" not in line and b"\r" not in line:
        return line[5:].strip()  # one line (the usual event): no split needed
    lines = [ln[5:].lstrip(b" ") for ln in event.splitlines() if ln.startswith(b"data:")]
    return b"\n".join(lines).strip() if lines else None


def parse_usage(usage: dict[str, Any] | None) -> tuple[int | None, int | None, int | None]:
    """(prompt_tokens, completion_tokens, cached_tokens) from an OpenAI usage object; None where absent."""
    if not usage:
        return None, None, None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")), _int(cached)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class SseScanner:
    """The tap's per-stream view of an SSE body, cheap enough for every upstream read.

    `feed(data, now)` returns the bytes to pass on: the complete events as received (a partial one
    waits for its end), minus the usage-only event when `drop_usage`. It keeps the first token
    event's time, the gaps between token events (0 s within one read) and the last usage seen.
    Pure: the caller passes the clock.
    """

    __slots__ = ("drop_usage", "max_event_bytes", "first_token", "last_token", "gaps", "usage", "_buf")

    def __init__(self, drop_usage: bool, max_event_bytes: int = 4 << 20) -> None:
        self.drop_usage = drop_usage
        self.max_event_bytes = max_event_bytes
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.gaps: list[float] = []
        self.usage: dict[str, Any] | None = None
        self._buf = b""

    def feed(self, data: bytes, now: float) -> bytes:
        if not self._buf and data.endswith(b"\n\n") and (n := _token_events(data)):
            self._tokens(n, now)  # the common read: whole token events only
            return data
        buf = self._buf + data if self._buf else data
        end = _last_event_end(buf)
        if end < 0:
            self._buf = buf
            if len(buf) > self.max_event_bytes:  # not SSE after all: stop holding it back
                self._buf = b""
                return buf
            return b""
        whole, self._buf = (buf, b"") if end == len(buf) else (buf[:end], buf[end:])
        if n := _token_events(whole):
            self._tokens(n, now)
            return whole
        # the stream's tail (usage, [DONE]) or something unusual: token events before it still
        # take the fast path, the rest is classified event by event
        cut = _last_event_end(whole[: _first_special(whole)])
        if cut > 0 and (n := _token_events(whole[:cut])):
            self._tokens(n, now)
            tail = self._events(whole[cut:], now)
            return whole if len(tail) == len(whole) - cut else whole[:cut] + tail
        return self._events(whole, now)

    def rest(self) -> bytes:
        """Bytes after the last complete event (passed on as-is when the stream ends)."""
        rest, self._buf = self._buf, b""
        return rest

    def _tokens(self, n: int, now: float) -> None:
        if self.first_token is None:
            self.first_token = now
        else:
            self.gaps.append(now - self.last_token)  # type: ignore[operator]
        if n > 1:
            self.gaps.extend([0.0] * (n - 1))
        self.last_token = now

    def _events(self, whole: bytes, now: float) -> bytes:
        keep: list[bytes] = []
        dropped = False
        for ev in split_events(whole):
            e = classify_event(ev)
            if e.usage is not None:
                self.usage = e.usage
            if e.kind == "usage_only" and self.drop_usage:
                dropped = True
                continue
            if e.kind == "token":
                self._tokens(1, now)
            keep.append(ev)
        return b"".join(keep) if dropped else whole


def _token_events(whole: bytes) -> int:
    """How many events `whole` (complete events from an event boundary on) holds if every one
    is a compact token chunk, else 0. Every `data:` must open an event (at the start or after a
    blank line), so no event has two data lines; events without one (comments) are not tokens on
    either path. `[DONE]` needs no scan: its `data:` has no `"choices":[{`, so the counts cannot
    match (a JSON string cannot hold `"choices":[{` unescaped)."""
    if b'"usage"' in whole:
        return 0
    n = whole.count(b"data:")
    if n and whole.startswith(b"data:") and whole.count(b"\n\ndata:") == n - 1 and whole.count(b'"choices":[{') == n:
        return n
    return 0


def _first_special(whole: bytes) -> int:
    """Where the first usage object or [DONE] marker starts (len(whole) if neither occurs)."""
    return min((i for i in (whole.find(b'"usage"'), whole.find(b"[DONE]")) if i >= 0), default=len(whole))


def _last_event_end(buf: bytes) -> int:
    """Index just past the last blank-line event terminator in buf, -1 if there is none."""
    i = buf.rfind(b"\n\n")
    j = buf.rfind(b"\r\n\r\n")
    return max(i + 2 if i >= 0 else -1, j + 4 if j >= 0 else -1)
