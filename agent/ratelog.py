"""Rate-limited warnings for the agent's background loops: a bad input repeated every second is
logged once a minute per reason; the self-metrics count every one."""

from __future__ import annotations

import logging
import time
from typing import Any

_LAST_WARNED: dict[str, float] = {}


def warn_every(log: logging.Logger, key: str, msg: str, *args: Any, interval_s: float = 60.0) -> None:
    """`log.warning(msg, *args)` at most once per `interval_s` per `key` (keys are reason tokens,
    a bounded set)."""
    now = time.monotonic()
    if now - _LAST_WARNED.get(key, -interval_s) >= interval_s:
        _LAST_WARNED[key] = now
        log.warning(msg, *args)
