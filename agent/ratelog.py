"""Rate-limited warnings for the agent's background loops: a bad input repeated every second is
logged once a minute per reason (`warn_every`), and a target or collector going down and up again
is logged once per change, at most once a minute per target (`ChangeLog`); the self-metrics count
every one."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

_LAST_WARNED: dict[str, float] = {}


def warn_every(log: logging.Logger, key: str, msg: str, *args: Any, interval_s: float = 60.0) -> None:
    """`log.warning(msg, *args)` at most once per `interval_s` per `key` (keys are reason tokens,
    a bounded set)."""
    now = time.monotonic()
    if now - _LAST_WARNED.get(key, -interval_s) >= interval_s:
        _LAST_WARNED[key] = now
        log.warning(msg, *args)


class ChangeLog:
    """Logs the state changes of things the agent watches (a scrape target, a collector): one
    warning when one goes down, with its reason token, and one info line when it is up again.

    Rate-limited per thing: a line is written only when the state differs from the last line
    written for it (a failure repeated with the same reason is logged once), and at most once per
    `interval_s` per thing; a change held back by the limit is written once the interval has passed
    (if it still holds), with how many changes happened since the last line. A thing first seen up
    logs nothing; first seen down logs the down line. Keys are the configured targets and collectors
    (a bounded set)."""

    def __init__(
        self, log: logging.Logger, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log, self.interval_s, self._clock = log, interval_s, clock
        self._logged: dict[str, tuple[bool, str]] = {}  # key -> state of its last line
        self._seen: dict[str, tuple[bool, str]] = {}  # key -> state last observed
        self._changes: dict[str, int] = {}  # key -> changes since its last line
        self._at: dict[str, float] = {}  # key -> when its last line was written

    def observe(self, key: str, what: str, up: bool, reason: str) -> None:
        """Record `key`'s state this cycle (`what` names it in the line: "target http://...")."""
        state = (True, "") if up else (False, reason or "unknown")
        if state != self._seen.get(key, (True, "")):
            self._changes[key] = self._changes.get(key, 0) + 1
        self._seen[key] = state
        if state == self._logged.get(key, (True, "")):
            return
        now = self._clock()
        if key in self._at and now - self._at[key] < self.interval_s:
            return
        self._at[key], self._logged[key] = now, state
        changes = self._changes.pop(key, 0)
        extra = f" ({changes} state changes since the last line)" if changes > 1 else ""
        if up:
            self._log.info("%s is up again%s", what, extra)
        else:
            self._log.warning("%s is down: %s%s", what, state[1], extra)
