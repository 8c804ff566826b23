"""Enriched webhooks kept in SQLite, bounded by row count (oldest deleted first).

One row per webhook received: its status (`pending` until diagnosed, then `done`, `not_diagnosed`
when an alert's data could not be read, or `error`), the enriched payload as JSON, and where
forwarding stands. A row still `pending` is never trimmed (its diagnosis is queued or running).
Listings are read one row at a time and summarise at most `SUMMARY_ALERTS` alerts per webhook, each
text cut to `SUMMARY_CHARS`, so a page's size is bounded whatever the webhooks held. `:memory:`
gives the in-memory twin for tests.
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
SUMMARY_ALERTS = 50
"""Alerts summarised per webhook in a listing (as many as are diagnosed: payload.MAX_ALERTS)."""
SUMMARY_CHARS = 1000
"""Characters kept of each text in a listing's summary (alert names, headlines, summaries)."""


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
            self._db.execute("DELETE FROM diagnoses WHERE id <= ? AND status != 'pending'", (row_id - self.max_rows,))
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
        text = self.get_json(row_id)
        return None if text is None else json.loads(text)

    def get_json(self, row_id: int) -> str | None:
        """The row as a JSON object (id, received_at, status, alertnames, forward, payload), the
        stored payload spliced in as it is, not decoded and encoded again."""
        with self._lock:
            row = self._db.execute(_SELECT + " WHERE id = ?", (row_id,)).fetchone()
        if row is None:
            return None
        head = json.dumps(_head(row))
        return f'{head[:-1]}, "payload": {row[4]}}}'

    def payload(self, row_id: int) -> dict[str, Any] | None:
        """The stored payload of one row (a queued webhook's, read when its diagnosis starts)."""
        with self._lock:
            row = self._db.execute("SELECT payload FROM diagnoses WHERE id = ?", (row_id,)).fetchone()
        return None if row is None else json.loads(row[0])

    def list(self, limit: int = 50, alertname: str | None = None, before: int | None = None) -> list[dict[str, Any]]:
        """Newest first, only rows older than id `before` when given (the next page); `alertname`
        filters on one alert name. Rows are decoded one at a time into their bounded summary."""
        where: builtins.list[str] = []
        args: builtins.list[Any] = []
        if alertname:
            where.append("',' || alertnames || ',' LIKE ?")
            args.append(f"%,{alertname},%")
        if before is not None:
            where.append("id < ?")
            args.append(before)
        query = _SELECT + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC LIMIT ?"
        with self._lock:
            return [_summary(r) for r in self._db.execute(query, (*args, limit))]

    def latest(self, alertname: str, labels: dict[str, str], scan: int = 200) -> dict[str, Any] | None:
        """The newest stored diagnosis of an alert named `alertname` whose labels include `labels`
        (among the newest `scan` webhooks that carried that alert name): {id, received_at, status,
        alert}, the alert with its `kvscope` object; None if there is none."""
        with self._lock:  # one stored payload decoded at a time
            rows = self._db.execute(
                _SELECT + " WHERE ',' || alertnames || ',' LIKE ? ORDER BY id DESC LIMIT ?",
                (f"%,{alertname},%", scan),
            )
            for row_id, received, status, _, payload, _ in rows:
                for alert in json.loads(payload).get("alerts", []):
                    have = alert.get("labels", {})
                    if have.get("alertname") == alertname and all(have.get(k) == v for k, v in labels.items()):
                        return {"id": row_id, "received_at": received, "status": status, "alert": alert}
        return None

    def pending(self, limit: int) -> builtins.list[int]:  # `list` is a method here
        """Ids of the oldest webhooks still waiting for a diagnosis (e.g. the process stopped
        mid-queue); their payloads are read when their diagnosis starts (`payload`)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id FROM diagnoses WHERE status = 'pending' ORDER BY id LIMIT ?", (limit,)
            ).fetchall()
        return [int(r[0]) for r in rows]

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM diagnoses").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _head(row: tuple) -> dict[str, Any]:
    row_id, received, status, names, _, forward = row
    return {
        "id": row_id,
        "received_at": received,
        "status": status,
        "alertnames": [n for n in names.split(",") if n],
        "forward": forward,
    }


def _summary(row: tuple) -> dict[str, Any]:
    """A listing's entry: the row's head, its alert count and the first SUMMARY_ALERTS alerts'
    briefs (`alertnames` cut like the briefs' texts)."""
    alerts = json.loads(row[4]).get("alerts", [])
    head = _head(row)
    head["alertnames"] = [_cut(n) for n in head["alertnames"][:SUMMARY_ALERTS]]
    return {**head, "alerts": len(alerts), "summary": [_brief(a) for a in alerts[:SUMMARY_ALERTS]]}


def _brief(alert: dict[str, Any]) -> dict[str, Any]:
    ks = alert.get("kvscope") or {}
    cause = ks.get("likely_cause") or {}
    return {
        "alertname": _cut(alert.get("labels", {}).get("alertname")),
        "status": alert.get("status"),
        "diagnosis": ks.get("status"),
        "headline": _cut(ks.get("headline")),
        "likely_cause": _cut(cause.get("rule_id")),
        "summary": _cut(cause.get("summary")),
    }


def _cut(text: Any) -> Any:
    if isinstance(text, str) and len(text) > SUMMARY_CHARS:
        return text[:SUMMARY_CHARS] + "…"
    return text
