"""Cumulative histograms and counters keyed by label sets, rendered as flattened canonical samples.

The trace receiver, the request tap and the KV-event subscriber observe values on their own
threads/loops and a collector renders them; one lock keeps an observation and a render apart.
Bucket boundaries are the OpenTelemetry GenAI semantic-convention advisories.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections.abc import Sequence

from kvscope.core.signals import Labels, Sample

GENAI_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
"""`gen_ai.server.time_to_first_token` explicit bucket boundaries (seconds)."""

GENAI_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
"""`gen_ai.server.time_per_output_token` explicit bucket boundaries (seconds)."""

PHASE_BUCKETS = GENAI_TTFT_BUCKETS + (20.48, 40.96, 81.92)
"""Request phases: the TTFT boundaries (1 ms .. 10 s, where queue, prefill and KV transfer live)
extended by the top of `gen_ai.server.request.duration` (20.48 .. 81.92 s) for long decodes."""

RESIDENCY_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
"""KV block residency: milliseconds (churn) up to half an hour (a warm shared prefix)."""


class HistogramSet:
    """One histogram family: per label set, bucket counts, sum and count (cumulative, never reset)."""

    def __init__(self, name: str, buckets: Sequence[float], max_series: int = 2000) -> None:
        self.name = name
        self.bounds = tuple(sorted(buckets))
        self.max_series = max_series
        self.dropped = 0  # observations refused because max_series was reached
        self._series: dict[Labels, list[float]] = {}  # labels -> [b0..bn, +Inf, sum]
        self._lock = threading.Lock()

    def observe(self, labels: Labels, *values: float) -> None:
        """Count `values` under `labels` (NaN and negative ones refused): one lock and one series
        lookup for all of them, as for a stream's token gaps."""
        kept = [v for v in values if v >= 0]  # NaN compares false
        if not kept:
            return
        with self._lock:
            row = self._series.get(labels)
            if row is None:
                if len(self._series) >= self.max_series:
                    self.dropped += len(kept)
                    return
                row = self._series[labels] = [0.0] * (len(self.bounds) + 2)
            bounds = self.bounds
            for v in kept:
                row[bisect_left(bounds, v)] += 1
            row[-1] += sum(kept)

    def render(self, timestamp: float | None = None) -> list[Sample]:
        """`_bucket{le}` (cumulative), `_sum`, `_count` samples for every label set."""
        out: list[Sample] = []
        with self._lock:
            rows = [(lab, list(row)) for lab, row in self._series.items()]
        for labels, row in rows:
            cum = 0.0
            for bound, n in zip((*self.bounds, math.inf), row[:-1], strict=True):
                cum += n
                le = "+Inf" if math.isinf(bound) else repr(float(bound))
                out.append(Sample(self.name + "_bucket", tuple(sorted((*labels, ("le", le)))), cum, timestamp))
            out.append(Sample(self.name + "_sum", labels, row[-1], timestamp))
            out.append(Sample(self.name + "_count", labels, cum, timestamp))
        return out


class CounterSet:
    """One counter family keyed by label sets (cumulative)."""

    def __init__(self, name: str, max_series: int = 2000) -> None:
        self.name = name
        self.max_series = max_series
        self.dropped = 0
        self._values: dict[Labels, float] = {}
        self._lock = threading.Lock()

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        if amount != amount or amount < 0:
            return
        with self._lock:
            if labels not in self._values and len(self._values) >= self.max_series:
                self.dropped += 1
                return
            self._values[labels] = self._values.get(labels, 0.0) + amount

    def render(self, timestamp: float | None = None) -> list[Sample]:
        with self._lock:
            return [Sample(self.name, lab, v, timestamp) for lab, v in self._values.items()]


class GroupFamilies:
    """The per-request families of one grouping label (`tenant`, `adapter`) under `<group>_*`
    names (docs/requests.md): requests, errors, prompt / completion / cached tokens, in-flight
    seconds, TTFT and token gaps. The tap fills every one (agent/tap/groups.py), the trace receiver
    the ones spans carry (agent/traces/tenants.py); a family nothing fed renders nothing."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.requests = CounterSet(f"{group}_requests_total")
        self.errors = CounterSet(f"{group}_request_errors_total")
        self.prompt_tokens = CounterSet(f"{group}_prompt_tokens_total")
        self.completion_tokens = CounterSet(f"{group}_completion_tokens_total")
        self.cached_tokens = CounterSet(f"{group}_cached_tokens_total")
        self.request_seconds = CounterSet(f"{group}_request_seconds_total")
        self.ttft = HistogramSet(f"{group}_ttft_seconds", GENAI_TTFT_BUCKETS)
        self.itl = HistogramSet(f"{group}_itl_seconds", GENAI_TPOT_BUCKETS)

    def render(self, timestamp: float | None = None) -> list[Sample]:
        """Every family's samples."""
        out: list[Sample] = []
        for fam in (
            self.requests,
            self.errors,
            self.prompt_tokens,
            self.completion_tokens,
            self.cached_tokens,
            self.request_seconds,
            self.ttft,
            self.itl,
        ):
            out.extend(fam.render(timestamp))
        return out
