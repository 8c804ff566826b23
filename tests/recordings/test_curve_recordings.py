"""The operating curve on real vLLM recordings (issue 36), against truths the recorder computed
without kvscope's code (testbed/curve_record.py): per level, the engine's own TTFT histogram read
from raw /metrics text at the level's start and end, its requests in flight polled once a second,
and the load driver's client-side TTFT. Expected verdicts were written into each YAML
(`expected_curve`) before kvscope read the recording."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest
import yaml

from kvscope.diagnoser.curve.intervals import CONCURRENCY, pool_intervals
from kvscope.diagnoser.curve.points import quantile_ci
from kvscope.diagnoser.curve.report import pool_curves
from kvscope.diagnoser.curve.window import read_window
from kvscope.diagnoser.sources.recording import RecordingSource

HERE = Path(__file__).resolve().parent
STAIRS = "curve-vllm-staircase"
POOL = ("tiny-llama", "vllm")


@cache
def _frame(name: str):
    source = RecordingSource(HERE / f"{name}.om.gz")
    return read_window(source, None, None, source.natural_step())


def _meta(name: str) -> dict:
    return yaml.safe_load((HERE / f"{name}.yaml").read_text())


def _levels(name: str):
    """(phase, its intervals) per phase: intervals ending inside the phase."""
    meta, iv = _meta(name), pool_intervals(_frame(name))[POOL]
    t0 = meta["recorded_at_unix"]
    for p in meta["phases"]:
        yield p, iv.take((iv.t_end > t0 + p["start_s"]) & (iv.t_end <= t0 + p["end_s"]))


def test_staircase_merged_histograms_match_the_engines_own_per_level():
    """Truth: the engine's histogram over each level. The level's intervals merged the way a curve
    bucket merges them give the same quantiles; the window edges differ by up to one scrape (2 s of
    a 50 s level), hence the tolerance."""
    for p, iv in _levels(STAIRS):
        les, arr = iv.hists["request_ttft_seconds"]
        merged = np.maximum.accumulate(np.nansum(arr, axis=0))
        assert merged[-1] == pytest.approx(p["engine_requests"], rel=0.1), p["name"]
        p50, _ = quantile_ci(0.5, les, merged)
        p99, _ = quantile_ci(0.99, les, merged)
        assert p50 == pytest.approx(p["engine_ttft_p50_s"], rel=0.1), p["name"]
        assert p99 == pytest.approx(p["engine_ttft_p99_s"], rel=0.1), p["name"]


def test_staircase_concurrency_is_the_engines_requests_in_flight():
    """Truth: running + waiting polled once a second from the engine during each level."""
    for p, iv in _levels(STAIRS):
        assert np.nanmean(iv.gauges[CONCURRENCY]) == pytest.approx(p["engine_in_flight_mean"], rel=0.3), p["name"]


def test_staircase_knee_and_c_max_against_the_engine_truth():
    meta = _meta(STAIRS)
    (pc,) = pool_curves(_frame(STAIRS), slo_s=1.0)
    levels = meta["phases"]
    # No knee in the engine's own numbers: nothing ever waits, and p50 climbs with p99 (the engine's
    # steps slow down on a saturated 2-core box) instead of staying flat while p99 leaves it (§8.1).
    assert all(pt.waiting == 0 for pt in pc.points)
    assert levels[-1]["engine_ttft_p50_s"] > 1.5 * levels[0]["engine_ttft_p50_s"]
    assert pc.operating.knee_concurrency is None and pc.operating.knee_signs == []
    # C_max lies between the highest level whose engine p99 met the SLO and the first that broke it.
    under = [lv["engine_in_flight_mean"] for lv in levels if lv["engine_ttft_p99_s"] <= 1.0]
    over = [lv["engine_in_flight_mean"] for lv in levels if lv["engine_ttft_p99_s"] > 1.0]
    assert pc.operating.c_max is not None and min(under) <= pc.operating.c_max <= min(over)
    assert pc.operating.usable_rps and pc.operating.littles_law_gap
    assert pc.changes == []  # one engine, one config, never restarted
