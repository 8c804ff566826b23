"""Where the diagnoser reads a window of canonical series from.

Every source returns a `Frame` (diagnoser/evaluate/frame.py): canonical series sampled on one grid with
Prometheus' lookback, plus engine facts. The same data gives the same frame from each source:

* `recording.RecordingSource` - an OpenMetrics recording, through agent/replay (postmortems, tests);
* `prometheus.PrometheusSource` - range queries against a Prometheus-compatible HTTP API (fleets);
* `agent.AgentSource` - the agent's JSON API `/api/v1/samples` (one node, the embedded store).
"""

from __future__ import annotations

from typing import Protocol

from kvscope.diagnoser.evaluate.frame import Frame


class SourceError(RuntimeError):
    """The source could not be read (file, HTTP, malformed answer); the message says which."""


class Source(Protocol):
    """A window of canonical series."""

    description: str

    def read_frame(self, names: set[str], start: float | None, end: float | None, step: float) -> Frame:
        """Series whose canonical sample name is in `names`, on the grid [start, end] by `step`.

        None for start/end means the source's natural window (a recording's first and last scrape,
        or the last 30 minutes of a live source). Raises SourceError when it cannot be read.
        """
        ...
