"""`kvscope agent` and `kvscope record` as real processes: clean stop on SIGTERM / Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from agentharness import start_agent_process, start_target_process

from kvscope.agent.recording.omfile import read_recording, read_recording_text
from testbed.procs import http_get, stop_process, wait_until

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "scrapes" / "vllm-0.32.0-cpu-after-load.txt"


def get(url: str) -> bytes | None:
    status, body = http_get(url, timeout_s=3)
    return body if status == 200 else None


def wait_for(pred, timeout_s: float, what: str):
    """Poll until pred() holds; ceilings are hang guards only, sized for a loaded 2-core box."""
    return wait_until(pred, timeout_s, what, interval_s=0.2)


@pytest.fixture
def target(tmp_path):
    """A separate process serving the vLLM capture at /metrics."""
    root = tmp_path / "www"
    root.mkdir()
    shutil.copy(FIXTURE, root / "metrics")
    proc, base = start_target_process(root)
    try:
        yield base + "/metrics"
    finally:
        stop_process(proc)


def test_agent_process_serves_stores_and_stops_cleanly_on_sigterm(target, tmp_path):
    db = tmp_path / "kvscope.db"
    proc, base = start_agent_process(
        [
            "--target",
            target,
            "--job",
            "vllm",
            "--scrape.interval",
            "1s",
            "--store.path",
            str(db),
            "--no-collector.nvml",
            "--no-collector.host",
        ]
    )
    try:
        wait_for(lambda: get(base + "/-/ready"), 180, "agent ready")

        def healthy_after_three_cycles():  # a loaded CI box may time a scrape out now and then
            data = json.loads(get(base + "/api/v1/health") or b'{"data": {"cycles": 0}}')["data"]
            return data["cycles"] >= 3 and [t["reason"] for t in data["targets"]] == ["ok"] and data

        health = wait_for(healthy_after_three_cycles, 180, "three cycles with the target up")
        assert set(health["collectors"]) == {
            "engine",
            "derive_engine_gpu",
            "derive_fairness",
            "derive_cascade",
            "store",
        }  # the hooks and the store writer too
    finally:
        rc = stop_process(proc, signal.SIGTERM)
    err = "".join(proc.output_lines)
    assert rc == 0, err
    assert "stopped after" in err
    with sqlite3.connect(db) as conn:  # the store was flushed on the way out
        names = {r[0] for r in conn.execute("SELECT name FROM series")}
    assert {"engine_kv_cache_usage_ratio", "kvscope_target_up"} <= names


def stop_and_read(proc: subprocess.Popen, sig: int) -> tuple[int, str]:
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=300)  # flushes the store on the way out; a hang guard only
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return proc.returncode, err


def test_agent_refuses_a_port_in_use(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = subprocess.run(
            [sys.executable, "-m", "kvscope", "agent", "--store.path", "", "--web.listen-address", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=300,  # a hang guard only (slow on a loaded 2-core box)
        )
    assert res.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in res.stderr


def test_agent_stops_at_start_when_the_store_cannot_be_opened(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvscope",
            "agent",
            "--store.path",
            str(blocker / "kvscope.db"),
            "--web.listen-address",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only (slow on a loaded 2-core box)
    )
    assert res.returncode == 1
    assert "store:" in res.stderr and "Traceback" not in res.stderr


def test_record_stops_on_ctrl_c_and_leaves_a_valid_file(target, tmp_path):
    out = tmp_path / "incident.om.gz"
    spool = tmp_path / "spool"  # the writer spools under TMPDIR: watch it to know scrapes happened
    spool.mkdir()
    env = {**os.environ, "TMPDIR": str(spool)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvscope",
            "record",
            "--target",
            target,
            "--job",
            "vllm",
            "--duration",
            "10m",
            "--interval",
            "500ms",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        wait_for(lambda: sum(f.stat().st_size for f in spool.rglob("*.om")) > 150_000, 180, "two scrapes spooled")
    finally:
        rc, err = stop_and_read(proc, signal.SIGINT)
    assert rc == 0, err
    assert "stopped early: wrote" in err
    assert read_recording_text(out).endswith("# EOF\n")
    scrapes, expo = read_recording(out)
    assert not expo.issues
    # >150 kB spooled means at least two successful scrapes; on a loaded box one may time out
    assert sum(s.up for s in scrapes) >= 2, [s.up for s in scrapes]
    assert {s.instance for s in scrapes} == {target.split("/")[2]}
    assert any(r.name == "vllm:kv_cache_usage_perc" for r in scrapes[0].samples)


def test_record_rejects_a_bad_duration_and_missing_targets(tmp_path):
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvscope",
            "record",
            "--target",
            "http://127.0.0.1:1/metrics",
            "--duration",
            "soon",
            "--out",
            str(tmp_path / "x.om"),
        ],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only (slow on a loaded 2-core box)
    )
    assert bad.returncode == 2 and "--duration: expected seconds or a duration" in bad.stderr
    none = subprocess.run(
        [sys.executable, "-m", "kvscope", "record", "--duration", "1s", "--out", str(tmp_path / "x.om")],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only (slow on a loaded 2-core box)
        env={"PATH": "/usr/bin:/bin"},
    )
    assert none.returncode == 2 and "no targets" in none.stderr
