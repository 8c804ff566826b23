"""Tenant workload model for the load driver: who sends what, how long, and how often.

Pure logic, seeded: the same seed gives the same request sequence. Text is synthetic (words of
the tiny model's tokenizer corpus, ~1 token per word), so a length in words is close to a length
in tokens. Prompts are never logged: request records carry tenant, session, turn and lengths only.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import random
from dataclasses import dataclass, field

from testbed.build_tiny_model import WORDS


@dataclass(frozen=True)
class Dist:
    """A length distribution: `fixed`, `uniform` [lo, hi] or `lognormal` (median, sigma), clipped."""

    kind: str = "fixed"
    a: float = 64.0  # fixed value | uniform lo | lognormal median
    b: float = 0.0  # uniform hi | lognormal sigma
    lo: int = 1
    hi: int = 4096

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            v = self.a
        elif self.kind == "uniform":
            v = rng.uniform(self.a, self.b)
        elif self.kind == "lognormal":
            v = rng.lognormvariate(math.log(self.a), self.b)
        else:
            raise ValueError(f"unknown distribution kind {self.kind!r}")
        return max(self.lo, min(self.hi, int(round(v))))


@dataclass(frozen=True)
class Tenant:
    """One tenant: its own system prompt (the shared prefix), traffic share and lengths."""

    name: str
    system_words: int = 256  # length of the tenant's shared system prompt
    share: float = 1.0  # relative traffic weight
    prompt_words: Dist = Dist("fixed", 32)  # user message per turn
    output_tokens: Dist = Dist("fixed", 32)  # max_tokens (with ignore_eos: the exact length)
    turns: int = 1  # turns per session (>1: growing prefixes)
    reply_words: int = 24  # synthetic assistant turn carried into the next turn
    temperature: float = 0.0


def power_law_shares(n: int, alpha: float = 1.2) -> list[float]:
    """Zipf-like traffic shares for n tenants (rank 1 heaviest), summing to 1."""
    if n <= 0:
        raise ValueError("n must be positive")
    w = [1.0 / (rank**alpha) for rank in range(1, n + 1)]
    total = sum(w)
    return [x / total for x in w]


def synthetic_text(key: str, words: int) -> str:
    """Deterministic filler text: the same key gives the same words (a reusable prefix)."""
    rng = random.Random(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big"))
    return " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass
class Request:
    """One planned request. `messages` holds the text to send; never log it."""

    tenant: str
    session: str
    turn: int
    messages: list[dict[str, str]] = field(repr=False)
    max_tokens: int = 32
    prompt_words: int = 0
    temperature: float = 0.0

    def route_key(self, by: str) -> str:
        """The string a hashing router hashes: `tenant`, `session` or `prefix` (system prompt)."""
        if by == "tenant" or by == "prefix":
            return self.tenant
        if by == "session":
            return f"{self.tenant}/{self.session}"
        raise ValueError(f"unknown route key {by!r}")


@dataclass
class _Session:
    id: str
    turn: int
    messages: list[dict[str, str]]


class TenantSampler:
    """Draws requests: picks a tenant by share, then continues one of its open sessions or opens
    a new one. A session's turn k+1 resends turn k's messages plus a synthetic assistant reply and a
    new user message, so its prompt grows and its earlier blocks can be cache hits."""

    def __init__(self, tenants: list[Tenant], seed: int = 0, open_sessions: int = 4) -> None:
        if not tenants:
            raise ValueError("at least one tenant")
        if any(t.share < 0 for t in tenants) or sum(t.share for t in tenants) <= 0:
            raise ValueError("tenant shares must be >= 0 with a positive sum")
        self.tenants = tenants
        self.rng = random.Random(seed)
        self.open_sessions = open_sessions
        self._cum = list(itertools.accumulate(t.share for t in tenants))
        self._sessions: dict[str, list[_Session]] = {t.name: [] for t in tenants}
        self._counter = itertools.count()

    def pick_tenant(self) -> Tenant:
        x = self.rng.random() * self._cum[-1]
        return self.tenants[min(bisect.bisect_right(self._cum, x), len(self.tenants) - 1)]

    def next_request(self) -> Request:
        t = self.pick_tenant()
        sessions = self._sessions[t.name]
        if t.turns > 1 and sessions and (len(sessions) >= self.open_sessions or self.rng.random() < 0.5):
            s = self.rng.choice(sessions)
            s.messages = s.messages + [
                {"role": "assistant", "content": synthetic_text(f"{s.id}/a{s.turn}", t.reply_words)}
            ]
            s.turn += 1
        else:
            sid = f"s{next(self._counter)}"
            s = _Session(sid, 0, [{"role": "system", "content": synthetic_text(f"sys/{t.name}", t.system_words)}])
            if t.turns > 1:
                sessions.append(s)
        words = t.prompt_words.sample(self.rng)
        s.messages = s.messages + [{"role": "user", "content": synthetic_text(f"{s.id}/u{s.turn}", words)}]
        if s.turn + 1 >= t.turns and s in sessions:
            sessions.remove(s)
        return Request(t.name, s.id, s.turn, list(s.messages), t.output_tokens.sample(self.rng), words, t.temperature)
