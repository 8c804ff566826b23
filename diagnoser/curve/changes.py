"""Change events in a window, per pool: configuration, restarts, replica count.

* config: a canonical gauge read from an engine's `*_info` series (vLLM cache_config_info's KV
  capacity, lora_requests_info's max_lora) takes a new value on an instance;
* restart: a counter of an instance drops (the engine process started again; Prometheus reads
  the same reset), or its process start time takes a new value (a restart no counter shows
  dropping: the scrapes around it were too far apart);
* replicas: the number of instances reporting the concurrency signal changes and stays changed.
Events of one pool closer than `merge_s` are one event (a config change comes with a restart).
Engine version and the model served are facts the engines export as labels of info series that
a Frame merges over the window, so they are not placed in time here (docs/curve.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from kvscope.diagnoser.curve.intervals import Pool, Unit, new_process, per_instance, unit_of
from kvscope.diagnoser.curve.window import CONCURRENCY_SIGNAL, CONFIG_GAUGES, COUNTERS, HISTOGRAMS, START_TIME
from kvscope.diagnoser.evaluate.frame import Frame

KIND_ORDER = ("version", "config", "replicas", "restart", "curve")
MIN_STABLE = 5
"""Grid points a new replica count must hold to be a change (a scrape gap is not one)."""


@dataclass
class Change:
    time: float
    kind: str  # config | version | restart | replicas | curve
    diff: dict = field(default_factory=dict)  # name -> [before, after]
    instances: list[str] = field(default_factory=list)


def _pool_units(frame: Frame) -> dict[Unit, Pool]:
    block = frame.block(CONCURRENCY_SIGNAL)
    out = {}
    for labels in block.labels if block else []:
        d = dict(labels)
        out[unit_of(labels)] = (d.get("model", ""), d.get("engine", ""))
    return out


def _unit_steps(
    frame: Frame, name: str, units: dict[Unit, Pool], keep: Callable[[np.ndarray, np.ndarray], np.ndarray]
) -> Iterator[tuple[Pool, str, float, float, float]]:
    """(pool, instance, time, value before, value after) for each pair of consecutive present
    values of each series of `name` on a unit that belongs to a pool, where `keep(before, after)`
    holds (elementwise over the series' pairs)."""
    block = frame.block(name)
    if block is None:
        return
    for r, labels in enumerate(block.labels):
        unit = unit_of(labels)
        if unit not in units:
            continue
        row = block.values[r]
        present = ~np.isnan(row)
        t, v = frame.ts[present], row[present]
        for i in np.flatnonzero(keep(v[:-1], v[1:])) + 1:
            yield units[unit], unit[0], float(t[i]), float(v[i - 1]), float(v[i])


def _replica_changes(frame: Frame, units: dict[Unit, Pool]) -> dict[Pool, list[Change]]:
    """Per pool, the changes in how many instances report the concurrency signal."""
    running = frame.block(CONCURRENCY_SIGNAL)
    if running is None:
        return {}
    by_pool: dict[Pool, list[int]] = defaultdict(list)
    for r, labels in enumerate(running.labels):
        by_pool[units[unit_of(labels)]].append(r)
    return {
        pool: count_changes(frame.ts, (~np.isnan(running.values[rows])).sum(axis=0)) for pool, rows in by_pool.items()
    }


def raw_changes(frame: Frame) -> dict[Pool, list[Change]]:
    """Every config change and restart per instance, and replica count changes per pool."""
    units = _pool_units(frame)
    out: dict[Pool, list[Change]] = defaultdict(list)
    for name in CONFIG_GAUGES:
        for pool, instance, t, a, b in _unit_steps(frame, name, units, np.not_equal):
            out[pool].append(Change(t, "config", {name.removeprefix("engine_"): [a, b]}, [instance]))
    for name in COUNTERS + tuple(f"{h}_count" for h in HISTOGRAMS):
        for pool, instance, t, _, _ in _unit_steps(frame, name, units, np.greater):
            out[pool].append(Change(t, "restart", {}, [instance]))
    listed = list(units)
    started = new_process(per_instance(frame.block(START_TIME), listed, len(frame.ts)))
    for u, i in zip(*np.nonzero(started), strict=True):
        out[units[listed[u]]].append(Change(float(frame.ts[i + 1]), "restart", {}, [listed[u][0]]))
    for pool, changes in _replica_changes(frame, units).items():
        out[pool] += changes
    return {pool: merge(events, 3 * frame.step) for pool, events in out.items()}


def count_changes(ts: np.ndarray, count: np.ndarray) -> list[Change]:
    """Replica-count changes between runs of at least MIN_STABLE equal counts (0 is no count)."""
    runs, start = [], 0
    for i in range(1, len(count) + 1):
        if i == len(count) or count[i] != count[start]:
            if i - start >= MIN_STABLE and count[start] > 0:
                runs.append((start, int(count[start])))
            start = i
    return [
        Change(float(ts[s]), "replicas", {"replicas": [a, b]})
        for (_, a), (s, b) in zip(runs, runs[1:], strict=False)
        if a != b
    ]


def merge(events: list[Change], merge_s: float) -> list[Change]:
    """One event per cluster of events less than merge_s apart: the first time, the strongest kind,
    the union of diffs and instances."""
    out: list[Change] = []
    for e in sorted(events, key=lambda e: e.time):
        if out and e.time - out[-1].time < merge_s:
            last = out[-1]
            last.kind = min(last.kind, e.kind, key=KIND_ORDER.index)
            last.diff = {**e.diff, **last.diff}
            last.instances = sorted(set(last.instances) | set(e.instances))
        else:
            out.append(Change(e.time, e.kind, dict(e.diff), list(e.instances)))
    return out
