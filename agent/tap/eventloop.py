"""The event loop a standalone `kvscope tap` runs on: uvloop when installed (cheaper reads and
writes: bench/tap_latency.py), else asyncio's; inside the agent the tap shares the agent's loop."""

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
