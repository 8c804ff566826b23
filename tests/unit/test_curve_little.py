"""The curve's concurrency from Little's law on the latency histograms' sums, and the knee from
every sign of saturation (issue 55), on synthetic Frames whose truth is known by construction.
Expected values were written from the construction before running."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvscope.core.signals import make_labels
from kvscope.diagnoser.curve.intervals import CONCURRENCY, little_concurrency, pool_intervals, weigh
from kvscope.diagnoser.curve.operating import operating_point
from kvscope.diagnoser.curve.points import curve_points
from kvscope.diagnoser.curve.report import pool_curves, render_text, to_json
from kvscope.diagnoser.evaluate.frame import Block, Frame
from tests.unit.test_curve import BASE, LES, synth

POOL = ("m", "vllm")


def with_sums(
    frame: Frame, seconds: list[float], done: list[float], names=("request_inference_seconds",), queued=None
) -> Frame:
    """`frame` plus latency histograms' `_sum` and `_count` whose increases in interval i (grid
    point i to i+1) are seconds[i] and done[i]: the time the requests that finished in it spent in
    the engine, and how many they were. With the inference histogram alone, it stands for queue +
    inference: the queue's sum carries `queued` of those seconds (none by default) and the
    inference sum the rest."""
    lab = make_labels(BASE)
    cum = lambda x: np.concatenate([[0.0], np.cumsum(x)])[None, :]  # noqa: E731
    count = cum(done)
    blocks = dict(frame.blocks)
    if names == ("request_inference_seconds",):
        queue = np.zeros(len(seconds)) if queued is None else np.asarray(queued)
        blocks["request_queue_seconds_sum"] = Block([lab], cum(queue))
        seconds = list(np.asarray(seconds) - queue)
    for h in names:
        blocks[f"{h}_sum"] = Block([lab], cum(seconds))
        blocks[f"{h}_count"] = Block([lab], count)
    return Frame(ts=frame.ts, blocks=blocks)


def test_short_requests_between_scrapes_are_integrated_not_missed():
    """40 requests/s of 0.1 s each at every 15 s scrape: 4 in the engine on average (Little), but
    each scrape catches the engine empty. The gauges alone read it idle; the sums place it at 4."""
    n = 40
    gauges = synth([0.0] * n, waiting=lambda c: 0.0)
    assert curve_points(pool_intervals(gauges)[POOL]) == []  # idle at every sample
    frame = with_sums(gauges, [40 * 15 * 0.1] * (n - 1), [40 * 15.0] * (n - 1))
    (pc,) = pool_curves(frame)
    (pt,) = pc.points
    assert pt.concurrency == pytest.approx(4.0) and pt.bucket == (3.5, 5.0)
    assert pc.estimator == {
        "method": "littles_law+gauges",
        "sum": "request_queue_seconds + request_inference_seconds",
        "littles_law_weight": 1.0,  # idle at both edges of every span: Little's law is exact
    }


def test_a_gauge_that_swings_faster_than_scraped_is_placed_by_the_sums():
    """The gauge jumps 1 <-> 16 at every 15 s scrape (test_curve: all left out as coarse), while
    the engine's sums say 8 requests in it on average, each 2 s long: every interval is placed at 8."""
    n = 40
    swing = synth([1.0, 16.0] * (n // 2), waiting=lambda c: 0.0)
    frame = with_sums(swing, [8 * 15.0] * (n - 1), [8 * 15.0 / 2.0] * (n - 1))
    (pc,) = pool_curves(frame)
    assert pc.coarse_share == 0.0
    (pt,) = pc.points
    assert pt.bucket == (7.0, 10.0) and pt.intervals == n - 1
    assert 7.0 <= pt.concurrency <= 9.0  # Little's 8, weighed with the swinging gauges' mean (8.5)
    assert pc.estimator["littles_law_weight"] > 0.5


def test_long_requests_lean_on_the_gauges():
    """Requests of 60 s at a steady 4 in the engine, scraped every 2 s: one finishes every 15 s, so
    an interval's sum increase is 0 or 60 s (Little per interval 0 or 30); over the 10 s span it is
    still lumpy, while the gauge holds 4. The weight goes to the gauges and the estimate stays 4."""
    n = 150
    seconds = [60.0 if i % 8 == 0 else 0.0 for i in range(n - 1)]  # one 60 s request per 16 s
    done = [1.0 if i % 8 == 0 else 0.0 for i in range(n - 1)]
    frame = with_sums(synth([4.0] * n, waiting=lambda c: 0.0, step=2.0), seconds, done)
    iv = pool_intervals(frame)[POOL]
    assert np.nanmean(iv.little_weight) < 0.5
    assert np.nanmean(iv.gauges[CONCURRENCY]) == pytest.approx(4.0, abs=0.5)
    (pt,) = curve_points(iv)
    assert pt.bucket == (3.5, 5.0)


def test_little_edges_resets_and_missing_sums():
    ends = np.array([[0.0, 2.0, 2.0, 0.0, 3.0]])
    seconds = np.array([[1.0, 4.0, 2.0, 5.0]])
    done = np.array([[1.0, 2.0, 1.0, 1.0]])
    no_drop = np.zeros((1, 4), dtype=bool)
    value, err = little_concurrency(ends, seconds, done, no_drop, 2.0, 0)
    assert value[0].tolist() == [0.5, 2.0, 1.0, 2.5]  # seconds / interval
    # error: sqrt(N_start + N_end) * W / sqrt(12) / span, W = seconds / done in the span
    assert err[0, 0] == pytest.approx(math.sqrt(2) * 1.0 / math.sqrt(12) / 2)
    assert err[0, 2] == pytest.approx(math.sqrt(2) * 2.0 / math.sqrt(12) / 2)
    # over a span of three intervals (half = 1): interval 1 reads intervals 0-2, edges at 0 and 3
    value, err = little_concurrency(ends, seconds, done, no_drop, 2.0, 1)
    assert value[0, 1] == pytest.approx(7.0 / 6.0) and err[0, 1] == 0.0  # idle at both edges: exact
    # a reset in the span, a missing sum, no finished request: no estimate
    drop = no_drop.copy()
    drop[0, 3] = True
    value, _ = little_concurrency(ends, seconds, done, drop, 2.0, 0)
    assert np.isnan(value[0, 3]) and not np.isnan(value[0, 2])
    gap = seconds.copy()
    gap[0, 0] = np.nan
    assert np.isnan(little_concurrency(ends, gap, done, no_drop, 2.0, 0)[0][0, 0])
    idle = np.zeros((1, 4))
    assert np.isnan(little_concurrency(ends, idle, idle, no_drop, 2.0, 0)[0][0, 1])


def test_weigh_by_inverse_variance():
    a, sa = np.array([4.0, 4.0, np.nan, 4.0, 4.0]), np.array([1.0, 0.0, np.nan, 1.0, np.nan])
    b, sb = np.array([8.0, 8.0, 8.0, np.nan, 8.0]), np.array([1.0, 1.0, 2.0, np.nan, 0.5])
    value, err, share = weigh(a, sa, b, sb)
    assert value.tolist() == [6.0, 4.0, 8.0, 4.0, 8.0]  # equal errors: the middle; exact a: a
    assert share.tolist() == [0.5, 1.0, 0.0, 1.0, 0.0]  # a without an error counts only alone
    assert err[0] == pytest.approx(1 / math.sqrt(2)) and err[2] == 2.0


def test_a_queue_between_scrapes_is_read_from_the_queue_sum():
    """At 30 s scrapes the waiting gauge catches an empty queue at every sample, while the
    queue-time sum says 3 requests waited on average (requests of 3 s, 1 s of it queued): the
    point's waiting is read from the sum, as its concurrency is, also beside an e2e sum alone (as
    SGLang exports them). Where the engine exports no queue sum, the gauge is all there is."""
    n = 30
    gauges = synth([9.0] * n, waiting=lambda c: 0.0, step=30.0)
    frame = with_sums(gauges, [9 * 30.0] * (n - 1), [3 * 30.0] * (n - 1), queued=[3 * 30.0] * (n - 1))
    (pt,) = pool_curves(frame)[0].points
    assert pt.waiting == pytest.approx(3.0, abs=0.1)
    e2e = with_sums(gauges, [9 * 30.0] * (n - 1), [3 * 30.0] * (n - 1), names=("request_e2e_seconds",))
    (pt,) = pool_curves(e2e)[0].points
    assert pt.waiting == 0.0
    queue = Block([make_labels(BASE)], np.arange(n, dtype=float)[None, :] * 3 * 30.0)
    (pt,) = pool_curves(Frame(ts=e2e.ts, blocks=e2e.blocks | {"request_queue_seconds_sum": queue}))[0].points
    assert pt.waiting == pytest.approx(3.0, abs=0.1)


def max_num_seqs_staircase(
    cap: int = 16, levels=(1, 2, 4, 8, 12, 16, 24, 32, 48), dwell_s: float = 20.0, step: float = 2.0
) -> Frame:
    """A closed-loop staircase on an engine that runs at most `cap` requests: running min(c, cap),
    the rest waiting. Every request's TTFT moves with the queue, median and tail alike (as on the
    shared CPU box): all of an interval's requests in (0.05, 0.1] s up to the cap, in (0.1, 0.25] s
    past it, so p99 never leaves p50 (p50 doubles with it). The sums integrate c (requests of 1 s),
    the queue's sum its waiting part."""
    per = int(dwell_s / step)
    conc = [float(c) for c in levels for _ in range(per)]
    frame = synth(conc, waiting=lambda c: max(0.0, c - cap), step=step)
    ttft = frame.block("request_ttft_seconds_bucket")
    buckets = np.zeros_like(ttft.values)
    for i in range(1, len(conc)):
        inc = np.zeros(len(LES))
        inc[1 if conc[i] <= cap else 2] = 40
        buckets[:, i] = buckets[:, i - 1] + np.cumsum(inc)
    blocks = dict(frame.blocks)
    blocks["request_ttft_seconds_bucket"] = Block(ttft.labels, buckets)
    seconds = [c * step for c in conc[1:]]
    queued = [max(0.0, c - cap) * step for c in conc[1:]]
    return with_sums(Frame(ts=frame.ts, blocks=blocks), seconds, seconds, queued=queued)


def test_the_knee_of_a_max_num_seqs_engine_is_where_running_pins_and_requests_wait():
    """Truth: saturation at 16 (running pins at its cap, requests wait from the next level on). The
    knee is at most one load level above it (24), placed by running_pinned; TTFT p99 does not leave
    p50 here, so the old rule (p99 leaving p50 first) found none."""
    (pc,) = pool_curves(max_num_seqs_staircase())
    op = pc.operating
    assert op.running_max == 16.0
    assert op.knee_sign == "running_pinned" and "requests_wait" in op.knee_signs
    assert 16 <= op.knee_concurrency <= 24
    assert "p99_leaves_p50" not in op.knee_signs
    doc = to_json([pc], 1.0)["pools"][0]
    assert doc["operating"]["knee_sign"] == "running_pinned" and doc["knee_concurrency"] == op.knee_concurrency
    assert "placed by running_pinned" in render_text([pc], 1.0)


def test_kv_full_with_requests_waiting_places_a_knee():
    """KV usage 0.95 from 12 in the engine on, requests waiting from there; the running batch is not
    at a fixed cap (it grows with c, as a KV-bound engine's does): kv_full places the knee at 12."""
    frame = max_num_seqs_staircase(cap=100)
    conc = frame.block("engine_requests_running").values[0] + frame.block("engine_requests_waiting").values[0]
    lab = make_labels(BASE)
    kv = np.where(conc >= 12, 0.95, conc / 16)
    waiting = np.where(conc >= 12, 2.0, 0.0)
    blocks = dict(frame.blocks)
    blocks["engine_kv_cache_usage_ratio"] = Block([lab], kv[None, :])
    blocks["engine_requests_waiting"] = Block([lab], waiting[None, :])
    blocks["engine_requests_running"] = Block([lab], (conc - waiting)[None, :])
    queued = np.concatenate([[0.0], np.cumsum(waiting[1:] * 2.0)])[None, :]  # the queue's sum says the same
    blocks["request_queue_seconds_sum"] = Block([lab], queued)
    blocks["request_inference_seconds_sum"] = Block([lab], frame.block("request_inference_seconds_sum").values - queued)
    (pc,) = pool_curves(Frame(ts=frame.ts, blocks=blocks))
    assert pc.operating.knee_sign == "kv_full" and pc.operating.knee_concurrency == pytest.approx(12, abs=1)


def test_saturated_from_the_lowest_bucket_is_no_knee_and_says_why():
    """Every bucket pinned and waiting: the knee is below the measured range, never extrapolated."""
    (pc,) = pool_curves(max_num_seqs_staircase(cap=1, levels=(4, 8, 12, 16)))
    assert pc.operating.knee_concurrency is None and pc.operating.knee_sign is None
    assert any("below the measured range" in n for n in pc.operating.notes)


def test_without_a_running_cap_the_knee_is_placed_by_the_queue_and_flat_throughput():
    """The records give no running gauge per bucket: running_pinned is not read, and the same
    bucket is placed by requests waiting while throughput gains flatten."""
    pts = curve_points(pool_intervals(max_num_seqs_staircase())[POOL])
    with_cap, without = (operating_point(pts, None, 1.0, running_max=cap) for cap in (16.0, None))
    assert with_cap.knee_sign == "running_pinned"
    assert (without.knee_concurrency, without.knee_signs, without.knee_sign) == (
        with_cap.knee_concurrency,
        ["requests_wait", "throughput_flat"],
        "throughput_flat",
    )


def test_a_scrape_gap_cuts_the_span_to_the_interval_itself():
    """2 s scrapes, the gauge swinging 1 <-> 16, the sums saying 8 (requests of 2 s), and 3 scrapes
    missing in the middle: the intervals next to the gap, whose 10 s span it cuts, are read from
    their own sums, not left to the swinging gauge (which would leave them out as coarse)."""
    n = 60
    frame = with_sums(
        synth([1.0, 16.0] * (n // 2), waiting=lambda c: 0.0, step=2.0), [8 * 2.0] * (n - 1), [8.0] * (n - 1)
    )
    blocks = {}
    for name, b in frame.blocks.items():
        v = b.values.copy()
        v[:, 30:33] = np.nan
        blocks[name] = Block(b.labels, v)
    (pc,) = pool_curves(Frame(ts=frame.ts, blocks=blocks))
    assert pc.coarse_share == 0.0
    (pt,) = pc.points
    assert pt.bucket == (7.0, 10.0) and pt.intervals == n - 1 - 4  # 4 intervals touch the gap


@pytest.mark.parametrize("dwell_s, step", [(10.0, 2.0), (20.0, 2.0), (90.0, 15.0), (180.0, 30.0)])
def test_the_max_num_seqs_knee_at_other_dwells_and_scrapes(dwell_s, step):
    """The same engine at 10 and 20 s per level scraped every 2 s, and at 90 and 180 s per level
    scraped every 15 and 30 s: the knee within one load level of the saturation at 16."""
    (pc,) = pool_curves(max_num_seqs_staircase(dwell_s=dwell_s, step=step))
    assert pc.operating.knee_sign == "running_pinned" and 16 <= pc.operating.knee_concurrency <= 24
