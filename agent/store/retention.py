"""Retention of the SQLite store (agent/store/sqlite.py), by age then by size, on the writer thread.
A cut first re-anchors the runs that cross it (`_reanchor`), so the points kept read back unchanged;
series left without rows are forgotten, so churn does not use up `max_series`.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections import Counter
from typing import Protocol

from kvscope.agent.store.changepoints import ChangeEncoder
from kvscope.core.signals import Labels


class _Counts(Protocol):
    rows: int
    deleted: Counter[str]


class RetainedStore(Protocol):
    """What retention reads and writes of the store it cuts (agent/store/sqlite.py `SqliteStore`,
    which calls it on its writer thread): its connections' locks, the writer connection, the
    series index and counters."""

    retention_s: float
    max_bytes: int
    _wlock: threading.RLock
    _slock: threading.Lock
    _qlock: threading.Lock
    _writer: sqlite3.Connection
    _ids: dict[tuple[str, Labels], int]
    _encoder: ChangeEncoder

    @property
    def _stats(self) -> _Counts: ...

    def unindex(self, gone: set[int]) -> None:
        """Forget series ids."""

    def rollback(self) -> None:
        """Roll the writer's transaction back."""


SIZE_TARGET_FRACTION = 0.9
"""A size-retention pass deletes until the pages in use are below this fraction of max_bytes."""


def enforce_retention(store: RetainedStore, now: float | None = None) -> int:
    """Delete rows older than retention_s, then the oldest rows until the pages in use are
    under max_bytes; give freed pages back with incremental_vacuum. Returns rows deleted."""
    now = time.time() if now is None else now
    with store._wlock:
        deleted = _delete_before(store, now - store.retention_s, "age")
        for _ in range(8):  # each pass removes the oldest slice sized from the overshoot
            used = used_bytes(store._writer)
            if used <= store.max_bytes:
                break
            deleted += _delete_oldest_fraction(store, 1.0 - SIZE_TARGET_FRACTION * store.max_bytes / used)
        if deleted:
            _prune_series(store)
            # Each step of this pragma frees one page, and execute() steps once (fetchall
            # too: there are no rows); executescript runs it to completion.
            store._writer.executescript("PRAGMA incremental_vacuum;")
        return deleted


def _prune_series(store: RetainedStore) -> None:
    """Forget series left without samples (engines and pods come and go)."""
    q = "SELECT id FROM series WHERE NOT EXISTS (SELECT 1 FROM samples WHERE series_id = series.id)"
    empty = [r[0] for r in store._writer.execute(q)]
    if not empty:
        return
    store._writer.executemany("DELETE FROM series WHERE id = ?", [(i,) for i in empty])
    store._writer.executemany("DELETE FROM marks WHERE series_id = ?", [(i,) for i in empty])
    gone = set(empty)
    store._encoder.forget(gone)
    store.unindex(gone)


def _series_ids(store: RetainedStore) -> list[int]:
    with store._slock:
        return list(store._ids.values())


def _delete_before(store: RetainedStore, cutoff_s: float, reason: str) -> int:
    cutoff = round(cutoff_s * 1000)
    params = [(sid, cutoff) for sid in _series_ids(store)]
    if not params:
        return 0
    store._writer.execute("BEGIN IMMEDIATE")
    try:
        added = _reanchor(store, cutoff) if _has_stamps_before(store, cutoff) else 0
        cur = store._writer.executemany("DELETE FROM samples WHERE series_id = ? AND ts_ms < ?", params)
        n = max(0, cur.rowcount)
        store._writer.executemany("DELETE FROM marks WHERE series_id = ? AND ts_ms < ?", params)
        store._writer.executemany(
            "DELETE FROM stamps WHERE group_id = ? AND ts_ms < ?", [(g, cutoff) for g in _groups(store)]
        )
        store._writer.execute("COMMIT")
    except sqlite3.Error:
        store.rollback()
        raise
    with store._qlock:
        store._stats.rows += added - n
        store._stats.deleted[reason] += n
    return n


def _groups(store: RetainedStore) -> list[int]:
    """Group ids that have stamps (a skip scan over the stamps primary key)."""
    out: list[int] = []
    row = store._writer.execute("SELECT MIN(group_id) FROM stamps").fetchone()
    while row and row[0] is not None:
        out.append(int(row[0]))
        row = store._writer.execute("SELECT MIN(group_id) FROM stamps WHERE group_id > ?", (row[0],)).fetchone()
    return out


def _has_stamps_before(store: RetainedStore, cutoff: int) -> bool:
    return any(
        store._writer.execute("SELECT 1 FROM stamps WHERE group_id = ? AND ts_ms < ? LIMIT 1", (g, cutoff)).fetchone()
        for g in _groups(store)
    )


def _reanchor(store: RetainedStore, cutoff: int) -> int:
    """Before rows older than `cutoff` go: a series whose run crosses the cut gets its carried
    value written as a point (and a mark) at its group's first stamp at or after the cut, so
    the points it keeps read back unchanged. Returns the points added."""
    w = store._writer
    points, marks = [], []
    for sid in _series_ids(store):
        mark = w.execute(
            "SELECT ts_ms, group_id FROM marks WHERE series_id = ? AND ts_ms <= ? ORDER BY ts_ms DESC LIMIT 1",
            (sid, cutoff),
        ).fetchone()
        if mark is None or not mark[1] or mark[0] == cutoff:
            continue
        first = w.execute(
            "SELECT MIN(ts_ms) FROM stamps WHERE group_id = ? AND ts_ms >= ?", (mark[1], cutoff)
        ).fetchone()[0]
        if first is None:
            continue
        later = w.execute(
            "SELECT 1 FROM marks WHERE series_id = ? AND ts_ms > ? AND ts_ms <= ? LIMIT 1", (sid, cutoff, first)
        ).fetchone()
        if later is not None:
            continue
        carried = w.execute(
            "SELECT value FROM samples WHERE series_id = ? AND ts_ms <= ? ORDER BY ts_ms DESC LIMIT 1", (sid, first)
        ).fetchone()
        if carried is None:
            continue
        points.append((sid, first, carried[0]))
        marks.append((sid, first, mark[1]))
    cur = w.executemany("INSERT OR IGNORE INTO samples (series_id, ts_ms, value) VALUES (?, ?, ?)", points)
    w.executemany("INSERT OR REPLACE INTO marks (series_id, ts_ms, group_id) VALUES (?, ?, ?)", marks)
    return max(0, cur.rowcount)


def _delete_oldest_fraction(store: RetainedStore, fraction: float) -> int:
    """Delete the oldest `fraction` of the time span stored (samples arrive at a steady rate,
    so time is a good proxy for rows; the caller loops until under the limit)."""
    lo, hi = _time_span(store)
    if lo is None or hi is None:
        return 0
    cutoff_ms = lo + max(1, math.ceil((hi - lo) * min(1.0, max(0.0, fraction))))
    return _delete_before(store, cutoff_ms / 1000, "size")


def _time_span(store: RetainedStore) -> tuple[int | None, int | None]:
    """Oldest and newest stored point (per series: each a range scan of its primary key)."""
    q = "SELECT MIN(ts_ms), MAX(ts_ms) FROM samples WHERE series_id = ?"
    spans = [row for sid in _series_ids(store) if (row := store._writer.execute(q, (sid,)).fetchone())[0] is not None]
    return (min(a for a, _ in spans), max(b for _, b in spans)) if spans else (None, None)


def used_bytes(conn: sqlite3.Connection) -> int:
    """Bytes of the pages in use (what max_bytes bounds): the file less its free pages."""
    page, count, free = (
        conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_size", "page_count", "freelist_count")
    )
    return int(page * (count - free))
