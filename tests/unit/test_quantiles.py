"""Histogram quantiles from bucket increases, with Prometheus histogram_quantile semantics."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from kvscope.agent.analytics.quantiles import (
    group_buckets,
    histogram_quantile,
    parse_le,
    window_mean,
    window_quantile,
    window_quantiles,
)
from kvscope.agent.signals import make_labels

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
    series = {**_bucket_series("a", 0, 1, {"1": 0, "+Inf": 0}, {"1": 1, "+Inf": 2}),
              **_bucket_series("b", 0, 1, {"1": 0, "+Inf": 0}, {"1": 1, "+Inf": 2}),
              make_labels({"model": "a", "le": "oops"}): [(0, 1), (1, 2)]}
    grouped = group_buckets(series)
    assert set(grouped) == {make_labels({"model": "a"}), make_labels({"model": "b"})}
    assert set(grouped[make_labels({"model": "a"})]) == {1.0, INF}


def test_window_mean_from_sum_and_count_deltas():
    assert window_mean([(0, 10.0), (60, 40.0)], [(0, 100.0), (60, 115.0)]) == 2.0
    assert window_mean([(0, 10.0), (60, 10.0)], [(0, 100.0), (60, 100.0)]) is None
    assert window_mean([(0, 10.0)], [(0, 100.0)]) is None


bounds = st.lists(st.floats(min_value=-10, max_value=1e4, allow_nan=False), min_size=1, max_size=12, unique=True)


@given(bounds, st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=13, max_size=13),
       st.floats(min_value=0, max_value=1), st.floats(min_value=0, max_value=1))
def test_quantile_is_monotone_in_q(les, counts, q1, q2):
    buckets = list(zip(sorted(les) + [INF], counts, strict=False))
    lo, hi = sorted((q1, q2))
    a, b = histogram_quantile(lo, buckets), histogram_quantile(hi, buckets)
    if a is None:
        assert b is None
        return
    assert a <= b + 1e-9 * max(1.0, abs(b))
