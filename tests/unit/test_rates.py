"""Counter increase and rate: resets, gaps, single-sample windows and Prometheus extrapolation."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvscope.core.rates import deltas
from testbed.promref import increase, rate, raw_increase


def test_increase_of_a_steady_counter():
    pts = [(0.0, 10.0), (15.0, 25.0), (30.0, 40.0)]
    assert raw_increase(pts) == 30.0
    assert rate(pts) == 1.0


def test_reset_counts_the_post_reset_value_not_a_negative_jump():
    pts = [(0.0, 100.0), (10.0, 120.0), (20.0, 5.0), (30.0, 15.0)]
    assert deltas(pts) == [(10.0, 20.0), (20.0, 5.0), (30.0, 10.0)]
    assert raw_increase(pts) == 35.0


def test_single_point_or_empty_window_has_no_rate():
    assert raw_increase([(5.0, 3.0)]) is None
    assert rate([]) is None
    assert increase([(5.0, 3.0)], 0.0, 10.0) is None


def test_flat_counter_has_zero_rate_not_none():
    assert rate([(0.0, 7.0), (10.0, 7.0)]) == 0.0


def test_extrapolates_to_window_edges_like_prometheus():
    # samples every 10 s from t=5 to t=55 in a [0, 60] window, counter +1 per 10 s
    pts = [(5.0 + 10 * i, 100.0 + i) for i in range(6)]
    # 5 s to each edge is under 1.1 x 10 s, so extrapolate the full way: 5 * 60 / 50
    assert increase(pts, 0.0, 60.0) == 6.0
    assert rate(pts, 0.0, 60.0) == 0.1


def test_extrapolation_stops_at_half_an_interval_after_a_gap():
    # the series starts 30 s into the window (new target): extend only 5 s (half of 10 s)
    pts = [(30.0 + 10 * i, 50.0 + i) for i in range(4)]  # 30..60
    assert increase(pts, 0.0, 60.0) == 3.0 * (30 + 5) / 30


def test_extrapolation_never_goes_below_a_zero_counter():
    # counter started at 1 at t=50: extrapolating 40 s back would imply negative values
    pts = [(50.0, 1.0), (60.0, 3.0)]
    inc = increase(pts, 40.0, 60.0)
    assert inc == 2.0 * (10 + 5) / 10
    assert increase([(10.0, 0.0), (20.0, 4.0)], 0.0, 20.0) == 4.0


counter_values = st.lists(st.floats(min_value=0, max_value=1e12, allow_nan=False), min_size=2, max_size=50)


@given(counter_values)
def test_increase_and_rate_are_never_negative(values):
    pts = [(float(i), v) for i, v in enumerate(values)]
    assert raw_increase(pts) >= 0
    assert increase(pts, -3.0, len(values) + 2.0) >= 0
    assert all(d >= 0 for _, d in deltas(pts))


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=2, max_size=50))
def test_monotonic_counter_increase_is_last_minus_first(steps):
    values, total = [], 0.0
    for s in steps:
        total += s
        values.append(total)
    pts = [(float(i), v) for i, v in enumerate(values)]
    assert abs(raw_increase(pts) - (values[-1] - values[0])) <= 1e-6 * max(1.0, values[-1])


def test_counter_starting_inside_the_window_follows_prometheus_3_zero_clamp():
    # first sample 113 s after the window start with value 3, +3 every 15 s: 36 counted over 180 s.
    pts = [(15.0 * i, 3.0 * (i - 7)) for i in range(8, 21)]
    # half an interval (7.5 s) back, not the 15 s back to zero that Prometheus 2.42 extends
    # by (promtool 2.42 answers 40.4 here), plus 7 s forward to the window end
    assert increase(pts, 7.0, 307.0) == 36.0 * ((180 + 7.5 + 7) / 180)


@given(st.lists(st.floats(min_value=0, max_value=1e9, allow_nan=False), min_size=1, max_size=40))
def test_the_array_form_is_the_scalar_rule(values):
    """One reset rule: `step_increases` (grid, weekly report, UI) equals `deltas` (agent)."""
    import numpy as np

    from kvscope.core.rates import step_increases

    pts = [(float(i), v) for i, v in enumerate(values)]
    assert step_increases(np.array(values)).tolist() == [d for _, d in deltas(pts)]


def test_a_chart_reads_a_counter_reset_as_the_rule_does():
    """At an engine restart the UI's counter chart gives the rule's rate (the value after the
    reset), not a gap: both come from grid.counter_rate."""
    import numpy as np

    from kvscope.core.signals import make_labels
    from kvscope.diagnoser.evaluate.frame import Block, Frame, make_grid
    from kvscope.diagnoser.evaluate.grid import counter_rate
    from kvscope.ui.data import signal_frame

    grid = make_grid(0.0, 150.0, 15.0)
    values = np.array([[0, 15, 30, 45, 3, 18, 33, 48, 63, 78, 93]], dtype=float)
    labels = [make_labels({"instance": "a", "job": "vllm"})]
    frame = Frame(ts=grid, blocks={"engine_preemptions_total": Block(labels, values)})
    chart = signal_frame(frame, "engine_preemptions_total")
    assert chart.iloc[4, 0] == 3 / 15  # the reset step: the value after it
    assert np.allclose(chart.iloc[:, 0].to_numpy()[1:], counter_rate(values, 1, 15.0)[0, 1:])
