"""A recording read at its own scrape interval: the grid ends on the last scrape, and a counter
rate that the short-window scaling shortens still spans two scrapes.

Both were lost when the grid became the targets' true scrape interval (2026-11-25): on a few-minute
recording at 15 s, a 2m rate shortened to one step held one sample where scrape times drift against
the grid (a rate of 0), and the grid stopped up to a step before the last scrape.
"""

from __future__ import annotations

import numpy as np

from kvscope.agent.recording.omfile import RecordingWriter
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.diagnoser.rulebook.rule import RATE_MIN_STEPS, grid_steps, rate_steps
from kvscope.diagnoser.sources.recording import RecordingSource

PAYLOAD = '# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total{{model_name="m"}} {v}\n'


def _recording(tmp_path, times: list[float]):
    writer = RecordingWriter(tmp_path / "r.om")
    for t in times:
        writer.add_scrape("vllm", "e0", 1_000_000.0 + t, parse_exposition(PAYLOAD.format(v=10.0 * t)))
    return writer.close()


def test_the_grid_ends_on_the_last_scrape(tmp_path):
    # every 15 s, one scrape 12 ms early: the median gap (15.002 s) is longer than the mean, so a
    # grid from the first scrape stops at 60.008 s, a step before the last scrape at 74.998 s
    times = [0.0, 15.002, 30.004, 45.006, 59.996, 74.998]
    source = RecordingSource(_recording(tmp_path, times))
    step = source.natural_step()
    assert abs(step - 15.002) < 1e-6
    frame = source.read_frame({"engine_prompt_tokens_total"}, None, None, step)
    assert abs(frame.ts[-1] - 1_000_074.998) < 1e-6
    assert frame.ts[0] - 1_000_000.0 < step  # the first scrape is still read (lookback)
    values = frame.block("engine_prompt_tokens_total").values[0]
    assert abs(values[-1] - 749.98) < 1e-6  # the last scrape's value
    assert not np.isnan(values).any()


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
