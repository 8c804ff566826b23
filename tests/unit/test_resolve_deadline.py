"""Issue 41 N2, name lookup: a DNS resolver that never answers must not hold a read past its
overall deadline. `socket.getaddrinfo` takes no timeout, so diagnoser/sources/http.py resolves on
a thread it waits for only as long as the deadline leaves. The resolver here is a stand-in that
hangs for names under `.hang.test` (the real one on this box answers at once, even for unknown
names); the read, the connection code and the CLI are the real ones."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest

from kvscope.diagnoser.sources.http import FetchError, fetch

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
