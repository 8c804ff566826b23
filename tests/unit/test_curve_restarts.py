"""A restart no counter shows (issue 55): at 30 s scrapes a restart that took 25 s, followed by
traffic that passed the old counts before the next scrape, leaves every counter higher than
before it (curve-shape-stairs-10's same-flags restart: 281 finished requests, then 468). The
process start time the engines export (prometheus_client's process collector) takes a new value:
that is the restart, and the interval across it is a reset."""

from __future__ import annotations

import numpy as np

from kvscope.core.signals import make_labels
from kvscope.diagnoser.curve.changes import raw_changes
from kvscope.diagnoser.curve.intervals import new_process, pool_intervals
from kvscope.diagnoser.evaluate.frame import Block, Frame
from tests.unit.test_curve import BASE, synth

HALF = 12


def _with_start(frame: Frame, starts: list[float]) -> Frame:
    """`frame` with a process start time per grid point, on the instance only (no rank label)."""
    labels = make_labels({"instance": BASE["instance"], "job": BASE["job"], "engine": "vllm"})
    blocks = dict(frame.blocks)
    blocks["engine_process_start_time_seconds"] = Block([labels], np.array([starts]))
    return Frame(ts=frame.ts, blocks=blocks)


def test_a_new_start_time_is_a_restart_where_no_counter_dropped():
    frame = synth([4.0] * (2 * HALF))  # the counters only grow
    assert raw_changes(frame)[("m", "vllm")] == []
    started = _with_start(frame, [100.0] * HALF + [200.0] * HALF)
    (change,) = raw_changes(started)[("m", "vllm")]
    assert change.kind == "restart" and change.instances == ["a"] and change.time == frame.ts[HALF]
    (iv,) = pool_intervals(started).values()
    assert iv.resets.sum() == 1 and iv.t_end[iv.resets][0] == frame.ts[HALF]


def test_the_start_time_is_compared_across_a_gap_and_absent_is_no_restart():
    """The scrapes during the restart read nothing: the new value after the gap is the restart; a
    series that is never read gives none."""
    nan = np.nan
    assert new_process(np.array([[1.0, 1.0, nan, nan, 2.0, 2.0]])).tolist() == [[False, False, False, True, False]]
    assert not new_process(np.full((1, 6), nan)).any()
    assert not new_process(np.array([[nan, 3.0, 3.0, nan, 3.0]])).any()
