"""Enriched webhooks kept in SQLite, bounded by row count (oldest deleted first).

One row per webhook received: its status (`pending` until diagnosed, then `done`), the enriched
payload as JSON, and where forwarding stands. `:memory:` gives the in-memory twin for tests.
"""

from __future__ import annotations

import builtins
import json
import sqlite3
import threading
import time
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS diagnoses (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  received_at REAL NOT NULL,
  status TEXT NOT NULL,
  alertnames TEXT NOT NULL,
  payload TEXT NOT NULL,
  forward TEXT NOT NULL DEFAULT ''
);
"""
_SELECT = "SELECT id, received_at, status, alertnames, payload, forward FROM diagnoses"


class DiagnosisStore:
    """Thread-safe SQLite store of enriched webhooks; keeps at most `max_rows`."""

    def __init__(self, path: str = ":memory:", max_rows: int = 1000) -> None:
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        if path != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)

    def add(self, payload: dict[str, Any]) -> int:
        """Store a received webhook as `pending`; returns its id. Trims the oldest rows."""
        names = ",".join(sorted({a.get("labels", {}).get("alertname", "") for a in payload.get("alerts", [])}))
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO diagnoses (received_at, status, alertnames, payload) VALUES (?, 'pending', ?, ?)",
                (time.time(), names, json.dumps(payload)),
            )
            row_id = int(cur.lastrowid or 0)
            self._db.execute("DELETE FROM diagnoses WHERE id <= ?", (row_id - self.max_rows,))
        return row_id

    def update(self, row_id: int, payload: dict[str, Any], status: str = "done") -> None:
        with self._lock:
            self._db.execute(
                "UPDATE diagnoses SET payload = ?, status = ? WHERE id = ?", (json.dumps(payload), status, row_id)
            )

    def set_forward(self, row_id: int, forward: str) -> None:
        with self._lock:
            self._db.execute("UPDATE diagnoses SET forward = ? WHERE id = ?", (forward, row_id))

    def get(self, row_id: int) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute(_SELECT + " WHERE id = ?", (row_id,)).fetchone()
        return _row(row, full=True) if row else None

    def list(self, limit: int = 50, alertname: str | None = None) -> list[dict[str, Any]]:
        """Newest first; `alertname` filters on one alert name."""
        query = _SELECT
        args: tuple[Any, ...] = ()
        if alertname:
            query += " WHERE ',' || alertnames || ',' LIKE ?"
            args = (f"%,{alertname},%",)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY id DESC LIMIT ?", (*args, limit)).fetchall()
        return [_row(r, full=False) for r in rows]

    def latest(self, alertname: str, labels: dict[str, str], scan: int = 200) -> dict[str, Any] | None:
        """The newest stored diagnosis of an alert named `alertname` whose labels include `labels`
        (among the newest `scan` webhooks that carried that alert name): {id, received_at, status,
        alert}, the alert with its `kvscope` object; None if there is none."""
        with self._lock:
            rows = self._db.execute(
                _SELECT + " WHERE ',' || alertnames || ',' LIKE ? ORDER BY id DESC LIMIT ?",
                (f"%,{alertname},%", scan),
            ).fetchall()
        for row_id, received, status, _, payload, _ in rows:
            for alert in json.loads(payload).get("alerts", []):
                have = alert.get("labels", {})
                if have.get("alertname") == alertname and all(have.get(k) == v for k, v in labels.items()):
                    return {"id": row_id, "received_at": received, "status": status, "alert": alert}
        return None

    def pending(self, limit: int) -> builtins.list[tuple[int, dict[str, Any]]]:  # `list` is a method here
        """Oldest webhooks still waiting for a diagnosis (e.g. the process stopped mid-queue)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, payload FROM diagnoses WHERE status = 'pending' ORDER BY id LIMIT ?", (limit,)
            ).fetchall()
        return [(int(r[0]), json.loads(r[1])) for r in rows]

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM diagnoses").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _row(row: tuple, full: bool) -> dict[str, Any]:
    row_id, received, status, names, payload, forward = row
    doc = json.loads(payload)
    return {
        "id": row_id,
        "received_at": received,
        "status": status,
        "alertnames": [n for n in names.split(",") if n],
        "forward": forward,
        **({"payload": doc} if full else {"summary": [_brief(a) for a in doc.get("alerts", [])]}),
    }


def _brief(alert: dict[str, Any]) -> dict[str, Any]:
    ks = alert.get("kvscope") or {}
    cause = ks.get("likely_cause") or {}
    return {
        "alertname": alert.get("labels", {}).get("alertname"),
        "status": alert.get("status"),
        "headline": ks.get("headline"),
        "likely_cause": cause.get("rule_id"),
        "summary": cause.get("summary"),
    }
