"""Connection limits every kvscope listener applies: a cap on open client connections that the
process's open-file limit can honour (`connection_cap`), the answer a connection over the cap gets
(`Refused`), and for the aiohttp servers (`HttpSite`: the agent's /metrics and API, the OTLP
receiver, `kvscope serve`) a `ConnectionGuard` that adds a request-head timeout to aiohttp's own
idle (keep-alive) timeout. The request tap (agent/tap/) has its own HTTP/1 protocol and times out
its connections itself, with the same cap and refusal.

The guard, per connection: its first request head must arrive whole within `header_timeout_s` of
the accept, however slowly its bytes trickle; after that aiohttp closes it once it has been
`idle_timeout_s` without a request (also before a later request's head is whole); a request's
body must then arrive whole within `request_timeout_s` of its head (agent/serve/site.py). At
`max_connections`, a new connection displaces the oldest one that has not yet sent a whole head (a
slow or half-open client), else the one whose request body has been arriving longest (a client
trickling its body; agent/serve/site.py marks it), so 300 half-open sockets or body tricklers
cannot keep a Prometheus scrape out; only when every open connection has sent a whole request is
the new one answered 503 and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
from collections import Counter
from collections.abc import Callable

from aiohttp import StreamReader

from kvscope.agent.config import ServerLimits

log = logging.getLogger("kvscope.serve")

LINGER_S = 1.0  # after an error answer, what the client still sends is read and dropped this long at most
SWEEP_S = 1.0  # at most; shorter when a timeout is short


OPEN_FILES = 8192
"""The soft open-file limit the agent asks for at start (the systemd units set LimitNOFILE to it;
in Kubernetes, which has no such field, the container runtime's hard limit allows it)."""


def raise_open_files(want: int = OPEN_FILES) -> int:
    """Raise the soft RLIMIT_NOFILE to `want` (never above the hard limit, never lower); the soft
    limit after. A seccomp filter or a hard limit below `want` leaves what is allowed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return soft


def connection_cap(wanted: int, who: str, fds_each: int = 1, reserve: int = 128) -> int:
    """`wanted` client connections, or fewer if the process may not open the file descriptors
    they need (`fds_each` per connection plus `reserve` for everything else): the soft
    RLIMIT_NOFILE is raised toward the hard limit first, as Go's runtime does."""
    need = fds_each * wanted + reserve
    soft = raise_open_files(need)
    if soft != resource.RLIM_INFINITY and soft < need:
        cap = max(1, (soft - reserve) // fds_each)
        log.warning(
            "%s: open-file limit %d allows %d client connections, not max_connections=%d", who, soft, cap, wanted
        )
        return cap
    return wanted


def linger(tr: asyncio.Transport) -> None:
    """Close after an error answer without resetting the connection under the client while it is
    still sending (a reset can destroy the answer before the client reads it): end our side, read
    on (the caller drops what comes), close at the client's end or after `LINGER_S`."""
    if tr.can_write_eof():
        tr.write_eof()
    tr.resume_reading()
    asyncio.get_running_loop().call_later(LINGER_S, tr.close)


def http_answer(status: str, body: bytes, content_type: bytes = b"application/json") -> bytes:
    """A whole `Connection: close` HTTP/1.1 answer (`status` like "503 Service Unavailable")."""
    return b"HTTP/1.1 %s\r\nContent-Type: %s\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (
        status.encode(),
        content_type,
        len(body),
        body,
    )


class Refused(asyncio.Protocol):
    """A connection over a listener's cap: `answer` at once, then closed (`linger`)."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.answer)  # type: ignore[attr-defined]
        linger(transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # the client is done too: close


class ConnectionGuard:
    """Wraps a protocol factory (aiohttp's `web.Server`): call it for each accepted connection.
    `closed` counts connections closed unserved by reason (`max_connections`, `displaced`,
    `header_timeout`, and `request_timeout` from agent/serve/site.py); `sweep()` runs until cancelled."""

    def __init__(self, factory: Callable[[], asyncio.BaseProtocol], limits: ServerLimits, who: str) -> None:
        self.factory, self.limits, self.who = factory, limits, who
        self.cap = connection_cap(limits.max_connections, who)
        self.open: dict[_Guarded, None] = {}  # oldest first
        self.closed: Counter[str] = Counter()
        body = b'{"status":"error","error":"%s: too many connections (max_connections)"}' % who.encode()
        self._answer = http_answer("503 Service Unavailable", body)

    def __call__(self) -> asyncio.BaseProtocol:
        if len(self.open) >= self.cap:
            victim = next((c for c in self.open if c.waiting_head), None) or self._slowest_body()
            if victim is None:
                self.count("max_connections")
                return Refused(self._answer)
            self.count("displaced")
            victim.close()
        return _Guarded(self.factory(), self)

    def _slowest_body(self) -> _Guarded | None:
        """The connection whose request body has been arriving longest, if one still is."""
        arriving = [c for c in self.open if c.body is not None and not c.body[1].is_eof()]
        return min(arriving, key=lambda c: c.body[0] if c.body else 0.0) if arriving else None

    def receiving_body(self, transport: asyncio.BaseTransport | None, body: tuple[float, StreamReader] | None) -> None:
        """Mark the connection on `transport` as receiving a request body, (since when in
        time.monotonic(), its stream), or done with the request (None): over the cap, a
        connection whose body is still arriving can be displaced."""
        for conn in self.open:
            if conn.transport is transport:
                conn.body = body
                return

    async def sweep(self) -> None:
        """Close every connection whose first request head is late."""
        limit = self.limits.header_timeout_s
        while True:
            await asyncio.sleep(min(SWEEP_S, limit / 4))
            late = time.monotonic() - limit
            for conn in [c for c in self.open if c.waiting_head and c.since < late]:
                self.count("header_timeout")
                conn.close()

    def abort_all(self) -> None:
        for conn in list(self.open):
            conn.close()

    def count(self, reason: str) -> None:
        """Count one connection closed unserved for `reason` (a warning at the 1st, 10th, 100th...)."""
        self.closed[reason] += 1
        n = self.closed[reason]
        if worth_a_warning(n):
            log.warning("%s: %d client connection(s) closed unserved (%s) so far", self.who, n, reason)


def worth_a_warning(n: int) -> bool:
    """Whether the `n`th connection closed unserved is logged: the 1st, 10th, 100th and every
    1000th (the count itself is in the self-metrics)."""
    return n in (1, 10, 100) or n % 1000 == 0


class _Guarded(asyncio.Protocol):
    """One accepted connection: passes everything to the wrapped protocol, watching only for the
    end of the first request head (a blank line)."""

    def __init__(self, inner: asyncio.BaseProtocol, guard: ConnectionGuard) -> None:
        self.inner, self.guard = inner, guard
        self.transport: asyncio.BaseTransport | None = None
        self.since = time.monotonic()
        self.waiting_head = True
        self.body: tuple[float, StreamReader] | None = None  # a request's body: since, its stream (site.py)
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.guard.open[self] = None
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.open.pop(self, None)
        self.transport = None
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.waiting_head:
            seen = self._tail + data[:65536]
            if b"\r\n\r\n" in seen or b"\n\n" in seen:
                self.waiting_head, self._tail = False, b""
            else:
                self._tail = seen[-3:]
        self.inner.data_received(data)  # type: ignore[attr-defined]

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()  # type: ignore[attr-defined]

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def close(self) -> None:
        self.guard.open.pop(self, None)
        if self.transport is not None:
            self.transport.close()
