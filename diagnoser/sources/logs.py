"""Diagnose from engine log lines (agent/logs): the frame a recording of the same log gives."""

from __future__ import annotations

from typing import Any

from kvscope.agent.recording.fromlog import log_replay
from kvscope.diagnoser.sources.recording import RecordingSource


class LogSource(RecordingSource):
    """An engine log already read (`agent.logs.series.read_log`), replayed as `record --log` writes it."""

    def __init__(self, read: Any, name: str) -> None:
        super().__init__(name, spans=False)
        self.description = f"log:{name}"
        self.summary = read.summary
        self._log = log_replay(read)

    def replay(self):  # noqa: ANN201 - Replay
        return self._log
