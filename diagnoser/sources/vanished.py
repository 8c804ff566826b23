"""Prometheus staleness for series that vanish from a target that is still scraped: absent from
the first successful scrape without them, not carried for the lookback. Only series whose every
sample sits on a successful scrape of its instance are judged (derived series keep the lookback).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from kvscope.core.signals import Labels, Sample
from kvscope.diagnoser.evaluate.frame import Frame


def mark_vanished(frame: Frame, samples: Iterable[Sample], up: Iterable[tuple[str, float, bool]]) -> None:
    """In place: a series of the frame is absent at grid times after a successful scrape of its
    instance that did not contain it, until its next sample."""
    scrapes = _successful_scrapes(up)
    if not scrapes:
        return
    times: dict[tuple[str, Labels], list[float]] = defaultdict(list)
    for s in samples:
        if s.timestamp is not None and s.name in frame.blocks:
            times[(s.name, s.labels)].append(s.timestamp)
    for name, block in frame.blocks.items():
        for i, labels in enumerate(block.labels):
            own = scrapes.get(dict(labels).get("instance", ""))
            ts = times.get((name, labels))
            if own is None or not ts:
                continue
            mask = _vanished(np.array(sorted(ts)), own, frame.ts)
            if mask is not None:
                block.values[i, mask] = np.nan
                if block.seen is not None:
                    block.seen[i, mask] = np.nan


def _successful_scrapes(up: Iterable[tuple[str, float, bool]]) -> dict[str, np.ndarray]:
    """instance -> the sorted times of its successful scrapes."""
    scraped: dict[str, list[float]] = defaultdict(list)
    for instance, t, ok in up:
        if ok:
            scraped[instance].append(t)
    return {i: np.array(sorted(ts)) for i, ts in scraped.items()}


def _vanished(sample_ts: np.ndarray, scrape_ts: np.ndarray, grid: np.ndarray) -> np.ndarray | None:
    """Grid points whose latest successful scrape came after the series' latest sample; None
    when the series is not a scraped one (a sample off the scrape times) or never vanished."""
    pos = np.searchsorted(scrape_ts, sample_ts)
    on_scrape = (pos < len(scrape_ts)) & (scrape_ts[np.minimum(pos, len(scrape_ts) - 1)] == sample_ts)
    if not on_scrape.all():
        return None
    last_scrape = np.searchsorted(scrape_ts, grid, side="right") - 1
    last_sample = np.searchsorted(sample_ts, grid, side="right") - 1
    ok = (last_scrape >= 0) & (last_sample >= 0)
    mask = np.zeros(grid.shape, dtype=bool)
    mask[ok] = scrape_ts[last_scrape[ok]] > sample_ts[last_sample[ok]]
    return mask if mask.any() else None
