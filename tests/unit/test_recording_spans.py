"""Spans sidecars of recordings: read, stitched as the trace receiver would, rendered per scrape."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest

from kvscope.agent.recording.replay import (
    MAX_SPAN_LINE,
    Replay,
    parse_span_line,
    read_spans,
    render_span_samples,
    scrape_times,
    service_labels_from,
    spans_path_for,
)
from kvscope.core.signals import Sample, make_labels
from kvscope.diagnoser.sources.recording import RecordingSource

LIBRARY = Path(__file__).resolve().parents[1] / "recordings"


def _span(trace: str, service: str, end_s: float, queue: float = 0.01, prefill: float = 0.02, **attrs) -> dict:
    return {
        "trace_id": trace,
        "span_id": trace[:16],
        "parent_span_id": "",
        "name": "llm_request",
        "kind": 2,
        "start_ns": int((end_s - 1) * 1e9),
        "end_ns": int(end_s * 1e9),
        "scope": "vllm.tracing.otel",
        "resource": {"service.name": service},
        "attributes": {
            "gen_ai.latency.time_in_queue": queue,
            "gen_ai.latency.time_in_model_prefill": prefill,
            "gen_ai.latency.time_in_model_decode": 0.5,
            "gen_ai.usage.prompt_tokens": 100,
            **attrs,
        },
    }


def _count(samples: list[Sample], t: float, **labels: str) -> float | None:
    vals = [
        s.value
        for s in samples
        if s.name == "request_phase_seconds_count"
        and s.timestamp == t
        and all(dict(s.labels).get(k) == v for k, v in labels.items())
    ]
    return sum(vals) if vals else None


def test_parse_span_line_reads_the_sidecar_format_and_rejects_broken_lines():
    span = parse_span_line(json.dumps(_span("a" * 32, "vllm-r0", 10.0)))
    assert (span.name, span.resource["service.name"], span.end_ns) == ("llm_request", "vllm-r0", 10_000_000_000)
    assert span.attributes["gen_ai.usage.prompt_tokens"] == 100
    for bad in ("{", "[1, 2]", json.dumps({"trace_id": "x"}), json.dumps({**_span("b" * 32, "s", 1), "end_ns": "x"})):
        with pytest.raises(ValueError):
            parse_span_line(bad)


def test_read_spans_skips_and_counts_bad_lines(tmp_path):
    path = tmp_path / "r.spans.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(_span("a" * 32, "vllm-r0", 10.0)) + "\n\nnot json\n")
        f.write(json.dumps(_span("c" * 32, "vllm-r0", 11.0)) + "\n")
    spans, issues = read_spans(path)
    assert [s.trace_id[0] for s in spans] == ["a", "c"]
    assert issues == Counter({"bad_line": 1})
    spans, issues = read_spans(path, max_spans=1)
    assert len(spans) == 1 and issues == Counter({"truncated": 1})


def test_an_over_long_sidecar_line_is_skipped_and_counted_without_reading_it_whole(tmp_path):
    path = tmp_path / "r.spans.jsonl"
    with path.open("wb") as f:
        f.write(b"x" * (16 * MAX_SPAN_LINE) + b"\n")
        f.write(json.dumps(_span("c" * 32, "vllm-r0", 11.0)).encode() + b"\n")
    tracemalloc.start()
    try:
        spans, issues = read_spans(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [s.trace_id[0] for s in spans] == ["c"] and issues == Counter({"line_too_long": 1})
    assert peak < 8 * MAX_SPAN_LINE  # read in bounded pieces, not as one 16 MiB line


def test_spans_path_for_finds_the_sidecar_next_to_the_recording(tmp_path):
    rec = tmp_path / "incident.om.gz"
    rec.write_bytes(b"")
    assert spans_path_for(rec) is None
    (tmp_path / "incident.spans.jsonl").write_text("")
    assert spans_path_for(rec) == tmp_path / "incident.spans.jsonl"
    (tmp_path / "incident.spans.jsonl.gz").write_bytes(b"")
    assert spans_path_for(rec) == tmp_path / "incident.spans.jsonl.gz"


def test_render_counts_each_request_from_its_end_and_nothing_before_the_first():
    spans = [
        parse_span_line(json.dumps(_span(f"{i:032x}", "vllm-r0", end)))
        for i, end in enumerate((10.5, 12.5, 12.9, 20.0))
    ]
    samples, stats = render_span_samples(spans, [10.0, 11.0, 13.0, 15.0], {"vllm-r0": {"instance": "r0", "model": "m"}})
    assert not [s for s in samples if s.timestamp == 10.0]  # absent before the first request
    assert _count(samples, 11.0, instance="r0", model="m", phase="queue") == 1
    assert _count(samples, 13.0, phase="prefill") == 3
    assert _count(samples, 15.0, phase="decode") == 3  # the 20 s request ended after the last time
    assert _count(samples, 15.0, phase="kv_transfer") is None  # no such phase in a unified vLLM span
    assert stats["requests"] == 4 and stats["requests_rendered"] == 3
    assert not [s for s in samples if s.name.startswith("tenant_")]  # vLLM spans name no tenant


def test_render_counts_traced_tenants():
    spans = [parse_span_line(json.dumps(_span("d" * 32, "vllm-r0", 5.0, **{"kvscope.tenant": "acme"})))]
    samples, _ = render_span_samples(spans, [6.0])
    prompt = [s for s in samples if s.name == "tenant_prompt_tokens_total"]
    assert [(dict(s.labels)["tenant"], s.value) for s in prompt] == [("acme", 100.0)]


def test_service_names_map_onto_recorded_targets_and_their_model():
    replay = Replay(
        samples=[Sample("engine_kv_cache_usage_ratio", make_labels({"instance": "replica-0", "model": "m"}), 0.1, 1.0)],
        engines={"replica-0": "vllm", "replica-1": "vllm"},
    )
    spans = [
        parse_span_line(json.dumps(_span(f"{i:032x}", svc, 1.0)))
        for i, svc in enumerate(("vllm-replica-0", "replica-1", "other-service", "vllm-replica-10"))
    ]
    assert service_labels_from(spans, replay) == {
        "vllm-replica-0": {"instance": "replica-0", "model": "m"},
        "replica-1": {"instance": "replica-1"},
    }


def test_scrape_times_merge_targets_scraped_together():
    up = [
        Sample("kvscope_target_up", make_labels({"instance": i}), 1.0, t)
        for t in (0.0, 2.0, 4.0)
        for i, t in (("a", t), ("b", t + 0.01))
    ]
    assert scrape_times(Replay(samples=up)) == [0.0, 2.0, 4.0]


def test_recording_source_replays_the_real_sidecar_per_replica():
    rec = LIBRARY / "round-robin-vs-sticky.om.gz"
    per_service = Counter()
    with gzip.open(LIBRARY / "round-robin-vs-sticky.spans.jsonl.gz", "rt") as f:
        for line in f:
            d = json.loads(line)
            if d["name"] == "llm_request":
                per_service[d["resource"]["service.name"]] += 1
    src = RecordingSource(rec)
    assert src.description.endswith("+spans:round-robin-vs-sticky.spans.jsonl.gz")
    frame = src.read_frame({"request_phase_seconds_count"}, None, None, src.natural_step())
    block = frame.block("request_phase_seconds_count")
    assert block is not None
    last = {}
    for labels, row in zip(block.labels, block.values, strict=True):
        lab = dict(labels)
        if lab["phase"] == "prefill":
            assert lab["model"] == "tiny-llama"
            last[lab["instance"]] = row[~(row != row)][-1]
    assert last == {"replica-0": per_service["vllm-replica-0"], "replica-1": per_service["vllm-replica-1"]}
    plain = RecordingSource(rec, spans=False)
    assert (
        plain.read_frame({"request_phase_seconds_count"}, None, None, 2.0).block("request_phase_seconds_count") is None
    )


def test_a_recorded_tap_target_replays_as_canonical_series(tmp_path):
    from kvscope.agent.recording.omfile import RecordingWriter
    from kvscope.agent.recording.replay import replay_recording
    from kvscope.agent.scrape.exposition import parse_exposition

    tap = (
        "# TYPE kvscope_prefix_split_ratio gauge\nkvscope_prefix_split_ratio {v}\n"
        '# TYPE kvscope_tenant_requests_total counter\nkvscope_tenant_requests_total{{tenant="a"}} {n}\n'
        '# TYPE kvscope_target_up gauge\nkvscope_target_up{{instance="x"}} 1\n'
    )
    path = tmp_path / "r.om"
    w = RecordingWriter(path)
    for i, (v, n) in enumerate(((0.1, 3), (0.8, 9))):
        w.add_scrape("kvscope-tap", "tap-0", 100.0 + 2 * i, parse_exposition(tap.format(v=v, n=n)))
    w.close()
    replay = replay_recording(path)
    assert replay.engines == {"tap-0": "kvscope"}
    got = sorted((s.name, dict(s.labels), s.value) for s in replay.samples if s.name != "kvscope_target_up")
    target = {"job": "kvscope-tap", "instance": "tap-0"}
    assert got == [
        ("prefix_split_ratio", target, 0.1),
        ("prefix_split_ratio", target, 0.8),
        ("tenant_requests_total", {**target, "tenant": "a"}, 3.0),
        ("tenant_requests_total", {**target, "tenant": "a"}, 9.0),
    ]
