"""Change-point storage reads back exactly what a dense store holds.

A simulated agent (three targets scraped at jittered times, plus samples stamped at the end of
each cycle) writes the same cycles into a dense store (`Dense`: every point) and the change-point SQLite
store; every query window must give identical points, rates and quantiles. The simulation has
idle and moving series, a counter reset, a series that vanishes and returns, a target that
goes down and comes back, a restart of the writing process, and age retention.
"""

from __future__ import annotations

import random

import pytest

from kvscope.agent.store import retention
from kvscope.agent.store.changepoints import ChangeEncoder, fill_points
from kvscope.agent.store.sqlite import SqliteStore
from kvscope.core.signals import Sample, make_labels
from testbed.promref import raw_increase, window_quantiles

BASE = 1_700_000_000.0
CYCLES = 120
DOWN = range(30, 45)  # target e2 does not answer
VANISH = range(60, 66)  # one gauge of e1 is missing from its payload
RESET_AT = 80  # e0 restarts: its counter goes back to a small value


def _cycle(n: int, rng: random.Random) -> list[Sample]:
    out: list[Sample] = []
    first = BASE + n + rng.random() * 0.002
    for t in range(3):
        inst = f"e{t}:8000"
        # on even cycles e1 is scraped in the same millisecond as e0
        ts = first + 0.0002 * t if t < 2 and n % 2 == 0 else BASE + n + 0.003 * t + rng.random() * 0.002
        up = not (t == 2 and n in DOWN)
        if up:
            lab = make_labels({"instance": inst, "engine": "vllm"})
            count = n // 7 if not (t == 0 and n >= RESET_AT) else (n - RESET_AT) // 3
            out.append(Sample("engine_requests_total", lab, float(count), ts))
            if not (t == 1 and n in VANISH):
                out.append(Sample("engine_requests_waiting", lab, float((n // 10) % 3), ts))
            out.append(Sample("engine_kv_cache_usage_ratio", lab, 0.5, ts))  # never moves
            for i, le in enumerate(("0.1", "1.0", "+Inf")):
                out.append(Sample("request_ttft_seconds_bucket", lab + (("le", le),), float(count * (i + 1)), ts))
        now = BASE + n + 0.05
        out.append(Sample("kvscope_target_up", make_labels({"instance": inst, "job": "vllm"}), 1.0 if up else 0.0, now))
    return out


NAMES = (
    "engine_requests_total",
    "engine_requests_waiting",
    "engine_kv_cache_usage_ratio",
    "request_ttft_seconds_bucket",
    "kvscope_target_up",
)
WINDOWS = [
    (BASE - 5, BASE + CYCLES + 5),
    (BASE + 10.5, BASE + 20.5),
    (BASE + 33.2, BASE + 50.0),
    (BASE + 61.0, BASE + 64.0),
    (BASE + 79.0, BASE + 95.0),
    (BASE + 100.0, BASE + 100.0),
]


class Dense:
    """Every point written, first write per series and millisecond kept: the oracle."""

    def __init__(self) -> None:
        self.points: dict[tuple, dict[float, float]] = {}

    def write(self, samples: list[Sample]) -> None:
        for s in samples:
            assert s.timestamp is not None
            self.points.setdefault((s.name, s.labels), {}).setdefault(round(s.timestamp * 1000) / 1000, s.value)

    def query(self, name: str, start: float, end: float) -> dict:
        return {
            labels: sel
            for (n, labels), pts in self.points.items()
            if n == name and (sel := sorted((t, v) for t, v in pts.items() if start <= t <= end))
        }


def _assert_same(dense, sparse, windows=WINDOWS):
    for name in NAMES:
        for lo, hi in windows:
            want, got = dense.query(name, lo, hi), sparse.query(name, lo, hi)
            assert got == want, (name, lo, hi)
            assert {k: raw_increase(v) for k, v in got.items()} == {k: raw_increase(v) for k, v in want.items()}
            if name.endswith("_bucket"):
                assert window_quantiles(0.9, got, lo, hi) == window_quantiles(0.9, want, lo, hi)


@pytest.fixture
def cycles():
    rng = random.Random(7)
    return [_cycle(n, rng) for n in range(CYCLES)]


def test_sparse_store_reads_back_the_dense_series(tmp_path, cycles):
    dense, sparse = Dense(), SqliteStore(tmp_path / "kv.db", background=False)
    for batch in cycles:
        dense.write(batch)
        sparse.write(batch)
        sparse.flush()
    _assert_same(dense, sparse)
    st = sparse.stats()
    assert st.written == sum(len(b) for b in cycles) and not st.dropped
    assert st.rows < st.written / 3 and st.unchanged == st.written - st.rows  # few rows: few moves
    marks = sparse._reader.execute("SELECT COUNT(*) FROM marks").fetchone()[0]
    assert marks < 0.1 * st.written  # groups are stable: a mark per run start or stale, not per scrape
    sparse.close()


def test_a_down_target_and_a_vanished_series_are_absent_not_carried(tmp_path, cycles):
    sparse = SqliteStore(tmp_path / "kv.db", background=False)
    for batch in cycles:
        sparse.write(batch)
    sparse.flush()
    e2 = make_labels({"instance": "e2:8000", "engine": "vllm"})
    ts = [t for t, _ in sparse.query("engine_kv_cache_usage_ratio", BASE, BASE + CYCLES)[e2]]
    assert not [t for t in ts if BASE + DOWN.start - 0.5 < t < BASE + DOWN.stop - 0.5]
    assert len(ts) == CYCLES - len(DOWN)
    e1 = make_labels({"instance": "e1:8000", "engine": "vllm"})
    waiting = sparse.query("engine_requests_waiting", BASE + VANISH.start - 0.5, BASE + VANISH.stop - 0.5)
    assert e1 not in waiting
    sparse.close()


def test_split_batches_restart_and_retention_keep_the_answers(tmp_path, cycles):
    dense = Dense()
    path = tmp_path / "kv.db"
    sparse = SqliteStore(path, background=False, batch_size=7)  # cycles cut across transactions
    for n, batch in enumerate(cycles):
        dense.write(batch)
        sparse.write(batch)
        sparse.flush()
        if n == 50:  # the agent restarts on the same file
            sparse.close()
            sparse = SqliteStore(path, background=False)
    _assert_same(dense, sparse)
    cut = BASE + 70.5  # mid-run for every series that does not move
    sparse.retention_s = 0.0
    assert retention.enforce_retention(sparse, now=cut) > 0
    kept = [(max(lo, cut), hi) for lo, hi in WINDOWS if hi >= cut]
    _assert_same(dense, sparse, kept)
    assert sparse.query("engine_kv_cache_usage_ratio", BASE, cut - 0.001) == {}
    sparse.close()


def test_out_of_order_and_duplicate_samples_are_dropped_and_counted():
    enc = ChangeEncoder(lambda name, labels: 1)
    lab = make_labels({"instance": "a"})
    out = enc.encode([Sample("x", lab, 1.0, 10.0), Sample("x", lab, 2.0, 10.0)], now=0.0)
    enc.encode([Sample("x", lab, 3.0, 9.0)], now=0.0, out=out)
    assert out.points == [(1, 10_000, 1.0)] and out.accepted == 1
    assert out.dropped == {"duplicate": 1, "out_of_order": 1}


def test_fill_without_marks_is_the_stored_points():
    assert fill_points([(1000, 1.0), (3000, 2.0)], None, [], lambda g, a, b: [], 0, 5000) == [(1.0, 1.0), (3.0, 2.0)]


def test_a_failed_commit_forgets_its_new_series_and_the_retry_reads_back_the_same(tmp_path, cycles):
    dense, sparse = Dense(), SqliteStore(tmp_path / "kv.db", background=False)
    for batch in cycles[:5]:
        dense.write(batch)
        sparse.write(batch)
    sparse.flush()
    sparse._writer.execute("CREATE TRIGGER boom BEFORE INSERT ON stamps BEGIN SELECT RAISE(ABORT, 'disk on fire'); END")
    extra = [Sample("engine_new_total", make_labels({"instance": "e9:8000"}), 1.0, BASE + 5.5)]
    for batch in (cycles[5] + extra, cycles[6]):
        dense.write(batch)
        sparse.write(batch)
    sparse.flush()  # fails inside the transaction, after the new series was created in it
    st = sparse.stats()
    assert st.errors and st.queued == len(cycles[5]) + len(cycles[6]) + 1
    assert "engine_new_total" not in sparse.names()
    sparse._writer.execute("DROP TRIGGER boom")
    for batch in cycles[7:]:
        dense.write(batch)
        sparse.write(batch)
    sparse.flush()
    _assert_same(dense, sparse)
    assert sparse.query("engine_new_total", 0, 2e9) == dense.query("engine_new_total", 0, 2e9) != {}
    sparse.close()
