"""Issue 41: a DNS resolver that never answers, for targets named by host name, must not take the
agent's other threads. aiohttp's default resolver looks names up on the event loop's default
executor, where the host and NVML collectors' threads and the OTLP push run too; the agent's
clients now look names up on bounded threads of their own (core/resolve.py).

The resolver here is a stand-in that does not answer names under `.stuck.test` until the test
lets it (then it answers 127.0.0.1); the scrape client, its connector and the reads are the real
ones. `tests/integration/test_agent_stuck_dns.py` runs the real agent against a real DNS server
that never answers."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from kvscope.agent.scrape.fetch import ScrapeError, new_session, read_exposition
from kvscope.core import resolve

STUCK = ".stuck.test"
HANG_GUARD_S = 60  # only turns a hang into a failure
BODY = b"vllm:num_requests_running 1\n"


def _lookup_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("resolve ") and t.is_alive()]


@pytest.fixture
def stuck_resolver(monkeypatch):
    answered = threading.Event()
    real = socket.getaddrinfo

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):  # noqa: ANN001, A002
        if isinstance(host, str) and host.endswith(STUCK):
            answered.wait()
            host = "127.0.0.1"
        return real(host, port, family, type, proto, flags)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield answered
    answered.set()


def _metrics_server() -> tuple[int, socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            head = f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(BODY)}\r\n\r\n"
            conn.sendall(head.encode() + BODY)

    threading.Thread(target=answer, daemon=True).start()
    return server.getsockname()[1], server


async def _scrape(session, url: str) -> str:  # noqa: ANN001
    try:
        return (await read_exposition(session, url, 0.3, 1 << 20)).text
    except ScrapeError as exc:
        return exc.reason


def test_targets_whose_names_never_resolve_leave_the_agents_threads_free(stuck_resolver):
    """40 targets (more than asyncio's default executor's 32 threads on any machine) whose names
    never resolve: every scrape ends at its timeout, at most MAX_LOOKUPS lookup threads wait on
    the resolver, a collector's thread (asyncio.to_thread, as the host collector runs) still runs,
    and once the resolver answers a target by name is scraped. Each timed-out scrape says it timed
    out on DNS (`dns_timeout`)."""
    port, server = _metrics_server()

    async def scenario() -> tuple[list[str], int, int, str]:
        session = new_session()
        try:
            urls = [f"http://engine{i}{STUCK}:8000/metrics" for i in range(40)]
            reasons = await asyncio.gather(*(_scrape(session, url) for url in urls))
            threads = len(_lookup_threads())
            try:
                ran = await asyncio.wait_for(asyncio.to_thread(lambda: 42), HANG_GUARD_S)
            finally:  # else asyncio.run waits for a default executor stuck in the resolver
                stuck_resolver.set()
            after = (await read_exposition(session, f"http://engine-after{STUCK}:{port}/metrics", 30, 1 << 20)).text
            return reasons, threads, ran, after
        finally:
            stuck_resolver.set()
            await session.close()

    try:
        reasons, threads, ran, after = asyncio.run(scenario())
    finally:
        server.close()
    # issue 57 S9: a name the resolver never answered reads dns_timeout, not timeout
    assert reasons == ["dns_timeout"] * 40, reasons
    assert threads <= resolve.MAX_LOOKUPS, threads
    assert ran == 42
    assert after == BODY.decode()


def test_the_lookup_of_one_name_is_shared_and_its_thread_freed_when_the_reader_gives_up(stuck_resolver):
    """Twelve scrapes of one stuck name: one lookup thread; each read ends at its timeout; when the
    resolver answers, the slot is given back (in_flight 0)."""
    resolver = resolve.ThreadResolver(limit=2)

    async def scenario() -> tuple[list[str], list[str], int]:
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=resolver))
        try:
            reasons = await asyncio.gather(*(_scrape(session, f"http://shared{STUCK}:8000/metrics") for _ in range(12)))
            names = [t.name for t in _lookup_threads()]
            stuck_resolver.set()
            for t in _lookup_threads():
                await asyncio.to_thread(t.join, HANG_GUARD_S)
            for _ in range(1000):  # the threads' hand-backs run on the loop
                if not resolver.in_flight:
                    break
                await asyncio.sleep(0.01)
            return reasons, names, resolver.in_flight
        finally:
            await session.close()

    reasons, names, in_flight = asyncio.run(scenario())
    assert reasons == ["timeout"] * 12, reasons
    assert names == [f"resolve shared{STUCK}"], names
    assert in_flight == 0


def test_the_taps_upstream_by_name_that_never_resolves_ends_at_its_connect_timeout(stuck_resolver):
    """The request tap's upstream connections: 40 names that never resolve each end at the connect
    timeout, the loop's executor stays free, and a name is connected once the resolver answers."""
    from kvscope.agent.tap.http1 import UpstreamPool

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    async def scenario() -> tuple[list[str], int, int, bool]:
        pool = UpstreamPool(connect_timeout_s=0.3)

        async def connect(host: str) -> str:
            try:
                await pool.connect((host, port, False))
            except TimeoutError:
                return "timeout"
            return "connected"

        outcomes = await asyncio.gather(*(connect(f"engine{i}{STUCK}") for i in range(40)))
        threads = len(_lookup_threads())
        try:
            ran = await asyncio.wait_for(asyncio.to_thread(lambda: 42), HANG_GUARD_S)
        finally:  # else asyncio.run waits for a default executor stuck in the resolver
            stuck_resolver.set()
        pool.connect_timeout_s = 30
        conn = await pool.connect((f"engine-after{STUCK}", port, False))
        connected = conn.transport is not None
        conn.transport.close()
        return outcomes, threads, ran, connected

    try:
        outcomes, threads, ran, connected = asyncio.run(scenario())
    finally:
        server.close()
    assert outcomes == ["timeout"] * 40, outcomes
    assert threads <= resolve.MAX_LOOKUPS, threads
    assert ran == 42
    assert connected


def test_a_daemon_call_given_up_on_still_runs_to_its_end():
    """A caller that gives up (its read's deadline) cancels the future, not the call: the call runs
    to its end on its own thread, so what its `finally` does (a lookup gives its slot back) is
    never skipped, even when the caller gives up before the thread has started; its result is
    dropped without an error. A call that raises hands the error to the caller."""
    release, ran = threading.Event(), []

    def slow() -> str:
        try:
            release.wait(HANG_GUARD_S)
            return "late"
        finally:
            ran.append("finally")

    async def main() -> None:
        call = resolve.daemon_call(slow, name="kvscope-test")
        call.cancel()  # at once: the thread may not have started yet
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await call
        with pytest.raises(ZeroDivisionError):
            await resolve.daemon_call(lambda: 1 / 0, name="kvscope-test")

    asyncio.run(main())
    for t in threading.enumerate():
        if t.name == "kvscope-test":
            t.join(HANG_GUARD_S)
    assert ran == ["finally"]
    plain = resolve.in_daemon(slow, name="kvscope-test")
    assert plain.result(HANG_GUARD_S) == "late"
