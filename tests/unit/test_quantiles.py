"""Histogram quantiles from bucket increases, with Prometheus histogram_quantile semantics."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscope.core.quantiles import histogram_quantile
from kvscope.core.signals import make_labels
from testbed.prometheus import promtool_test_rules
from testbed.promref import group_buckets, increase, parse_le, rate, window_quantile, window_quantiles

INF = math.inf


def test_interpolates_linearly_inside_the_bucket():
    buckets = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (INF, 40.0)]
    # rank 20 of 40 lies halfway through (0.1, 0.5]
    assert histogram_quantile(0.5, buckets) == 0.1 + 0.4 * 0.5
    # rank 4 of 40 is in the first bucket, interpolated from 0
    assert abs(histogram_quantile(0.1, buckets) - 0.04) < 1e-12


def test_rank_in_the_inf_bucket_returns_the_highest_finite_bound():
    assert histogram_quantile(0.99, [(0.5, 10.0), (1.0, 50.0), (INF, 100.0)]) == 1.0


def test_no_observations_or_missing_inf_bucket_gives_none():
    assert histogram_quantile(0.5, [(0.5, 0.0), (INF, 0.0)]) is None
    assert histogram_quantile(0.5, [(0.5, 3.0), (1.0, 4.0)]) is None
    assert histogram_quantile(0.5, [(INF, 4.0)]) is None
    assert histogram_quantile(float("nan"), [(1.0, 1.0), (INF, 1.0)]) is None


def test_q_outside_0_1_follows_prometheus():
    b = [(1.0, 1.0), (INF, 1.0)]
    assert histogram_quantile(-0.1, b) == -INF and histogram_quantile(1.5, b) == INF


def test_non_monotonic_buckets_are_fixed_before_interpolating():
    # the 1.0 bucket was read a moment before the 0.5 bucket and looks smaller
    fixed = histogram_quantile(0.5, [(0.5, 12.0), (1.0, 11.0), (INF, 20.0)])
    assert fixed == histogram_quantile(0.5, [(0.5, 12.0), (1.0, 12.0), (INF, 20.0)])


def test_negative_first_bound_is_returned_as_is():
    assert histogram_quantile(0.1, [(-1.0, 5.0), (0.0, 6.0), (INF, 10.0)]) == -1.0


def test_parse_le_accepts_inf_and_rejects_garbage():
    assert parse_le("+Inf") == INF and parse_le("0.25") == 0.25
    assert parse_le("abc") is None and parse_le("NaN") is None


def _bucket_series(model: str, t0: float, t1: float, before: dict[str, float], after: dict[str, float]):
    return {make_labels({"model": model, "le": le}): [(t0, before[le]), (t1, after[le])] for le in before}


def test_window_quantile_uses_bucket_deltas_not_totals():
    # lifetime histogram is dominated by slow requests; the last window saw only fast ones
    before = {"0.1": 0.0, "1.0": 0.0, "10.0": 1000.0, "+Inf": 1000.0}
    after = {"0.1": 100.0, "1.0": 100.0, "10.0": 1100.0, "+Inf": 1100.0}
    series = _bucket_series("m", 0.0, 60.0, before, after)
    (got,) = window_quantiles(0.9, series).values()
    assert abs(got - 0.09) < 1e-12
    lifetime = histogram_quantile(0.9, [(parse_le(k), v) for k, v in after.items()])
    assert lifetime > 1.0


def test_window_quantile_survives_a_reset_inside_the_window():
    pts = {0.5: [(0.0, 50.0), (10.0, 2.0), (20.0, 4.0)], INF: [(0.0, 80.0), (10.0, 4.0), (20.0, 8.0)]}
    # after the reset: 4 observations <= 0.5 and 8 in total
    assert window_quantile(0.5, pts) == 0.5
    assert window_quantile(0.5, {0.5: [(0.0, 1.0)], INF: [(0.0, 1.0)]}) is None


def test_group_buckets_splits_histograms_by_labels_without_le():
    series = {
        **_bucket_series("a", 0, 1, {"1": 0, "+Inf": 0}, {"1": 1, "+Inf": 2}),
        **_bucket_series("b", 0, 1, {"1": 0, "+Inf": 0}, {"1": 1, "+Inf": 2}),
        make_labels({"model": "a", "le": "oops"}): [(0, 1), (1, 2)],
    }
    grouped = group_buckets(series)
    assert set(grouped) == {make_labels({"model": "a"}), make_labels({"model": "b"})}
    assert set(grouped[make_labels({"model": "a"})]) == {1.0, INF}


bounds = st.lists(st.floats(min_value=-10, max_value=1e4, allow_nan=False), min_size=1, max_size=12, unique=True)


@given(
    bounds,
    st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=13, max_size=13),
    st.floats(min_value=0, max_value=1),
    st.floats(min_value=0, max_value=1),
)
def test_quantile_is_monotone_in_q(les, counts, q1, q2):
    buckets = list(zip(sorted(les) + [INF], counts, strict=False))
    lo, hi = sorted((q1, q2))
    a, b = histogram_quantile(lo, buckets), histogram_quantile(hi, buckets)
    if a is None:
        assert b is None
        return
    assert a <= b + 1e-9 * max(1.0, abs(b))


# ------------------------------------------------------------------ parity with real Prometheus

STEP_S = 15
EVAL_S = 307  # window [7 s, 307 s]: no sample sits on the boundary


def _series(rng: random.Random, n: int, reset_at: int | None = None) -> list[list[float]]:
    """Cumulative bucket counts for le = 0.05, 0.1, 0.5, +Inf over n scrapes (one list per le)."""
    cum = [0.0] * 4
    out: list[list[float]] = [[] for _ in range(4)]
    for i in range(n):
        if i == reset_at:
            cum = [0.0] * 4
        obs = [rng.randint(0, 3), rng.randint(0, 5), rng.randint(0, 4), rng.randint(0, 2)]
        running = 0.0
        for b in range(4):
            running += obs[b]
            cum[b] += running if i else 0.0
        for b in range(4):
            out[b].append(cum[b])
    return out


LES = ("0.05", "0.1", "0.5", "+Inf")


def _ours(values: list[list[float]], q: float) -> float | None:
    buckets = {
        parse_le(le): [(STEP_S * i, v) for i, v in enumerate(vals) if 7 <= STEP_S * i <= EVAL_S]
        for le, vals in zip(LES, values, strict=True)
    }
    return window_quantile(q, buckets, EVAL_S - 300, EVAL_S)


@pytest.mark.prometheus
@pytest.mark.needs("promtool")
def test_window_quantile_and_rate_agree_with_prometheus(tmp_path):
    rng = random.Random(7)
    cases = {"steady": _series(rng, 22), "reset": _series(rng, 22, reset_at=12)}
    counter = [5.0 * i for i in range(12)] + [3.0 * i for i in range(10)]  # restarted at i=12
    tests, checked = [], 0
    for name, values in cases.items():
        series = [
            {"series": f'lat_{name}_bucket{{le="{le}"}}', "values": " ".join(f"{v:g}" for v in vals)}
            for le, vals in zip(LES, values, strict=True)
        ]
        exprs = []
        for q in (0.25, 0.5, 0.9, 0.99):
            want = _ours(values, q)
            assert want is not None
            exprs.append(
                {
                    "expr": f"histogram_quantile({q}, rate(lat_{name}_bucket[5m]))",
                    "eval_time": f"{EVAL_S}s",
                    "exp_samples": [{"labels": "{}", "value": want}],
                }
            )
            checked += 1
        tests.append({"interval": f"{STEP_S}s", "input_series": series, "promql_expr_test": exprs})
    pts = [(STEP_S * i, v) for i, v in enumerate(counter) if 7 <= STEP_S * i <= EVAL_S]
    tests.append(
        {
            "interval": f"{STEP_S}s",
            "input_series": [{"series": "c_total", "values": " ".join(f"{v:g}" for v in counter)}],
            "promql_expr_test": [
                {
                    "expr": "increase(c_total[5m])",
                    "eval_time": f"{EVAL_S}s",
                    "exp_samples": [{"labels": "{}", "value": increase(pts, EVAL_S - 300, EVAL_S)}],
                },
                {
                    "expr": "rate(c_total[5m])",
                    "eval_time": f"{EVAL_S}s",
                    "exp_samples": [{"labels": "{}", "value": rate(pts, EVAL_S - 300, EVAL_S)}],
                },
            ],
        }
    )
    returncode, out = promtool_test_rules(tmp_path, tests, evaluation_interval="1m")
    assert returncode == 0, out
    assert checked == 8
    # the comparison can fail: nudge one expectation and promtool must reject it
    tests[0]["promql_expr_test"][1]["exp_samples"][0]["value"] *= 1.01
    assert promtool_test_rules(tmp_path, tests, evaluation_interval="1m")[0] != 0


def test_the_quantiles_of_many_histograms_at_once_are_histogram_quantiles():
    """quantile_from_planes (the grid's, and the bootstrap's replicates) gives, row by row, what histogram_quantile
    gives: rank inside a bucket, in the first bucket (from 0, or at a bound <= 0), in +Inf (the
    highest finite bound), on an empty bucket, and no observations (NaN for None)."""
    import numpy as np

    from kvscope.diagnoser.evaluate.grid import quantile_from_planes

    rng = np.random.default_rng(7)
    for les in (np.array([0.1, 0.5, 1.0, 2.5, np.inf]), np.array([-1.0, 0.0, 3.0, np.inf])):
        counts = np.maximum.accumulate(rng.integers(0, 4, size=(300, len(les))).astype(float), axis=1)
        counts[:5] = 0.0  # no observations
        counts[5] = [0.0] * (len(les) - 1) + [3.0]  # only in +Inf
        counts[6] = [4.0] * len(les)  # only in the first bucket
        for q in (0.0, 0.5, 0.99, 1.0):
            got = quantile_from_planes(q, les, counts.T)
            for row, value in zip(counts, got, strict=True):
                want = histogram_quantile(q, list(zip(les.tolist(), row.tolist(), strict=True)))
                assert (np.isnan(value) and want is None) or value == pytest.approx(want), (q, row)
