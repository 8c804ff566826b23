"""Changes judged at the arrival rate where no concurrency bucket decides (issue 55, item 2).

In open loop the arrival rate is the input and the requests in the engine are partly an outcome:
an engine made slower by a setting holds more requests at the same rate, so its curve and the old
one share no concurrency bucket. The rate as the engine saw it (finished requests plus the change
of the requests in it) matches the load, and TTFT's order in the load offered lets a side slower at
no more load be called slower (docs/curve.md "Did it help")."""

from __future__ import annotations

import numpy as np
import pytest

from kvscope.diagnoser.curve.intervals import ARRIVAL_RATE, arrival_rate, pool_intervals
from kvscope.diagnoser.curve.report import changes_text, pool_curves, regression_findings
from kvscope.diagnoser.evaluate.frame import Block, Frame
from tests.unit.test_curve import STEP, synth

HALF = 24
TTFT = ("request_ttft_seconds_bucket", "request_ttft_seconds_count")


def test_the_arrival_rate_is_what_finished_plus_what_stayed():
    """Conservation per interval: 5 finished and the engine went 0 -> 2 -> 2 -> 0 requests: 7, 5
    and 3 arrived; over a span of three intervals, 15 in 3 intervals; NaN over a reset."""
    finished = np.array([[5.0, 5.0, 5.0]])
    ends = np.array([[0.0, 2.0, 2.0, 0.0]])
    none = np.zeros((1, 3), dtype=bool)
    assert arrival_rate(finished, ends, none, 1.0, 0).tolist() == [[7.0, 5.0, 3.0]]
    assert arrival_rate(finished, ends, none, 2.0, 1)[0, 1] == pytest.approx(15 / 6)
    reset = np.array([[False, True, False]])
    assert np.isnan(arrival_rate(finished, ends, reset, 1.0, 0)[0, 1])


def _open_loop(kind: str, slower_after: bool = True, n: int = 40):
    """One engine at the same arrival rate throughout (40 requests finish per interval, the
    engine's count steady on each side, the same 40 output tokens per second): on the slower side it holds 14 requests (2 waiting) and its
    slowest 3 % take 2.5 s, on the other 4 and (0.05, 0.1]. `kind`: `config` (the KV capacity moves
    at HALF with a restart) or `restart` (same flags); `n`: the requests finished per interval."""
    slow, fast = 14.0, 4.0
    first, second = (fast, slow) if slower_after else (slow, fast)
    cap_after = 100.0 if kind == "config" else 1000.0
    return synth(
        [first] * HALF + [second] * HALF,
        tail=lambda c, i: 5 if c > 10 else 1,
        tokens=lambda c: 40.0,  # the same requests: the same tokens per second at the same rate
        resets=(HALF,),
        kv_cap=[1000.0] * HALF + [cap_after] * HALF,
        n=n,
    )


def test_a_setting_that_holds_more_requests_at_the_same_rate_is_judged_there():
    """No concurrency bucket in common (4 against 14 in the engine), the same 40 requests per
    interval arriving: a regression at the arrival rate, on TTFT p99, with the rate and the
    intervals compared said, and the regression finding."""
    (pc,) = pool_curves(_open_loop("config"), settle_s=0.0)
    (j,) = pc.changes
    assert j.change.kind == "config" and j.matched_concurrency == []
    assert j.verdict == "regression" and j.worse == ["ttft_p99_s"], (j.verdict, j.reason)
    assert j.by_arrival_rate and j.by_arrival_rate["method"] == "matched" and j.by_arrival_rate["rate_buckets"] == 1
    assert j.by_arrival_rate["after_intervals"] >= 5 and j.by_arrival_rate["before_intervals"] >= 5
    assert set(j.deltas) == {"ttft_p99_s", "output_tokens_per_s"}  # not ITL at a matched rate
    assert j.deltas["ttft_p99_s"]["interval"][0] > 0.1
    assert "judged at the arrival rate" in changes_text(pc)[0]
    assert regression_findings([pc], (0.0, 1.0), STEP)


def test_long_requests_under_half_a_request_a_second_are_matched_at_their_rate():
    """6 requests finish per 15-s interval (0.4 a second) while 4, then 14, are in the engine: each
    lasts 10-35 s. By Little's law that engine is busy, not idle, so the rate buckets continue
    below the concurrency edges' first (0.5): a regression at the matched rate, as at 40 a
    interval."""
    (pc,) = pool_curves(_open_loop("config", n=6), settle_s=0.0)
    (j,) = pc.changes
    assert j.verdict == "regression" and j.worse == ["ttft_p99_s"], (j.verdict, j.reason)
    assert j.by_arrival_rate and j.by_arrival_rate["method"] == "matched"


def test_the_inverse_setting_is_an_improvement_at_the_same_rate():
    (pc,) = pool_curves(_open_loop("config", slower_after=False), settle_s=0.0)
    (j,) = pc.changes
    assert j.verdict == "improvement" and j.better == ["ttft_p99_s"] and j.by_arrival_rate


def test_a_same_flags_restart_is_not_judged_by_the_rate():
    """Nothing the engine runs changed: a slower side there is the machine or the load, and the
    rate's order checks neither (the step-time check needs matched batches): no verdict."""
    (pc,) = pool_curves(_open_loop("restart"), settle_s=0.0)
    (j,) = pc.changes
    assert j.change.kind == "restart"
    assert j.verdict == "not_comparable" and j.by_arrival_rate is None


def test_an_engine_without_a_finished_counter_has_no_arrival_rate():
    """Absent, never zero: no finished counter, no rate, and no verdict from it."""
    frame = _open_loop("config")
    del frame.blocks["engine_requests_finished_total"]
    (iv,) = pool_intervals(frame).values()
    assert np.isnan(iv.gauges[ARRIVAL_RATE]).all()
    (pc,) = pool_curves(frame, settle_s=0.0)
    assert all(j.by_arrival_rate is None for j in pc.changes)


def test_the_curves_order_judges_a_setting_where_no_rate_matches():
    """The after side slower at a lower arrival rate (30 requests an interval against 40, 2.0 against
    2.7 a second, the same tokens per request): no rate bucket in common, and TTFT's order in the
    load says the after side, slower at less load, is slower at the same load."""
    before = _open_loop("config")
    after = synth([4.0] * HALF + [14.0] * HALF, tail=lambda c, i: 5 if c > 10 else 1, tokens=lambda c: 30.0, n=30)
    blocks = dict(before.blocks)  # the after side's counters from HALF on (they start again there: a reset)
    for name in ("engine_requests_finished_total", "engine_generation_tokens_total", *TTFT):
        lo, hi = before.blocks[name].values, after.blocks[name].values
        blocks[name] = Block(before.blocks[name].labels, np.concatenate([lo[:, :HALF], hi[:, HALF:]], axis=1))
    frame = Frame(ts=before.ts, blocks=blocks)
    (pc,) = pool_curves(frame, settle_s=0.0)
    (j,) = pc.changes
    assert j.verdict == "regression" and j.by_arrival_rate, (j.verdict, j.reason)
    assert j.by_arrival_rate["method"] == "ordered" and j.by_arrival_rate["arrival_rate_per_s"] == 2.5
