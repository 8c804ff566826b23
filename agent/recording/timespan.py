"""Samples timestamped far from the rest of a recording are dropped, counted and reported.

The evaluation grid spans a recording's earliest to latest timestamp, so one sample stamped
years off (a clock reset, a hand edit) would make it hundreds of millions of points long. A
sample more than `MAX_SPREAD_S` from the median timestamp (or without one, where others have one)
is dropped before anything is allocated, and one `timestamp_outlier` issue says how many, the
median and the file:line of the first ones; replay passes it on as a note.

Also the scrape interval a scraper was configured at, from the one it was measured at
(`configured_interval`), which replay and the Prometheus source both read."""

from __future__ import annotations

import io
import math
import os
from datetime import UTC, datetime

import numpy as np

from kvscope.agent.scrape.exposition import Exposition, ParseIssue

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


def iso_utc(t: float) -> str:
    """A Unix time as 2023-11-14T22:13:20Z (UTC, whole seconds); as a number where no date fits."""
    try:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError, OSError):
        return f"{t:g}"


INTERVAL_JITTER = 0.01
"""A measured interval within this fraction of a whole number of seconds (at least 1 s) is that
whole number (`configured_interval`)."""


def configured_interval(measured: float) -> float:
    """The scrape interval a scraper was configured at, from the interval measured between its
    scrapes: scrapers are configured in durations (`scrape_interval: 2s`) and start each scrape a
    little late or early (a loaded scraper, the clock read after the request went out), so the
    measured median is the configured interval plus jitter (2.001 s, 1.998 s, 2.0025 s in the
    incident library). A measured interval within INTERVAL_JITTER (1 %) of a whole number of
    seconds, at least 1 s, is that whole number; any other is kept as measured, to the
    millisecond (timestamps' resolution): 0.25 s, 1.5 s, and 2.05 s, which is no 2 s scraper's
    jitter."""
    ms, whole = round(measured * 1000), round(measured)
    if whole >= 1 and abs(ms - 1000 * whole) <= INTERVAL_JITTER * 1000 * whole:
        return float(whole)
    return ms / 1000
