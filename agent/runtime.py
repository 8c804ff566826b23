"""The agent loop: run every enabled collector each interval, derive, store, and keep the state
the HTTP server exposes. A collector that raises, hangs or cannot be built is reported down with a
reason in `kvscope_collector_status` (README.md) and the others go on; so does a failed cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import logging
import math
import pkgutil
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvscope.agent import collectors as collectors_pkg
from kvscope.agent.collectors.base import Collection, Collector, Health, registered_collectors
from kvscope.agent.config import AgentConfig
from kvscope.agent.derive.hooks import DeriveHook
from kvscope.agent.ratelog import ChangeLog, warn_every
from kvscope.core.signals import Labels, NameTest, Sample, make_labels

log = logging.getLogger("kvscope.agent")

_MODULE_ERRORS: dict[str, str] = {}
GC_YOUNG_THRESHOLD = 10_000
"""Net allocations between two collections of the youngest generation once the agent runs."""

EXTENSION_MODULES = {
    "otlp": "kvscope.agent.traces.receiver",
    "tap": "kvscope.agent.tap.collector",
    "kv_events": "kvscope.agent.kvevents.subscriber",
}
"""Collector -> its module, for collectors beside their own subsystem (not in agent/collectors/);
each registers a config section of its name and runs only when the config has that section."""


def load_collector_modules() -> dict[str, str]:
    """Import every module of kvscope.agent.collectors so that they register themselves.

    Returns module -> error for modules that failed to import (reported, never fatal).
    """
    names = [
        f"kvscope.agent.collectors.{info.name}"
        for info in pkgutil.iter_modules(collectors_pkg.__path__)
        if info.name != "base" and not info.name.startswith("_")
    ]
    for module in (*names, *EXTENSION_MODULES.values()):
        short = module.rsplit(".", 1)[-1] if module.startswith("kvscope.agent.collectors.") else module
        if short in _MODULE_ERRORS:
            continue
        try:
            importlib.import_module(module)
        except Exception as e:  # a broken optional collector must not stop the agent
            _MODULE_ERRORS[short] = f"import_{type(e).__name__}"
            log.warning("collector module %s failed to import: %s", module, e)
    return dict(_MODULE_ERRORS)


def known_collectors() -> dict[str, bool]:
    """Registered collector name -> enabled by default (after importing all modules)."""
    load_collector_modules()
    return {name: default for name, (_, default) in registered_collectors().items()}


class _BrokenCollector:
    """Stands in for a collector that could not be built; reports why each cycle."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason

    async def collect(self) -> Collection:
        return Collection(health=[Health(collector=self.name, up=False, reason=self.reason)])

    async def close(self) -> None:
        return None


def build_collectors(config: AgentConfig) -> list[Collector]:
    """Instantiate every enabled registered collector with the agent config."""
    out: list[Collector] = [_BrokenCollector(module, reason) for module, reason in load_collector_modules().items()]
    for name, (factory, default) in sorted(registered_collectors().items()):
        if name in EXTENSION_MODULES and name not in config.extensions:
            continue  # a subsystem with no config section stays off (and out of the health list)
        if not config.collector_enabled(name, default):
            continue
        try:
            out.append(factory(config))
        except Exception as e:
            log.warning("collector %s could not start: %s", name, e)
            out.append(_BrokenCollector(name, f"init_{type(e).__name__}"))
    return out


@dataclass
class AgentState:
    """Latest view of everything collected; the server renders /metrics and the API from it."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)  # collector -> samples
    health: dict[str, list[Health]] = field(default_factory=dict)  # collector -> health
    collector_status: dict[str, tuple[bool, str, float]] = field(default_factory=dict)  # up, reason, s
    facts: dict[str, dict[str, str]] = field(default_factory=dict)  # instance -> facts
    engines: dict[str, str | None] = field(default_factory=dict)  # instance -> engine
    jobs: dict[str, str] = field(default_factory=dict)  # instance -> job
    scrape_errors: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (job, inst, reason)
    dropped: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (coll, inst, reason)
    closed: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (coll, inst, reason): totals
    counter_resets: Counter[str] = field(default_factory=Counter)  # instance -> resets seen
    exports: Counter[tuple[str, str]] = field(default_factory=Counter)  # (exporter, result): pushes
    exported_points: Counter[str] = field(default_factory=Counter)  # exporter -> points accepted
    cycles: int = 0
    cycles_skipped: int = 0  # ticks missed because a cycle overran the interval
    last_cycle_s: float = 0.0
    last_cycle_end: float | None = None
    store_stats: Any = None  # StoreStats after the cycle
    version: int = 0

    def canonical_samples(self) -> list[Sample]:
        return [s for samples in self.samples.values() for s in samples]


class CounterResets:
    """Counts decreases of canonical counters per instance (an engine restart, usually).

    A counter is compared with its value in the previous cycle (where a series comes twice in a
    cycle, the last one wins).
    """

    def __init__(self) -> None:
        self._counter = NameTest(lambda name: name.endswith(("_total", "_count")), 100_000)  # name -> is a counter
        self._prev: dict[tuple[str, Labels], float] = {}

    def observe(self, samples: Iterable[Sample], into: Counter[str]) -> None:
        """Add one to `into[instance]` for each instance a counter of this cycle went down on."""
        resets: set[str] = set()
        seen: dict[tuple[str, Labels], float] = {}
        for s in samples:
            if self._counter[s[0]]:
                before = self._prev.get((s[0], s[1]))
                if before is not None and s[2] < before:
                    resets.add(dict(s[1]).get("instance", ""))
                seen[(s[0], s[1])] = s[2]
        self._prev = seen
        into.update(resets)  # one per instance per cycle


def freeze_startup_objects() -> None:
    """Freeze what is alive after the first cycle (it lives as long as the process) and collect the
    youngest generation every 10k net allocations instead of 700 (docs/performance.md)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


class AgentRuntime:
    """Runs collectors on a fixed cadence, feeds derive hooks and the store, keeps `state`."""

    def __init__(
        self,
        config: AgentConfig,
        collectors: Sequence[Collector],
        store: Any,
        derive: Sequence[DeriveHook] = (),
        clock: Callable[[], float] = time.time,
        freeze_gc: bool = False,
    ) -> None:
        """`freeze_gc`: `freeze_startup_objects` after the first cycle (process-wide: only the
        `kvscope agent` process asks for it)."""
        self.freeze_gc = freeze_gc
        self.config = config
        self.collectors = list(collectors)
        self.store = store
        self.derive = list(derive)
        self.clock = clock
        self.state = AgentState(jobs={t.instance: t.job for t in config.targets})
        self._resets = CounterResets()
        self._stop = asyncio.Event()
        self._urls = {t.instance: t.url for t in config.targets}
        self.changes = ChangeLog(log)
        """Logs each target's and collector's state changes (down with reason, up again)."""

    async def run_cycle(self) -> None:
        """Collect once from every collector (concurrently), then derive and store."""
        t0 = time.monotonic()
        results = await asyncio.gather(*(self._collect_one(c) for c in self.collectors))
        cycle: list[Sample] = []
        for collector, (collection, status) in zip(self.collectors, results, strict=True):
            self._absorb(collector.name, collection, status)
            cycle.extend(collection.samples)
        self._resets.observe(cycle, self.state.counter_resets)
        now = self.clock()
        cycle.extend(self._target_up_samples(now))
        derived = self._derived(cycle)
        self.state.samples["derive"] = derived  # catalog signals among them are re-exported too
        cycle.extend(derived)
        self._store(cycle)
        if self.store is not None:
            failing = (st := self.store.snapshot()).failing  # no disk I/O: stays on the loop
            self.state.store_stats = st
            self.state.collector_status["store"] = (not failing, f"write_{failing}" if failing else "ok", 0.0)
        self.state.cycles += 1
        self.state.last_cycle_s = time.monotonic() - t0
        self.state.last_cycle_end = now
        self.state.version += 1

    async def _collect_one(self, collector: Collector) -> tuple[Collection, tuple[bool, str, float]]:
        limit = max(self.config.interval_s, self.config.timeout_s + 1.0)
        t0 = time.monotonic()
        try:
            collection = await asyncio.wait_for(collector.collect(), timeout=limit)
        except TimeoutError:
            return Collection(), (False, "collect_timeout", time.monotonic() - t0)
        except Exception as e:  # the agent never dies on a collector bug
            log.warning("collector %s raised: %r", collector.name, e)
            return Collection(), (False, f"exception_{type(e).__name__}", time.monotonic() - t0)
        own = [h for h in collection.health if not h.target]
        up = all(h.up for h in own)
        reason = next((h.reason for h in own if not h.up), "")
        return collection, (up, reason or "ok", time.monotonic() - t0)

    def _absorb(self, name: str, collection: Collection, status: tuple[bool, str, float]) -> None:
        st = self.state
        st.collector_status[name] = status
        self.changes.observe(f"collector:{name}", f"collector {name}", status[0], status[1])
        health = collection.health or self._unfinished(name, status)
        st.samples[name] = collection.samples
        st.health[name] = health
        st.facts.update(collection.facts)
        st.engines.update(collection.engines)
        for h in health:
            if h.target:
                what = f"target {self._urls.get(h.target, h.target)} ({name})"
                self.changes.observe(f"target:{name}:{h.target}", what, h.up, h.reason)
                for reason, n in h.errors.items():
                    st.scrape_errors[(st.jobs.get(h.target, name), h.target, reason)] += n
            for reason, n in h.dropped.items():
                st.dropped[(name, h.target, reason)] += n
            st.closed.update({(name, h.target, reason): n for reason, n in h.closed.items()})

    def _unfinished(self, name: str, status: tuple[bool, str, float]) -> list[Health]:
        """A collection that did not finish (it timed out or raised) reports nothing of its own:
        each target it had is down this cycle with the collector's reason and one scrape error,
        so `kvscope_target_up` reads 0 instead of vanishing for a cycle."""
        if status[0]:
            return []
        reason = status[1]
        return [
            Health(name, h.target, up=False, reason=reason, errors=Counter({reason: 1}))
            for h in self.state.health.get(name, [])
            if h.target
        ]

    def _target_up_samples(self, now: float) -> list[Sample]:
        """`kvscope_target_up` history for the store (as replay produces it from recordings)."""
        out = []
        for healths in self.state.health.values():
            for h in healths:
                if h.target:
                    labels = make_labels({"job": self.state.jobs.get(h.target, h.collector), "instance": h.target})
                    out.append(Sample("kvscope_target_up", labels, 1.0 if h.up else 0.0, now))
        return out

    def _derived(self, cycle: list[Sample]) -> list[Sample]:
        out: list[Sample] = []
        for hook in self.derive:
            name = f"derive_{getattr(hook, '__name__', 'hook')}"
            try:
                out.extend(hook(cycle))
                self.state.collector_status[name] = (True, "ok", 0.0)
                for reason, n in getattr(hook, "dropped", {}).items():  # bad items it skipped
                    self.state.dropped[(name, "", reason)] = n
            except Exception as e:
                log.warning("derive hook %s raised: %r", name, e)
                self.state.collector_status[name] = (False, f"exception_{type(e).__name__}", 0.0)
        return out

    def _store(self, samples: list[Sample]) -> None:
        if self.store is None or not samples:
            return
        try:
            self.store.write(samples)
        except Exception as e:
            log.warning("store write failed: %r", e)
            self.state.dropped[("store", "", f"exception_{type(e).__name__}")] += len(samples)

    async def run(self) -> None:
        """Cycle every `interval_s` until `stop()`; ticks missed by a long cycle are skipped and
        counted (`cycles_skipped`, warned at most once a minute)."""
        interval = self.config.interval_s
        next_tick = time.monotonic()
        while not self._stop.is_set():
            try:
                await self.run_cycle()
                if "cycle" in self.state.collector_status:
                    self.state.collector_status["cycle"] = (True, "ok", 0.0)
            except Exception as e:  # noqa: BLE001 - a bug in one cycle must not stop the agent
                warn_every(log, f"cycle:{type(e).__name__}", "collection cycle failed: %r; the next runs on time", e)
                self.state.collector_status["cycle"] = (False, f"exception_{type(e).__name__}", 0.0)
                self.state.version += 1
            if self.state.cycles == 1 and self.freeze_gc:
                freeze_startup_objects()
            next_tick += interval
            now = time.monotonic()
            if next_tick < now:
                missed = math.ceil((now - next_tick) / interval)
                next_tick += missed * interval
                self.state.cycles_skipped += missed
                self.state.version += 1
                warn_every(
                    log,
                    "cycle:overrun",
                    "a collection cycle took %.2f s, longer than scrape.interval_s=%g: %d tick(s) skipped (%d so far)",
                    self.state.last_cycle_s,
                    interval,
                    missed,
                    self.state.cycles_skipped,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=next_tick - now)

    def stop(self) -> None:
        self._stop.set()

    async def close(self) -> None:
        """Close collectors, then the store (which flushes)."""
        for c in self.collectors:
            try:
                await c.close()
            except Exception as e:
                log.warning("collector %s failed to close: %r", c.name, e)
        if self.store is not None:
            self.store.close()
