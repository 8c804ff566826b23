"""Adaptive buckets: sparse concurrency buckets pooled at the same mix of load (issue 55, item 3).

A closed loop of 16 streams held 4.3 requests in the engine in one pass and 6.7 in the next, so a
side's few intervals there fell over several buckets, each too few alone, and the change was not
judged. Pooled, each bucket of the pool weighs the smaller side's count of intervals on both sides
(post-stratification), so the two sides are compared at the same mixture of loads
(docs/curve.md "Did it help")."""

from __future__ import annotations

import numpy as np
import pytest

from kvscope.diagnoser.curve.intervals import CONCURRENCY, pool_intervals
from kvscope.diagnoser.curve.pooled import pools
from kvscope.diagnoser.curve.report import pool_curves
from tests.unit.test_curve import hump, synth
from tests.unit.test_curve_machine_speed import _with_itl


def _restart(before: list[float], after: list[float], **kw):
    """One engine at `before` requests per interval, restarted with the same flags, then at `after`."""
    conc = [before[0], *before, *after]
    return synth(conc, resets=(len(before) + 1,), **kw)


def test_sparse_buckets_pool_at_the_same_mix_of_load():
    """Before: 4 intervals at 4.2 in the engine and 3 at 6; after: 3 and 4. Each bucket is sparse
    alone (under 5 intervals). The slowest 3 % wait 2.5 s from 6 on, so the after side's plain
    merge holds more slow requests (4 of 7 intervals against 3 of 7) and reads a TTFT p99 about
    0.3 s worse with no engine change. Pooled with 3 intervals of each bucket weighing on both
    sides, the mixtures are the same: the delta is nil."""
    frame = _restart([4.2] * 4 + [6.0] * 3, [4.2] * 3 + [6.0] * 4)
    (pc,) = pool_curves(frame, settle_s=0.0)
    (j,) = pc.changes
    assert all(p.sparse for p in j.before + j.after)
    assert j.matched_concurrency, "the sparse buckets were pooled"
    assert j.deltas["ttft_p99_s"]["delta"] == pytest.approx(0.0, abs=1e-9)
    assert j.verdict != "regression"


def _sides(frame):
    """The pool's intervals before and after the restart (the interval across it left out)."""
    iv = next(iter(pool_intervals(frame).values()))
    cut = iv.t_end[int(np.flatnonzero(iv.resets)[0])]
    return iv.take(iv.t_end < cut), iv.take(iv.t_end > cut)


def test_a_bucket_only_one_side_reached_weighs_nothing():
    """The after side also ran 3 intervals at 12 in the engine, where the before side never went:
    that bucket is not in the comparison, whatever its latency."""
    frame = _restart([4.2] * 4 + [6.0] * 3, [4.2] * 3 + [6.0] * 4 + [12.0] * 3)
    before, after = _sides(frame)
    (m,) = pools(before, after, set())
    conc = after.gauges[CONCURRENCY]
    assert conc.max() == 12.0 and conc[m.rows_a].max() < 10.0
    (pc,) = pool_curves(frame, settle_s=0.0)
    assert pc.changes[0].deltas["ttft_p99_s"]["delta"] == pytest.approx(0.0, abs=1e-9)


def test_too_few_intervals_on_both_sides_make_no_pool():
    """2 intervals at 4.2 and 2 at 6 on each side: under the 5 matched intervals a bucket needs.
    Nothing is compared, and the change says how much more traffic would decide it."""
    frame = _restart([4.2] * 2 + [6.0] * 2, [4.2] * 2 + [6.0] * 2)
    assert pools(*_sides(frame), set()) == []
    (pc,) = pool_curves(frame, settle_s=0.0)
    (j,) = pc.changes
    assert j.verdict == "not_comparable" and not j.deltas and j.more_traffic


def test_a_short_tail_joins_the_pool_below_it():
    """6 intervals at 3 in the engine before and 5 after (the first after the restart opens none):
    a pool of 5 matched. Above it each side ran two intervals at 12 (the one between the levels
    swung too far to place): too few for a pool of their own, they join the one below."""
    frame = _restart([3.0] * 6 + [12.0] * 3, [3.0] * 6 + [12.0] * 3)
    (m,) = pools(*_sides(frame), set())
    assert m.weight == 7.0


def test_itl_is_read_only_where_both_sides_ran_the_same_batch():
    """A KV setting grown back: before, 2 of the 8 requests in the engine waited; after, all 8 run,
    so every decode step carries more requests and takes twice as long, while TTFT falls. At the
    same requests in the engine the two sides ran different batches: ITL there reads the setting's
    trade of TTFT for ITL, not the engine's speed, and is not compared (a regression on it would
    call the restored KV a regression)."""
    half = 12
    frame = synth([8.0] * (2 * half), tail=lambda c, i: 5 if i < half else 1, resets=(half,),
                  kv_cap=[100.0] * half + [1000.0] * half)  # fmt: skip
    frame.blocks["engine_requests_waiting"].values[0, half:] = 0.0
    frame.blocks["engine_requests_running"].values[0, half:] = 8.0
    frame = _with_itl(frame, lambda i: 0.02 * (2.0 if i >= half else 1.0), lambda i: 1.0)
    (pc,) = pool_curves(frame, settle_s=0.0)
    (j,) = pc.changes
    assert j.change.kind == "config"
    assert "itl_p99_s" not in j.deltas
    assert j.verdict == "improvement" and j.better == ["ttft_p99_s"]


def test_an_undecided_pool_says_how_much_more_traffic_at_its_load_would_settle_it():
    """Only a pool matched (4.2 and 6 in the engine, sparse alone) and every other interval after
    the restart has its slowest 3 % at 0.5 s: TTFT p99's interval straddles the thresholds. The
    traffic that would settle it is asked of the pool, named by its outer edges, at its load."""
    frame = _restart(
        [4.2] * 4 + [6.0] * 3, [4.2] * 3 + [6.0] * 4, tail=lambda c, i: 3 if i > 8 and i % 2 == 0 else hump(c)
    )
    (pc,) = pool_curves(frame, settle_s=0.0)
    (j,) = pc.changes
    assert j.verdict == "not_comparable" and j.reason.startswith("undecided")
    (more,) = j.more_traffic
    assert more["bucket"] == [3.5, 7.0] and 4.2 < more["concurrency"] < 6.0
    assert (more["before"]["intervals"], more["after"]["intervals"]) == (7, 6)
    assert more["before"]["more_intervals"] > 0 and more["after"]["more_seconds"] > 0
