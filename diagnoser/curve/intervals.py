"""A window as per-instance scrape intervals: what happened in each (t[i], t[i+1]] per engine.

One row per (instance, interval) where the concurrency signal is present: the requests in the
engine (running + waiting, the mean of the gauges around the interval: WINDOW_S), waiting and KV
usage likewise, the reset-aware increases of the counters (a counter that drops was reset: the
increase is the value after it, as in Prometheus) and of every histogram bucket. Absent stays
NaN: a signal the engine does not export never reads as zero.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from kvscope.agent.derive.rates import step_increases
from kvscope.agent.signals import Labels
from kvscope.diagnoser.curve.window import CONCURRENCY_SIGNAL, CONFIG_GAUGES, COUNTERS, GAUGES, HISTOGRAMS
from kvscope.diagnoser.evaluate.frame import Block, Frame

Pool = tuple[str, str]  # (model, engine)
WAITING = "engine_requests_waiting"
WINDOW_S = 10.0
"""Gauges are read as their mean over the samples within about this span around an interval (at
least its two ends): at a 2 s scrape, a request's arrival or finish moves the gauge more than
the interval's load does."""
CONCURRENCY = "concurrency"
"""The curve's concurrency per instance: requests in the engine, running plus waiting where the
engine exports its queue (the load a client's concurrency sweep offers, §8.2), else running."""
Unit = tuple[str, str]  # (instance, dp_rank)


@dataclass
class Intervals:
    """One pool's intervals: arrays over rows (instance, interval), time-ordered per instance."""

    step: float
    signal: str  # what `gauges["concurrency"]` is made of
    t_end: np.ndarray  # interval end (unix s)
    unit: np.ndarray  # index into `units`
    units: list[Unit]
    gauges: dict[str, np.ndarray] = field(default_factory=dict)  # interval mean
    spread: np.ndarray = field(default_factory=lambda: np.zeros(0))  # standard error of the concurrency
    counters: dict[str, np.ndarray] = field(default_factory=dict)  # increase in the interval
    hists: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # les, [rows, les]
    resets: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # a counter dropped

    def take(self, mask: np.ndarray) -> Intervals:
        """The rows where mask holds."""
        return Intervals(
            self.step,
            self.signal,
            self.t_end[mask],
            self.unit[mask],
            self.units,
            {k: v[mask] for k, v in self.gauges.items()},
            self.spread[mask],
            {k: v[mask] for k, v in self.counters.items()},
            {k: (les, v[mask]) for k, (les, v) in self.hists.items()},
            self.resets[mask],
        )

    def __len__(self) -> int:
        return len(self.t_end)


def unit_of(labels: Labels) -> Unit:
    """The unit a series belongs to: its engine instance and data-parallel rank."""
    d = dict(labels)
    return d.get("instance", ""), d.get("dp_rank", "")


def _rows_by_unit(block: Block, index: dict[Unit, int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for r, labels in enumerate(block.labels):
        u = index.get(unit_of(labels))
        if u is not None:
            out[u].append(r)
    return out


def _gauge(block: Block | None, index: dict[Unit, int], n_t: int) -> np.ndarray:
    out = np.full((len(index), n_t), np.nan)
    if block is not None:
        for u, rows in _rows_by_unit(block, index).items():
            out[u] = np.fmax.reduce(block.values[rows], axis=0)
    return out


def _increases(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reset-aware increases along the last axis and where a value dropped (a reset)."""
    d = np.diff(values, axis=-1)
    with np.errstate(invalid="ignore"):
        return step_increases(values), d < 0


def _counter(block: Block | None, index: dict[Unit, int], n_t: int) -> tuple[np.ndarray, np.ndarray]:
    out = np.full((len(index), n_t - 1), np.nan)
    dropped = np.zeros((len(index), n_t - 1), dtype=bool)
    if block is not None:
        for u, rows in _rows_by_unit(block, index).items():
            inc, drop = _increases(block.values[rows])
            present = ~np.isnan(inc)
            out[u] = np.where(present.any(axis=0), np.nansum(np.where(present, inc, 0.0), axis=0), np.nan)
            dropped[u] = drop.any(axis=0)
    return out, dropped


def _histogram(block: Block | None, index: dict[Unit, int], n_t: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(sorted finite-and-+Inf bounds, cumulative bucket increases [units, les, intervals])."""
    if block is None:
        return None
    by: dict[tuple[int, float], list[int]] = defaultdict(list)
    for r, labels in enumerate(block.labels):
        u = index.get(unit_of(labels))
        try:
            le = float(dict(labels).get("le", ""))
        except ValueError:
            continue
        if u is not None:
            by[(u, le)].append(r)
    les = np.array(sorted({le for _, le in by}))
    if len(les) < 2 or not np.isinf(les[-1]):
        return None
    pos = {le: i for i, le in enumerate(les)}
    out = np.full((len(index), len(les), n_t - 1), np.nan)
    single = [(u, pos[le], rows[0]) for (u, le), rows in by.items() if len(rows) == 1]
    if single:  # one series per unit and bound (the usual case): every increase at once
        u_at, le_at, rows_at = (np.array(c) for c in zip(*single, strict=True))
        out[u_at, le_at] = step_increases(block.values[rows_at])
    for (u, le), rows in by.items():
        if len(rows) > 1:  # the unit's series of one bound summed (NaN where none is present)
            inc = step_increases(block.values[rows])
            out[u, pos[le]] = np.where(np.isnan(inc).all(axis=0), np.nan, np.nansum(inc, axis=0))
    return les, out


def pool_intervals(frame: Frame) -> dict[Pool, Intervals]:
    """Each pool's intervals (model x engine, from the concurrency signal's labels)."""
    block = frame.block(CONCURRENCY_SIGNAL)
    n_t = len(frame.ts)
    if block is None or n_t < 2:
        return {}
    pools: dict[Pool, list[Unit]] = defaultdict(list)
    for labels in block.labels:
        d = dict(labels)
        pool, unit = (d.get("model", ""), d.get("engine", "")), unit_of(labels)
        if unit not in pools[pool]:
            pools[pool].append(unit)
    out = {}
    for pool, units in sorted(pools.items()):
        index = {u: i for i, u in enumerate(units)}
        gauges = {name: _gauge(frame.block(name), index, n_t) for name in GAUGES + CONFIG_GAUGES}
        counters, drops = {}, np.zeros((len(units), n_t - 1), dtype=bool)
        for name in COUNTERS + tuple(f"{h}_count" for h in HISTOGRAMS):
            counters[name], dropped = _counter(frame.block(name), index, n_t)
            drops |= dropped
        hists = {h: got for h in HISTOGRAMS if (got := _histogram(frame.block(f"{h}_bucket"), index, n_t))}
        running, waiting = gauges[CONCURRENCY_SIGNAL], gauges[WAITING]
        has_wait = ~np.isnan(waiting).all(axis=1)
        gauges[CONCURRENCY] = np.where(has_wait[:, None], running + np.nan_to_num(waiting), running)
        signal = CONCURRENCY_SIGNAL + (
            f" + {WAITING}" if has_wait.all() else f" (+ {WAITING} where exported)" if has_wait.any() else ""
        )
        conc = gauges[CONCURRENCY]
        keep = ~np.isnan(conc[:, 1:]) & ~np.isnan(conc[:, :-1])
        u_idx, i_idx = np.nonzero(keep)
        iv = Intervals(frame.step, signal, frame.ts[1:][i_idx], u_idx, units)
        iv.resets = drops[u_idx, i_idx]
        half = int(round(WINDOW_S / frame.step / 2)) if frame.step > 0 else 0
        for name, g in gauges.items():
            win = np.lib.stride_tricks.sliding_window_view(
                np.pad(g, ((0, 0), (half, half)), constant_values=np.nan), 2 + 2 * half, axis=1
            )[u_idx, i_idx]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows stay NaN
                iv.gauges[name] = np.nanmean(win, axis=1)
                if name == CONCURRENCY:  # the standard error of that mean
                    n = (~np.isnan(win)).sum(axis=1)
                    iv.spread = np.nanstd(win, axis=1, ddof=1) / np.sqrt(n)
        iv.counters = {name: c[u_idx, i_idx] for name, c in counters.items()}
        iv.hists = {h: (les, arr[u_idx, :, i_idx]) for h, (les, arr) in hists.items()}
        out[pool] = iv
    return out
