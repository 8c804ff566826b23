"""The tap's native forwarding loop for streamed answers, and what it needs from Python.

`Relay` (agent/tap/_relay.c, built by setup.py) does the per-read work of an accounted SSE
answer in C: it undoes the upstream's chunked coding, cuts events, counts token events, and
writes what passes to the client, so an upstream read costs one Python call (the protocol's
`data_received`) plus C. Everything that is not a compact token chunk (the usage chunk,
`[DONE]`, anything unusual) comes back to Python through `SpecialEvents`, which classifies it
exactly as the pure-Python `SseScanner` does (agent/tap/sse.py).

`FRONT` (agent/tap/_front.c) is the request side of the common case: it renders one whole
plain request for the upstream, so the tap can write it before any Python work on it, and
declines everything else to the llhttp path (tests/unit/test_tap_front.py holds the two to the
same bytes).

The extensions are optional: `RELAY` and `FRONT` are None when they were not built (no compiler
at install time) or when `KVSCOPE_TAP_NATIVE=0` is set, and the tap then runs its pure-Python
path, which gives the client the same bytes (tests/unit/test_tap_native.py checks both against
each other).
"""

from __future__ import annotations

import os
from typing import Any

from kvscope.agent.tap.sse import classify_event

try:
    from kvscope.agent.tap._relay import Relay as _Relay
except ImportError:          # not built: the pure-Python path serves
    _Relay = None
try:
    from kvscope.agent.tap._front import render as _render
    from kvscope.agent.tap._front import seed as _seed
except ImportError:
    _render = _seed = None

_OFF = os.environ.get("KVSCOPE_TAP_NATIVE", "1") == "0"
RELAY: Any = None if _OFF else _Relay
FRONT: Any = None if _OFF else _render     # the request side for the common case (agent/tap/_front.c)
if _seed is not None:
    _seed(int.from_bytes(os.urandom(8), "big"))
PASS, TOKEN, DROP = 0, 1, 2


def native_status() -> str:
    """One line for the tap's startup log: which request side and stream loop run, and why."""
    if RELAY is not None and FRONT is not None:
        return "native (C) request side and stream relay"
    if _OFF:
        return "pure-Python request side and stream relay (KVSCOPE_TAP_NATIVE=0)"
    missing = [f"kvscope.agent.tap.{name}" for name, mod in (("_front", _render), ("_relay", _Relay)) if mod is None]
    python = [part for part, off in (("request side", FRONT is None), ("stream relay", RELAY is None)) if off]
    return f"pure-Python {' and '.join(python)} (C extension not built: {', '.join(missing)})"


class SpecialEvents:
    """The relay's callback for every event that is not a compact token chunk.

    Returns PASS, TOKEN or DROP for the event and keeps the last usage object seen (`usage`);
    DROP only for the usage-only chunk when the tap asked for it (`drop_usage`)."""

    __slots__ = ("drop_usage", "usage")

    def __init__(self, drop_usage: bool) -> None:
        self.drop_usage = drop_usage
        self.usage: dict[str, Any] | None = None

    def __call__(self, event: bytes) -> int:
        e = classify_event(event)
        if e.usage is not None:
            self.usage = e.usage
        if e.kind == "usage_only" and self.drop_usage:
            return DROP
        return TOKEN if e.kind == "token" else PASS
