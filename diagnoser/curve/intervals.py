"""A window as per-instance scrape intervals: what happened in each (t[i], t[i+1]] per engine.

One row per (instance, interval) where the concurrency signal is present: the requests in the
engine over the interval (`little_concurrency`: Little's law on the latency histograms' sums,
weighed against the gauges' mean by their uncertainty; the gauges alone where the engine exports
no such sum), waiting (the same from the queue-time sum, else the gauge) and KV usage (the mean of
the gauges around the interval: WINDOW_S), the
reset-aware increases of the counters (a counter that drops was reset: the increase is the value
after it, as in Prometheus) and of every histogram bucket. Absent stays NaN: a signal the engine
does not export never reads as zero.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from kvscope.core.rates import step_increases
from kvscope.core.signals import Labels
from kvscope.diagnoser.curve.window import (
    CACHE_HITS,
    CONCURRENCY_SIGNAL,
    CONFIG_GAUGES,
    COUNTERS,
    GAUGES,
    HISTOGRAMS,
    LITTLE_SUMS,
    MIX_COUNTERS,
    OBJECTIVE_HISTOGRAMS,
    START_TIME,
    STEP_COUNTERS,
)
from kvscope.diagnoser.evaluate.frame import Block, Frame

Pool = tuple[str, str]  # (model, engine)
WAITING = "engine_requests_waiting"
QUEUE_SUM = LITTLE_SUMS[0][0]
"""The queue-time histogram (vLLM request_queue_time_seconds): its sum's increase over a span is the
seconds the requests that finished in it spent waiting, so the queue's time-average is read from it
as the requests in the engine are (Little's law), weighed with the waiting gauge's mean: a gauge
sampled every 30 s reads an empty queue between bursts that the sum integrates."""
WINDOW_S = 10.0
"""Gauges are read as their mean over the samples within about this span around an interval (at
least its two ends): at a 2 s scrape, a request's arrival or finish moves the gauge more than
the interval's load does. Little's law reads the same span (the interval alone where it is cut)."""
CONCURRENCY = "concurrency"
"""The curve's concurrency per instance: the time-average requests in the engine (running plus
waiting where the engine exports its queue: the load a client's concurrency sweep offers, §8.2;
else running), from Little's law on the latency sums weighed with the gauges' mean where the
engine exports such a sum (`little_concurrency`, `weigh`), from the gauges alone elsewhere."""
Unit = tuple[str, str]  # (instance, dp_rank)
COMPUTED = "engine_prompt_tokens_computed"
"""Per interval: the prompt tokens the engine computed, its prompt tokens less its device prefix
cache's hits (NaN where either is not exported): the prefill work the requests asked of it."""
ARRIVAL_RATE = "arrival_rate"
"""Per interval: the requests that reached the engine per second, over the span the gauges are
averaged over: those that finished in it plus the change of the requests in the engine (running
plus waiting) from its start to its end, read at the grid points (conservation: what arrived
either left or is still there). The offered load as the engine saw it, in open loop the input and
in closed loop what the clients' streams drew; NaN where the engine exports no finished counter or
no in-engine gauge, and over a reset."""


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
    little_weight: np.ndarray = field(default_factory=lambda: np.zeros(0))  # Little's law's share of it
    little_sum: str | None = None  # the histogram sums Little's law read (None: gauges only)
    running_max: float | None = None  # the running gauge's highest sample in the window (any unit)
    weight: np.ndarray | None = None  # engine-intervals per row (None: one each; the records: a bucket's engines)
    sums: dict[str, np.ndarray] = field(default_factory=dict)  # the records' other sums per row (record_intervals)

    def take(self, mask: np.ndarray) -> Intervals:
        """The rows where mask holds, or the rows `mask` numbers (an index array)."""
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
            self.little_weight[mask],
            self.little_sum,
            self.running_max,
            None if self.weight is None else self.weight[mask],
            {k: v[mask] for k, v in self.sums.items()},
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


def per_instance(block: Block | None, units: list[Unit], n_t: int) -> np.ndarray:
    """[units, grid]: a process-level series (no data-parallel rank) read for every unit of its
    instance (the highest where several match); NaN where the instance has none."""
    out = np.full((len(units), n_t), np.nan)
    if block is not None:
        rows: dict[str, list[int]] = defaultdict(list)
        for r, labels in enumerate(block.labels):
            rows[unit_of(labels)[0]].append(r)
        for u, (instance, _) in enumerate(units):
            if rows.get(instance):
                out[u] = np.fmax.reduce(block.values[rows[instance]], axis=0)
    return out


def new_process(started: np.ndarray) -> np.ndarray:
    """[units, intervals]: the interval ends at a process start time other than the one last read
    before it (a restart, which a counter need not show dropping); False where none is read."""
    last = np.where(~np.isnan(started), np.arange(started.shape[1]), -1)
    last = np.maximum.accumulate(last, axis=1)[:, :-1]  # the last grid point read up to each interval's start
    before = np.take_along_axis(started, np.maximum(last, 0), axis=1)
    with np.errstate(invalid="ignore"):
        return (last >= 0) & ~np.isnan(started[:, 1:]) & (started[:, 1:] != before)


def _device_hits(frame: Frame) -> Block | None:
    """The prefix-cache hit counter's series that count the device cache's hits: vLLM's (no
    cache_scope) and SGLang's `device` scope; SGLang's `all_tiers` adds host and storage tiers and
    would count a hit twice beside `device`, so it is not read (absent, never guessed)."""
    block = frame.block(CACHE_HITS)
    if block is None:
        return None
    rows = [r for r, labels in enumerate(block.labels) if dict(labels).get("cache_scope", "device") == "device"]
    return Block([block.labels[r] for r in rows], block.values[rows]) if rows else None


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


def _window_sum(x: np.ndarray, half: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per interval i: the sum of x over intervals i-half..i+half (within the window), how many of
    them are present, and the grid points that open and close that span."""
    n = x.shape[1]
    lo = np.clip(np.arange(n) - half, 0, n)
    hi = np.clip(np.arange(n) + half + 1, 0, n)
    total = np.pad(np.cumsum(np.nan_to_num(x), axis=1), ((0, 0), (1, 0)))
    present = np.pad(np.cumsum(~np.isnan(x), axis=1), ((0, 0), (1, 0)))
    return total[:, hi] - total[:, lo], present[:, hi] - present[:, lo], lo, hi


def _little_sums(frame: Frame, index: dict[Unit, int], n_t: int) -> tuple[np.ndarray, np.ndarray, str | None]:
    """(seconds spent in the engine by the requests that finished in each interval, those requests)
    per unit and interval, from the first of LITTLE_SUMS each unit exports; NaN where it exports none."""
    seconds = np.full((len(index), n_t - 1), np.nan)
    done = np.full((len(index), n_t - 1), np.nan)
    used = []
    for names in LITTLE_SUMS:
        parts = [_counter(frame.block(f"{h}_sum"), index, n_t)[0] for h in names]
        count = _counter(frame.block(f"{names[-1]}_count"), index, n_t)[0]
        total = np.sum(parts, axis=0)  # NaN where any part is absent
        fill = np.isnan(seconds).all(axis=1) & ~np.isnan(total).all(axis=1) & ~np.isnan(count).all(axis=1)
        if fill.any():
            seconds[fill], done[fill] = total[fill], count[fill]
            used.append(" + ".join(names))
    return seconds, done, ("; ".join(used) or None)


def little_concurrency(
    ends: np.ndarray, seconds: np.ndarray, done: np.ndarray, drops: np.ndarray, step: float, half: int
) -> tuple[np.ndarray, np.ndarray]:
    """Little's law per interval: (time-average requests in the engine, its standard error), over
    the span of intervals i-half..i+half around interval i (the span the gauges are averaged over).

    `seconds`: the increase of a latency histogram's sum in each interval; `done`: of its count;
    `ends`: the requests in the engine at each grid point (the gauges). The integral of the requests
    in the engine over a span is exactly the seconds the requests that finished in it spent in the
    engine, plus the age of those in flight at its end, less the age of those in flight at its start
    (before the span). The sum gives the first term; the ages are not exported. Estimated as
    sum / span, the ages' difference is the error: it is zero in expectation at a steady load, and
    its standard error is taken as that of N ages uniform in [0, W] at each edge (N the gauge there,
    W the requests' mean time in the engine over the span): sqrt(N_start + N_end) W / sqrt(12) /
    span. Exact where the engine is idle at both edges; the error shrinks as the span grows
    against W. NaN where the span has no finished request (W unknown), a reset (the sums restarted)
    or a missing value."""
    total, present, lo, hi = _window_sum(seconds, half)
    finished, _, _, _ = _window_sum(done, half)
    dropped, _, _, _ = _window_sum(drops.astype(float), half)
    span = (hi - lo) * step
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_w = np.where(finished > 0, total / finished, np.nan)
        edge = ends[:, lo] + ends[:, hi]
        value = total / span
        err = np.sqrt(edge) * mean_w / np.sqrt(12.0) / span
    idle_edges = edge == 0
    err = np.where(idle_edges & ~np.isnan(value), 0.0, err)
    bad = (present < (hi - lo)) | (dropped > 0) | np.isnan(err)
    return np.where(bad, np.nan, value), np.where(bad, np.nan, err)


def integrated(
    ends: np.ndarray, seconds: np.ndarray, done: np.ndarray, drops: np.ndarray, step: float, half: int
) -> tuple[np.ndarray, np.ndarray]:
    """`little_concurrency` over the span around each interval, and over the interval alone where
    that span is cut (a scrape gap, the window's edge)."""
    value, err = little_concurrency(ends, seconds, done, drops, step, half)
    if half:
        alone, alone_err = little_concurrency(ends, seconds, done, drops, step, 0)
        cut = np.isnan(value)
        value, err = np.where(cut, alone, value), np.where(cut, alone_err, err)
    return value, err


def arrival_rate(finished: np.ndarray, ends: np.ndarray, drops: np.ndarray, step: float, half: int) -> np.ndarray:
    """Requests that reached the engine per second, per unit and interval, over the span of
    intervals i-half..i+half (the interval alone where that span is cut): the finished requests in
    the span plus the requests in the engine at its end less those at its start (`ends`: the gauges
    at each grid point). NaN where a value is missing or a counter was reset in the span."""

    def over(h: int) -> np.ndarray:
        total, present, lo, hi = _window_sum(finished, h)
        dropped, _, _, _ = _window_sum(drops.astype(float), h)
        with np.errstate(invalid="ignore"):
            value = (total + ends[:, hi] - ends[:, lo]) / ((hi - lo) * step)
        return np.where((present < hi - lo) | (dropped > 0), np.nan, value)

    out = over(half)
    return np.where(np.isnan(out), over(0), out) if half else out


def weigh(a: np.ndarray, sa: np.ndarray, b: np.ndarray, sb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two estimates of one quantity with their standard errors, combined by inverse variance:
    (value, standard error, a's weight). Where one is missing, the other; where one is exact (zero
    error), it alone; an estimate without an error counts only where the other is missing."""
    has_a, has_b = ~np.isnan(a), ~np.isnan(b)
    with np.errstate(invalid="ignore", divide="ignore"):
        wa = np.where(has_a, np.nan_to_num(np.where(sa == 0, np.inf, 1.0 / sa**2), nan=0.0, posinf=np.inf), 0.0)
        wb = np.where(has_b, np.nan_to_num(np.where(sb == 0, np.inf, 1.0 / sb**2), nan=0.0, posinf=np.inf), 0.0)
        share = np.where(
            np.isinf(wa),
            1.0,
            np.where(np.isinf(wb), 0.0, np.where(wa + wb > 0, wa / (wa + wb), np.where(has_a, 1.0, 0.0))),
        )
        value = np.where(share == 1.0, a, np.where(share == 0.0, b, share * a + (1 - share) * b))
        err = np.where(share == 1.0, sa, np.where(share == 0.0, sb, 1.0 / np.sqrt(wa + wb)))
    return value, err, share


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
        for name in COUNTERS + MIX_COUNTERS + STEP_COUNTERS + tuple(f"{h}_count" for h in HISTOGRAMS):
            counters[name], dropped = _counter(frame.block(name), index, n_t)
            drops |= dropped
        drops |= new_process(per_instance(frame.block(START_TIME), units, n_t))
        counters[COMPUTED] = counters["engine_prompt_tokens_total"] - _counter(_device_hits(frame), index, n_t)[0]
        hists = {
            h: got
            for h in HISTOGRAMS + OBJECTIVE_HISTOGRAMS
            if (got := _histogram(frame.block(f"{h}_bucket"), index, n_t))
        }
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
        spread = {}
        for name, g in gauges.items():
            win = np.lib.stride_tricks.sliding_window_view(
                np.pad(g, ((0, 0), (half, half)), constant_values=np.nan), 2 + 2 * half, axis=1
            )[u_idx, i_idx]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows stay NaN
                iv.gauges[name] = np.nanmean(win, axis=1)
                if name in (CONCURRENCY, WAITING):  # the standard error of that mean
                    spread[name] = np.nanstd(win, axis=1, ddof=1) / np.sqrt((~np.isnan(win)).sum(axis=1))
        iv.spread = spread[CONCURRENCY]
        iv.counters = {name: c[u_idx, i_idx] for name, c in counters.items()}
        iv.hists = {h: (les, arr[u_idx, :, i_idx]) for h, (les, arr) in hists.items()}
        iv.little_weight = np.zeros(len(u_idx))
        seconds, done, iv.little_sum = _little_sums(frame, index, n_t)
        if iv.little_sum is not None:
            # the gauges' mean misses what moves between its samples: at least the error of the
            # arrivals and finishes in the span (about two per finished request) placed anywhere
            # in their interval, sqrt(events / 12) / intervals
            finished, _, lo, hi = _window_sum(done, half)
            floor = (np.sqrt(2 * np.nan_to_num(finished) / 12.0) / (hi - lo))[u_idx, i_idx]
            little, little_err = integrated(conc, seconds, done, drops, frame.step, half)
            iv.gauges[CONCURRENCY], iv.spread, iv.little_weight = weigh(
                little[u_idx, i_idx], little_err[u_idx, i_idx], iv.gauges[CONCURRENCY], np.fmax(iv.spread, floor)
            )
            queued = _counter(frame.block(f"{QUEUE_SUM}_sum"), index, n_t)[0]
            if not np.isnan(queued).all():  # the queue the same way: its time-average from the queue-time sum
                wait, wait_err = integrated(conc, queued, done, drops, frame.step, half)
                iv.gauges[WAITING] = weigh(
                    wait[u_idx, i_idx], wait_err[u_idx, i_idx], iv.gauges[WAITING], np.fmax(spread[WAITING], floor)
                )[0]
        arrivals = arrival_rate(counters["engine_requests_finished_total"], conc, drops, frame.step, half)
        iv.gauges[ARRIVAL_RATE] = arrivals[u_idx, i_idx]
        running_seen = running[~np.isnan(running)]
        iv.running_max = float(running_seen.max()) if len(running_seen) else None
        out[pool] = iv
    return out
