"""The event loop a standalone `kvscope tap` runs on: uvloop when it is installed, else asyncio's.

uvloop (libuv) cuts the per-read and per-write cost of the event loop, which is most of what a
streaming proxy does (bench/tap_latency.py). The tap itself uses only asyncio's public API, so
it runs the same on either loop; inside the agent it shares the agent's loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


def run_event_loop(main: Coroutine[Any, Any, Any]) -> Any:
    """Run `main` to completion on uvloop if available, else on the default asyncio loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def loop_name() -> str:
    """Which loop `run_event_loop` would use (for the startup line)."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"
