"""Per-tenant accounting from stitched traces: the tap's `tenant_*` counters without a tap.

A fleet that sends traces but runs no request tap still gets per-tenant usage: every stitched
request whose spans carry a tenant (`kvscope.tenant`, `tenant`, `tenant.id`, `enduser.id`,
`user.id` on a span or its resource, or `tenant` in `otlp.service_labels`; see stitch.py) adds to
the same canonical series the tap produces and the fairness analytics read:

Series carry `instance` (the engine that ran the request, when the trace names it) next to
`tenant`, so they never collide with the tap's series (tenant only) in one agent; consumers sum
over instances (PromQL `sum by (tenant)`, `parse_tenant_usage`).

* `tenant_requests_total{tenant}`            one per stitched request (P/D pair = one request);
* `tenant_prompt_tokens_total{tenant}`       `gen_ai.usage.prompt_tokens` of the engine span;
* `tenant_cached_tokens_total{tenant}`       `gen_ai.usage.cached_tokens` (SGLang sets it; vLLM's
                                             `llm_request` span does not: absent, never 0);
* `tenant_ttft_seconds{tenant}`              the engine's `gen_ai.latency.time_to_first_token`
                                             (server-side; the tap measures client-side).

Traces that contain the request tap's own span (instrumentation scope `kvscope.tap`) are skipped:
the tap already counted those requests, and counting them twice would double every tenant total.
Records without a tenant are not counted. Tenant labels are bounded by the same traffic-ranked
`TenantLimiter` as the tap's (top `max_tenants` + `other`). Only numbers are kept, never text.
"""

from __future__ import annotations

import threading
from collections import Counter

from kvscope.agent.metricsets import GENAI_TTFT_BUCKETS, CounterSet, HistogramSet
from kvscope.agent.signals import Sample, make_labels
from kvscope.agent.tenants import TenantLimiter
from kvscope.agent.traces.stitch import RequestRecord

TAP_SCOPE = "kvscope.tap"
"""Instrumentation scope of the request tap's spans (agent/tap/proxy.py)."""


class TenantAccounting:
    """Cumulative per-tenant counters and TTFT histogram fed with stitched request records."""

    def __init__(self, max_tenants: int = 50) -> None:
        self.limiter = TenantLimiter(max_tenants)
        self.requests = CounterSet("tenant_requests_total")
        self.prompt_tokens = CounterSet("tenant_prompt_tokens_total")
        self.cached_tokens = CounterSet("tenant_cached_tokens_total")
        self.ttft = HistogramSet("tenant_ttft_seconds", GENAI_TTFT_BUCKETS)
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
        with self._lock:
            self.requests.inc(lab)
            if record.prompt_tokens is not None:
                self.prompt_tokens.inc(lab, record.prompt_tokens)
            if record.cached_tokens is not None:
                self.cached_tokens.inc(lab, record.cached_tokens)
            if record.ttft_s is not None:
                self.ttft.observe(lab, record.ttft_s)
        self.stats["accounted"] += 1
        return True

    def render(self, timestamp: float | None = None) -> list[Sample]:
        """The tenant series (cumulative; absent families render nothing)."""
        with self._lock:
            out: list[Sample] = []
            for fam in (self.requests, self.prompt_tokens, self.cached_tokens, self.ttft):
                out.extend(fam.render(timestamp))
            return out
