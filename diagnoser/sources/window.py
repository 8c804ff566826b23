"""One way to read a window of canonical series: `read_window(source, signals, span, step) -> Frame`.

Every consumer (`kvscope diagnose`, the UI, the weekly report, the webhook, the operating curve)
reads through `read_window`; every source (a recording, an engine log, the agent's API or store,
a Prometheus-compatible TSDB) implements `Source`. A source answers the canonical sample names
it is asked for on the grid [start, end] by `step`, with Prometheus' 5-minute lookback and
staleness (diagnoser/evaluate/frame.py), plus engine facts; a signal it lacks is absent from the
Frame, never zero.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kvscope.diagnoser.evaluate.frame import Frame

DEFAULT_STEP_S = 15.0
"""The grid step when neither the caller nor the source names one (a typical scrape interval)."""


def lattice_end(step: float, now: float | None = None) -> float:
    """`now` (None: the clock) rounded down to a multiple of `step`: the end of a live window on
    the step's lattice, as Grafana asks (TSDBs that align queries for their caches,
    VictoriaMetrics and query frontends, answer at the times asked)."""
    return math.floor((time.time() if now is None else now) / step) * step


@dataclass(frozen=True)
class Span:
    """A window [start, end] in Unix seconds; None on either side: the source's natural edge
    (a recording's first or last scrape; for live sources, now and 30 minutes before `end`)."""

    start: float | None = None
    end: float | None = None

    @classmethod
    def last(cls, seconds: float, end: float) -> Span:
        """The `seconds` before `end`."""
        return cls(end - seconds, end)


@runtime_checkable
class Source(Protocol):
    """Where a window comes from. `description` names it in a Diagnosis (`recording:x.om.gz`,
    `prometheus:http://...`); `notes` says what reading left out or how it was split (always
    shown to the user); `natural_step()` is the source's own sampling interval (None: it has none,
    e.g. a TSDB, whose callers pick a step)."""

    description: str

    @property
    def notes(self) -> list[str]: ...

    def natural_step(self) -> float | None: ...

    def read_frame(self, names: set[str], start: float | None, end: float | None, step: float) -> Frame:
        """The Frame of the canonical sample names `names` on [start, end] by `step` (None: the
        natural edge, see `Span`). Raises SourceError when the source cannot be read, ValueError
        for a window too large to hold (frame.MAX_GRID_POINTS, MAX_FRAME_CELLS)."""
        ...


def read_window(source: Source, signals: Iterable[str], span: Span = Span(), step: float | None = None) -> Frame:  # noqa: B008 - frozen
    """The canonical sample names `signals` (histograms as `_bucket`, `_sum`, `_count`; counters
    ending in `_total`) of `source` over `span`, on a grid of `step` seconds (None: the source's
    natural step, else DEFAULT_STEP_S). The one reader every consumer uses."""
    if step is None:
        step = source.natural_step() or DEFAULT_STEP_S
    return source.read_frame(set(signals), span.start, span.end, step)
