"""A window of canonical series sampled on one time grid: what every source hands the engine.

The grid is `start, start+step, ..., end`. The value of a series at grid time t is its latest
sample in (t - lookback, t] (Prometheus' instant-vector lookback, 5 minutes by default), so a
recording, a Prometheus range query and the agent API give the same numbers for the same data.
A series with no sample in the lookback is NaN there: absent, never zero.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from kvscope.core.rates import step_increases
from kvscope.core.scalars import iso_utc
from kvscope.core.signals import Labels, Sample
from kvscope.diagnoser.evaluate.grid import ffill

DEFAULT_LOOKBACK_S = 300.0


@dataclass
class Block:
    """All series of one canonical sample name: a label set per row, values [rows, T]."""

    labels: list[Labels]
    values: np.ndarray
    seen: np.ndarray | None = None
    """The values before failed scrapes made some stale (mark_stale); None when none did. A
    replica that failed a scrape still exists: counts of replicas read this."""

    def __post_init__(self) -> None:
        if self.values.ndim != 2 or self.values.shape[0] != len(self.labels):
            raise ValueError("Block values must be [len(labels), T]")


@dataclass(frozen=True)
class JudgedSpans:
    """Grid stretches at which a rule's conditions are judged, each for the groups whose labels
    match (compared on the labels the rule groups by; a stretch naming none of them is every
    group's). Groups no stretch matches are not judged at all."""

    spans: tuple[tuple[tuple[tuple[str, str], ...], int, int], ...]  # (labels, first, last)

    def mask(self, by: tuple[str, ...], keys: list[tuple[str, ...]], n: int) -> np.ndarray:
        """bool [len(keys), n]: where each group is judged."""
        out = np.zeros((len(keys), n), dtype=bool)
        pos = {label: i for i, label in enumerate(by)}
        index: dict[tuple, list[int]] = defaultdict(list)
        for gi, key in enumerate(keys):
            index[key].append(gi)
        for labels, first, last in self.spans:
            wanted = [(pos[k], v) for k, v in labels if k in pos]
            if len(wanted) == len(by):  # the whole key: a dict lookup
                key = tuple(v for _, v in sorted(wanted))
                rows = index.get(key, [])
            else:
                rows = [gi for gi, key in enumerate(keys) if all(key[i] == v for i, v in wanted)]
            out[rows, max(0, first) : last + 1] = True
        return out


@dataclass
class Frame:
    """Canonical series of one window on a common grid, plus engine facts per instance."""

    ts: np.ndarray  # grid timestamps [T]
    blocks: dict[str, Block] = field(default_factory=dict)
    facts: dict[str, dict[str, str]] = field(default_factory=dict)  # instance -> merged facts
    cache: dict | None = field(default_factory=dict)  # series computed once, shared by rules (None = off)
    down: dict[str, np.ndarray] = field(default_factory=dict)
    """instance -> grid points at which its latest scrape had failed (mark_stale)."""
    judged: JudgedSpans | None = None
    """Where conditions are judged, per group (None: everywhere): the pushdown
    path fetches each candidate's data only around the stretches where it can fire."""
    outer: tuple[float, float] | None = None
    """The whole window when the grid is a stretch of it (the fleet path evaluates a rule only
    where its evidence was fetched); findings name this window."""
    profile: dict[tuple[str, ...], float] | None = None
    """When a dict: CPU seconds per rule (`("rule", id)`) and per series node (`("node", rule id,
    name, form, signal)`, inclusive of what it refers to) are added to it (bench --profile)."""

    @property
    def step(self) -> float:
        return float(self.ts[1] - self.ts[0]) if len(self.ts) > 1 else 0.0

    @property
    def window(self) -> tuple[float, float]:
        return self.outer or (float(self.ts[0]), float(self.ts[-1]))

    def names(self) -> set[str]:
        return set(self.blocks)

    def block(self, name: str) -> Block | None:
        return self.blocks.get(name)


def increases(
    frame: Frame, name: str, cols: np.ndarray | None = None, carry: bool = False
) -> list[tuple[dict[str, str], float]]:
    """(labels, reset-aware increase over the grid points `cols`, None: all) of each series of
    `name` with a value there. A gap counts nothing into or out of it, or with `carry` is
    bridged from the value before it (a series first seen inside counts from its first value)."""
    block = frame.block(name)
    if block is None:
        return []
    values = block.values if cols is None else block.values[:, cols]
    inc = np.nansum(step_increases(ffill(values) if carry else values), axis=1)
    seen = ~np.isnan(values).all(axis=1)
    return [(dict(labels), float(v)) for labels, v, ok in zip(block.labels, inc, seen, strict=True) if ok]


MAX_GRID_POINTS = 1_000_000
"""Grid points one evaluation may have (a week at a 1 s step is 604,800)."""
MAX_FRAME_CELLS = 100_000_000
"""Series x grid points of one frame (800 MB of float64): checked before the frame is built."""


def make_grid(start: float, end: float, step: float) -> np.ndarray:
    """Grid points from start to end inclusive (end is kept when it falls on the grid).
    ValueError for a bad window or one longer than MAX_GRID_POINTS, before any allocation."""
    if not (step > 0 and math.isfinite(start) and math.isfinite(end)) or end < start:
        raise ValueError(f"bad grid: start={start} end={end} step={step}")
    n = int(np.floor((end - start) / step + 1e-9)) + 1
    if n > MAX_GRID_POINTS:
        raise ValueError(
            f"the window {iso_utc(start)} to {iso_utc(end)} at a {step:g} s step is {n:,} grid points "
            f"(at most {MAX_GRID_POINTS:,}): pass --start/--end for a shorter window or a larger --step"
        )
    return start + step * np.arange(n, dtype=float)


def sample_on_grid(
    times: np.ndarray, values: np.ndarray, grid: np.ndarray, lookback_s: float = DEFAULT_LOOKBACK_S
) -> np.ndarray:
    """Latest value at or before each grid point within the lookback; NaN where none."""
    idx = np.searchsorted(times, grid, side="right") - 1
    out = np.full(grid.shape, np.nan)
    ok = idx >= 0
    ok[ok] = (grid[ok] - times[idx[ok]]) < lookback_s
    out[ok] = values[idx[ok]]
    return out


def frame_from_samples(
    samples: Iterable[Sample],
    start: float,
    end: float,
    step: float,
    lookback_s: float = DEFAULT_LOOKBACK_S,
    names: set[str] | None = None,
) -> Frame:
    """Group timestamped canonical samples into series and sample them on the grid. `names`
    limits the frame to the sample names the rules read; samples without a timestamp are ignored."""
    grid = make_grid(start, end, step)
    points: dict[tuple[str, Labels], list[tuple[float, float]]] = defaultdict(list)
    for s in samples:
        if s.timestamp is None or (names is not None and s.name not in names):
            continue
        if s.timestamp > end or s.timestamp <= start - lookback_s:
            continue
        points[(s.name, s.labels)].append((s.timestamp, s.value))
    if len(points) * len(grid) > MAX_FRAME_CELLS:
        raise ValueError(
            f"{len(points):,} series x {len(grid):,} grid points is more than {MAX_FRAME_CELLS:,} "
            "values: pass --start/--end for a shorter window or a larger --step"
        )

    def on_grid(pts: list[tuple[float, float]]) -> np.ndarray:
        arr = np.array(sorted(pts), dtype=float)
        return sample_on_grid(arr[:, 0], arr[:, 1], grid, lookback_s)

    return Frame(ts=grid, blocks=blocks_of((name, labels, on_grid(pts)) for (name, labels), pts in points.items()))


def blocks_of(rows: Iterable[tuple[str, Labels, np.ndarray]]) -> dict[str, Block]:
    """Series rows (name, labels, values on one grid) -> a Block per name, names and each block's
    rows in sorted order (the order every source gives)."""
    parts: dict[str, list[tuple[Labels, np.ndarray]]] = defaultdict(list)
    for name, labels, row in rows:
        parts[name].append((labels, row))
    out = {}
    for name in sorted(parts):
        part = sorted(parts[name], key=lambda r: r[0])
        out[name] = Block([labels for labels, _ in part], np.vstack([row for _, row in part]))
    return out


def failed_scrape_spans(up: Iterable[tuple[str, float, bool]]) -> dict[str, list[tuple[float, float]]]:
    """instance -> [from, until) spans from a failed scrape to the next successful one (+inf when
    none follows); `up` holds (instance, scrape time, succeeded)."""
    by: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    for instance, t, ok in up:
        by[instance].append((t, ok))
    out: dict[str, list[tuple[float, float]]] = {}
    for instance, scrapes in by.items():
        spans: list[tuple[float, float]] = []
        down_since: float | None = None
        for t, ok in sorted(scrapes):
            if not ok and down_since is None:
                down_since = t
            elif ok and down_since is not None:
                spans.append((down_since, t))
                down_since = None
        if down_since is not None:
            spans.append((down_since, float("inf")))
        if spans:
            out[instance] = spans
    return out


def mark_stale(frame: Frame, down: dict[str, list[tuple[float, float]]]) -> None:
    """Prometheus staleness for failed scrapes, in place: a series of an instance is absent at
    grid times when that instance's latest scrape had failed (Prometheus writes stale markers
    there; a lookback carrying frozen counters through an outage would fake a rate drop)."""
    masks = {instance: mask for instance, spans in down.items() if (mask := _span_mask(frame.ts, spans)).any()}
    if not masks:
        return
    frame.down.update(masks)
    for block in frame.blocks.values():
        for i, labels in enumerate(block.labels):
            gone = masks.get(dict(labels).get("instance", ""))
            if gone is not None and not np.isnan(block.values[i, gone]).all():
                if block.seen is None:
                    block.seen = block.values.copy()
                block.values[i, gone] = np.nan


def _span_mask(ts: np.ndarray, spans: list[tuple[float, float]]) -> np.ndarray:
    """bool [T]: grid times inside any of the [from, until) spans."""
    return np.any([(ts >= a) & (ts < b) for a, b in spans], axis=0) if spans else np.zeros(len(ts), dtype=bool)


def removed_target_spans(
    up: Iterable[tuple[str, float, bool]], factor: float = 3.0
) -> dict[str, list[tuple[float, float]]]:
    """instance -> [from, until) spans in which the target was not scraped at all: removed from
    service discovery (a replica scaled in), not failing.

    `up`: (instance, scrape time, succeeded) of every scrape. A target whose next scrape is over
    `factor` x its median interval away while others were scraped is gone from one interval after
    its last scrape until it returns (+inf if never)."""
    by: dict[str, list[float]] = defaultdict(list)
    for instance, t, _ok in up:
        by[instance].append(t)
    every = np.array(sorted({t for ts in by.values() for t in ts}))
    if len(every) < 2:
        return {}
    out: dict[str, list[tuple[float, float]]] = {}
    for instance, times in by.items():
        ts = np.array(sorted(times))
        if len(ts) < 3:
            continue
        med = float(np.median(np.diff(ts)))
        nxt = np.append(ts[1:], np.inf)
        spans = []
        for t1, t2 in zip(ts, nxt, strict=True):
            if t2 - t1 <= factor * med:
                continue
            lo, hi = t1 + (factor - 1) * med, min(t2, every[-1] + med)
            if ((every > lo) & (every < hi)).any():  # others were scraped meanwhile
                spans.append((t1 + med, t2))
        if spans:
            out[instance] = spans
    return out


def mark_removed(frame: Frame, removed: dict[str, list[tuple[float, float]]]) -> None:
    """Prometheus staleness for targets that left service discovery, in place: their series are
    absent there and, unlike mark_stale, `seen` too (the target is no longer a replica)."""
    rows: dict[str, list[tuple[Block, int]]] = defaultdict(list)  # instance -> its series: one pass
    if removed:
        for block in frame.blocks.values():
            for i, labels in enumerate(block.labels):
                rows[dict(labels).get("instance", "")].append((block, i))
    for instance, spans in removed.items():
        mask = _span_mask(frame.ts, spans)
        if not mask.any():
            continue
        for block, i in rows.get(instance, ()):
            block.values[i, mask] = np.nan
            if block.seen is not None:
                block.seen[i, mask] = np.nan


def merge_facts(per_rank: dict[str, dict[str, dict[str, str]]]) -> dict[str, dict[str, str]]:
    """instance -> dp_rank -> facts  to  instance -> facts (rank "" or the first rank wins)."""
    return {
        instance: {k: v for rank in sorted(ranks, reverse=True) for k, v in ranks[rank].items()}
        for instance, ranks in per_rank.items()
    }
