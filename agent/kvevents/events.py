"""KV cache events (vLLM / SGLang ZMQ publisher) -> typed events. Pure: bytes in, events out.

Wire (engine-metrics.md §1.9, §2.8): a ZMQ multipart message `[topic, seq (8-byte big-endian),
payload]`; the payload is a msgpack array `[ts, events, dp_rank]` (dp_rank missing in older
releases). Each event is a map tagged with `type` (BlockStored | BlockRemoved |
AllBlocksCleared), or, from older array-encoded publishers, an array whose first item is the tag
followed by the fields in declaration order. Unknown event types are skipped, not errors.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, NamedTuple

import msgspec

_DECODER = msgspec.msgpack.Decoder()

# tag -> (kind, positional field order of the array-encoded event after its tag)
_EVENTS = {
    "BlockStored": ("stored", ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")),
    "BlockRemoved": ("removed", ("block_hashes", "medium")),
    "AllBlocksCleared": ("cleared", ()),
}


class KvEventError(ValueError):
    """A payload that is not a KV event batch; `reason` is a stable token for metrics."""

    def __init__(self, message: str, reason: str = "bad_batch") -> None:
        super().__init__(message)
        self.reason = reason


class KvEvent(NamedTuple):
    """One block event. `block_hashes` are ints or bytes exactly as published (never token ids)."""

    kind: str  # stored | removed | cleared
    ts: float
    dp_rank: int | None
    block_hashes: tuple[Any, ...]
    medium: str | None = None


def parse_seq(frame: bytes) -> int:
    """The 8-byte big-endian sequence number frame (-1 is the replay end marker)."""
    if len(frame) != 8:
        raise KvEventError(f"sequence frame has {len(frame)} bytes, want 8", "bad_seq")
    return int.from_bytes(frame, "big", signed=True)


def parse_kv_batch(payload: bytes, bad: Counter[str] | None = None) -> list[KvEvent]:
    """Decode one msgpack `[ts, events, dp_rank]` batch into events (token ids are not kept).

    Raises KvEventError when the batch itself is unusable. An event inside a good batch that is
    malformed (a block hash that is not an int, bytes or str...) is skipped and counted in `bad`
    under `bad_event`; the batch's other events are kept."""
    try:
        doc = _DECODER.decode(payload)
    except (msgspec.DecodeError, ValueError, TypeError) as e:  # UnicodeDecodeError is a ValueError
        raise KvEventError(f"not msgpack: {e}", "not_msgpack") from e
    except RecursionError:  # msgspec's own depth limit (found by bench/fuzz_inputs.py)
        raise KvEventError("msgpack nested too deeply for a KV event batch", "bad_batch") from None
    if not isinstance(doc, list) or len(doc) < 2 or not isinstance(doc[1], list):
        raise KvEventError("KV event batch must be an array [ts, events, dp_rank]")
    ts = float(doc[0]) if isinstance(doc[0], (int, float)) and math.isfinite(doc[0]) else 0.0
    dp = doc[2] if len(doc) > 2 and type(doc[2]) is int else None
    out = []
    for raw in doc[1]:
        try:
            ev = _event(raw, ts, dp)
        except KvEventError:
            if bad is not None:
                bad["bad_event"] += 1
            continue
        if ev is not None:
            out.append(ev)
    return out


def _fields(raw: Any) -> tuple[str | None, dict[str, Any]]:
    if isinstance(raw, dict):
        return raw.get("type"), raw
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        names = _EVENTS.get(raw[0], ("", ()))[1]
        return raw[0], dict(zip(names, raw[1:], strict=False))
    return None, {}


def _event(raw: Any, ts: float, dp: int | None) -> KvEvent | None:
    tag, f = _fields(raw)
    if not isinstance(tag, str) or tag not in _EVENTS:
        return None
    kind = _EVENTS[tag][0]
    hashes = f.get("block_hashes") or ()
    if not isinstance(hashes, (list, tuple)):
        hashes = (hashes,)
    parent = f.get("parent_block_hash")
    if not all(type(h) in _HASH_TYPES for h in hashes) or parent is not None and type(parent) not in _HASH_TYPES:
        raise KvEventError(f"{tag}: block hashes must be ints, bytes or strings")
    medium = f.get("medium")
    return KvEvent(kind, ts, dp, tuple(hashes), medium if isinstance(medium, str) else None)


_HASH_TYPES = (int, bytes, str)
