"""What the tap learns about one request while it passes (`Exchange`), and what a `Forward`
needs of the tap that made it (`Tap`, met by agent/tap/proxy.py `RequestTap`)."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvscope.agent.tap.http1 import Request, UpstreamPool
from kvscope.agent.tap.sessions import Turn


@dataclass(slots=True)
class Exchange:
    """What the tap learned about one request while it passed."""

    tenant: str
    path: str
    model: str | None
    start: float
    trace_id: str
    span_id: str
    parent_id: str
    replica: str = ""
    reusable_ratio: float | None = None
    first_token: float | None = None
    status: int = 0
    usage: dict[str, Any] | None = None
    outcome: str = "ok"
    start_ns: int = 0
    gaps: list[float] = field(default_factory=list)
    session_id: str | None = None
    turn: Turn | None = None
    adapter: str | None = None  # the bounded adapter label of `model`; None without a model


class Tap(Protocol):
    """The tap a `Forward` reports to: its upstream pool, running tasks, outcome counts, and
    the tenant, prefix and usage bookkeeping of an exchange."""

    pool: UpstreamPool
    tasks: set[asyncio.Task[None]]
    stats: Counter[str]

    def identify(self, ex: Exchange, req: Request, doc: dict[str, Any]) -> None: ...

    def observe_prefix(self, ex: Exchange, doc: dict[str, Any]) -> None: ...

    def account(self, ex: Exchange) -> None: ...
