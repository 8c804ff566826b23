"""Diagnose or report from canonical samples: already in memory, or in the agent's SQLite store.

`SamplesSource` holds samples already normalized (recordings replayed and joined, a test's fleet);
`StoreSource` reads them from the agent's store file (agent/store/sqlite.py), which the agent
keeps writing (WAL lets both read). With `carry=False` a grid point holds only a sample taken
within the step before it (lookback = step): the points the source holds, placed on the grid, as
the weekly report counts them; else Prometheus' 5-minute lookback, as the evaluator reads.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from kvscope.core.signals import Labels, Sample
from kvscope.diagnoser.evaluate.frame import DEFAULT_LOOKBACK_S, Frame, frame_from_samples
from kvscope.diagnoser.sources import SourceError


class SamplesSource:
    """Timestamped canonical samples in memory; the natural window is their first to last."""

    def __init__(self, samples: Sequence[Sample], description: str = "samples", carry: bool = True) -> None:
        self.samples = samples
        self.description = description
        self.carry = carry
        self.notes: list[str] = []

    def natural_step(self) -> float | None:
        """The median interval between a series' points (median over series); None with none."""
        return median_interval(self.samples)

    def read_frame(self, names: set[str], start: float | None, end: float | None, step: float) -> Frame:
        stamps = [s.timestamp for s in self.samples if s.timestamp is not None]
        if (start is None or end is None) and not stamps:
            raise SourceError(f"{self.description} holds no timestamped samples")
        start = min(stamps) if start is None else start
        end = max(stamps) if end is None else end
        lookback = DEFAULT_LOOKBACK_S if self.carry else step
        return frame_from_samples(self.samples, start, end, step, lookback_s=lookback, names=names)


def median_interval(samples: Iterable[Sample]) -> float | None:
    """The median over series of the median gap between a series' consecutive points."""
    times: dict[tuple[str, Labels], list[float]] = defaultdict(list)
    for s in samples:
        if s.timestamp is not None:
            times[(s.name, s.labels)].append(s.timestamp)
    gaps = [float(np.median(np.diff(sorted(ts)))) for ts in times.values() if len(ts) > 1]
    return float(np.median(gaps)) if gaps else None


class StoreSource:
    """The agent's SQLite store file, read with its own connection (the agent may keep writing)."""

    def __init__(self, path: str | os.PathLike[str], carry: bool = True) -> None:
        self.path = str(path)
        self.description = f"store:{os.path.basename(self.path)}"
        self.carry = carry
        self.notes: list[str] = []

    def natural_step(self) -> float | None:
        """None: the store keeps the agent's points at its own interval (callers pick a step)."""
        return None

    def read_frame(self, names: set[str], start: float | None, end: float | None, step: float) -> Frame:
        from kvscope.agent.store.sqlite import SqliteStore

        if start is None or end is None:
            raise SourceError(f"{self.description}: name the window to read (start and end)")
        if not os.path.isfile(self.path):
            raise SourceError(f"store {self.path} does not exist")
        store = SqliteStore(self.path, background=False)
        try:
            lookback = DEFAULT_LOOKBACK_S if self.carry else step
            samples = [
                Sample(name, labels, v, t)
                for name in sorted(store.names() & names)
                for labels, points in store.query(name, start - lookback, end).items()
                for t, v in points
            ]
        finally:
            store.close()
        return SamplesSource(samples, self.description, self.carry).read_frame(names, start, end, step)
