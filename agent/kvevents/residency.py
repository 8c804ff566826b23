"""Block residency and churn from KV events (002 §7.4 LRU failure, §7.7 "KV residency time"):
the residency of every evicted block, hashes evicted then stored again within `churn_window_s`
(recomputed), and evictions of hot blocks (reused, or recomputed `hot_min_uses` times); the
definitions are in docs/requests.md §4. Memory: at most `max_blocks` resident and `max_blocks`
recently evicted hashes (oldest dropped, counted).
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from kvscope.agent.kvevents.events import KvEvent
from kvscope.agent.metricsets import RESIDENCY_BUCKETS, CounterSet, HistogramSet
from kvscope.core.signals import Sample, make_labels


@dataclass
class _Resident:
    stored_ts: float
    uses: int  # reuses + recomputations seen for this hash


class ResidencyTracker:
    """Consumes KV events of one engine instance and keeps the churn / residency series."""

    def __init__(
        self, instance: str, churn_window_s: float = 300.0, hot_min_uses: int = 2, max_blocks: int = 200_000
    ) -> None:
        self.instance = instance
        self.churn_window_s, self.hot_min_uses = churn_window_s, hot_min_uses
        self.max_blocks = max_blocks
        self._resident: OrderedDict[tuple[int | None, object], _Resident] = OrderedDict()
        self._evicted: OrderedDict[tuple[int | None, object], tuple[float, int]] = OrderedDict()
        self.stored = CounterSet("kv_blocks_stored_total")
        self.removed = CounterSet("kv_blocks_removed_total")
        self.recomputed = CounterSet("kv_blocks_evicted_recomputed_total")
        self.hot_evicted = CounterSet("kv_hot_blocks_evicted_total")
        self.residency = HistogramSet("kv_block_residency_seconds", RESIDENCY_BUCKETS)
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _labels(self, dp: int | None, medium: str | None = None) -> tuple[tuple[str, str], ...]:
        lab = {"instance": self.instance}
        if dp is not None:
            lab["dp_rank"] = str(dp)
        if medium:
            lab["medium"] = medium
        return make_labels(lab)

    def apply(self, events: Iterable[KvEvent]) -> None:
        with self._lock:
            for ev in events:
                if ev.kind == "stored":
                    self._stored(ev)
                elif ev.kind == "removed":
                    self._removed(ev)
                else:
                    self._resident = OrderedDict((k, v) for k, v in self._resident.items() if k[0] != ev.dp_rank)
                    self.stats["cleared"] += 1

    def _stored(self, ev: KvEvent) -> None:
        self.stored.inc(self._labels(ev.dp_rank, ev.medium), len(ev.block_hashes))
        base = self._labels(ev.dp_rank)
        self.recomputed.inc(base, 0)  # the source supports them: present at 0, not absent
        self.hot_evicted.inc(base, 0)
        for h in ev.block_hashes:
            key = (ev.dp_rank, h)
            res = self._resident.get(key)
            if res is not None:  # reuse report (kv_cache_report_mode=full)
                res.uses += 1
                self._resident.move_to_end(key)
                continue
            uses = 0
            if (gone := self._evicted.pop(key, None)) is not None and ev.ts - gone[0] <= self.churn_window_s:
                uses = gone[1] + 1
                self.recomputed.inc(base)
            self._resident[key] = _Resident(ev.ts, uses)
            self._bound(self._resident, "resident_overflow")

    def _removed(self, ev: KvEvent) -> None:
        self.removed.inc(self._labels(ev.dp_rank, ev.medium), len(ev.block_hashes))
        for h in ev.block_hashes:
            key = (ev.dp_rank, h)
            res = self._resident.pop(key, None)
            if res is None:
                self.stats["removed_unknown"] += 1  # stored before we subscribed
                continue
            self.residency.observe(self._labels(ev.dp_rank), max(0.0, ev.ts - res.stored_ts))
            if res.uses >= self.hot_min_uses:
                self.hot_evicted.inc(self._labels(ev.dp_rank))
            self._evicted[key] = (ev.ts, res.uses)
            self._bound(self._evicted, "evicted_overflow")

    def _bound(self, table: OrderedDict, reason: str) -> None:
        while len(table) > self.max_blocks:
            table.popitem(last=False)
            self.stats[reason] += 1

    def render_samples(self, timestamp: float | None = None) -> list[Sample]:
        with self._lock:
            families = (self.stored, self.removed, self.recomputed, self.hot_evicted, self.residency)
            return [s for fam in families for s in fam.render(timestamp)]
