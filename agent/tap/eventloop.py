"""The event loop a standalone `kvscope tap` runs on: uvloop when installed (cheaper reads and
writes: bench/tap_latency.py), else asyncio's; inside the agent the tap shares the agent's loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


def _uvloop() -> Any:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def run_event_loop(main: Coroutine[Any, Any, Any]) -> Any:
    """Run `main` to completion on uvloop if available, else on the default asyncio loop."""
    uvloop = _uvloop()
    return uvloop.run(main) if uvloop else asyncio.run(main)


def loop_name() -> str:
    """Which loop `run_event_loop` would use (for the startup line)."""
    return "uvloop" if _uvloop() else "asyncio"
