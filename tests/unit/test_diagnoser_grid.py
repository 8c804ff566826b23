"""The diagnoser's vectorised grid functions agree with the scalar analytics they mirror."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.core.quantiles import histogram_quantile
from kvscope.diagnoser.evaluate import grid
from kvscope.diagnoser.evaluate.frame import make_grid, sample_on_grid
from testbed.promref import increase, window_quantile

STEP = 15.0


def _counter(increments: list[float], resets: set[int]) -> list[float]:
    values, v = [], 0.0
    for i, inc in enumerate(increments):
        v = inc if i in resets else v + inc
        values.append(v)
    return values


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 1000), min_size=3, max_size=40), st.sets(st.integers(1, 39), max_size=3), st.integers(1, 10)
)
def test_counter_rate_matches_analytics_increase_with_resets(increments, resets, k):
    values = _counter(increments, {r for r in resets if r < len(increments)})
    rates = grid.counter_rate(np.array([values]), k, STEP)[0]
    for t in range(len(values)):
        j = max(0, t - k)
        points = [(i * STEP, values[i]) for i in range(j, t + 1)]
        want = increase(points)
        if t == j:
            assert math.isnan(rates[t])
        else:
            assert rates[t] * (t - j) * STEP == np_approx(want)


def np_approx(x: float | None):
    import pytest

    return pytest.approx(x, rel=1e-9, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=5, max_size=5), st.floats(0.01, 0.999))
def test_bucket_quantile_matches_analytics(counts, q):
    les = [0.1, 0.5, 1.0, 2.5, math.inf]
    cum = np.cumsum(counts).astype(float)
    got = grid.bucket_quantile(q, np.array(les), cum[None, :, None])[0, 0]
    want = histogram_quantile(q, list(zip(les, cum, strict=True)))
    if want is None:
        assert math.isnan(got)
    else:
        assert got == np_approx(want)


def test_window_quantile_over_bucket_counters_matches_analytics():
    les = [0.1, 0.5, 1.0, math.inf]
    per_step = [3, 5, 1, 1]
    series = {le: [(i * STEP, float(sum(per_step[: j + 1]) * i)) for i in range(21)] for j, le in enumerate(les)}
    values = np.array([[v for _, v in series[le]] for le in les])
    rates = grid.counter_rate(values, 20, STEP)
    got = grid.bucket_quantile(0.9, np.array(les), rates[None, :, :])[0, -1]
    assert got == np_approx(window_quantile(0.9, series))


def test_reduce_groups_ignores_absent_and_keeps_all_absent_absent():
    v = np.array([[1.0, np.nan, np.nan], [3.0, 4.0, np.nan], [10.0, 10.0, 10.0]])
    inv = np.array([0, 0, 1])
    assert grid.reduce_groups(v, inv, 2, "sum")[0].tolist()[:2] == [4.0, 4.0]
    assert math.isnan(grid.reduce_groups(v, inv, 2, "sum")[0, 2])
    assert grid.reduce_groups(v, inv, 2, "max")[0, 0] == 3.0
    assert grid.reduce_groups(v, inv, 2, "avg")[0, 0] == 2.0
    assert grid.reduce_groups(v, inv, 2, "count")[0].tolist() == [2.0, 1.0, 0.0]


def test_sample_on_grid_uses_lookback_and_absent_after_it():
    times = np.array([0.0, 10.0, 20.0])
    values = np.array([1.0, 2.0, 3.0])
    g = make_grid(0.0, 400.0, 100.0)
    got = sample_on_grid(times, values, g, lookback_s=300.0)
    assert got[:4].tolist() == [1.0, 3.0, 3.0, 3.0]
    assert math.isnan(got[4])  # 380 s after the last sample: stale


def test_deriv_is_the_least_squares_slope():
    v = np.array([[2.0 * i + 1 for i in range(20)]])
    assert grid.deriv(v, 10, STEP)[0, -1] == np_approx(2.0 / STEP)


def test_changes_counts_value_changes_in_the_window():
    v = np.array([[1, 1, 2, 2, 1, 1, 1, 1]], dtype=float)
    assert grid.changes(v, 3)[0].tolist() == [0, 0, 1, 1, 2, 1, 1, 0]


def test_changes_ignores_the_leading_edge_of_a_series_but_not_later_changes():
    # a count of replicas: absent, then 2 -> 4 while the targets' first scrapes arrive, a real
    # change 4 -> 5 later, then the count vanishes and returns (its leading edge again)
    nan = np.nan
    v = np.array([[nan, 2, 4, 4, 4, 4, 5, 5, 5, nan, nan, 3, 5, 5, 5]], dtype=float)
    plain = grid.changes(v, 20)[0]
    settled = grid.changes(v, 20, settle=2)[0]
    assert plain[5] == 1  # without a leading edge the arrival is a change
    assert np.isnan(settled[:3]).all()  # the edge itself is not judged
    assert settled[3:6].tolist() == [0, 0, 0]
    assert settled[6:9].tolist() == [1, 1, 1]  # 4 -> 5 after the edge is counted
    assert np.isnan(settled[9:13]).all()  # absent, then the new edge (3 -> 5 arriving)
    assert settled[13:].tolist() == [1, 1]  # window still holds the earlier 4 -> 5


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 1000), min_size=3, max_size=40), st.sets(st.integers(1, 39), max_size=3), st.integers(1, 10)
)
def test_cached_increase_path_matches_counter_rate(increments, resets, k):
    values = np.array([_counter(increments, {r for r in resets if r < len(increments)})])
    adj = grid.reset_adjusted(values)
    rates = grid.window_increase(adj, k) / (grid.window_spans(values.shape[1], k) * STEP)
    np.testing.assert_allclose(rates, grid.counter_rate(values, k, STEP), rtol=1e-9, atol=1e-9, equal_nan=True)
