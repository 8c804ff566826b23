"""Progress on stderr: a tqdm bar where stderr is a terminal; where it is not (a log file, CI, a
pipe) no bar, because its carriage-return redraws read as one garbled line per refresh there."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm


def progress_bar(enabled: bool = True, **kwargs: Any) -> tqdm:
    """A tqdm bar on stderr, drawn only when `enabled` and stderr is a terminal (tqdm's
    `disable=None`); a disabled bar takes every call and writes nothing."""
    return tqdm(disable=None if enabled else True, file=sys.stderr, **kwargs)


class Stages:
    """A few named stages of one command: a bar on a terminal, one line per stage elsewhere
    ("report: reading"), nothing when disabled."""

    def __init__(self, command: str, total: int, enabled: bool = True) -> None:
        self.command = command
        self.lines = enabled and not sys.stderr.isatty()
        self.bar = progress_bar(enabled, total=total, desc=command, unit="step")

    def stage(self, name: str) -> None:
        """Start the stage `name`."""
        self.bar.set_postfix_str(name)
        if self.lines:
            print(f"{self.command}: {name}", file=sys.stderr, flush=True)

    def done(self) -> None:
        """The current stage finished."""
        self.bar.update()

    def close(self) -> None:
        self.bar.close()
