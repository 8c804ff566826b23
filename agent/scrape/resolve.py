"""Name lookups for the agent's HTTP clients, on daemon threads of their own, at most a few at once.

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
import socket
import threading
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

MAX_LOOKUPS = 8
"""Lookups on threads at once per client session."""

_NUMERIC = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV


class ThreadResolver(AbstractResolver):
    """aiohttp's resolver interface over `socket.getaddrinfo` on bounded daemon threads (module
    docstring). `in_flight` is how many lookups are on a thread now."""

    def __init__(self, limit: int = MAX_LOOKUPS) -> None:
        self.limit = limit
        self.in_flight = 0
        self._slots: asyncio.Semaphore | None = None  # made on first use, in the loop that uses it

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """The addresses of `host` (aiohttp's form), once a thread is free and the resolver answers."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        slots = self._slots
        await slots.acquire()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[list[ResolveResult], BaseException | None]] = loop.create_future()

        def settle(out: tuple[list[ResolveResult], BaseException | None]) -> None:
            self.in_flight -= 1
            slots.release()
            if not done.done():  # a reader that gave up cancelled it
                done.set_result(out)

        def work() -> None:
            try:
                out: tuple[list[ResolveResult], BaseException | None] = (_lookup(host, port, family), None)
            except (OSError, UnicodeError) as exc:
                out = ([], exc if isinstance(exc, OSError) else OSError(f"bad host name {host!r}: {exc}"))
            try:
                loop.call_soon_threadsafe(settle, out)
            except RuntimeError:  # the loop closed while the resolver kept this thread
                pass

        try:
            threading.Thread(target=work, name=f"resolve {host}", daemon=True).start()
        except RuntimeError as exc:  # no thread to be had
            slots.release()
            raise OSError(f"cannot start a name lookup for {host}: {exc}") from None
        self.in_flight += 1
        hosts, error = await done
        if error is not None:
            raise error
        return hosts

    async def close(self) -> None:
        """Nothing to release: a lookup thread ends when the resolver answers."""


def connector(**options: Any) -> aiohttp.TCPConnector:
    """An aiohttp connector (TCPConnector `options`) whose names are looked up by a ThreadResolver:
    what every HTTP client of the agent and `kvscope serve` connects through."""
    return aiohttp.TCPConnector(resolver=ThreadResolver(), **options)


def _lookup(host: str, port: int, family: socket.AddressFamily) -> list[ResolveResult]:
    """getaddrinfo for a stream socket, in aiohttp's ResolveResult form (as its ThreadedResolver)."""
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
