"""The store on a real full file system and on a damaged file: errors counted, exported, logged,
health down while writes fail, nothing queued lost once space is back; a clean error at open."""

import asyncio
import os
import random
import subprocess
import time

import pytest

from kvscope.agent.config import build_config
from kvscope.agent.runtime import AgentRuntime
from kvscope.agent.serve.export import render_metrics
from kvscope.agent.store.sqlite import SqliteStore, StoreError
from kvscope.core.signals import Sample, load_catalog, make_labels


@pytest.fixture
def small_fs(tmp_path):
    """A 256 KiB tmpfs (needs root); skipped where it cannot be mounted."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_is_counted_exported_logged_and_shown_in_health_and_loses_nothing(small_fs, caplog):
    filler = small_fs / "filler"
    filler.write_bytes(b"x" * 100_000)
    store = SqliteStore(small_fs / "k.db", background=False)
    runtime = AgentRuntime(build_config({}, environ={}), [], store)
    t0, sent = time.time() - 1000, 0
    for i in range(200):
        store.write(
            [Sample("engine_x", make_labels({"instance": "a", "k": f"{i}-{j}"}), float(j), t0 + i) for j in range(50)]
        )
        sent += 50
        store.flush()
        if store.stats().errors:
            break
    asyncio.run(runtime.run_cycle())
    st = runtime.state.store_stats
    assert st.errors == {"disk_full": 1} and st.failing == "disk_full" and st.queued > 0
    assert runtime.state.collector_status["store"][:2] == (False, "write_disk_full")
    body = render_metrics(runtime.state, load_catalog())
    assert 'kvscope_store_write_errors_total{reason="disk_full"} 1' in body
    assert 'kvscope_collector_up{collector="store"} 0' in body
    assert any(r.name == "kvscope.store" and "disk_full" in r.getMessage() for r in caplog.records)

    filler.unlink()  # space is back: the queued samples are committed
    store.flush()
    asyncio.run(runtime.run_cycle())
    assert runtime.state.store_stats.failing is None and runtime.state.collector_status["store"][:2] == (True, "ok")
    assert sum(len(p) for p in store.query("engine_x", t0 - 1, t0 + 1000).values()) == sent
    store.close()


def test_damaged_store_file_gives_a_clean_error_naming_the_file(tmp_path):
    path = tmp_path / "k.db"
    store = SqliteStore(path, background=False)
    for i in range(300):
        store.write(
            [
                Sample(f"engine_x{j}", make_labels({"instance": "a", "k": str(i % 50)}), float(i), 1e9 + i)
                for j in range(20)
            ]
        )
    store.flush()
    store.close()
    data = bytearray(path.read_bytes())
    rng = random.Random(0)
    for off in range(4096 * 2, len(data), 4096 * 3):  # every third page after the schema
        data[off : off + 4096] = rng.randbytes(4096)
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=f"{path}.*malformed.*move it aside"):
        SqliteStore(path, background=False)
    os.truncate(path, 0)
    path.write_bytes(rng.randbytes(8192))  # not a database at all
    with pytest.raises(StoreError, match=f"{path}: .*(not a database|malformed).*move it aside"):
        SqliteStore(path, background=False)


def test_agent_exits_non_zero_with_one_line_on_a_damaged_store(tmp_path):
    path = tmp_path / "k.db"
    path.write_bytes(b"SQLite format 3\x00" + random.Random(1).randbytes(8000))
    proc = subprocess.run(
        [
            os.path.join(os.path.dirname(os.sys.executable), "kvscope"),
            "agent",
            "--store.path",
            str(path),
            "--web.listen-address",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only (slow on a loaded 2-core box)
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"{path}" in proc.stderr and "move it aside" in proc.stderr
