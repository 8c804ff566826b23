"""Issue 41: a real DNS server that never answers, met by the real agent and the real diagnoser.

In a user and network namespace of its own (`unshare -rnm`, no root needed where user namespaces
are allowed), /etc/resolv.conf names 127.0.0.1, where a UDP socket is bound and never read, with
glibc's longest waits (`timeout:30 attempts:5`: a lookup takes minutes, then fails; the next one
starts over). The C library's getaddrinfo, the agent CLI on uvloop and `fetch` are the real ones.

- The agent, scraping targets named by host name and pushing OTLP to a collector by name: its host
  collector keeps running, and SIGTERM ends it (before: uvloop's close waited for every lookup in
  libuv's pool, and the loop's shutdown for the push's executor thread, minutes per name).
- The agent subscribing to a KV-event publisher named by host name (tcp://): the subscriber looks
  the name up on a thread of its own with a deadline and counts `resolve_timeout` (before: libzmq
  looked it up on its context's I/O thread, which the stuck lookup held).
- The diagnoser's reads (`fetch`), one name after another: at most MAX_LOOKUPS lookup threads stay
  behind, and a read then fails at once saying the resolver is not answering (before: one thread
  more per read, without bound).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GUARD_S = 300  # a hang guard only: a loaded 2-core box can be slow to start processes

INNER = r"""
import json, os, signal, socket, subprocess, sys, threading, time, urllib.request

# a DNS server that never answers: the port is bound, nothing is ever read from it
dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dns.bind(("127.0.0.1", 53))
out = {}

from kvscope.core import net as http
from kvscope.core.net import FetchError, fetch

errors = []
LIMIT = getattr(http, "MAX_LOOKUPS", 8)  # 8: what the test expects where the module has no bound
for i in range(3 * LIMIT):
    try:
        fetch(f"http://prom{i}.monitoring.example:9090/api/v1/query?query=up", f"read {i}", 0.2, 100)
    except FetchError as exc:
        errors.append(str(exc))
out["fetch_errors"] = errors
out["lookup_threads"] = sum(t.name.startswith("resolve ") for t in threading.enumerate())
out["max_lookups"] = LIMIT

port = int(sys.argv[1])
cmd = [sys.executable, "-m", "kvscope", "agent", "--scrape.interval", "2s", "--scrape.timeout", "1s",
       "--web.listen-address", f"127.0.0.1:{port}", "--store.path", sys.argv[2], "--no-collector.nvml",
       "--log-level", "warning", "--config", sys.argv[4]]
for i in range(10):
    cmd += ["--target", f"http://engine{i}.inference.example:8000/metrics"]
# and an OTLP push to a collector by name, whose export thread waits on the resolver too
env = {**os.environ, "OTEL_METRICS_EXPORTER": "otlp", "OTEL_METRIC_EXPORT_INTERVAL": "2000",
       "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.observability.example:4318"}
agent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(sys.argv[3], "w"), env=env)
health = None
for _ in range(600):
    time.sleep(0.5)
    try:
        doc = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=10))
    except OSError:
        continue
    if doc["data"]["cycles"] >= 3:
        health = doc["data"]
        break
out["health"] = health
out["kv_resolve_timeout"] = False
for _ in range(240 if health else 0):  # the subscriber's lookup deadline is 10 s
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    except OSError:
        text = ""
    if 'job="kv_events"' in text and 'reason="resolve_timeout"' in text:
        out["kv_resolve_timeout"] = True
        break
    time.sleep(0.5)
agent.send_signal(signal.SIGTERM)
try:
    out["agent_rc"] = agent.wait(60)
except subprocess.TimeoutExpired:
    out["agent_rc"] = "still running 60 s after SIGTERM"
    agent.kill()
    agent.wait()
print(json.dumps(out))
"""


def _namespace_ok() -> str:
    """Why a user+network+mount namespace with its own resolv.conf cannot be made here ('' if it can)."""
    if not (shutil.which("unshare") and shutil.which("ip")):
        return "unshare or ip (util-linux, iproute2) is not installed"
    probe = subprocess.run(
        ["unshare", "-rnm", "sh", "-c", "mount --bind /dev/null /etc/resolv.conf && ip link set lo up"],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    return "" if probe.returncode == 0 else f"cannot make a user+network namespace here: {probe.stderr.strip()}"


def test_a_dns_server_that_never_answers(tmp_path: Path) -> None:
    if why := _namespace_ok():
        pytest.skip(why)
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:30 attempts:5\n")
    (tmp_path / "inner.py").write_text(INNER)
    log = tmp_path / "agent.log"
    shell = f'mount --bind {resolv} /etc/resolv.conf && ip link set lo up && exec {sys.executable} inner.py "$@"'
    config = tmp_path / "agent.yaml"  # a KV-event publisher by name, as a pod in a StatefulSet
    config.write_text('kv_events:\n  - {endpoint: "tcp://engine0.inference.example:5557", instance: "engine0:8000"}\n')
    args = ["19402", str(tmp_path / "store.db"), str(log), str(config)]  # a fresh network namespace: every port is free
    proc = subprocess.run(
        ["unshare", "-rnm", "sh", "-c", shell, "inner", *args],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])

    limit = out["max_lookups"]
    errors = out["fetch_errors"]
    assert len(errors) == 3 * limit, errors
    assert all("did not resolve within 0.2 s" in e for e in errors[:limit]), errors[:limit]
    assert all("the DNS resolver is not answering" in e for e in errors[limit:]), errors[limit:]
    assert out["lookup_threads"] <= limit, out["lookup_threads"]

    health = out["health"]
    assert health is not None, log.read_text()[-3000:]
    assert health["collectors"]["host"]["up"], health["collectors"]
    scraped = [t for t in health["targets"] if t["job"] != "kv_events"]
    assert {t["reason"] for t in scraped} <= {"dns_timeout", "dns_error"}, health["targets"]
    assert out["kv_resolve_timeout"], log.read_text()[-3000:]
    assert out["agent_rc"] == 0, (out["agent_rc"], log.read_text()[-3000:])
