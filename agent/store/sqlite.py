"""Where canonical samples live on one node: the embedded SQLite store, in a file or (path
`MEMORY`, for tests and an agent without a store file) in memory; thread-safe (the runtime writes
from the scrape loop while the server, the diagnoser and the UI query).

SQLite (WAL mode; tables in `_SCHEMA`, clustered on their primary keys; timestamps integer ms)
holds the rows of agent/store/changepoints.py; `query` fills the unchanged points back in, so it
returns exactly the points written. One writer thread commits queued writes in batches, so `write()`
never waits on disk; past `max_queue` the *oldest* queued samples are dropped (`queue_full`). A
committed batch survives a crash of the process (WAL, `synchronous=NORMAL`). Retention
(agent/store/retention.py) runs on the writer thread; a full VACUUM is never run automatically.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import logging
import os
import sqlite3
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvscope.agent.ratelog import warn_every
from kvscope.agent.store import retention
from kvscope.agent.store.changepoints import ChangeEncoder, Encoded, StampIndex, fill_points
from kvscope.agent.store.retention import used_bytes
from kvscope.core.signals import Labels, Sample

Points = list[tuple[float, float]]
log = logging.getLogger("kvscope.store")

RETENTION_CHECK_INTERVAL_S = 60.0
WAL_SIZE_LIMIT_BYTES = 64 << 20
MEMORY = ":memory:"
"""The path of a store kept in memory: one connection (reads wait for a commit), no file."""
MEMORY_MAX_BYTES = 128 << 20
"""The most pages an agent without a store file keeps in memory (store.max_bytes if smaller)."""


@dataclass
class StoreStats:
    """Self-observation of a store, exported as kvscope_store_* by the runtime."""

    rows: int = 0
    series: int = 0
    bytes: int = 0  # on disk: database + WAL
    used_bytes: int = 0  # pages in use (what max_bytes bounds)
    queued: int = 0
    written: int = 0  # samples committed since open (queryable points)
    unchanged: int = 0  # of those, stored without a row (value as at the previous scrape)
    dropped: Counter[str] = field(default_factory=Counter)  # samples dropped, by reason
    errors: Counter[str] = field(default_factory=Counter)  # failed writes / retention passes, by reason
    failing: str | None = None  # reason while the latest write failed (disk_full...), None once one succeeds
    deleted: Counter[str] = field(default_factory=Counter)  # rows removed by retention: age | size
    over_budget: Counter[str] = field(default_factory=Counter)  # instance -> samples refused: its series budget used up
    max_write_latency_s: float = 0.0


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS series (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
    "labels TEXT NOT NULL, UNIQUE (name, labels))",
    "CREATE TABLE IF NOT EXISTS samples (series_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, "
    "value REAL NOT NULL, PRIMARY KEY (series_id, ts_ms)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS stamps (group_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, "
    "PRIMARY KEY (group_id, ts_ms)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS marks (series_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, "
    "group_id INTEGER NOT NULL, PRIMARY KEY (series_id, ts_ms)) WITHOUT ROWID",
)
_STAMPS_IN = "SELECT ts_ms FROM stamps WHERE group_id = ? AND ts_ms BETWEEN ? AND ? ORDER BY ts_ms"


_REASONS = {
    "SQLITE_FULL": "disk_full",
    "SQLITE_CORRUPT": "corrupt",
    "SQLITE_NOTADB": "corrupt",
    "SQLITE_BUSY": "busy",
    "SQLITE_LOCKED": "busy",
    "SQLITE_READONLY": "read_only",
    "SQLITE_CANTOPEN": "cant_open",
    "SQLITE_IOERR": "io_error",
}


def _instance(labels: Labels) -> str:
    """The `instance` label ("" without one): the target a series' budget is counted against."""
    return next((v for k, v in labels if k == "instance"), "")


def error_reason(exc: BaseException) -> str:
    """A stable token for a store failure: disk_full, io_error, corrupt, busy, read_only... or the
    exception's type name when SQLite gives no error code."""
    base = "_".join((getattr(exc, "sqlite_errorname", "") or "").split("_")[:2])  # SQLITE_IOERR_WRITE -> SQLITE_IOERR
    return _REASONS.get(base) or base.lower().removeprefix("sqlite_") or type(exc).__name__


class StoreError(OSError):
    """The database cannot be opened or has an unexpected schema; the message names the file."""


LOW_SPACE_BYTES = 1 << 20
"""Free space under which an open that fails is put down to a full disk."""


def open_failure(path: Path, exc: BaseException) -> str:
    """Why the store at `path` cannot be opened and what to do, in one line. History is never
    at stake for a cause that is not damage: only a damaged file is to be moved aside (kept, never
    deleted), and a full disk, a missing directory, a dangling link, missing permissions or another
    program's file say so and leave the file alone."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    err = getattr(exc, "errno", None)
    if path.is_symlink() and not path.exists():
        return (
            f"{path} is a symbolic link to {os.readlink(path)}, which does not exist (a volume not mounted or "
            "moved?): restore the link's target or point store.path at the store; nothing was changed"
        )
    if err == errno.ENOSPC or name.startswith("SQLITE_FULL") or _free_bytes(path) < LOW_SPACE_BYTES:
        return (
            f"{path}: no space left on the device ({_free_bytes(path)} bytes free; {exc}): free space or set "
            "store.path on a disk with room; the store itself is not damaged, keep it"
        )
    if not path.parent.is_dir():
        what = "is not a directory" if path.parent.exists() else "does not exist and cannot be created"
        return f"{path}: {path.parent} {what} ({exc}): fix store.path or create the directory"
    if err in (errno.EACCES, errno.EPERM, errno.EROFS) or name.startswith(("SQLITE_READONLY", "SQLITE_PERM")):
        return (
            f"{path}: cannot be written as uid {os.getuid()} ({exc}): fix the ownership or permissions of the file "
            f"and {path.parent}, or the read-only mount; the store is not damaged"
        )
    if name.startswith("SQLITE_NOTADB"):
        return (
            f"{path}: not a SQLite database ({exc}): if it is another program's file, set store.path to a new "
            "file; if it was a kvscope store it is damaged: move it aside (keep it) and start again, a new store "
            "is created"
        )
    if (
        name.startswith("SQLITE_CORRUPT")
        or isinstance(exc, sqlite3.DatabaseError)
        and not name.startswith(("SQLITE_IOERR", "SQLITE_CANTOPEN", "SQLITE_BUSY", "SQLITE_LOCKED"))
    ):
        return (
            f"{path}: {exc}; the store is damaged: move it aside (keep it; `sqlite3 FILE .recover` may save its "
            "history) and start again, a new store is created"
        )
    return f"{path}: cannot open store: {exc}"


def _free_bytes(path: Path) -> int:
    """Bytes free to this user on the file system of `path` (its nearest existing directory)."""
    probe = path.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError:
        return LOW_SPACE_BYTES  # unknown: not put down to a full disk
    return st.f_bavail * st.f_frsize


class SqliteStore:
    """Embedded SQLite store for one node (see the module docstring for layout and guarantees).

    `retention_s` and `max_bytes` bound the data kept; `batch_size` caps one transaction;
    `flush_interval_s` is the longest a queued sample waits before it is committed. Series are
    capped twice: `max_series` in all, and `max_series_per_target` per `instance` label (default a
    quarter of `max_series`), so one target churning label values cannot use up the shared cap;
    samples of refused series are dropped as `series_limit` / `target_series_limit`, the latter also
    counted per instance in `StoreStats.over_budget`. `path` MEMORY keeps the database in memory;
    with `background=False` nothing is committed until `flush()`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        retention_s: float = 7 * 86400,
        max_bytes: int = 1 << 30,
        batch_size: int = 20_000,
        flush_interval_s: float = 1.0,
        max_queue: int = 200_000,  # samples waiting for the writer (about 40 MiB at worst)
        max_series: int = 200_000,  # samples of further new series are dropped (`series_limit`)
        max_series_per_target: int | None = None,  # per instance label; None: max_series // 4
        background: bool = True,
        busy_timeout_s: float = 30.0,
    ) -> None:
        self.path = Path(path)
        self.memory = str(path) == MEMORY
        self.retention_s = retention_s
        self.max_bytes = max_bytes
        self.batch_size = max(1, batch_size)
        self.flush_interval_s = flush_interval_s
        self.max_queue = max(1, max_queue)
        self.max_series = max_series
        self.max_series_per_target = max(1, max_series // 4 if max_series_per_target is None else max_series_per_target)
        self._per_target: Counter[str] = Counter()  # instance -> series in the index
        self.busy_timeout_s = busy_timeout_s
        self._queue: deque[tuple[float, Sequence[Sample]]] = deque()  # (time of write(), samples)
        self._queued = 0
        self._qlock = threading.Lock()  # guards _queue and _stats.dropped (cheap, never I/O)
        self._wlock = threading.RLock()  # guards the writer connection
        self._rlock = self._wlock if self.memory else threading.Lock()  # guards the reader connection
        self._slock = threading.Lock()  # guards the series index
        self._stats = StoreStats()
        self._closed = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._ids: dict[tuple[str, Labels], int] = {}
        self._by_name: dict[str, list[tuple[Labels, int]]] = {}
        try:
            self._writer = self._connect()
            self._init_schema()
            self._reader = self._writer if self.memory else self._connect()
            for sid, name, labels in self._writer.execute("SELECT id, name, labels FROM series ORDER BY id"):
                self._index(sid, name, tuple((str(k), str(v)) for k, v in json.loads(labels)))
            last_group = self._writer.execute("SELECT MAX(group_id) FROM stamps").fetchone()[0]
            self._encoder = ChangeEncoder(self._series_for, int(last_group or 0) + 1)
        except sqlite3.DatabaseError as exc:  # a damaged file (pages the first reads touch), a full disk...
            raise StoreError(open_failure(self.path, exc)) from exc
        self._created: list[tuple[int, str, Labels]] | None = None
        self._snapshot: StoreStats | None = None
        self._row_offset: int | None = None  # rows at open, counted on first stats() (a full scan)
        self._next_retention = 0.0
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name="kvscope-store-writer", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ setup
    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=self.busy_timeout_s
            )
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables and "samples" not in tables:  # another program's database: never written to
                conn.close()
                raise StoreError(
                    f"{self.path}: a SQLite database of another program (tables: {', '.join(sorted(tables)[:5])}), "
                    "not a kvscope store; it was left unchanged: set store.path to a new file"
                )
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # only before WAL writes a new file's header
            conn.execute("PRAGMA journal_mode=WAL")
            # a checkpoint cuts the WAL back to this size, so max_bytes plus this bounds the disk used
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
            conn.execute("PRAGMA synchronous=NORMAL")
            return conn
        except StoreError:
            raise
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(open_failure(self.path, exc)) from exc

    def _init_schema(self) -> None:
        try:
            for stmt in _SCHEMA:
                self._writer.execute(stmt)
            cols = [r[1] for r in self._writer.execute("PRAGMA table_info(samples)")]
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: not a kvscope store: {exc}") from exc
        if cols != ["series_id", "ts_ms", "value"]:
            raise StoreError(f"{self.path}: not a kvscope store (samples columns {cols})")

    def _index(self, sid: int, name: str, labels: Labels) -> None:
        with self._slock:
            self._ids[(name, labels)] = sid
            self._by_name.setdefault(name, []).append((labels, sid))
            self._per_target[_instance(labels)] += 1

    def unindex(self, gone: set[int]) -> None:
        """Forget series ids (rolled back, or pruned by retention)."""
        with self._slock:
            self._ids = {k: v for k, v in self._ids.items() if v not in gone}
            self._per_target = Counter(_instance(labels) for _, labels in self._ids)
            self._by_name = {
                n: kept
                for n, lst in self._by_name.items()
                if (kept := [(lab, sid) for lab, sid in lst if sid not in gone])
            }

    # ------------------------------------------------------------------ write path
    def write(self, samples: Sequence[Sample]) -> None:
        """Queue samples; never blocks on disk or raises for a bad sample (dropped, counted by
        reason in `stats()`). A sample without a timestamp is stamped with the time of the call."""
        if self._closed:
            with self._qlock:
                self._stats.dropped["closed"] += len(samples)
            return
        chunk = samples if isinstance(samples, list) else list(samples)
        if not chunk:
            return
        with self._qlock:
            self._queue.append((time.time(), chunk))
            self._queued += len(chunk)
            self._trim_queue()
            full = self._queued >= self.batch_size
        if full:
            self._wake.set()

    def _trim_queue(self) -> None:
        """Drop the oldest queued samples past max_queue (caller holds _qlock)."""
        over = self._queued - self.max_queue
        if over > 0:
            self._stats.dropped["queue_full"] += over
            self._pop(over)

    def _pop(self, n: int) -> list[tuple[float, Sequence[Sample]]]:
        """Up to `n` of the oldest queued samples, as whole write() calls where they fit (caller holds _qlock)."""
        taken: list[tuple[float, Sequence[Sample]]] = []
        while self._queue and n > 0:
            now, chunk = self._queue[0]
            if len(chunk) > n:
                self._queue[0] = (now, chunk[n:])
                chunk = chunk[:n]
            else:
                self._queue.popleft()
            taken.append((now, chunk))
            n -= len(chunk)
            self._queued -= len(chunk)
        return taken

    def _take(self) -> list[tuple[float, Sequence[Sample]]]:
        """Whole write() calls (one scrape cycle each, usually) up to batch_size samples."""
        with self._qlock:
            return self._pop(self.batch_size)

    def flush(self) -> None:
        """Commit everything queued (visible to `query` once it returns). On a database error
        (locked past the busy timeout, disk full, I/O error) the batch goes back to the head of the
        queue, the error is counted in `stats().errors`, and the next flush retries it; the queue
        bound still applies."""
        with self._wlock:
            while batch := self._take():
                if not self._commit(batch):
                    break

    def _commit(self, batch: list[tuple[float, Sequence[Sample]]]) -> bool:
        t0 = time.perf_counter()
        self._created = []  # series first seen in this batch: created inside its transaction
        try:
            self._writer.execute("BEGIN IMMEDIATE")
            enc = Encoded()
            for now, chunk in batch:
                self._encoder.encode(chunk, now, enc)
            cur = self._writer.executemany(
                "INSERT OR IGNORE INTO samples (series_id, ts_ms, value) VALUES (?, ?, ?)", enc.points
            )
            inserted = cur.rowcount if cur.rowcount >= 0 else len(enc.points)
            self._writer.executemany(
                "INSERT OR REPLACE INTO marks (series_id, ts_ms, group_id) VALUES (?, ?, ?)", enc.marks
            )
            self._writer.executemany("INSERT OR IGNORE INTO stamps (group_id, ts_ms) VALUES (?, ?)", enc.stamps)
            self._writer.execute("COMMIT")
        except sqlite3.Error as exc:
            self._undo()
            with self._qlock:  # back to the head of the queue, still bounded by max_queue
                self._queue.extendleft(reversed(batch))
                self._queued += sum(len(chunk) for _, chunk in batch)
                self._trim_queue()
            self._failed(exc)
            return False
        except BaseException:
            self._undo()
            raise
        finally:
            self._created = None
        elapsed = time.perf_counter() - t0
        with self._qlock:
            st = self._stats
            st.dropped.update(enc.dropped)  # Counter.update adds
            lost = len(enc.points) - inserted  # same series and millisecond already stored: first wins
            if lost > 0:
                st.dropped["duplicate"] += lost
            st.rows += inserted
            st.failing = None
            st.written += enc.accepted - max(0, lost)
            st.unchanged += enc.accepted - len(enc.points)
            st.max_write_latency_s = max(st.max_write_latency_s, elapsed)
        return True

    def _undo(self) -> None:
        """A batch failed: roll back, forget the series its transaction created and the
        encoder's state (it described rows that are not on disk)."""
        self.rollback()
        self._encoder.reset()
        if self._created:
            self.unindex({sid for sid, _, _ in self._created})

    def rollback(self) -> None:
        """Roll the writer's open transaction back (none open: nothing)."""
        with contextlib.suppress(sqlite3.Error):
            self._writer.execute("ROLLBACK")

    def _series_for(self, name: str, labels: Labels) -> int | str:
        """The id of a series, created on first sight; past a cap, the reason it is refused."""
        if (sid := self._ids.get((name, labels))) is not None:
            return sid
        if len(self._ids) >= self.max_series:
            return "series_limit"
        if self._per_target[instance := _instance(labels)] >= self.max_series_per_target:
            with self._qlock:
                self._stats.over_budget[instance] += 1
            warn_every(
                log,
                f"store:budget:{instance}",
                "store: target %r has %d series (max_series_per_target); samples of its new series are dropped",
                instance,
                self._per_target[instance],
            )
            return "target_series_limit"
        text = json.dumps(labels, separators=(",", ":"))
        self._writer.execute("INSERT OR IGNORE INTO series (name, labels) VALUES (?, ?)", (name, text))
        sid = int(
            self._writer.execute("SELECT id FROM series WHERE name = ? AND labels = ?", (name, text)).fetchone()[0]
        )
        self._index(sid, name, labels)
        if self._created is not None:
            self._created.append((sid, name, labels))
        return sid

    # ------------------------------------------------------------------ background
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            try:
                self.flush()
                if time.monotonic() >= self._next_retention:
                    retention.enforce_retention(self)
                    self._next_retention = time.monotonic() + RETENTION_CHECK_INTERVAL_S
                # file sizes and row count for snapshot(), on this thread and its connection: a
                # long API read holding the reader never delays the writer
                self._snapshot = self._stats_via(self._writer, self._wlock)
            except Exception as exc:  # noqa: BLE001 - the writer thread must outlive any one failure
                self.rollback()
                self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        """Count a failed write or retention pass by reason, mark the store failing, log (rate-limited)."""
        reason = error_reason(exc)
        with self._qlock:
            self._stats.errors[reason] += 1
            self._stats.failing = reason
            queued = self._queued
        warn_every(
            log,
            f"store:{reason}",
            "store %s: writes failing (%s: %s); %d samples queued for retry (the oldest are dropped past %d)",
            self.path,
            reason,
            exc,
            queued,
            self.max_queue,
        )

    def snapshot(self) -> StoreStats:
        """`stats()` without touching the disk, for the scrape loop: the counters as of now, the
        file sizes and row count as of the writer thread's last pass (at most flush_interval_s
        old). Without a writer thread it is `stats()`."""
        last = self._snapshot
        if last is None:
            return self.stats()
        st = self._counters()
        st.rows, st.bytes, st.used_bytes = last.rows, last.bytes, last.used_bytes
        if self._thread is not None and not self._thread.is_alive() and not self._closed:
            st.failing = "writer_dead"
        return st

    # ------------------------------------------------------------------ read path
    def query(self, name: str, start: float, end: float) -> dict[Labels, Points]:
        """Points of every series named `name` with start <= ts <= end (seconds), sorted by time,
        as committed (`flush()`)."""
        with self._slock:
            targets = list(self._by_name.get(name, ()))
        lo, hi = round(start * 1000), round(end * 1000)
        with self._rlock:
            r = self._reader
            stamps = StampIndex(lambda g: [t for (t,) in r.execute(_STAMPS_IN, (g, lo, hi))])
            r.execute("BEGIN")  # one snapshot: points, marks and stamps of the same commits
            try:
                return {lab: pts for lab, sid in targets if (pts := self._series_points(sid, lo, hi, stamps))}
            finally:
                r.execute("COMMIT")

    def _series_points(self, sid: int, lo: int, hi: int, stamps: StampIndex) -> Points:
        """Points of one series in [lo, hi] ms: stored change points plus the filled-in repeats."""
        r = self._reader
        real = [
            (t, float(v))
            for t, v in r.execute(
                "SELECT ts_ms, value FROM samples WHERE series_id = ? AND ts_ms BETWEEN ? AND ? ORDER BY ts_ms",
                (sid, lo, hi),
            )
        ]
        marks = r.execute(
            "SELECT ts_ms, group_id FROM marks WHERE series_id = ? AND ts_ms <= ? AND ts_ms >= "
            "COALESCE((SELECT MAX(ts_ms) FROM marks WHERE series_id = ? AND ts_ms <= ?), ?) ORDER BY ts_ms",
            (sid, hi, sid, lo, lo),
        ).fetchall()
        carry = None
        if marks and (not real or real[0][0] > lo):
            row = r.execute(
                "SELECT ts_ms, value FROM samples WHERE series_id = ? AND ts_ms < ? ORDER BY ts_ms DESC LIMIT 1",
                (sid, lo),
            ).fetchone()
            carry = (row[0], float(row[1])) if row else None
        return fill_points(real, carry, marks, stamps, lo, hi)

    def names(self) -> set[str]:
        """Canonical sample names that have at least one series stored."""
        with self._slock:
            return {n for n, series in self._by_name.items() if series}

    def stats(self) -> StoreStats:
        """A snapshot of the counters plus the current file sizes."""
        return self._stats_via(self._reader, self._rlock)

    def _counters(self) -> StoreStats:
        """A copy of the counters, with the queue length and the series count, each under its lock."""
        with self._qlock:
            st = copy.deepcopy(self._stats)
            st.queued = self._queued
        with self._slock:
            st.series = len(self._ids)
        return st

    def _stats_via(self, conn: sqlite3.Connection, lock: threading.Lock | threading.RLock) -> StoreStats:
        st = self._counters()
        st.rows = self._row_count(st.rows)
        st.bytes = 0 if self.memory else sum(_size(Path(f"{self.path}{suffix}")) for suffix in ("", "-wal"))
        if not self._closed:
            with lock:
                st.used_bytes = used_bytes(conn)
        return st

    def _row_count(self, delta: int) -> int:
        """Rows stored: the count at open (taken once, lazily) plus the inserts minus deletes since."""
        if self._row_offset is None and not self._closed:
            with self._wlock, self._rlock:  # no commit in flight: the count and the delta agree
                count = self._reader.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
                with self._qlock:
                    self._row_offset = count - self._stats.rows
            return count
        return (self._row_offset or 0) + delta

    def close(self) -> None:
        """Flush, stop the writer thread and release the database. Idempotent."""
        if self._closed:
            return
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.flush()
        self._closed = True
        with self._wlock:
            with contextlib.suppress(sqlite3.Error):  # one compact file left, unless a reader holds it up
                self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._writer.close()
        with self._rlock:
            self._reader.close()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
