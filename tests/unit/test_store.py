"""SqliteStore honours the Store contract in a file and in memory."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from kvscope.agent.store import retention
from kvscope.agent.store.sqlite import MEMORY, SqliteStore, StoreError
from kvscope.core.signals import Sample, make_labels

A = make_labels({"instance": "e0:8000", "engine": "vllm"})
B = make_labels({"instance": "e1:8000", "engine": "vllm"})


@pytest.fixture(params=["sqlite", "memory"])
def store(request, tmp_path):
    s = SqliteStore(tmp_path / "kv.db" if request.param == "sqlite" else MEMORY, background=False)
    yield s
    s.close()


def test_query_returns_points_in_range_sorted_by_time(store):
    store.write([Sample("engine_requests_waiting", A, v, 100.0 + v) for v in (3.0, 1.0, 2.0, 9.0)])
    store.flush()
    got = store.query("engine_requests_waiting", 101.0, 103.5)
    assert got == {A: [(101.0, 1.0), (102.0, 2.0), (103.0, 3.0)]}


def test_query_of_a_missing_name_is_empty(store):
    store.write([Sample("x", A, 1.0, 10.0)])
    store.flush()
    assert store.query("missing", 0, 20) == {}


def test_names_lists_stored_sample_names(store):
    store.write([Sample("a_total", A, 1.0, 1.0), Sample("b_bucket", A + (("le", "0.5"),), 1.0, 1.0)])
    store.flush()
    assert store.names() == {"a_total", "b_bucket"}


def test_nan_is_dropped_with_reason_and_duplicates_keep_first(store):
    store.write([Sample("x", A, float("nan"), 1.0), Sample("x", A, 5.0, 2.0), Sample("x", A, 6.0, 2.0)])
    store.flush()
    assert store.query("x", 0, 10) == {A: [(2.0, 5.0)]}
    st = store.stats()
    assert st.dropped["nan"] == 1 and st.dropped["duplicate"] == 1
    assert st.rows == 1 and st.series == 1


def test_infinite_values_round_trip(store):
    store.write([Sample("h_bucket", A, float("inf"), 1.0)])
    store.flush()
    assert store.query("h_bucket", 0, 2)[A] == [(1.0, float("inf"))]


def test_sample_without_timestamp_is_stamped_at_write(store):
    store.write([Sample("x", A, 1.0)])
    store.flush()
    (points,) = store.query("x", 0, 4e9).values()
    assert points[0][0] > 1.7e9


def test_reopen_finds_series_and_samples(tmp_path):
    s = SqliteStore(tmp_path / "kv.db", background=False)
    s.write([Sample("x", A, 1.5, 10.0), Sample("y", B, 2.5, 11.0)])
    s.close()
    s2 = SqliteStore(tmp_path / "kv.db", background=False)
    assert s2.names() == {"x", "y"}
    assert s2.query("y", 0, 20) == {B: [(11.0, 2.5)]}
    s2.write([Sample("y", B, 3.5, 12.0)])  # an existing series keeps its id
    s2.flush()
    assert s2.query("y", 0, 20) == {B: [(11.0, 2.5), (12.0, 3.5)]}
    assert s2.stats().series == 2 and s2.stats().rows == 3
    s2.close()


def test_full_queue_drops_oldest_and_counts_it(tmp_path):
    s = SqliteStore(tmp_path / "kv.db", max_queue=5, background=False)
    s.write([Sample("x", A, float(i), float(i)) for i in range(8)])
    assert s.stats().dropped["queue_full"] == 3
    s.flush()
    assert [v for _, v in s.query("x", 0, 100)[A]] == [3.0, 4.0, 5.0, 6.0, 7.0]
    s.close()


def test_series_limit_drops_new_series_only(tmp_path):
    s = SqliteStore(tmp_path / "kv.db", max_series=1, background=False)
    s.write([Sample("x", A, 1.0, 1.0), Sample("x", B, 1.0, 1.0), Sample("x", A, 2.0, 2.0)])
    s.flush()
    assert set(s.query("x", 0, 10)) == {A}
    assert s.stats().dropped["series_limit"] == 1
    s.close()


def test_retention_by_age_deletes_old_rows(tmp_path):
    s = SqliteStore(tmp_path / "kv.db", retention_s=100, background=False)
    s.write([Sample("x", A, float(t), float(t)) for t in range(0, 1000, 10)])
    s.flush()
    assert retention.enforce_retention(s, now=1000.0) == 90
    assert [t for t, _ in s.query("x", 0, 2000)[A]][0] == 900.0
    assert s.stats().deleted["age"] == 90 and s.stats().rows == 10
    s.close()


def test_retention_forgets_series_left_empty(tmp_path):
    s = SqliteStore(tmp_path / "kv.db", retention_s=100, max_series=2, background=False)
    s.write([Sample("x", A, 1.0, 10.0), Sample("y", B, 1.0, 950.0)])
    s.flush()
    retention.enforce_retention(s, now=1000.0)
    assert s.names() == {"y"} and s.stats().series == 1
    s.write([Sample("z", A, 1.0, 990.0)])  # the freed slot takes a new series
    s.flush()
    assert s.names() == {"y", "z"}
    s.close()
    reopened = SqliteStore(tmp_path / "kv.db", background=False)
    assert reopened.names() == {"y", "z"}
    reopened.close()


def test_retention_by_size_keeps_newest_under_limit(tmp_path):
    s = SqliteStore(tmp_path / "kv.db", retention_s=1e12, max_bytes=256 * 1024, background=False)
    labels = [make_labels({"instance": f"e{i}", "gpu": str(i)}) for i in range(50)]
    for t in range(600):
        s.write([Sample("gpu_power_watts", lab, 100.0 + t * 0.37, 1000.0 + t) for lab in labels])
    s.flush()
    before = s.stats()
    assert before.used_bytes > 256 * 1024
    retention.enforce_retention(s, now=2000.0)
    after = s.stats()
    assert after.used_bytes <= 256 * 1024
    assert after.deleted["size"] > 0 and after.rows == before.rows - after.deleted["size"]
    kept = s.query("gpu_power_watts", 0, 1e9)[labels[7]]
    assert kept[-1][0] == 1599.0  # newest survives
    assert kept[0][0] > 1000.0  # oldest went first
    s.close()
    # incremental_vacuum handed the freed pages back: the file itself shrank
    assert (tmp_path / "kv.db").stat().st_size <= 256 * 1024 < before.used_bytes


def test_background_writer_commits_within_flush_interval(tmp_path):
    s = SqliteStore(tmp_path / "kv.db", flush_interval_s=0.05)
    s.write([Sample("x", A, 1.0, 1.0)])
    done = threading.Event()
    for _ in range(100):
        if s.stats().written == 1:
            done.set()
            break
        threading.Event().wait(0.02)
    assert done.is_set()
    s.close()


def test_concurrent_writers_lose_nothing(tmp_path):
    s = SqliteStore(tmp_path / "kv.db", flush_interval_s=0.01, batch_size=500)
    base = time.time() - 3600  # recent: the writer thread also applies age retention

    def writer(k: int) -> None:
        lab = make_labels({"instance": f"w{k}"})
        for i in range(2000):
            s.write([Sample("x", lab, float(i), base + i)])

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s.flush()
    got = s.query("x", 0, 4e9)
    assert len(got) == 4 and all(len(p) == 2000 for p in got.values())
    s.close()


def test_write_after_close_is_counted_not_raised(tmp_path):
    s = SqliteStore(tmp_path / "kv.db", background=False)
    s.close()
    s.write([Sample("x", A, 1.0, 1.0)])
    assert s.stats().dropped["closed"] == 1
    s.close()


def test_opening_a_foreign_database_is_a_clear_error(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE samples (a, b)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="not a kvscope store"):
        SqliteStore(path, background=False)


def test_database_uses_wal_and_incremental_vacuum(tmp_path):
    s = SqliteStore(tmp_path / "kv.db", background=False)
    s.close()
    conn = sqlite3.connect(tmp_path / "kv.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    conn.close()


def test_bad_values_are_dropped_with_reason(store):
    store.write([Sample("x", A, "not a number", 1.0), Sample("x", A, None, 2.0), Sample("x", A, 3, 3.0)])
    store.flush()
    assert store.query("x", 0, 10) == {A: [(3.0, 3.0)]}
    assert store.stats().dropped["bad_value"] == 2


def test_locked_database_keeps_the_batch_queued_and_retries(tmp_path):
    s = SqliteStore(tmp_path / "kv.db", background=False, busy_timeout_s=0.05)
    other = sqlite3.connect(tmp_path / "kv.db", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another writer holds the lock
    s.write([Sample("x", A, float(i), 100.0 + i) for i in range(5)])
    s.flush()
    st = s.stats()
    assert st.errors["busy"] >= 1 and st.failing == "busy" and st.queued == 5 and not st.dropped
    other.execute("ROLLBACK")
    other.close()
    s.flush()
    assert [v for _, v in s.query("x", 0, 1e3)[A]] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert s.stats().queued == 0 and s.stats().rows == 5
    s.close()


def test_a_memory_store_is_bounded_by_age_and_size_and_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = SqliteStore(MEMORY, retention_s=100, max_bytes=64 << 10, background=False)
    now = time.time()
    s.write([Sample("old", A, 1.0, now - 500), Sample("x", A, 2.0, now - 50)])
    s.flush()
    retention.enforce_retention(s, now)
    assert s.names() == {"x"} and s.stats().deleted["age"] == 1  # an emptied series is gone
    s.write([Sample("x", B, float(i), now - 40 + i * 0.001) for i in range(20_000)])
    s.flush()
    assert retention.used_bytes(s._writer) > s.max_bytes
    retention.enforce_retention(s, now)
    st = s.stats()
    assert st.deleted["size"] > 0 and st.used_bytes <= s.max_bytes and st.bytes == 0
    assert A not in s.query("x", 0, 4e9)  # the oldest went first
    assert s.query("x", 0, 4e9)[B][-1] == (round((now - 40 + 19_999 * 0.001) * 1000) / 1000, 19_999.0)
    s.close()
    assert list(tmp_path.iterdir()) == []


def test_snapshot_gives_counters_now_and_file_sizes_from_the_writer_thread(tmp_path):
    s = SqliteStore(tmp_path / "kv.db", flush_interval_s=0.05)
    now = time.time()  # recent: the writer thread also applies age retention
    s.write([Sample("x", A, 1.0, now), Sample("x", B, 2.0, now)])
    deadline = time.monotonic() + 120  # ends at the writer pass; the ceiling is a hang guard only
    while s.snapshot().rows < 2 and time.monotonic() < deadline:  # the writer pass after the commit
        time.sleep(0.02)
    snap = s.snapshot()
    assert snap.written == 2 and snap.series == 2 and snap.bytes > 0 and snap.rows == 2
    s.write([Sample("x", A, 3.0, now + 1)])
    assert s.snapshot().queued + s.snapshot().written == 3  # counters are current, not cached
    s.close()
    still = SqliteStore(tmp_path / "kv.db", background=False)
    assert still.snapshot().rows == still.stats().rows == 3  # no writer thread: it is stats()
    still.close()
