"""Per-tenant accounting from stitched traces: the tap's `tenant_*` counters without a tap.

Every stitched request whose spans name a tenant (stitch.py) adds to `tenant_requests_total`,
`tenant_prompt_tokens_total`, `tenant_cached_tokens_total` (absent where the span lacks it) and
`tenant_ttft_seconds`, labelled `tenant` and `instance` (the tap's carry `tenant` only, so they
never collide). Traces holding the tap's own span (scope `kvscope.tap`) are skipped: the tap
counted them. Tenants are bounded by the tap's `TenantLimiter` (top `max_tenants` + `other`)."""

from __future__ import annotations

import threading
from collections import Counter

from kvscope.agent.metricsets import GroupFamilies
from kvscope.agent.tenants import TenantLimiter
from kvscope.agent.traces.stitch import RequestRecord
from kvscope.core.signals import Sample, make_labels


class TenantAccounting:
    """Cumulative per-tenant counters and TTFT histogram fed with stitched request records."""

    def __init__(self, max_tenants: int = 50) -> None:
        self.limiter = TenantLimiter(max_tenants)
        self.series = GroupFamilies("tenant")  # the tap's tenant families; spans fill four of them
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()

    def observe(self, record: RequestRecord) -> bool:
        """Count one stitched request; False (and counted in `stats`) when it is not accounted."""
        if record.tenant is None:
            self.stats["no_tenant"] += 1
            return False
        if record.tapped:
            self.stats["counted_by_tap"] += 1
            return False
        lab = make_labels(
            {"tenant": self.limiter.label(record.tenant)} | ({"instance": record.instance} if record.instance else {})
        )
        series = self.series
        with self._lock:
            series.requests.inc(lab)
            if record.prompt_tokens is not None:
                series.prompt_tokens.inc(lab, record.prompt_tokens)
            if record.cached_tokens is not None:
                series.cached_tokens.inc(lab, record.cached_tokens)
            if record.ttft_s is not None:
                series.ttft.observe(lab, record.ttft_s)
        self.stats["accounted"] += 1
        return True

    def render(self, timestamp: float | None = None) -> list[Sample]:
        """The tenant series (cumulative; absent families render nothing)."""
        with self._lock:
            return self.series.render(timestamp)
