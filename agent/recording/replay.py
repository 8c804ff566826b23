"""Turn a recording back into canonical samples, through the same dialects as live scrapes.

A target serving kvscope's own series (the tap's `/kvscope/metrics`, the agent's `kvscope_*`
`/metrics`) is read as canonical signals directly. A scrape's target labels (on its `up`, or a
`pod`/`namespace`/`container` on every sample, as Prometheus records Kubernetes targets) are
applied as the live agent applies a target's configured labels, and the live engine<->GPU join
(agent/derive/gpu_join.py) runs once per scrape round. A spans sidecar (`x.spans.jsonl.gz` next
to `x.om.gz`) is stitched as the trace receiver would (`add_spans`)."""

from __future__ import annotations

import gzip
import json
import os
import statistics
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import Any

from kvscope.agent.derive.gpu_join import derive_engine_gpu
from kvscope.agent.logs.series import iter_lines
from kvscope.agent.metricsets import PHASE_BUCKETS, HistogramSet
from kvscope.agent.normalize.dialect import MappingMemo, detect_engine, normalize
from kvscope.agent.recording.omfile import RecordingLimits, read_recording, scrapes_by_target
from kvscope.agent.scrape.exposition import Exposition
from kvscope.agent.serve.export import KVSCOPE_PREFIX, signal_of
from kvscope.agent.traces.otlp import Span
from kvscope.agent.traces.stitch import StitchConfig, observe_phases, stitch_trace
from kvscope.agent.traces.tenants import TenantAccounting
from kvscope.core.rates import configured_interval
from kvscope.core.signals import Catalog, Labels, Sample, load_catalog, make_labels


@dataclass
class Replay:
    """Canonical series of a whole recording, plus what each target was and knew."""

    samples: list[Sample] = field(default_factory=list)
    engines: dict[str, str | None] = field(default_factory=dict)  # instance -> engine
    facts: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # instance -> rank -> facts
    unmapped: Counter[str] = field(default_factory=Counter)  # instance -> count
    span_stats: Counter[str] = field(default_factory=Counter)  # spans read, requests, bad lines
    notes: list[str] = field(default_factory=list)  # what reading left out, and why
    start: float | None = None
    end: float | None = None


KVSCOPE = "kvscope"
"""Engine name of a target that serves kvscope's own series (the request tap's /kvscope/metrics,
the agent's /metrics): canonical signals, no dialect needed."""


def kvscope_signal(name: str, catalog: Catalog) -> str | None:
    """The canonical sample name of a series kvscope serves: a kvscope-produced signal under its
    own name (the tap's `tenant_requests_total`) or any catalog signal under the agent's export
    prefix (`kvscope_engine_kv_cache_usage_ratio`); None for anything else."""
    bare = name.removeprefix(KVSCOPE_PREFIX)
    hit = signal_of(bare, catalog)
    return bare if hit is not None and (bare != name or KVSCOPE in hit[0].producers) else None


def parse_kvscope_samples(raw: list, target: dict[str, str], timestamp: float, catalog: Catalog) -> list[Sample]:
    """kvscope's own series of one scrape as canonical samples, with the target's job/instance."""
    out = []
    for r in raw:
        name = kvscope_signal(r.name, catalog)
        if name is None or r.value != r.value:
            continue
        labels = {k: v for k, v in r.labels if k not in ("job", "instance")} | target
        out.append(Sample(name, make_labels(labels), r.value, timestamp))
    return out


TARGET_LABELS = ("pod", "namespace", "container")
"""Labels that, carried by every sample of a recorded target, are its target labels (Kubernetes
service discovery puts them there); the engine<->GPU join matches engines to GPUs on them."""


def parse_target_labels(samples: list) -> dict[str, str]:
    """The TARGET_LABELS that have one value on every one of a target's raw samples."""
    out: dict[str, str] = {}
    label_sets = [dict(labels) for labels in {r.labels for r in samples}]  # a series' labels are read once
    for key in TARGET_LABELS:
        values = {labels.get(key) for labels in label_sets}
        if len(values) == 1 and (value := values.pop()) is not None and value != "":
            out[key] = value
    return out


def replay_recording(
    path: str | os.PathLike[str],
    catalog: Catalog | None = None,
    gpu_mapping: Any = None,
    limits: RecordingLimits | None = None,
) -> Replay:
    """Normalize every scrape of every target (engine detected once per target; a failed scrape gives
    only `kvscope_target_up 0`), then run the engine<->GPU join per scrape round. The recording is
    read within `limits` (default RecordingLimits(): RecordingTooLarge past one)."""
    catalog = catalog or load_catalog()
    scrapes, whole = read_recording(path, limits or RecordingLimits())
    out = Replay(notes=[i.text for i in whole.issues if i.reason == "timestamp_outlier"])
    for (job, instance), target_scrapes in scrapes_by_target(scrapes):
        union = Exposition(samples=[s for sc in target_scrapes for s in sc.samples[:2000]], types=whole.types)
        engine = detect_engine(union, catalog)
        target = {"job": job, "instance": instance}
        found = target | parse_target_labels(union.samples)
        if engine is None and any(kvscope_signal(s.name, catalog) for s in union.samples):
            engine = KVSCOPE
        out.engines[instance] = engine
        memo = MappingMemo()  # as the live collector keeps one per target: a series seen before is a lookup
        for sc in target_scrapes:
            out.samples.append(Sample("kvscope_target_up", make_labels(target), 1.0 if sc.up else 0.0, sc.timestamp))
            if not sc.samples:
                continue
            if engine == KVSCOPE:
                out.samples.extend(parse_kvscope_samples(sc.samples, target, sc.timestamp, catalog))
                continue
            norm = normalize(
                Exposition(samples=sc.samples, types=whole.types),
                engine,
                found | sc.labels,
                sc.timestamp,
                catalog,
                memo,
            )
            out.samples.extend(norm.samples)
            out.unmapped[instance] += norm.unmapped
            for rank, facts in norm.facts.items():
                out.facts.setdefault(instance, {}).setdefault(rank, {}).update(facts)
    if scrapes:
        out.start, out.end = min(sc.timestamp for sc in scrapes), max(sc.timestamp for sc in scrapes)
    out.samples.extend(render_engine_gpu_rounds(out, gpu_mapping))
    return out


def render_engine_gpu_rounds(replay: Replay, gpu_mapping: Any = None) -> list[Sample]:
    """The live agent's engine<->GPU join (`derive_engine_gpu`, its per-cycle derive hook) run on
    each scrape round of the replay: `engine_gpu_memory_used_bytes` stamped at the round's newest
    sample, as the agent would have exported it. Empty when no GPU series can be joined."""
    rounds = scrape_times(replay)
    if not rounds:
        return []
    cycles: list[list[Sample]] = [[] for _ in rounds]
    for ts, run in groupby(replay.samples, key=itemgetter(3)):  # one scrape's samples share a time
        i = bisect_right(rounds, ts) - 1 if ts is not None else -1
        cycles[max(i, 0)].extend(run)
    return [s for cycle in cycles for s in derive_engine_gpu(cycle, gpu_mapping)]


SPAN_SUFFIXES = (".spans.jsonl.gz", ".spans.jsonl")
MAX_SPAN_LINE = 1 << 20
"""Bytes; a longer line is counted as bad and skipped (bounded memory per span)."""


def spans_path_for(recording: str | os.PathLike[str]) -> Path | None:
    """The spans sidecar of a recording (`x.om.gz` -> `x.spans.jsonl.gz` or `.jsonl`), if it exists."""
    p = Path(recording)
    stem = p.name
    for ext in (".gz", ".om", ".txt"):
        stem = stem.removesuffix(ext)
    return next((cand for suffix in SPAN_SUFFIXES if (cand := p.with_name(stem + suffix)).is_file()), None)


def parse_span_line(line: str) -> Span:
    """One JSON line of a spans sidecar (what testbed/otlp_sink.py writes) -> Span. ValueError if malformed."""
    d = json.loads(line)
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    try:
        return Span(
            trace_id=str(d["trace_id"]),
            span_id=str(d["span_id"]),
            parent_id=str(d.get("parent_span_id") or ""),
            name=str(d["name"]),
            kind=int(d.get("kind") or 0),
            start_ns=int(d["start_ns"]),
            end_ns=int(d["end_ns"]),
            attributes=dict(d.get("attributes") or {}),
            resource=dict(d.get("resource") or {}),
            scope=str(d.get("scope") or ""),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"missing or bad field: {exc}") from exc


def read_spans(path: str | os.PathLike[str], max_spans: int = 2_000_000) -> tuple[list[Span], Counter[str]]:
    """Spans of a JSON-lines sidecar (gzip by suffix). Bad lines are skipped and counted by reason;
    reading stops after `max_spans` spans (counted once as `truncated`)."""
    spans: list[Span] = []
    issues: Counter[str] = Counter()
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        for line in iter_lines(f, MAX_SPAN_LINE):
            if line is None:
                issues["line_too_long"] += 1
                continue
            if not line.strip():
                continue
            if len(spans) >= max_spans:
                issues["truncated"] += 1
                break
            try:
                spans.append(parse_span_line(line))
            except ValueError:
                issues["bad_line"] += 1
    return spans, issues


def render_span_samples(
    spans: list[Span], times: list[float], service_labels: dict[str, dict[str, str]] | None = None
) -> tuple[list[Sample], Counter[str]]:
    """What the trace receiver would have reported at each of `times` (unix s): stitched requests
    count from their end; nothing is rendered before the first request (absent, not zero)."""
    cfg = StitchConfig(service_labels=service_labels or {})
    traces: dict[str, list[Span]] = {}
    for s in spans:
        traces.setdefault(s.trace_id, []).append(s)
    records = sorted((r for tr in traces.values() for r in stitch_trace(tr, cfg)), key=lambda r: r.end_ns)
    phases = HistogramSet("request_phase_seconds", PHASE_BUCKETS)
    tenants = TenantAccounting()
    out: list[Sample] = []
    i = 0
    for t in sorted(times):
        while i < len(records) and records[i].end_ns <= t * 1e9:
            rec = records[i]
            observe_phases(phases, rec)
            tenants.observe(rec)
            i += 1
        if i:
            out.extend(phases.render(t) + tenants.render(t))
    stats = Counter({"traces": len(traces), "requests": len(records), "requests_rendered": i})
    stats.update({f"tenant_{k}": v for k, v in tenants.stats.items()})
    return out, stats


def service_labels_from(spans: list[Span], replay: Replay) -> dict[str, dict[str, str]]:
    """Map each span `service.name` onto a recorded target: the instance whose name equals the
    service name or ends it after a `-` (`vllm-replica-0` -> `replica-0`), with that target's
    `model` label when it has exactly one. Services that match no target keep their own name."""
    models: dict[str, set[str]] = {}
    for s in replay.samples:
        lab = dict(s.labels)
        if lab.get("model") and lab.get("instance"):
            models.setdefault(lab["instance"], set()).add(lab["model"])
    out: dict[str, dict[str, str]] = {}
    for service in {str(s.resource.get("service.name", "")) for s in spans} - {""}:
        hits = [inst for inst in replay.engines if service == inst or service.endswith("-" + inst)]
        if len(hits) != 1:
            continue
        labels = {"instance": hits[0]}
        if len(models.get(hits[0], ())) == 1:
            labels["model"] = next(iter(models[hits[0]]))
        out[service] = labels
    return out


def scrape_interval(samples: Iterable[Sample]) -> float | None:
    """The recording's scrape interval, from its `kvscope_target_up` samples: the median gap
    between one target's scrapes (a target: the labels of its `up`, job and instance), then the
    lower median over targets, an interval some target was scraped at (of an engine every 2 s and
    a GPU exporter every 10 s, 2 s; never their mean), read as the interval it was configured at
    (`configured_interval`: 2.001 s measured is 2 s). Taken per target because the scrape times
    of several targets interleave: two engines scraped 3 ms apart every 2 s put gaps of 3 ms and
    1.997 s between the scrape times of the recording. None when no target was scraped twice."""
    per_target: dict[Labels, set[float]] = defaultdict(set)
    for s in samples:
        if s.name == "kvscope_target_up" and s.timestamp is not None:
            per_target[s.labels].add(s.timestamp)
    gaps = [statistics.median(_gaps(sorted(ts))) for ts in per_target.values() if len(ts) > 1]
    return configured_interval(float(statistics.median_low(gaps))) if gaps else None


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def scrape_times(replay: Replay) -> list[float]:
    """One time per scrape round: all targets' scrape times, merged when closer than half the
    scrape interval (`scrape_interval`; the targets of one recording are scraped together)."""
    interval = scrape_interval(replay.samples)
    min_gap = interval / 2 if interval else 0.0
    out: list[float] = []
    for t in sorted({s.timestamp for s in replay.samples if s.name == "kvscope_target_up" and s.timestamp is not None}):
        if not out or t - out[-1] >= min_gap:
            out.append(t)
    return out


def add_spans(replay: Replay, spans_path: str | os.PathLike[str]) -> Replay:
    """Replay a spans sidecar into `replay`: request-phase (and traced-tenant) samples at the
    recording's scrape times, with instance/model labels joined onto the recorded targets."""
    spans, issues = read_spans(spans_path)
    samples, stats = render_span_samples(spans, scrape_times(replay), service_labels_from(spans, replay))
    replay.samples.extend(samples)
    replay.span_stats.update(stats + issues + Counter({"spans": len(spans)}))
    return replay
