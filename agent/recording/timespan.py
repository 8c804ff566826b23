"""Samples timestamped far from the rest of a recording are dropped, counted and reported.

The evaluation grid spans a recording's earliest to latest timestamp, so one sample stamped
years off (a clock reset, a hand edit) would make it hundreds of millions of points long. A
sample more than `MAX_SPREAD_S` from the median timestamp (or without one, where others have one)
is dropped before anything is allocated, and one `timestamp_outlier` issue says how many, the
median and the file:line of the first ones; replay passes it on as a note."""

from __future__ import annotations

import io
import math
import os

import numpy as np

from kvscope.agent.scrape.exposition import Exposition, ParseIssue
from kvscope.core.scalars import iso_utc

MAX_SPREAD_S = 31 * 86400.0
"""How far from the median timestamp a sample may be: a recording may span up to 62 days."""


def drop_time_outliers(expo: Exposition, text: str, path: str | os.PathLike[str]) -> None:
    """Remove the outlying samples from `expo.samples` and say so in `expo.issues`."""
    if not expo.samples:
        return
    ts = np.fromiter(
        (math.nan if s.timestamp is None else s.timestamp for s in expo.samples), dtype=float, count=len(expo.samples)
    )
    if np.isnan(ts).all():
        return
    median = float(np.nanmedian(ts))
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(ts - median) <= MAX_SPREAD_S)
    n = int(bad.sum())
    if not n:
        return
    first = [expo.samples[i].timestamp for i in np.flatnonzero(bad)[:3]]
    expo.samples = [s for s, b in zip(expo.samples, bad.tolist(), strict=True) if not b]
    lines = _lines_of(text, {t for t in first if t is not None})
    where = f"{path}:{lines[0]}" if lines else str(path)
    shown = ", ".join(iso_utc(t) if t is not None else "no timestamp" for t in first)
    expo.issues.append(
        ParseIssue(
            lines[0] if lines else 0,
            "timestamp_outlier",
            (
                f"{where}: dropped {n} sample(s) timestamped more than {MAX_SPREAD_S / 86400:g} days from the "
                f"recording's median time {iso_utc(median)} ({shown}{', ...' if n > 3 else ''}"
                f"{'; lines ' + ', '.join(map(str, lines)) if len(lines) > 1 else ''}); "
                "the rest of the recording is read"
            ),
        )
    )


def _lines_of(text: str, wanted: set[float], limit: int = 3) -> list[int]:
    """Line numbers of the first sample lines whose timestamp is in `wanted`."""
    out: list[int] = []
    if not wanted:
        return out
    for lineno, line in enumerate(io.StringIO(text), 1):
        if line.startswith("#"):
            continue
        try:
            if float(line.rsplit(None, 1)[-1]) in wanted:
                out.append(lineno)
        except (ValueError, IndexError):
            continue
        if len(out) >= limit:
            break
    return out
