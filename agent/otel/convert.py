"""kvscope's metrics as the OpenTelemetry SDK's `MetricsData`, ready for an SDK exporter.

Input is what `/metrics` renders (agent/serve/export.py `Family`: canonical `kvscope_*` families
and the agent's self-health) plus the GenAI server histograms (agent/otel/genai.py). A gauge
becomes a `Gauge`, a counter a monotonic `Sum`, a histogram a `Histogram` (Prometheus labels are
the attributes, names unchanged, so a Prometheus-compatible receiver reads the same series back).

Temporality: cumulative points carry the time the series was first seen (or last reset) as their
start; delta points carry the increase since the previous export, a counter that went down (an
engine restart) starting afresh from its new value. The first delta of a series is its whole
value since it was first seen, so nothing is lost.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from kvscope.agent.otel.genai import BucketSeries, Convention, HistogramPoint
from kvscope.agent.serve.export import Family

SCOPE = InstrumentationScope("kvscope.agent")
_UNITS = {"seconds": "s", "bytes": "By", "ratio": "1"}
_Key = tuple[str, tuple[tuple[str, Any], ...]]


class Converter:
    """Keeps what temporality needs between exports (start times, previous values)."""

    def __init__(
        self, temporality: str = "cumulative", resource: Resource | None = None, started_ns: int | None = None
    ) -> None:
        """`started_ns`: the start of series seen at the first export (default: now)."""
        if temporality not in ("cumulative", "delta"):
            raise ValueError(f"temporality must be cumulative or delta, got {temporality!r}")
        self.delta = temporality == "delta"
        self.temporality = AggregationTemporality.DELTA if self.delta else AggregationTemporality.CUMULATIVE
        self.resource = resource or Resource.create({"service.name": "kvscope-agent"})
        self._start: dict[_Key, int] = {}
        self._prev: dict[_Key, Any] = {}
        self._last_export = started_ns if started_ns is not None else time.time_ns()

    def metrics_data(
        self,
        families: Iterable[Family],
        genai: dict[Convention, list[HistogramPoint]],
        now_ns: int,
        max_points: int = 0,
    ) -> tuple[MetricsData, int, int]:
        """(MetricsData, points kept, points dropped by `max_points`; 0 = no cap)."""
        metrics: list[Metric] = []
        budget = [max_points or math.inf, 0]  # left, dropped
        for conv, points in genai.items():
            hists = [self._histogram(conv.name, p.attributes, p, now_ns) for p in points]
            metrics += self._metric(conv.name, conv.description, conv.unit, "histogram", hists, budget)
        for fam in families:
            metrics += self._family(fam, now_ns, budget)
        self._last_export = now_ns
        kept = sum(len(m.data.data_points) for m in metrics)
        scope = ScopeMetrics(scope=SCOPE, metrics=metrics, schema_url="")
        data = MetricsData(resource_metrics=[ResourceMetrics(self.resource, [scope], schema_url="")])
        return data, kept, int(budget[1])

    def _metric(self, name: str, help_: str, unit: str, kind: str, points: Sequence[Any], budget: list) -> list[Metric]:
        points = [p for p in points if p is not None]
        if len(points) > budget[0]:
            budget[1] += len(points) - int(budget[0])
            points = points[: int(budget[0])]
        budget[0] -= len(points)
        if not points:
            return []
        data: Any
        if kind == "gauge":
            data = Gauge(data_points=points)
        elif kind == "counter":
            data = Sum(data_points=points, aggregation_temporality=self.temporality, is_monotonic=True)
        else:
            data = Histogram(data_points=points, aggregation_temporality=self.temporality)
        return [Metric(name=name, description=help_, unit=unit, data=data)]

    def _family(self, fam: Family, now_ns: int, budget: list) -> list[Metric]:
        unit = next((u for suffix, u in _UNITS.items() if fam.name.endswith("_" + suffix)), "")
        if fam.kind != "histogram":
            numbers = [self._number(fam.name, fam.kind, labels, value, now_ns) for _, labels, value in fam.lines]
            return self._metric(fam.name, fam.help, unit, fam.kind, numbers, budget)
        series: dict[tuple[tuple[str, str], ...], BucketSeries] = defaultdict(BucketSeries)
        for name, labels, value in fam.lines:
            base = tuple(kv for kv in labels if kv[0] != "le")
            series[base].add(base, name[len(fam.name) :], dict(labels).get("le", "+Inf"), value)
        points: list[HistogramDataPoint | None] = []
        for base, acc in series.items():
            hist = acc.point(base)  # a series that is not a whole cumulative histogram: no point
            points.append(None if isinstance(hist, str) else self._histogram(fam.name, base, hist, now_ns))
        return self._metric(fam.name, fam.help, unit, "histogram", points, budget)

    def _number(self, name: str, kind: str, labels: tuple, value: float, now_ns: int) -> NumberDataPoint | None:
        if not math.isfinite(value):
            return None
        attrs = dict(labels)
        if kind == "gauge":
            return NumberDataPoint(attributes=attrs, start_time_unix_nano=0, time_unix_nano=now_ns, value=value)
        key = (name, labels)
        prev = self._prev.get(key)
        reset = prev is not None and value < prev
        start = self._start_of(key, reset)
        self._prev[key] = value
        if self.delta:
            value = value if prev is None or reset else value - prev
            start = self._last_export if prev is not None and not reset else start
        return NumberDataPoint(attributes=attrs, start_time_unix_nano=start, time_unix_nano=now_ns, value=value)

    def _histogram(self, name: str, attrs: tuple, p: HistogramPoint, now_ns: int) -> HistogramDataPoint:
        key = (name, attrs)
        prev: HistogramPoint | None = self._prev.get(key)
        usable = prev is not None and prev.bounds == p.bounds
        reset = usable and (p.count < prev.count or any(a < b for a, b in zip(p.counts, prev.counts, strict=True)))  # type: ignore[union-attr]
        start = self._start_of(key, reset or (prev is not None and not usable))
        self._prev[key] = p
        counts, total, count = p.counts, p.total, p.count
        if self.delta and usable and not reset:
            assert prev is not None
            counts = tuple(a - b for a, b in zip(p.counts, prev.counts, strict=True))
            total, count, start = p.total - prev.total, p.count - prev.count, self._last_export
        return HistogramDataPoint(
            attributes=dict(attrs),
            start_time_unix_nano=start,
            time_unix_nano=now_ns,
            count=count,
            sum=total,
            bucket_counts=list(counts),
            explicit_bounds=list(p.bounds),
            min=None,  # type: ignore[arg-type]  # unknown from buckets: left out of the OTLP point
            max=None,  # type: ignore[arg-type]
        )

    def _start_of(self, key: _Key, reset: bool) -> int:
        if reset or key not in self._start:  # new or restarted since the last export
            self._start[key] = self._last_export
        return self._start[key]
