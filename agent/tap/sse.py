"""Server-sent events of an OpenAI-compatible stream, handled as bytes so they pass unchanged.

`SseSplitter` cuts the upstream byte stream into complete events (each with its blank-line
terminator, exactly as received). `classify_event` says what an event is: a token chunk, the
usage-only chunk (`"choices":[]` plus `usage`) that `stream_options.include_usage` adds, the
`[DONE]` marker, or something else. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

_DECODER = msgspec.json.Decoder()


class SseSplitter:
    """Feed bytes, get complete events back (terminator included); the rest waits for more."""

    def __init__(self, max_event_bytes: int = 4 << 20) -> None:
        self._buf = b""
        self.max_event_bytes = max_event_bytes

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._buf + chunk if self._buf else chunk
        out, start = [], 0
        while True:
            i = buf.find(b"\n\n", start)
            j = buf.find(b"\r\n\r\n", start)
            if i < 0 and j < 0:
                break
            end = j + 4 if j >= 0 and (i < 0 or j < i) else i + 2
            out.append(buf[start:end])
            start = end
        self._buf = buf[start:]
        if len(self._buf) > self.max_event_bytes:     # not SSE after all: stop holding it back
            out.append(self._buf)
            self._buf = b""
        return out

    def rest(self) -> bytes:
        """Bytes after the last complete event (sent as-is when the stream ends)."""
        rest, self._buf = self._buf, b""
        return rest


@dataclass(frozen=True)
class Event:
    kind: str                          # token | usage_only | done | other
    usage: dict[str, Any] | None = None


def classify_event(event: bytes) -> Event:
    """What one SSE event carries. Only `data:` events with a JSON object are decoded."""
    if b'"usage":{' not in event and event.startswith(b"data: {") and event.count(b"data:") == 1:
        # fast path for the common token chunk, no JSON decode: vLLM and SGLang write one compact
        # JSON object per `data:` line. Anything spelled otherwise takes the decoding path.
        if b'"choices":[{' in event:
            return Event("token")
        if b'"choices":[]' in event:
            return Event("other")
    data = _data(event)
    if data is None:
        return Event("other")
    if data == b"[DONE]":
        return Event("done")
    try:
        doc = _DECODER.decode(data)
    except msgspec.DecodeError:
        return Event("other")
    if not isinstance(doc, dict):
        return Event("other")
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else None
    if doc.get("choices") == [] and usage is not None:
        return Event("usage_only", usage)
    return Event("token" if doc.get("choices") else "other", usage)


def _data(event: bytes) -> bytes | None:
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
