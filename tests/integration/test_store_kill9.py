"""A committed batch survives SIGKILL of the writing process (WAL, synchronous=NORMAL)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

from kvscope.agent.store.sqlite import SqliteStore
from kvscope.core.signals import make_labels

WRITER = textwrap.dedent("""
    import sys, time
    from kvscope.core.signals import Sample, make_labels
    from kvscope.agent.store.sqlite import SqliteStore

    store = SqliteStore(sys.argv[1], flush_interval_s=0.05, batch_size=3000)
    base = time.time() - 600
    labels = [make_labels({"instance": f"e{i}:8000", "engine": "vllm"}) for i in range(9)]
    step = 0
    while True:
        store.write([Sample("engine_requests_running", lab, float(step), base + step * 0.01)
                     for lab in labels])
        step += 1
        if step % 50 == 0:
            store.flush()
            print(f"committed {step} {base!r}", flush=True)   # everything below step is durable
""")


def test_every_flushed_sample_survives_kill_9(tmp_path):
    path = tmp_path / "kv.db"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    committed, base = 0, 0.0
    try:
        deadline = time.monotonic() + 300  # ends at 1500 commits; generous for a loaded 2-core box
        while committed < 1500 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "writer exited early"
            _, n, b = line.split()
            committed, base = int(n), float(b)
        os.kill(proc.pid, signal.SIGKILL)  # mid-stream: the writer keeps writing until killed
    finally:
        proc.kill()
        proc.wait(timeout=60)  # reaping a SIGKILLed child; a hang guard only
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL and committed >= 1500

    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    store = SqliteStore(path, background=False)
    try:
        got = store.query("engine_requests_running", 0, 4e9)
        assert len(got) == 9
        for i in range(9):
            points = got[make_labels({"instance": f"e{i}:8000", "engine": "vllm"})]
            values = [v for _, v in points]
            assert values[:committed] == [float(s) for s in range(committed)]
            assert points[committed - 1][0] == round((base + (committed - 1) * 0.01) * 1000) / 1000
    finally:
        store.close()
