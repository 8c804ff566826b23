"""Where a window holds data (`DataCoverage`) and the fleet timeline binned over it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvscope.diagnoser.evaluate.frame import Frame
from kvscope.report.weekly.series import (
    MAX_GAP_S,
    SIGNALS,
    Columns,
    after_gap,
    counter_increments,
    gauge_coverage,
    in_window,
    utilisation_signal,
)


@dataclass(frozen=True)
class DataCoverage:
    """Where a window actually holds data: `spans` are the stretches with samples (points no
    further apart than the GPU-hour gap limit, see MAX_GAP_S); the rest of the window is a gap."""

    start: float
    end: float
    spans: tuple[tuple[float, float], ...]

    @property
    def held_s(self) -> float:
        """Seconds of data held (the spans' total length)."""
        return float(sum(b - a for a, b in self.spans))

    @property
    def span_s(self) -> float:
        """First sample to last sample (0 with no data)."""
        return self.spans[-1][1] - self.spans[0][0] if self.spans else 0.0

    @property
    def gaps(self) -> list[tuple[float, float]]:
        """Stretches of the window without data: before the first span, between spans, after the last."""
        edges = [self.start] + [t for span in self.spans for t in span] + [self.end]
        pairs = zip(edges[::2], edges[1::2], strict=True)
        return [(a, b) for a, b in pairs if b > a]

    @property
    def inner_gaps(self) -> int:
        """Gaps between the first and the last sample."""
        return max(0, len(self.spans) - 1)


def data_coverage(frame: Frame, start: float, end: float, max_gap_s: float = MAX_GAP_S) -> DataCoverage:
    """The spans of (start, end] that hold samples of any report signal. Consecutive sample
    times further apart than max_gap_s, or twice the typical interval, start a new span."""
    held = np.zeros(len(frame.ts), dtype=bool)  # grid times at which any report signal has a sample
    for name in frame.names() & set(SIGNALS):
        held |= ~np.isnan(frame.blocks[name].values).all(axis=0)
    times = frame.ts[held]
    inside = times[(times > start) & (times <= end)]
    if not inside.size:
        return DataCoverage(start, end, ())
    before = times[times <= start]
    ts = np.r_[before.max(), inside] if before.size else inside  # data running into the window
    dt = np.diff(ts)
    limit = max(max_gap_s, 2 * float(np.median(dt))) if dt.size else max_gap_s
    breaks = np.flatnonzero(dt > limit)
    spans = [
        (max(start, float(ts[a])), float(ts[b]))
        for a, b in zip(np.r_[0, breaks + 1], np.r_[breaks, ts.size - 1], strict=True)
    ]
    return DataCoverage(start, end, tuple((a, b) for a, b in spans if b > start))


TIMELINE_STEPS_S = (60.0, 300.0, 900.0, 3600.0)
"""Timeline bin widths to choose from: the smallest that still gives at most TIMELINE_BINS bins
over the data held (a 10-minute recording gets 1-minute bins, a full week 1-hour bins)."""


TIMELINE_BINS = 200


def timeline_step(held_s: float) -> float:
    """The bin width for a window holding `held_s` seconds of data."""
    return next((s for s in TIMELINE_STEPS_S if held_s / s <= TIMELINE_BINS), TIMELINE_STEPS_S[-1])


def _bins(ts: np.ndarray, origin: float, step: float, n: int) -> np.ndarray:
    return np.minimum((ts - origin) // step, n - 1).astype(np.int64)


def timeline(ss: Columns, start: float, end: float, cov: DataCoverage) -> pd.DataFrame:
    """Fleet numbers per time bin over the whole window (index: bin start, UTC); a bin without
    data is NaN (absent), never zero. Rates are per second of data held in the bin."""
    step = timeline_step(cov.held_s)
    origin = math.floor(start / step) * step  # bins on round clock times
    n = int(math.ceil((end - origin) / step))
    edges = origin + step * np.arange(n + 1)
    held = np.zeros(n)
    for a, b in cov.spans:
        held += np.clip(np.minimum(edges[1:], b) - np.maximum(edges[:-1], a), 0.0, None)
    cols: dict[str, np.ndarray] = {}
    pts, inc = counter_increments(ss, "engine_generation_tokens_total")
    mask = in_window(pts, start, end) & ~after_gap(pts)
    tokens = None
    if mask.any():
        bins = _bins(pts.ts[mask], origin, step, n)
        rated = np.bincount(bins, weights=(~pts.first[mask]).astype(float), minlength=n) > 0  # first points: no rate
        tokens = np.where(rated, np.bincount(bins, weights=inc[mask], minlength=n), np.nan)
        cols["output_tokens_per_s"] = np.where(held > 0, tokens / np.where(held > 0, held, 1), np.nan)
    gpu, dt = gauge_coverage(ss, utilisation_signal(ss))
    mask = in_window(gpu, start, end) & ~after_gap(gpu)
    if mask.any():
        bins = _bins(gpu.ts[mask], origin, step, n)
        hours = np.bincount(bins, weights=dt[mask], minlength=n) / 3600
        busy = np.bincount(bins, weights=(dt * gpu.value)[mask], minlength=n) / 3600
        cols["gpu_util"] = np.where(hours > 0, busy / np.where(hours > 0, hours, 1), np.nan)
        if tokens is not None:
            cols["tokens_per_gpu_hour"] = np.where(hours > 0, tokens / np.where(hours > 0, hours, 1), np.nan)
    index = pd.to_datetime(edges[:-1], unit="s", utc=True)
    frame = pd.DataFrame(cols, index=index)
    frame.attrs["step_s"] = step
    return frame
