"""The operating curve on synthetic pools: merged quantiles, sparse buckets, resets, coarse
sampling, knee and C_max, and the verdicts of changes at matched load."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from kvscope.core.signals import make_labels
from kvscope.diagnoser.curve.intervals import pool_intervals
from kvscope.diagnoser.curve.operating import PLACING, operating_point
from kvscope.diagnoser.curve.points import curve_points
from kvscope.diagnoser.curve.report import (
    changes_text,
    knee_text,
    pool_curves,
    regression_findings,
    render_text,
    to_json,
)
from kvscope.diagnoser.evaluate.frame import Block, Frame

LES = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, math.inf]
STEP = 15.0
BASE = {"instance": "a", "engine": "vllm", "model": "m", "job": "vllm"}


def hump(c: float, i: int = 0) -> int:
    """TTFT bucket of the slowest 3 % of requests: the median's bucket up to 6 running, 2.5 s after."""
    return 1 if c < 6 else 5


def synth(
    conc: list[float],
    tail=hump,
    tokens=lambda c: 10 * min(c, 6),
    waiting=lambda c: 0.0 if c < 6 else 2.0,
    n: int = 40,
    resets: tuple[int, ...] = (),
    kv_cap: list[float] | None = None,
    start: float = 1000.0,
    step: float = STEP,
) -> Frame:
    """One vLLM instance with conc[i] requests in it (running + waiting); interval i ends at grid point i+1 and runs at conc[i+1]. At each grid
    index in `resets` every counter starts again from that interval's increase."""
    T = len(conc)
    ts = start + step * np.arange(T)
    buckets = np.zeros((len(LES), T))
    fin, gen = np.zeros(T), np.zeros(T)
    for i in range(1, T):
        keep = 0.0 if i in resets else 1.0
        inc = np.zeros(len(LES))
        inc[1] += n * 0.97  # the median request: (0.05, 0.1]
        inc[tail(conc[i], i)] += n * 0.03
        buckets[:, i] = keep * buckets[:, i - 1] + np.cumsum(inc)
        fin[i] = keep * fin[i - 1] + n
        gen[i] = keep * gen[i - 1] + tokens(conc[i]) * step
    lab = lambda **extra: make_labels(BASE | extra)  # noqa: E731
    blocks = {
        "engine_requests_running": Block([lab()], np.array([[c - waiting(c) for c in conc]])),
        "engine_requests_waiting": Block([lab()], np.array([[waiting(c) for c in conc]])),
        "engine_requests_finished_total": Block([lab(reason="stop")], fin[None, :]),
        "engine_generation_tokens_total": Block([lab()], gen[None, :]),
        "request_ttft_seconds_bucket": Block([lab(le=str(le) if le != math.inf else "+Inf") for le in LES], buckets),
        "request_ttft_seconds_count": Block([lab()], buckets[-1:].copy()),
    }
    if kv_cap is not None:
        blocks["engine_kv_capacity_tokens"] = Block([lab()], np.array([kv_cap]))
    return Frame(ts=ts, blocks=blocks)


STAIRS = [c for c in (1, 2, 3, 4.2, 8, 12, 16) for _ in range(8)]


def test_points_merge_histograms_and_rates():
    pts = curve_points(pool_intervals(synth(STAIRS))[("m", "vllm")])
    assert [p.concurrency for p in pts] == pytest.approx([1, 2, 3, 4.2, 6.1, 8, 12, 16], abs=0.3)
    low, high = pts[0], pts[-1]
    # 97 % in (0.05, 0.1]: p50 interpolated there; 3 % tail at 2.5 s past the knee
    assert low.ttft_p50_s == pytest.approx(0.075) and high.ttft_p50_s == pytest.approx(0.05 + 0.05 * (0.5 / 0.97))
    assert low.ttft_p99_s < 0.1 < 1.9 < high.ttft_p99_s <= 2.5
    assert high.ttft_p99_ci[0] <= high.ttft_p99_s <= high.ttft_p99_ci[1]
    assert low.rps == pytest.approx(40 / STEP) and low.output_tokens_per_s == pytest.approx(10)
    assert low.intervals == 7 and not low.sparse  # the first grid point opens no interval
    # an interval between two levels sits in the bucket of its mean (4.2 -> 8: a sparse 6.1)
    assert pts[4].sparse and pts[4].intervals == 1
    assert low.itl_p99_s is None  # no ITL histogram: absent, not zero


def test_knee_c_max_and_headroom():
    (pc,) = pool_curves(synth(STAIRS), slo_s=1.0)
    op = pc.operating
    assert op.knee_concurrency == 8 and "p99_leaves_p50" in op.knee_signs and "requests_wait" in op.knee_signs
    assert 4.2 < op.c_max < 8 and 40 / STEP == pytest.approx(op.usable_rps)
    assert op.littles_law_gap == pytest.approx((op.c_max / 1.0) / op.usable_rps)
    assert op.peak_concurrency == 16 and op.headroom_to_knee == 0.5


def test_no_knee_is_none_never_invented():
    flat = synth(STAIRS, tail=lambda c, i: 1, tokens=lambda c: 10 * c, waiting=lambda c: 0.0)
    (pc,) = pool_curves(flat, slo_s=1.0)
    assert pc.operating.knee_concurrency is None and pc.operating.c_max is None
    assert "stays under the SLO" in pc.operating.c_max_note
    assert pc.changes == []  # one steady config: no change, and no curve shift


def test_sparse_bucket_is_flagged_and_not_a_knee():
    conc = [1.0] * 8 + [2.0] * 8 + [3.0] * 8 + [16.0] * 3  # the saturated bucket has 3 intervals
    pts = curve_points(pool_intervals(synth(conc))[("m", "vllm")])
    assert pts[-1].sparse and pts[-1].ttft_p99_s > 2  # kept as measured, flagged
    op = operating_point(pts, None, slo_s=1.0)
    assert (op.knee_concurrency, op.knee_signs, op.knee_sign) == (None, [], None)


def test_knee_read_over_buckets_too_thin_alone():
    """Saturated from 6 (waiting, the tail at 2.5 s, throughput flat), not at 3; between 3 and 12
    the window held its load for 7 intervals spread over buckets each too thin to read. Every one
    of them from the first saturated load up shows a sign, and together with 12 and 16 they hold
    far more than a point's intervals: the knee is read there, within the bucket where saturation
    begins (a bucket is x1.41 wide), and the note says it was read over thin buckets."""
    conc = [1.0] * 8 + [2.0] * 8 + [3.0] * 8 + [4.2, 6.0, 8.5] * 3 + [12.0] * 8 + [16.0] * 8
    (pc,) = pool_curves(synth(conc), slo_s=1.0)
    dense = [p.concurrency for p in pc.points if not p.sparse]
    between = [p.intervals for p in pc.points if p.sparse and 3 < p.concurrency < 12]
    assert dense == pytest.approx([1, 2, 3, 12, 16], abs=0.3) and sum(between) >= 5
    op = pc.operating
    assert op.knee_concurrency is not None and 6 / 1.41 <= op.knee_concurrency <= 6 * 1.41
    assert op.knee_sign in PLACING
    assert any(n.startswith("the knee is read over buckets each too thin to read alone") for n in op.notes)
    assert not any(n.startswith("the knee lies between") for n in op.notes)


def test_no_knee_where_thin_buckets_disagree():
    """The same window with its thin bucket at 7.25 read unsaturated (no queue, the tail at the
    median's, throughput still gaining) between the saturated thin 5.1 and the dense 12: a sign at
    a thin load that a higher one does not hold, so saturation may begin anywhere between 3 and
    12. No knee is placed, and the note says between which loads it lies."""
    conc = [1.0] * 8 + [2.0] * 8 + [3.0] * 8 + [4.2, 6.0, 8.5] * 3 + [12.0] * 8 + [16.0] * 8
    (pc,) = pool_curves(synth(conc), slo_s=1.0)
    calm = [
        replace(p, waiting=0.0, ttft_p99_s=0.0995, output_tokens_per_s=90.0) if p.concurrency == 7.25 else p
        for p in pc.points
    ]
    assert [p.sparse for p in calm if 5 < p.concurrency < 8] == [True, True]
    op = operating_point(calm, peak=16.0, slo_s=1.0)
    assert op.knee_concurrency is None
    assert any(n.startswith("the knee lies between 2.94 and 11.8 in the engine") for n in op.notes), op.notes
    assert knee_text(op) == "Knee: none in the measured range (see the notes)."


def test_no_knee_read_over_thin_buckets_without_enough_below():
    """The same saturated thin buckets, but the load under them held for 2 intervals only (the
    lowest buckets dropped, 3 left thin): no unsaturated side read as long as a point needs, so
    where saturation begins is not known and no knee is placed. The note says from which load
    saturation shows and how many more intervals under it would place the knee (3: a side needs 5)."""
    conc = [1.0] * 8 + [2.0] * 8 + [3.0] * 8 + [4.2, 6.0, 8.5] * 3 + [12.0] * 8 + [16.0] * 8
    (pc,) = pool_curves(synth(conc), slo_s=1.0)
    short = [
        replace(p, intervals=1, sparse=True) if p.concurrency < 3.5 else p for p in pc.points if p.concurrency > 2.5
    ]
    assert sum(p.intervals for p in short if p.concurrency < 5) == 2
    op = operating_point(short, peak=16.0, slo_s=1.0)
    assert op.knee_concurrency is None
    (note,) = [n for n in op.notes if n.startswith("no knee placed")]
    assert "holds at every load from 5.1 in the engine up, not at 3.6" in note, note
    assert note.endswith("3 more intervals under 5.1 would place it, if the signs hold there"), note
    assert knee_text(op) == "Knee: none in the measured range (see the notes)."


def test_counter_reset_inside_a_bucket():
    plain = curve_points(pool_intervals(synth(STAIRS))[("m", "vllm")])
    (pc,) = pool_curves(synth(STAIRS, resets=(5, 12)))  # restarts inside the c=1 and c=2 buckets
    iv = pool_intervals(synth(STAIRS, resets=(5,)))[("m", "vllm")]
    assert (iv.counters["engine_requests_finished_total"] >= 0).all()
    assert iv.counters["engine_requests_finished_total"][4] == 40  # the value after the reset
    for a, b in zip(plain, pc.points, strict=True):
        assert (a.ttft_p99_s, a.rps) == pytest.approx((b.ttft_p99_s, b.rps))
    assert [c.change.kind for c in pc.changes] == ["restart", "restart"]


def test_concurrency_sampled_coarser_than_it_moves():
    swing = [1.0, 16.0] * 20  # the gauge jumps 1 <-> 16 at every 15 s scrape: the load is unknown
    (pc,) = pool_curves(synth(swing))
    assert pc.points == [] and pc.coarse_share == 1.0
    assert pc.operating.knee_concurrency is None
    assert "scrape more often" in render_text([pc], 1.0)


def _two_phases(tail_after, cap_after: float, conc_after=STAIRS) -> Frame:
    conc = STAIRS + list(conc_after)
    half = len(STAIRS)
    cap = [1000.0] * half + [cap_after] * len(conc_after)
    return synth(conc, tail=lambda c, i: hump(c) if i < half else tail_after(c), resets=(half,), kv_cap=cap)


def _two_phases_at(step: float, seconds: float = 80.0) -> Frame:
    """Two phases of `seconds` each at 4 requests per engine scraped every `step`: KV capacity
    1000 -> 500 with a restart between them, the slowest 3 % at 2.5 s after it."""
    half = int(seconds / step)
    conc = [4.0] * (2 * half)
    tail = lambda c, i: hump(c) if i < half else 5  # noqa: E731
    return synth(conc, tail=tail, resets=(half,), kv_cap=[1000.0] * half + [500.0] * half, step=step)


def test_config_change_regression_improvement_no_change_not_comparable():
    worse = _two_phases(lambda c: 5, 200.0)  # tail at 2.5 s at every load after
    (pc,) = pool_curves(worse, settle_s=0.0)
    (j,) = pc.changes
    assert j.change.kind == "config" and j.change.diff == {"kv_capacity_tokens": [1000.0, 200.0]}
    assert j.verdict == "regression" and j.worse == ["ttft_p99_s"]
    (f,) = regression_findings([pc], (0.0, 1.0), STEP)
    assert f.rule_id == "regression_after_change" and "kv_capacity_tokens" in f.summary
    assert "num-gpu-blocks-override" in f.levers[1].changes[0].change

    inverse = _two_phases(lambda c: 1, 2000.0)  # the tail gone at every load: better
    (pc,) = pool_curves(inverse, settle_s=0.0)
    (j,) = pc.changes
    assert j.verdict == "improvement" and j.better == ["ttft_p99_s"] and j.worse == []

    same = _two_phases(hump, 1000.0)  # restarted, same config, same load
    (pc,) = pool_curves(same, settle_s=0.0)
    (j,) = pc.changes
    assert j.change.kind == "restart" and j.verdict == "no_change"
    assert regression_findings([pc], (0.0, 1.0), STEP) == []

    moved = _two_phases(hump, 200.0, conc_after=[40.0] * 20)  # after: a load never seen before
    (pc,) = pool_curves(moved, settle_s=0.0)
    assert pc.changes[0].verdict == "not_comparable"


def test_a_change_with_nothing_to_compare_says_why():
    """An idle engine restarted with half its KV cache, its busy after-side all within the settle
    time: neither side places a point on the curve, so no bucket can be asked for; the verdict is
    not_comparable and the reason says what each side held (before: a bare not_comparable)."""
    half = 8
    frame = synth([0.0] * half + [4.0] * half, resets=(half,), kv_cap=[1000.0] * half + [500.0] * half)
    (pc,) = pool_curves(frame, settle_s=300.0)
    (j,) = pc.changes
    assert j.verdict == "not_comparable" and not j.more_traffic
    assert j.reason == (
        "nothing to compare: the window holds 7 scrape intervals (none placed on the curve) before the change and "
        "0 scrape intervals after it, past the first 300 s left out while the engine settles; comparing them "
        "takes at least 5 intervals (75 s) on each side at a load both share"
    )
    assert changes_text(pc)[0].endswith(f"not_comparable ({j.reason})")
    (pc,) = pool_curves(frame, settle_s=0.0)  # the after side read: the load to add before it is asked
    assert pc.changes[0].reason is None and pc.changes[0].more_traffic[0]["before"]["more_intervals"] == 5


def test_json_shape():
    doc = json.loads(json.dumps(to_json(pool_curves(_two_phases(lambda c: 5, 200.0), settle_s=0.0), 1.0)))
    (pool,) = doc["pools"]
    assert set(pool) >= {"labels", "concurrency_signal", "points", "knee_concurrency", "c_max", "usable_rps", "changes"}
    assert set(pool["points"][0]) >= {
        "concurrency",
        "ttft_p50_s",
        "ttft_p99_s",
        "rps",
        "output_tokens_per_s",
        "intervals",
    }
    assert set(pool["changes"][0]) >= {"time", "kind", "diff", "verdict", "deltas"}
    assert pool["labels"] == {"model": "m", "engine": "vllm"}


def test_a_curve_shift_where_the_machine_speed_is_not_read_is_not_reported():
    """The TTFT tail at 2.5 s at every load from the window's middle, no restart, no config, and no
    ITL exported: the machine's speed is not read, so a slower machine is not ruled out and no
    shift of the engine's curve is reported (test_curve_machine_speed: the same with the step read
    held is a `curve` regression)."""
    half = 2 * len(STAIRS)  # each half climbs the stairs twice: its earlier and later halves each hold every load
    shifted = synth(STAIRS * 4, tail=lambda c, i: hump(c) if i < half else 5)  # no restart, no config
    (pc,) = pool_curves(shifted, settle_s=0.0)
    assert pc.changes == [], [(j.change.kind, j.verdict) for j in pc.changes]


def test_a_stretch_of_noise_inside_one_half_is_no_curve_shift():
    """The slow tail at every load in the second climb of the stairs only (a noisy stretch inside
    the window's first half, nothing at the split): the halves differ, but the earlier parts of
    the two halves do not, so the shift does not hold in both parts of each side: none reported."""
    n = len(STAIRS)
    noisy = synth(STAIRS * 4, tail=lambda c, i: 5 if n <= i < 2 * n else hump(c))
    (pc,) = pool_curves(noisy, settle_s=0.0)
    assert pc.changes == [], [(j.change.kind, j.verdict, j.better) for j in pc.changes]


def test_lever_follow_up_after_a_change_that_applied_a_findings_lever():
    from kvscope.diagnoser.curve.report import attach
    from kvscope.diagnoser.findings import Diagnosis, Finding, LeverAdvice

    (pc,) = pool_curves(_two_phases(lambda c: 1, 2000.0), settle_s=0.0)  # KV 1000 -> 2000: better
    t = pc.changes[0].change.time

    def k1(until: float, active: bool) -> Finding:
        lever = LeverAdvice("vllm.gpu_memory_utilization", 1, "increase")
        return Finding(
            "kv_pressure_preemption",
            "K1",
            "KV full",
            "warning",
            {},
            1000.0,
            until,
            active,
            (0, 1),
            STEP,
            1,
            "s",
            levers=(lever,),
        )

    cleared = attach(Diagnosis((0, 1), "x", k1(t - STEP, False)), [pc]).changes[0]
    assert cleared["follow_up"] == [
        {
            "finding": "kv_pressure_preemption",
            "levers_md": "K1",
            "lever": "vllm.gpu_memory_utilization",
            "symptom_cleared": True,
        }
    ]
    assert "KV full (vllm.gpu_memory_utilization): cleared; at matched load: improvement" in cleared["text_follow_up"]
    still = attach(Diagnosis((0, 1), "x", k1(t + 600, True)), [pc]).changes[0]
    assert still["follow_up"][0]["symptom_cleared"] is False
    assert "follow_up" not in attach(Diagnosis((0, 1), "x", None), [pc]).changes[0]


class _Source:
    """A source with a natural step (a recording) or a measured scrape interval (a TSDB), or neither."""

    def __init__(self, natural: float | None = None, scraped: float | None = None, probes: bool = True) -> None:
        self.natural, self.scraped, self.asked = natural, scraped, []
        if probes:
            self.scrape_interval = self._probe

    def natural_step(self) -> float | None:
        return self.natural

    def _probe(self, names: set[str], start: float, end: float) -> float | None:
        self.asked.append((names, start, end))
        return self.scraped


def test_the_curve_step_is_the_sources_scrape_interval_not_the_findings_step():
    from kvscope.diagnoser.curve.window import curve_step

    assert curve_step(_Source(natural=2.0), None, None, 15.0) == 2.0  # a recording: its own scrapes
    tsdb = _Source(scraped=2.0)
    assert curve_step(tsdb, 0.0, 1800.0, 15.0) == 2.0
    assert tsdb.asked == [({"engine_requests_running"}, 0.0, 1800.0)]
    # no finer than one range query answers (11,000 points per series)
    assert curve_step(_Source(scraped=1.0), 0.0, 7 * 86400.0, 15.0) == pytest.approx(7 * 86400 / 11_000)
    # the source cannot say: the caller's step
    assert curve_step(_Source(scraped=None), 0.0, 1800.0, 15.0) == 15.0
    assert curve_step(_Source(probes=False), 0.0, 1800.0, 15.0) == 15.0
    assert curve_step(_Source(scraped=2.0), None, None, 15.0) == 15.0


def test_a_short_phase_is_comparable_at_the_scrape_interval_and_not_at_a_coarser_step():
    """The same two 80 s phases (KV cut in half, TTFT tail worse) read at their 2 s scrape
    interval and at a 15 s grid: only the first has enough intervals per bucket to compare."""
    fine = _two_phases_at(2.0)
    coarse = Frame(ts=fine.ts[::8], blocks={k: Block(b.labels, b.values[:, ::8]) for k, b in fine.blocks.items()})
    (at_scrape,) = pool_curves(fine, settle_s=0.0)
    (at_grid,) = pool_curves(coarse, settle_s=0.0)
    assert [j.verdict for j in at_scrape.changes] == ["regression"]
    assert [j.verdict for j in at_grid.changes] == ["not_comparable"]


def test_the_recorded_peak_is_the_99th_percentile_of_the_recorded_buckets():
    """recorded._peak: the intervals' concurrency histogram (bucket -1: idle) read at its 99th
    percentile, interpolated linearly inside the bucket that holds it; no intervals, no peak."""
    from kvscope.diagnoser.curve.recorded import _peak

    assert _peak({}) is None
    assert _peak({-1: 0.0}) is None
    # 98 idle intervals and 2 in [7, 10): rank 99 is the first half of the busy bucket's two
    assert _peak({-1: 98.0, 5: 2.0}) == pytest.approx(7 + 3 * 1 / 2)
    # everything in one bucket: 99 % of the way through it
    assert _peak({2: 10.0}) == pytest.approx(2.5 + 0.99)


def test_drift_between_intervals_is_in_the_verdicts_interval():
    """A noisy neighbour slows some intervals' tails (a run of slow intervals on each side, a few more
    of them after the window's middle): with 4000 requests per interval the order-statistic interval
    of the merged p99 is narrow and excluded zero (a `curve` regression, +12 %); the bootstrap over
    intervals sees the slow intervals come and go within each side and gives no verdict."""
    slow = set(range(1, 11)) | set(range(20, 33))  # 10 of the first half's intervals, 13 of the second's
    drifting = synth([4.0] * 40, tail=lambda c, i: 5 if i in slow else 1, n=4000)
    (pc,) = pool_curves(drifting, settle_s=0.0)
    assert pc.changes == [], [(j.verdict, j.deltas) for j in pc.changes]


def test_a_different_token_mix_at_matched_concurrency_is_not_judged():
    """After the change the requests carry twice the output tokens (a different workload, §8.2: one
    curve per input/output length) and their tails are slower: not a regression of the engine."""
    half = 20
    frame = synth(
        [4.0] * (2 * half),
        tail=lambda c, i: hump(c) if i < half else 5,
        tokens=lambda c: 10 * min(c, 6),
        resets=(half,),
        kv_cap=[1000.0] * half + [500.0] * half,
    )
    gen = frame.blocks["engine_generation_tokens_total"].values
    gen[:, half:] *= 2.0  # every interval after the change: twice the tokens for the same requests
    (pc,) = pool_curves(frame, settle_s=0.0)
    (j,) = pc.changes
    assert j.verdict == "not_comparable" and j.reason and "output_tokens_per_request" in j.reason
    assert j.offered_load["output_tokens_per_request"]["relative"] == pytest.approx(1.0, rel=0.05)
    assert regression_findings([pc], (0.0, 1.0), STEP) == []


def test_a_block_as_long_as_the_side_never_collapses_the_bootstrap():
    """A side that drifts as slowly as it is long gets an estimated block length beyond its size;
    resampling one block would repeat the side in every replicate (an interval of zero width)."""
    from kvscope.diagnoser.curve.bootstrap import resampled

    (iv,) = pool_intervals(synth([4.0] * 30)).values()
    rows = np.arange(len(iv))
    w = resampled(iv, rows, np.random.default_rng(0), 50, length=1e9)(np.eye(len(rows)))
    assert (w.sum(axis=1) == len(rows)).all() and len({tuple(r) for r in w}) > 1


@pytest.mark.parametrize("length", [1.0, 2.5, 7.0])
def test_resampled_totals_are_the_drawn_blocks_cut_at_the_side(length):
    """The plain definition, replicate by replicate: blocks of consecutive intervals of one
    instance drawn end to end with replacement, the rows taken until the side's count; a row's
    weight is how often it was taken, times its scale."""
    from kvscope.diagnoser.curve.bootstrap import resampled

    gen = np.random.default_rng(7)
    # three instances' intervals in no order, of unequal counts (short last blocks)
    iv = SimpleNamespace(
        unit=gen.permutation(np.repeat([0, 1, 2], [23, 17, 11])), t_end=gen.permutation(np.arange(51.0))
    )
    rows = np.flatnonzero(np.arange(51) % 3 != 1)  # a bucket's rows: not every interval
    n = len(rows)
    scale = gen.uniform(0.5, 2.0, n)
    x = gen.normal(size=(n, 4))
    got = resampled(iv, rows, np.random.default_rng(5), 40, length, scale)(x)
    size = max(1, min(math.ceil(length), math.ceil(min(3 * math.sqrt(n), n / 3))))
    blocks = []
    for u in np.unique(iv.unit[rows]):
        mine = [i for i in np.argsort(iv.t_end[rows], kind="stable") if iv.unit[rows][i] == u]
        blocks += [mine[i : i + size] for i in range(0, len(mine), size)]
    picks = np.random.default_rng(5).integers(0, len(blocks), size=(40, math.ceil(n / size) + 1))
    for r in range(40):
        taken = [i for b in picks[r] for i in blocks[b]][:n]
        weights = np.bincount(taken, minlength=n) * scale
        assert got[r] == pytest.approx(weights @ x, rel=1e-12, abs=1e-12)


def test_a_restart_is_where_the_recorded_restart_count_rises():
    """recorded.restart_times: the restarts record counts drops over the last five minutes, so one
    restart shows at several evaluations; it is placed at the first, a second within the span at
    the count's rise, and not at the window's first evaluation (that one may count an older one)."""
    from kvscope.diagnoser.curve.recorded import restart_times

    pts = np.array([[100.0, 1], [110, 1], [120, 1], [200, 1], [210, 2], [220, 2], [230, 1]])
    assert restart_times(pts, 10.0, 0.0).tolist() == [100.0, 200.0, 210.0]
    assert restart_times(pts, 10.0, 95.0).tolist() == [200.0, 210.0]
    assert restart_times(None, 10.0, 0.0).tolist() == []
