"""Issue 41 N2, name lookup: a DNS resolver that never answers must not hold a read past its
overall deadline. `socket.getaddrinfo` takes no timeout, so core/net.py's reads resolve on
a thread they wait for only as long as the deadline leaves. The resolver here is a stand-in that
hangs for names under `.hang.test` (the real one on this box answers at once, even for unknown
names); the read, the connection code and the CLI are the real ones."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable

import pytest

from kvscope.core import net as http
from kvscope.core.net import FetchError, fetch

HANGS = ".hang.test"
HANG_GUARD_S = 120  # only turns a hang into a failure; the deadlines under test are 1-3 s

SITECUSTOMIZE = f"""
import socket, threading
_real = socket.getaddrinfo
# a resolver that does not answer (AI_NUMERICHOST never asks one)
def _getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
    if isinstance(host, str) and host.endswith({HANGS!r}) and not flags & socket.AI_NUMERICHOST:
        threading.Event().wait()
    return _real(host, port, family, type, proto, flags)
socket.getaddrinfo = _getaddrinfo
"""


@pytest.fixture
def hanging_resolver(monkeypatch):
    release = threading.Event()
    real = socket.getaddrinfo

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):  # noqa: ANN001, A002
        if isinstance(host, str) and host.endswith(HANGS) and not flags & socket.AI_NUMERICHOST:
            release.wait()  # a resolver that does not answer (AI_NUMERICHOST never asks one)
            raise socket.gaierror(socket.EAI_AGAIN, "released by the test")
        return real(host, port, family, type, proto, flags)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield
    release.set()


def _in_thread(fn):  # noqa: ANN001
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except Exception as exc:  # noqa: BLE001
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(HANG_GUARD_S)
    assert not t.is_alive(), "the read outlived its deadline (blocked in name resolution)"
    return box


def test_a_hanging_resolver_ends_at_the_reads_deadline_naming_the_host(hanging_resolver):
    url = f"http://prom{HANGS}:9090/api/v1/query?query=up"
    box = _in_thread(lambda: fetch(url, f"Prometheus http://prom{HANGS}:9090", 1.0, 1 << 20))
    exc = box.get("error")
    assert isinstance(exc, FetchError) and exc.timed_out, box
    assert str(exc).startswith(f"Prometheus http://prom{HANGS}:9090: the host name prom{HANGS} did not resolve"), exc


def test_names_that_resolve_and_addresses_still_connect(hanging_resolver):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer() -> None:
        for _ in range(2):
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    threading.Thread(target=answer, daemon=True).start()
    try:
        by_name = _in_thread(lambda: fetch(f"http://localhost:{port}/", "test", 30.0, 100)[0])
        by_address = _in_thread(lambda: fetch(f"http://127.0.0.1:{port}/", "test", 30.0, 100)[0])
    finally:
        server.close()
    assert by_name == {"value": bytearray(b"ok")} and by_address == {"value": bytearray(b"ok")}


def test_diagnose_exits_in_time_with_one_line_naming_the_source_when_dns_hangs(tmp_path):
    """The real CLI, with the stand-in resolver installed at interpreter start (sitecustomize)."""
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    url = f"http://prom{HANGS}:9090"
    cmd = [sys.executable, "-m", "kvscope", "diagnose", "--prometheus", url, "--timeout", "3", "-q"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=HANG_GUARD_S, cwd=tmp_path)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("kvscope diagnose:")]
    assert proc.returncode == 4, proc.stderr
    assert len(errors) == 1, proc.stderr  # one line (the hint under it is the usual one for an unreachable source)
    assert f"http://prom{HANGS}:9090: the host name prom{HANGS} did not resolve within 3 s" in errors[0], errors


# ---------------------------------------------------------------- a resolver stuck for good
# A long-running `kvscope serve` pointed at a resolver that never answers must not gain a thread
# per read: at most MAX_LOOKUPS lookups wait on the resolver at once, and one name's lookup
# is shared by every read of it meanwhile.

STUCK = ".stuck.test"


def _resolve_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("resolve ") and t.is_alive()]


@pytest.fixture
def stuck_resolver(monkeypatch):
    """A resolver that does not answer names under `.stuck.test` until the test sets the event,
    then answers them with 127.0.0.1."""
    for t in _resolve_threads():  # another test's lookups, released by its own fixture
        t.join(HANG_GUARD_S)
    answered = threading.Event()
    real = socket.getaddrinfo

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):  # noqa: ANN001, A002
        if isinstance(host, str) and host.endswith(STUCK) and not flags & socket.AI_NUMERICHOST:
            answered.wait()
            host = "127.0.0.1"
        return real(host, port, family, type, proto, flags)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield answered
    answered.set()


def _serve_ok(count: int) -> tuple[int, Callable[[], None]]:
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        for _ in range(count):
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    threading.Thread(target=answer, daemon=True).start()
    return server.getsockname()[1], server.close


def test_a_resolver_that_never_answers_leaves_a_bounded_number_of_threads_then_recovers(stuck_resolver):
    limit = getattr(http, "MAX_LOOKUPS", 8)
    abandoned_before = http.lookups().abandoned_total
    port, close = _serve_ok(1)
    errors = []
    try:
        for i in range(5 * limit):  # every read names another host, as many alerts' sources could
            box = _in_thread(lambda i=i: fetch(f"http://prom{i}{STUCK}:{port}/", f"read {i}", 0.2, 100))
            errors.append(box.get("error"))
            assert len(_resolve_threads()) <= limit, f"{len(_resolve_threads())} lookup threads after {i + 1} reads"
        assert all(isinstance(e, FetchError) and e.timed_out for e in errors), errors
        # once every slot is held by an abandoned lookup, a new read fails at once, saying why
        last = str(errors[-1])
        assert last.startswith(f"read {5 * limit - 1}: the DNS resolver is not answering: {limit} name lookups"), last
        assert f"so prom{5 * limit - 1}{STUCK} was not looked up" in last, last
        assert http.lookups().abandoned_total - abandoned_before == limit
        assert http.lookups().in_flight == limit == http.lookups().stuck()

        stuck_resolver.set()  # the resolver answers: its lookups end and their slots are free
        for t in _resolve_threads():
            t.join(HANG_GUARD_S)
        box = _in_thread(lambda: fetch(f"http://prom-after{STUCK}:{port}/", "after", 30.0, 100)[0])
    finally:
        close()
    assert box == {"value": bytearray(b"ok")}, box
    assert http.lookups().in_flight == 0


def test_reads_of_one_name_share_its_lookup(stuck_resolver):
    port, close = _serve_ok(12)
    got: list = []

    def read() -> None:
        try:
            got.append(fetch(f"http://prom-shared{STUCK}:{port}/", "read", HANG_GUARD_S, 100)[0])
        except FetchError as exc:
            got.append(exc)

    readers = [threading.Thread(target=read, daemon=True) for _ in range(12)]
    try:
        for reader in readers:
            reader.start()
        pause = threading.Event()
        while all(r.is_alive() for r in readers) and not _resolve_threads():
            pause.wait(0.01)  # until the first lookup waits on the resolver
        pause.wait(0.5)  # the other readers reach it meanwhile (any later one joins the same lookup)
        assert [t.name for t in _resolve_threads()] == [f"resolve prom-shared{STUCK}"]
        stuck_resolver.set()
        for reader in readers:
            reader.join(HANG_GUARD_S)
    finally:
        close()
    assert got == [bytearray(b"ok")] * 12, got


def test_serve_exports_the_lookups_it_abandoned():
    from kvscope.agent.scrape.exposition import parse_exposition
    from kvscope.diagnoser.alertmanager.server import render_metrics

    values = {s.name: s.value for s in parse_exposition(render_metrics(Counter(), 0, None)).samples}
    assert values["kvscope_resolve_abandoned_total"] == http.lookups().abandoned_total, values
    assert values["kvscope_resolve_in_flight"] == http.lookups().in_flight, values
