"""Diagnose from an OpenMetrics recording (agent/recording/omfile.py), replayed through the dialects.

When the recording has a spans sidecar (`x.spans.jsonl.gz` next to `x.om.gz`), its spans are
stitched as the agent's trace receiver would and join the frame as `request_phase_seconds` (and
the `tenant_*` counters of traced tenants), so request-phase rules can judge the recording.
"""

from __future__ import annotations

import math
import os
import zlib
from typing import Any

from kvscope.agent.recording.omfile import RecordingLimits, RecordingTooLarge
from kvscope.agent.recording.replay import add_spans, replay_recording, scrape_interval, spans_path_for
from kvscope.diagnoser.evaluate.frame import (
    Frame,
    failed_scrape_spans,
    frame_from_samples,
    mark_removed,
    mark_stale,
    merge_facts,
    removed_target_spans,
)
from kvscope.diagnoser.sources import SourceError
from kvscope.diagnoser.sources.vanished import mark_vanished

GRID_CELLS = 12_000_000
"""Series x grid points a recording's or log's frame is built with (~100 MB a float64 array; the
frame and the evaluator hold a few): a finer grid is stepped coarser, and said so."""
MIN_STEPS = 60
"""Fewer grid points than this over the window is no diagnosis: more series than GRID_CELLS /
MIN_STEPS are refused instead."""


class RecordingSource:
    """A recording file: native engine series normalized exactly as live scrapes are."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        spans: str | os.PathLike[str] | bool | None = None,
        gpu_mapping: Any = None,
        limits: RecordingLimits | None = None,
    ) -> None:
        """`spans`: None finds the sidecar next to the recording, a path names one, False ignores spans.
        `gpu_mapping`: the engine-GPU join's map (agent/recording/replay.py), as `kvscope report` takes it.
        `limits`: what the read holds at most (default RecordingLimits(); SourceError past one)."""
        self.path = str(path)
        self.limits = limits or RecordingLimits()
        self.gpu_mapping = gpu_mapping
        self.step_given = False
        """True when the user chose the step (`--step`): a grid too large is then refused, naming what
        to pass, instead of stepped coarser behind their back."""
        if spans is None or spans is True:
            found = spans_path_for(self.path)
            self.spans_path = str(found) if found else None
        else:
            self.spans_path = str(spans) if spans else None
        self.description = f"recording:{os.path.basename(self.path)}"
        if self.spans_path:
            self.description += f"+spans:{os.path.basename(self.spans_path)}"
        self._replay = None
        self._notes: list[str] = []

    def replay(self):  # noqa: ANN201 - agent.replay.Replay
        """The replayed recording (canonical samples, engines, facts, span statistics), read once.
        Raises SourceError naming the file for every way it cannot be read, a gzip cut short
        (EOFError) or corrupt (zlib.error) included, so no caller handles those itself."""
        if self._replay is None:
            try:
                replay = replay_recording(self.path, gpu_mapping=self.gpu_mapping, limits=self.limits)
            except RecordingTooLarge as exc:
                raise SourceError(str(exc)) from None
            except (EOFError, zlib.error) as exc:  # a gzip cut short (recorder killed mid-write) or corrupt
                raise SourceError(f"recording {self.path} is truncated or corrupt: {exc}") from exc
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                raise SourceError(f"cannot read recording {self.path}: {exc}") from exc
            if self.spans_path:
                try:
                    add_spans(replay, self.spans_path)
                except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
                    raise SourceError(f"cannot read spans {self.spans_path}: {exc}") from exc
            self._replay = replay
        return self._replay

    @property
    def notes(self) -> list[str]:
        """What reading the recording left out, and why (timestamps far from the rest)."""
        return (self._replay.notes if self._replay is not None else []) + self._notes

    def natural_step(self) -> float:
        """The recording's scrape interval (`scrape_interval`: per target, the lower median over
        targets), at least 1 s; 15 s when no target was scraped twice."""
        interval = scrape_interval(self.replay().samples)
        return 15.0 if interval is None else max(1.0, interval)

    def read_frame(self, names: set[str], start: float | None, end: float | None, step: float) -> Frame:
        replay = self.replay()
        if replay.start is None or replay.end is None:
            raise SourceError(f"recording {self.path} holds no scrapes")
        start = replay.start if start is None else start
        end = replay.end if end is None else end
        step = self._sized_step(replay.samples, names, start, end, step)
        frame = frame_from_samples(replay.samples, start, end, step, names=names)
        up = [
            (s.label("instance") or "", s.timestamp, s.value == 1.0)
            for s in replay.samples
            if s.name == "kvscope_target_up" and s.timestamp is not None
        ]
        mark_stale(frame, failed_scrape_spans(up))
        mark_vanished(frame, replay.samples, up)
        mark_removed(frame, removed_target_spans(up))
        frame.facts = merge_facts(replay.facts)
        return frame

    def _sized_step(self, samples: list[Any], names: set[str], start: float, end: float, step: float) -> float:
        """`step`, or a coarser one (noted) when series x grid points would pass GRID_CELLS; counted
        before anything is allocated. SourceError when even MIN_STEPS points are too many."""
        series = {(s.name, s.labels) for s in samples if s.name in names and s.timestamp is not None}
        n, steps = len(series), int((end - start) // step) + 1 if end >= start and step > 0 else 1
        if n * steps <= GRID_CELLS:
            return step
        instances = len({dict(labels).get("instance", "") for _, labels in series})
        coarse = step * math.ceil(n * steps / GRID_CELLS)
        if self.step_given:
            raise ValueError(
                f"{n:,} series x {steps:,} grid points at the {step:g} s step asked for would be {n * steps:,} "
                f"values (over {GRID_CELLS:,}): pass a coarser --step (at least {coarse:g}s) or pass "
                "--start/--end for a shorter window"
            )
        if n * MIN_STEPS > GRID_CELLS:
            raise SourceError(
                f"{self.description}: {n:,} series from {instances:,} instances (engines or DP ranks) are more "
                f"than one diagnosis reads at {MIN_STEPS} grid points ({GRID_CELLS:,} values); split the "
                "input by instance (e.g. grep one pod's lines) and diagnose each part"
            )
        self._notes.append(
            f"{n:,} series from {instances:,} instances x {steps:,} grid points at a {step:g} s step would be "
            f"{n * steps:,} values (over {GRID_CELLS:,}): stepped coarser, every {coarse:g} s"
        )
        return coarse
