"""Retention of the SQLite store (agent/store/sqlite.py): by age and by size, on the writer thread.

Rows older than `retention_s` go first, then, while the pages in use exceed `max_bytes`, the
oldest slice of the stored time span (sized from the overshoot, to 90% of the limit). Before
change points older than a cut are deleted, a series whose unchanged run crosses the cut gets
its carried value written at its group's first stamp after the cut (`_reanchor`), so the points
kept read back unchanged. Series left without rows are forgotten, so churn does not use up
`max_series`. Freed pages go back to the file system with `PRAGMA incremental_vacuum`.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvscope.agent.signals import Labels
    from kvscope.agent.store.changepoints import ChangeEncoder

SIZE_TARGET_FRACTION = 0.9
"""A size-retention pass deletes until the pages in use are below this fraction of max_bytes."""


class RetentionMixin:
    """Retention for `SqliteStore`; uses its writer connection, locks, series index and stats."""

    retention_s: float
    max_bytes: int
    _writer: sqlite3.Connection
    _wlock: threading.RLock
    _slock: threading.Lock
    _qlock: threading.Lock
    _encoder: ChangeEncoder
    _ids: dict[tuple[str, Labels], int]
    _stats: Any
    _rollback: Callable[[], None]
    _unindex: Callable[[set[int]], None]

    def enforce_retention(self, now: float | None = None) -> int:
        """Delete rows older than retention_s, then the oldest rows until the pages in use are
        under max_bytes; give freed pages back with incremental_vacuum. Returns rows deleted."""
        now = time.time() if now is None else now
        with self._wlock:
            deleted = self._delete_before(now - self.retention_s, "age")
            for _ in range(8):  # each pass removes the oldest slice sized from the overshoot
                used = used_bytes(self._writer)
                if used <= self.max_bytes:
                    break
                deleted += self._delete_oldest_fraction(1.0 - SIZE_TARGET_FRACTION * self.max_bytes / used)
            if deleted:
                self._prune_series()
                # Each step of this pragma frees one page, and execute() steps once (fetchall
                # too: there are no rows); executescript runs it to completion.
                self._writer.executescript("PRAGMA incremental_vacuum;")
            return deleted

    def _prune_series(self) -> None:
        """Forget series left without samples (engines and pods come and go), so that churn
        does not use up max_series."""
        empty = [
            r[0]
            for r in self._writer.execute(
                "SELECT id FROM series WHERE NOT EXISTS (SELECT 1 FROM samples WHERE series_id = series.id)"
            )
        ]
        if not empty:
            return
        self._writer.executemany("DELETE FROM series WHERE id = ?", [(i,) for i in empty])
        self._writer.executemany("DELETE FROM marks WHERE series_id = ?", [(i,) for i in empty])
        gone = set(empty)
        self._encoder.forget(gone)
        self._unindex(gone)

    def _series_ids(self) -> list[int]:
        with self._slock:
            return list(self._ids.values())

    def _delete_before(self, cutoff_s: float, reason: str) -> int:
        cutoff = round(cutoff_s * 1000)
        params = [(sid, cutoff) for sid in self._series_ids()]
        if not params:
            return 0
        self._writer.execute("BEGIN IMMEDIATE")
        try:
            added = self._reanchor(cutoff) if self._has_stamps_before(cutoff) else 0
            cur = self._writer.executemany("DELETE FROM samples WHERE series_id = ? AND ts_ms < ?", params)
            n = max(0, cur.rowcount)
            self._writer.executemany("DELETE FROM marks WHERE series_id = ? AND ts_ms < ?", params)
            self._writer.executemany(
                "DELETE FROM stamps WHERE group_id = ? AND ts_ms < ?", [(g, cutoff) for g in self._groups()]
            )
            self._writer.execute("COMMIT")
        except sqlite3.Error:
            self._rollback()
            raise
        with self._qlock:
            self._stats.rows += added - n
            self._stats.deleted[reason] += n
        return n

    def _groups(self) -> list[int]:
        """Group ids that have stamps (a skip scan over the stamps primary key)."""
        out: list[int] = []
        row = self._writer.execute("SELECT MIN(group_id) FROM stamps").fetchone()
        while row and row[0] is not None:
            out.append(int(row[0]))
            row = self._writer.execute("SELECT MIN(group_id) FROM stamps WHERE group_id > ?", (row[0],)).fetchone()
        return out

    def _has_stamps_before(self, cutoff: int) -> bool:
        return any(
            self._writer.execute(
                "SELECT 1 FROM stamps WHERE group_id = ? AND ts_ms < ? LIMIT 1", (g, cutoff)
            ).fetchone()
            for g in self._groups()
        )

    def _reanchor(self, cutoff: int) -> int:
        """Before rows older than `cutoff` go: a series whose run crosses the cut gets its carried
        value written as a point (and a mark) at its group's first stamp at or after the cut, so
        the points it keeps read back unchanged. Returns the points added."""
        w = self._writer
        points, marks = [], []
        for sid in self._series_ids():
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

    def _delete_oldest_fraction(self, fraction: float) -> int:
        """Delete the oldest `fraction` of the time span stored (samples arrive at a steady rate,
        so time is a good proxy for rows; the caller loops until under the limit)."""
        lo, hi = self._time_span()
        if lo is None or hi is None:
            return 0
        cutoff_ms = lo + max(1, math.ceil((hi - lo) * min(1.0, max(0.0, fraction))))
        return self._delete_before(cutoff_ms / 1000, "size")

    def _time_span(self) -> tuple[int | None, int | None]:
        """Oldest and newest stored point (per series: each a range scan of its primary key)."""
        q = "SELECT MIN(ts_ms), MAX(ts_ms) FROM samples WHERE series_id = ?"
        spans = [
            row for sid in self._series_ids() if (row := self._writer.execute(q, (sid,)).fetchone())[0] is not None
        ]
        return (min(a for a, _ in spans), max(b for _, b in spans)) if spans else (None, None)


def used_bytes(conn: sqlite3.Connection) -> int:
    """Bytes of the pages in use (what max_bytes bounds): the file less its free pages."""
    page, count, free = (
        conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_size", "page_count", "freelist_count")
    )
    return int(page * (count - free))
