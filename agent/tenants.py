"""Who sent a request (a header, the body's `user`, or a hash of the API key, never the key), and a
bounded label set for it: the `max_tenants` busiest tenants, every other one `other`
(docs/requests.md)."""

from __future__ import annotations

import hashlib
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

OTHER = "other"
UNKNOWN = "unknown"
_SAFE = re.compile(r"[^A-Za-z0-9_.:@/-]")


def parse_tenant(headers: Mapping[str, str], body: Mapping[str, Any] | None, tenant_header: str | None) -> str:
    """The tenant id of one request (pure). `unknown` when nothing identifies the caller."""
    if tenant_header and (v := headers.get(tenant_header)):
        return clean_id(v)
    if body and isinstance(body.get("user"), str) and body["user"]:
        return clean_id(body["user"])
    auth = headers.get("Authorization") or headers.get("authorization") or ""
    bearer = auth[7:] if auth.lower().startswith("bearer ") and len(auth) > 7 else None
    if key := bearer or headers.get("api-key") or headers.get("x-api-key"):
        return "key-" + hashlib.sha256(key.strip().encode()).hexdigest()[:12]
    return UNKNOWN


def clean_id(v: str) -> str:
    """An id from a request (tenant, adapter name) as a label value: at most 64 characters of
    [A-Za-z0-9_.:@/-], every other character `_` (pure)."""
    return _SAFE.sub("_", v.strip())[:64] or UNKNOWN


class TenantLimiter:
    """Maps tenant ids to the `max_tenants` busiest (decayed request count) plus `other`. Memory:
    `max_tenants` counts + `sketch_size` sketch entries + at most `max_labels` labels handed out."""

    promote_ratio = 1.25  # an untracked tenant replaces the smallest tracked one past this ratio
    min_promote = 1.5  # ... and once it certainly sent this many requests' weight

    def __init__(
        self,
        max_tenants: int = 50,
        *,
        half_life_s: float = 300.0,
        max_labels: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_tenants = max_tenants
        self.sketch_size = max(64, 4 * max_tenants)
        self.max_labels = max_labels if max_labels is not None else 10 * max_tenants
        self._rate = math.log(2) / half_life_s
        self._clock = clock
        self._t0 = clock()
        self._tracked: dict[str, float] = {}  # tenant -> forward-decayed count
        self._sketch: dict[str, list[float]] = {}  # tenant -> [estimate, error]
        self._floor = 0.0  # largest estimate pruned from the sketch
        self._labelled: set[str] = set()  # every tenant that ever had a label
        self._low: tuple[str, float] | None = None  # cached smallest tracked (tenant, count)
        self._lock = threading.Lock()
        self.folded = 0  # requests counted as `other`
        self.stats: Counter[str] = Counter()

    def label(self, tenant: str) -> str:
        """The label for one request of `tenant` (its own name, or `other`), counting the request."""
        with self._lock:
            w = self._weight()
            if tenant in self._tracked:
                self._tracked[tenant] += w
                if self._low is not None and self._low[0] == tenant:
                    self._low = None  # counts only grow: only the smallest one moving changes the min
                return tenant
            if len(self._tracked) < self.max_tenants and self._may_label(tenant):
                est, _ = self._sketch.pop(tenant, (0.0, 0.0))
                self._admit(tenant, est + w)
                return tenant
            est, err = self._count_other(tenant, w)
            if self._tracked and self._may_label(tenant):
                low, low_count = self._smallest()
                sure = est - err  # requests it certainly sent (decayed)
                if sure > self.promote_ratio * low_count and sure >= self.min_promote * w:
                    self._demote(low, low_count)
                    del self._sketch[tenant]
                    self._admit(tenant, est)
                    self.stats["promoted"] += 1
                    return tenant
            self.folded += 1
            return OTHER

    def tracked(self) -> dict[str, float]:
        """Tracked tenants and their decayed request counts (as of now), busiest first."""
        with self._lock:
            scale = math.exp(-self._rate * (self._clock() - self._t0))
            return dict(sorted(((t, c * scale) for t, c in self._tracked.items()), key=lambda kv: -kv[1]))

    def __len__(self) -> int:
        """Entries held (tracked + sketch): the memory bound."""
        return len(self._tracked) + len(self._sketch)

    def _weight(self) -> float:
        """Forward decay: an event at t weighs exp(rate * (t - t0)); rebase before floats overflow."""
        x = self._rate * (self._clock() - self._t0)
        if x > 300:
            shrink = math.exp(-x)
            self._tracked = {t: c * shrink for t, c in self._tracked.items()}
            self._sketch = {t: [e * shrink, r * shrink] for t, (e, r) in self._sketch.items()}
            self._floor *= shrink
            self._low = None
            self._t0 = self._clock()
            x = 0.0
        return math.exp(x)

    def _may_label(self, tenant: str) -> bool:
        if tenant in self._labelled or len(self._labelled) < self.max_labels:
            return True
        self.stats["label_budget_spent"] += 1
        return False

    def _smallest(self) -> tuple[str, float]:
        if self._low is None:
            self._low = min(self._tracked.items(), key=lambda kv: kv[1])
        return self._low

    def _admit(self, tenant: str, count: float) -> None:
        self._tracked[tenant] = count
        self._low = None
        self._labelled.add(tenant)

    def _demote(self, tenant: str, count: float) -> None:
        del self._tracked[tenant]
        self._low = None
        self._sketch[tenant] = [count, 0.0]
        self.stats["demoted"] += 1
        self._prune()

    def _count_other(self, tenant: str, w: float) -> tuple[float, float]:
        entry = self._sketch.get(tenant)
        if entry is None:
            entry = self._sketch[tenant] = [self._floor + w, self._floor]
            self._prune()
        else:
            entry[0] += w
        return entry[0], entry[1]

    def _prune(self) -> None:
        """Over `sketch_size`: keep the busier half; the largest pruned estimate becomes the floor
        (error bound) for ids that arrive later (amortised O(log n) per new id)."""
        if len(self._sketch) <= self.sketch_size:
            return
        ranked = sorted(self._sketch.items(), key=lambda kv: -kv[1][0])
        keep = self.sketch_size // 2
        self._floor = max(self._floor, ranked[keep][1][0])
        self._sketch = dict(ranked[:keep])
