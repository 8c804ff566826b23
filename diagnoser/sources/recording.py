"""Diagnose from an OpenMetrics recording (agent/recording.py), replayed through the dialects."""

from __future__ import annotations

import os

from kvscope.agent.replay import replay_recording
from kvscope.diagnoser.frame import Frame, frame_from_samples, merge_facts
from kvscope.diagnoser.sources import SourceError


class RecordingSource:
    """A recording file: native engine series normalized exactly as live scrapes are."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self.description = f"recording:{os.path.basename(self.path)}"
        self._replay = None

    def _load(self):  # noqa: ANN202 - Replay, loaded once
        if self._replay is None:
            try:
                self._replay = replay_recording(self.path)
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                raise SourceError(f"cannot read recording {self.path}: {exc}") from exc
        return self._replay

    def natural_step(self) -> float:
        """The recording's scrape interval (median gap between scrapes), at least 1 s."""
        import numpy as np
        replay = self._load()
        ts = sorted({s.timestamp for s in replay.samples if s.name == "kvscope_target_up"})
        if len(ts) < 2:
            return 15.0
        return max(1.0, float(np.median(np.diff(ts))))

    def read_frame(self, names: set[str], start: float | None, end: float | None, step: float) -> Frame:
        replay = self._load()
        if replay.start is None or replay.end is None:
            raise SourceError(f"recording {self.path} holds no scrapes")
        start = replay.start if start is None else start
        end = replay.end if end is None else end
        frame = frame_from_samples(replay.samples, start, end, step, names=names)
        frame.facts = merge_facts(replay.facts)
        return frame
