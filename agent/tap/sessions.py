"""Multi-turn sessions seen by the tap: did turn N+1 find turn N's context in the prefix cache?
(LEVERS.md K5; docs/requests.md §2, Sessions.) Turns link by session id, else by prefix chain; a
follow-up whose `cached_tokens` falls over `slack_tokens` short of the previous turn's
`prompt_tokens` is a miss. Only hashes are kept, never text; at most `max_sessions` (LRU).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from kvscope.agent.metricsets import CounterSet
from kvscope.agent.tap.prefix import PrefixMatch
from kvscope.core.signals import Sample, make_labels

SESSION_HEADER = "X-Session-ID"


@dataclass
class _Session:
    prompt_tokens: int  # the last finished turn's prompt tokens
    turns: int  # turns seen so far
    last_seen: float


class Turn(NamedTuple):
    """What `begin` learned about one request; pass it to `finish`."""

    key: int | bytes | None  # where it will be remembered: chain block hash (int) or session
    # id digest (bytes, never equal to an int); None: not chained
    previous: _Session | None  # the turn it follows, if any
    via: str  # id | chain | none


class TurnVerdict(NamedTuple):
    """How `finish` judged a turn."""

    follow_up: bool
    missed: bool | None  # None: not a follow-up, or cached tokens unknown


def parse_session_id(
    headers: Mapping[str, str], body: Mapping[str, Any] | None, header: str | None = SESSION_HEADER
) -> str | None:
    """The caller's session id: the configured header, else the body's `session_id` (pure)."""
    v = (headers.get(header) if header else None) or (body.get("session_id") if body else None)
    return (v.strip() or None) if isinstance(v, str) else None


class SessionTracker:
    """Links turns of one conversation and counts follow-up turns that lost their cached context."""

    def __init__(
        self,
        *,
        window_s: float = 1800.0,
        max_sessions: int = 20_000,
        slack_tokens: int = 32,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s, self.max_sessions, self.slack_tokens = window_s, max_sessions, slack_tokens
        self._clock = clock
        self._sessions: OrderedDict[int | bytes, _Session] = OrderedDict()
        self._lock = threading.Lock()
        self.turns = CounterSet("session_turns_total")
        self.misses = CounterSet("session_turn_misses_total")
        self.stats: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._sessions)

    def begin(self, match: PrefixMatch | None, session_id: str | None = None) -> Turn:
        """Find the turn this request follows: by `session_id` (see `parse_session_id`) when the
        caller sent one, else by prefix chain (`match` from `PrefixIndex.observe`)."""
        now = self._clock()
        with self._lock:
            if session_id is not None:
                key = b"s" + hashlib.blake2b(session_id.encode(), digest_size=8).digest()
                return Turn(key, self._live(key, now), "id")
            if match is None or match.full_blocks == 0:
                return Turn(None, None, "none")
            last = match.hashes[match.full_blocks - 1]
            # the deepest earlier turn whose last full block this prompt contains, with more after it,
            # found by a C-level filter (one pass, not a Python lookup per block)
            earlier = reversed(match.hashes[: match.full_blocks - 1])
            for h in filter(self._sessions.__contains__, earlier):
                prev = self._live(h, now)
                if prev is not None:
                    self._sessions.pop(h)  # the chain moves on to this turn
                    return Turn(last, prev, "chain")
            return Turn(last, None, "chain")

    def _live(self, key: int | bytes, now: float) -> _Session | None:
        s = self._sessions.get(key)
        return s if s is not None and now - s.last_seen <= self.window_s else None

    def finish(
        self, turn: Turn | None, tenant: str, upstream: str, prompt_tokens: int | None, cached_tokens: int | None
    ) -> TurnVerdict:
        """Judge a finished turn and remember it as the latest of its session."""
        if turn is None or turn.key is None:
            return TurnVerdict(False, None)
        prev = turn.previous
        missed = None
        if prev is not None and cached_tokens is not None:
            missed = cached_tokens < prev.prompt_tokens - self.slack_tokens
            # instance: the upstream's host:port, the label engines' own series carry
            lab = make_labels({"tenant": tenant, "instance": urlsplit(upstream).netloc or upstream})
            self.turns.inc(lab)
            if missed:
                self.misses.inc(lab)
            self.stats[f"follow_up_{turn.via}"] += 1
        if prompt_tokens is not None:
            self._remember(turn.key, prompt_tokens, (prev.turns if prev else 0) + 1)
        return TurnVerdict(prev is not None, missed)

    def _remember(self, key: int | bytes, prompt_tokens: int, turns: int) -> None:
        with self._lock:
            self._sessions[key] = _Session(prompt_tokens, turns, self._clock())
            self._sessions.move_to_end(key)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
                self.stats["evicted"] += 1

    def render(self, timestamp: float | None = None) -> list[Sample]:
        """`session_turns_total` and `session_turn_misses_total` (cumulative)."""
        return self.turns.render(timestamp) + self.misses.render(timestamp)
