"""Name lookups for the agent's HTTP clients, on daemon threads of their own, at most a few at once.
(The KV-event subscriber looks its publishers' names up with `daemon_call` and `lookup` too.)

aiohttp's default resolver runs getaddrinfo through the event loop. On asyncio's loop that is the
loop's default executor (min(32, cores + 4) threads), which the host and NVML collectors' own
threads and the OTLP push run on too; on uvloop it is libuv's pool, and a closing uvloop waits for
every lookup still in it. getaddrinfo takes no timeout, so a DNS server that never answers, for a
few targets named by host name, stalls those collectors (asyncio) or keeps a stopped agent from
exiting until glibc gives up on every name (uvloop: timeout x attempts x nameservers x search
domains per name; up to minutes under Kubernetes' ndots:5).

`ThreadResolver` gives each lookup a daemon thread and runs at most `limit` of them at once per
client session; aiohttp's connector already shares one lookup among the requests for one host and
port, so the lookups waiting for a thread are at most one per name. A read still ends at its own
deadline (the lookup is left to finish; its slot is free once the resolver answers), and a process
exits without waiting for a lookup.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

T = TypeVar("T")

MAX_LOOKUPS = 8
"""Lookups on threads at once per client session."""

_NUMERIC = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV


class ResolverStuck(OSError):
    """Every lookup slot is held by a lookup that its readers gave up on: the resolver is not
    answering, so `host` is not looked up at all (no thread is started for it)."""

    def __init__(self, host: str, stuck: int, oldest_s: float) -> None:
        super().__init__(f"the DNS resolver is not answering, {host} was not looked up")
        self.host, self.stuck, self.oldest_s = host, stuck, oldest_s


class ThreadResolver(AbstractResolver):
    """aiohttp's resolver interface over `socket.getaddrinfo` on bounded daemon threads (module
    docstring). `in_flight` is how many lookups are on a thread now; `abandoned_total` how many a
    read gave up on at its deadline (`abandon`), `stuck()` how many of those are still running.
    Once every thread is held by an abandoned lookup a new name fails at once (ResolverStuck)."""

    def __init__(self, limit: int = MAX_LOOKUPS) -> None:
        self.limit = limit
        self.in_flight = 0
        self.abandoned_total = 0
        self._threads: dict[str, list[float]] = {}  # host -> start times of its lookups on a thread
        self._abandoned: set[str] = set()
        self.unanswered: Counter[str] = Counter()
        """Host names whose lookup the resolver has not answered yet (waiting for a thread or in
        getaddrinfo): a read that times out meanwhile timed out on DNS (`dns_timeout`)."""
        self._slots: asyncio.Semaphore | None = None  # made on first use, in the loop that uses it

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """The addresses of `host` (aiohttp's form), once a thread is free and the resolver answers."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        slots = self._slots
        stuck = self.stuck()
        if stuck >= self.limit:
            oldest = time.monotonic() - min(t for h in self._abandoned for t in self._threads.get(h, ()))
            raise ResolverStuck(host, stuck, oldest)
        self.unanswered[host] += 1
        try:
            await slots.acquire()
        except BaseException:
            self._answered(host)
            raise
        loop = asyncio.get_running_loop()

        def give_back() -> None:
            self.in_flight -= 1
            started = self._threads.get(host, [])
            if started:
                started.pop(0)
            if not started:
                self._threads.pop(host, None)
                self._abandoned.discard(host)
            self._answered(host)
            slots.release()

        def run() -> list[ResolveResult]:
            try:
                return lookup(host, port, family)
            except UnicodeError as exc:  # a label idna refuses
                raise OSError(f"bad host name {host!r}: {exc}") from None
            finally:  # the slot is free once the resolver answered, whether or not a reader still waits
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(give_back)

        try:
            answer = daemon_call(run, name=f"resolve {host}")
        except RuntimeError as exc:  # no thread to be had
            slots.release()
            self._answered(host)
            raise OSError(f"cannot start a name lookup for {host}: {exc}") from None
        self.in_flight += 1
        self._threads.setdefault(host, []).append(time.monotonic())
        return await answer

    async def close(self) -> None:
        """Nothing to release: a lookup thread ends when the resolver answers."""

    def abandon(self, host: str) -> None:
        """A read gave up on `host`'s lookup at its deadline: counted once per lookup thread."""
        if host in self._threads and host not in self._abandoned:
            self._abandoned.add(host)
            self.abandoned_total += len(self._threads[host])

    def stuck(self) -> int:
        """Lookups still on a thread after a read gave up on them."""
        return sum(len(self._threads.get(host, ())) for host in self._abandoned)

    def _answered(self, host: str) -> None:
        self.unanswered[host] -= 1
        if self.unanswered[host] <= 0:
            del self.unanswered[host]


class Connector(aiohttp.TCPConnector):
    """An aiohttp TCPConnector whose names are looked up by its own ThreadResolver (`lookups`):
    what every HTTP client of the agent, `kvscope serve` and the diagnoser's reads connects through."""

    def __init__(self, **options: Any) -> None:
        self.lookups = ThreadResolver()
        super().__init__(resolver=self.lookups, **options)


def in_daemon(fn: Callable[..., T], *args: Any, name: str) -> concurrent.futures.Future[T]:
    """fn(*args) on a daemon thread of its own, as a concurrent future (the caller outside an event
    loop waits on it; `daemon_call` for a caller inside one). The process's exit does not wait for
    it, and cancelling the future leaves the call to run and end by itself (a lookup's `finally`
    still gives its slot back)."""
    done: concurrent.futures.Future[T] = concurrent.futures.Future()

    def main() -> None:
        try:
            value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled meanwhile
                done.set_exception(exc)
        else:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                done.set_result(value)

    threading.Thread(target=main, name=name, daemon=True).start()
    return done


def daemon_call(fn: Callable[..., T], *args: Any, name: str) -> asyncio.Future[T]:
    """`in_daemon` as a future of the running loop. Unlike asyncio.to_thread it takes no thread of
    the loop's executor, so nothing else waits behind a call that hangs (in getaddrinfo, say), and
    neither the loop's shutdown nor the process's exit waits for it (a loop closed while the call
    runs is not told)."""
    return asyncio.wrap_future(in_daemon(fn, *args, name=name), loop=asyncio.get_running_loop())


def dns_unanswered(session: aiohttp.ClientSession, host: str | None) -> bool:
    """Whether `session`'s lookup of `host` is still waiting for the resolver (a read that timed
    out then never got past DNS)."""
    lookups = getattr(session.connector, "lookups", None)
    return isinstance(lookups, ThreadResolver) and host is not None and lookups.unanswered.get(host, 0) > 0


def lookup(host: str, port: int, family: socket.AddressFamily) -> list[ResolveResult]:
    """getaddrinfo for a stream socket, in aiohttp's ResolveResult form (as its ThreadedResolver).
    Blocking and without a timeout: call it on a thread of its own (`daemon_call`)."""
    flags = socket.AI_ADDRCONFIG
    out: list[ResolveResult] = []
    for fam, _, proto, _, address in socket.getaddrinfo(
        host, port, family=family, type=socket.SOCK_STREAM, flags=flags
    ):
        addr: Any = address
        if fam == socket.AF_INET6:
            if len(addr) < 3:  # no IPv6 in this Python build
                continue
            if addr[3]:  # a link-local address: its scope as the host's %suffix
                resolved, numeric_port = socket.getnameinfo(addr, socket.NI_NUMERICHOST | socket.NI_NUMERICSERV)
                resolved_port = int(numeric_port)
            else:
                resolved, resolved_port = addr[0], addr[1]
        elif fam == socket.AF_INET:
            resolved, resolved_port = addr[0], addr[1]
        else:
            continue
        out.append(
            ResolveResult(hostname=host, host=resolved, port=resolved_port, family=fam, proto=proto, flags=_NUMERIC)
        )
    return out
