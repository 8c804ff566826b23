"""A counter rate that the short-window scaling shortens still spans two grid steps.

Lost when the grid became the targets' true scrape interval (2026-11-25): on a few-minute
recording at 15 s, a 2m rate shortened to one step held one sample where scrape times drift
against the grid (a rate of 0). tests/unit/test_diagnose_robustness.py runs the recording
(round-robin-vs-sticky at 15 s) that lost P2 to it.
"""

from __future__ import annotations

from kvscope.diagnoser.rulebook.rule import RATE_MIN_STEPS, grid_steps, rate_steps


def test_a_shortened_rate_range_keeps_two_steps():
    assert RATE_MIN_STEPS == 2
    # a 2m rate on a 150 s window (scale 1/6) at a 15 s grid: 20 s would be one step
    assert grid_steps(120.0 / 6, 15.0) == 1
    assert rate_steps(120.0, 1 / 6, 15.0) == 2
    # never longer than written: a 15 s rate at 15 s stays one step
    assert rate_steps(15.0, 1 / 6, 15.0) == 1
    # at full length, or where the shortened range is already longer, nothing changes
    assert rate_steps(120.0, 1.0, 15.0) == 8
    assert rate_steps(120.0, 0.5, 15.0) == 4
