"""OpenTelemetry GenAI model-server metrics from kvscope's canonical engine histograms.

The conventions (OpenTelemetry semantic conventions, "Generative AI model server metrics") define
three server histograms; each is built from one canonical signal whose meaning is the same:

| convention                             | unit | canonical signal        |
|----------------------------------------|------|-------------------------|
| `gen_ai.server.request.duration`       | s    | `request_e2e_seconds`   |
| `gen_ai.server.time_to_first_token`    | s    | `request_ttft_seconds`  |
| `gen_ai.server.time_per_output_token`  | s    | `request_tpot_seconds`  |

An engine histogram is already aggregated (cumulative bucket counts), so no observation is
re-recorded: the OTel API has no observable histogram, and re-recording would invent values.
The points are written as the SDK's own `HistogramDataPoint`s (agent/otel/convert.py). Bucket
boundaries follow the conventions' advice exactly when the engine's boundaries contain every
advised boundary (merging buckets is exact: vLLM's and SGLang's TTFT buckets do); otherwise the
engine's own boundaries are kept, since splitting a bucket would invent counts. A histogram the
engine lacks is absent, never zero.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvscope.agent.metricsets import GENAI_TPOT_BUCKETS, GENAI_TTFT_BUCKETS
from kvscope.core.signals import Sample


@dataclass(frozen=True)
class Convention:
    """One GenAI server metric: name, UCUM unit, description, bucket advice, kvscope's source."""

    name: str
    unit: str
    description: str
    advice: tuple[float, ...]
    signal: str


CONVENTIONS: tuple[Convention, ...] = (
    Convention(
        "gen_ai.server.request.duration",
        "s",
        "Generative AI server request duration such as time-to-last byte or last output token.",
        (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92),
        "request_e2e_seconds",
    ),
    Convention(
        "gen_ai.server.time_to_first_token",
        "s",
        "Time to generate first token for successful responses.",
        GENAI_TTFT_BUCKETS,
        "request_ttft_seconds",
    ),
    Convention(
        "gen_ai.server.time_per_output_token",
        "s",
        "Time per output token generated after the first token for successful responses.",
        GENAI_TPOT_BUCKETS,
        "request_tpot_seconds",
    ),
)

OPERATION_NAME = "text_completion"
"""`gen_ai.operation.name` when the config names none: an engine's latency histograms count every
generation request it served (a chat request reaches the engine as a rendered prompt) and do not
say which API the client called."""

Attributes = tuple[tuple[str, str | int], ...]


@dataclass(frozen=True)
class HistogramPoint:
    """One histogram series: OTel attributes, explicit bounds, per-bucket (not cumulative) counts
    with the overflow bucket last (len(bounds) + 1 of them), sum and count."""

    attributes: Attributes
    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float
    count: int


def genai_points(
    samples: Iterable[Sample], operation_name: str = OPERATION_NAME, dropped: dict[str, int] | None = None
) -> dict[Convention, list[HistogramPoint]]:
    """The GenAI server histograms found in canonical `samples`: convention -> points.

    Series of one (instance, engine, model) are summed (data-parallel ranks, roles); a series
    whose buckets are not cumulative, or whose group disagrees on its boundaries, is left out and
    counted in `dropped` by reason."""
    by_signal = {c.signal: c for c in CONVENTIONS}
    raw: dict[tuple[str, Attributes], BucketSeries] = defaultdict(BucketSeries)
    for s in samples:
        base, suffix = _split(s.name)
        if base not in by_signal or not math.isfinite(s.value):
            continue
        labels = dict(s.labels)
        key = (base, _attributes(labels, operation_name))
        series = tuple(kv for kv in s.labels if kv[0] != "le")
        raw[key].add(series, suffix, labels.get("le"), s.value)
    out: dict[Convention, list[HistogramPoint]] = {}
    for (base, attrs), acc in sorted(raw.items(), key=lambda kv: (kv[0][0], repr(kv[0][1]))):
        conv = by_signal[base]
        point = acc.point(attrs, conv.advice)
        if isinstance(point, str):
            if dropped is not None:
                dropped[point] = dropped.get(point, 0) + 1
            continue
        out.setdefault(conv, []).append(point)
    return out


def _split(name: str) -> tuple[str, str]:
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            return name[: -len(suffix)].removeprefix("kvscope_"), suffix
    return "", ""


def _attributes(labels: Mapping[str, str], operation_name: str) -> Attributes:
    """The conventions' attributes from canonical labels: the engine (dialect) is the provider
    (`gen_ai.provider.name`, and the older `gen_ai.system` that gateways still emit), the model
    label the requested model, the instance `server.address` and `server.port`."""
    attrs: dict[str, str | int] = {"gen_ai.operation.name": operation_name}
    if engine := labels.get("engine"):
        attrs["gen_ai.provider.name"] = engine
        attrs["gen_ai.system"] = engine
    if model := labels.get("model"):
        attrs["gen_ai.request.model"] = model
    if instance := labels.get("instance"):
        host, sep, port = instance.rpartition(":")
        if sep and port.isdecimal() and host:
            attrs["server.address"], attrs["server.port"] = host.strip("[]"), int(port)
        else:
            attrs["server.address"] = instance
    return tuple(sorted(attrs.items()))


class BucketSeries:
    """The `_bucket`/`_sum`/`_count` samples of every Prometheus histogram series mapped to one
    point (here: the canonical series of one convention's attributes; agent/otel/convert.py: one
    exported series each)."""

    def __init__(self) -> None:
        self.series: dict[tuple[tuple[str, str], ...], dict[str, object]] = {}

    def add(self, series: tuple[tuple[str, str], ...], suffix: str, le: str | None, value: float) -> None:
        row = self.series.setdefault(series, {"buckets": {}})
        if suffix == "_bucket":
            try:
                bound = float(le) if le is not None else math.nan
            except ValueError:
                bound = math.nan
            if not math.isnan(bound):
                row["buckets"][bound] = value  # type: ignore[index]
        else:
            row[suffix] = value

    def point(self, attrs: Attributes, advice: tuple[float, ...] = ()) -> HistogramPoint | str:
        """The summed point, or the reason it cannot be built; its buckets merged onto `advice`
        when that is exact (none given: the series' own boundaries)."""
        bounds: tuple[float, ...] | None = None
        cumulative: list[float] = []
        total = 0.0
        for row in self.series.values():
            buckets: dict[float, float] = row["buckets"]  # type: ignore[assignment]
            if "_sum" not in row or math.inf not in buckets:
                return "incomplete_histogram"
            keys = tuple(sorted(b for b in buckets if b != math.inf))
            values = [buckets[b] for b in (*keys, math.inf)]
            if any(b < a for a, b in zip(values, values[1:], strict=False)):
                return "not_cumulative"
            if bounds is None:
                bounds, cumulative = keys, values
            elif keys != bounds:
                return "bounds_differ"
            else:
                cumulative = [a + b for a, b in zip(cumulative, values, strict=True)]
            total += float(row["_sum"])  # type: ignore[arg-type]
        assert bounds is not None
        count = cumulative[-1]  # the +Inf bucket: OTLP wants the bucket counts to add up to the count
        if advice and set(advice) <= set(bounds):  # merging buckets onto the advice is exact
            keep = [i for i, b in enumerate(bounds) if b in advice]
            cumulative = [cumulative[i] for i in keep] + [cumulative[-1]]
            bounds = tuple(bounds[i] for i in keep)
        per_bucket = [cumulative[0]] + [b - a for a, b in zip(cumulative, cumulative[1:], strict=False)]
        return HistogramPoint(attrs, bounds, tuple(round(c) for c in per_bucket), total, round(count))
