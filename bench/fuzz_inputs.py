"""Fuzz targets for the agent's and the webhook's inputs (bench/fuzz.py runs them).

Each target runs what the product runs on one body and catches only that path's documented
clean errors; anything else escaping is a crash:

* otlp-protobuf, otlp-json: `parse_otlp_traces` then the receiver's stitching (TraceStitcher);
  clean error OtlpDecodeError (the receiver's 400).
* webhook-json: `parse_webhook`, then every alert's place and diagnosis window; WebhookError (400).
* kv-events-msgpack: `parse_kv_batch` then the residency tracker; KvEventError (counted by reason).
* config-yaml: `parse_config_yaml` then `build_config` (every section validated); ConfigError.

Seeds are real: vLLM's own OTLP spans captured on CPU (tests/recordings/healthy-shared-prefix
.spans.jsonl.gz) packed as OTLP protobuf and OTLP/JSON bodies, plus spans from the OpenTelemetry
SDK through its own OTLP encoder; the Alertmanager 0.25 webhook captured in
../shared/research/toolchain-probe.md; the vLLM 0.32 KV event captured in
../shared/research/vllm-cpu-probe.md in the map and array encodings; the repository's agent
configs (deploy/).
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from kvscope.agent.config import ConfigError, build_config, parse_config_yaml
from kvscope.agent.kvevents.events import KvEventError, parse_kv_batch
from kvscope.agent.kvevents.residency import ResidencyTracker
from kvscope.agent.runtime import load_collector_modules
from kvscope.agent.traces.otlp import OtlpDecodeError, parse_otlp_traces
from kvscope.agent.traces.stitch import StitchConfig, TraceStitcher
from kvscope.diagnoser.alertmanager.payload import WebhookError, diagnosis_window, instance_places, parse_webhook

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
SPANS = ROOT / "tests" / "recordings" / "healthy-shared-prefix.spans.jsonl.gz"
load_collector_modules()  # the config sections of otlp / tap / kv_events register on import


# ------------------------------------------------------------------------------------ OTLP
def _otlp(data: bytes, ctype: str) -> object:
    try:
        spans = parse_otlp_traces(data, ctype)
    except OtlpDecodeError:
        return None
    stitcher = TraceStitcher(StitchConfig(settle_s=0.0, max_traces=100), clock=lambda: 1e9)
    return stitcher.add(spans) + stitcher.flush(force=True)


def parse_otlp_protobuf(data: bytes) -> object:
    return _otlp(data, "application/x-protobuf")


def parse_otlp_json(data: bytes) -> object:
    return _otlp(data, "application/json")


def _real_spans() -> list[dict[str, Any]]:
    with gzip.open(SPANS, "rt") as f:
        return [json.loads(line) for line in f]


def _json_value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list):
        return {"arrayValue": {"values": [_json_value(x) for x in v]}}
    return {"stringValue": str(v)}


def _json_body(spans: list[dict[str, Any]]) -> bytes:
    """OTLP/JSON (hex ids, 64-bit integers as strings) of spans sharing a resource."""
    attrs = lambda d: [{"key": k, "value": _json_value(v)} for k, v in d.items()]  # noqa: E731
    out = [
        {
            "traceId": s["trace_id"],
            "spanId": s["span_id"],
            "parentSpanId": s.get("parent_span_id") or "",
            "name": s["name"],
            "kind": s.get("kind", 0),
            "startTimeUnixNano": str(s["start_ns"]),
            "endTimeUnixNano": str(s["end_ns"]),
            "attributes": attrs(s.get("attributes") or {}),
        }
        for s in spans
    ]
    return json.dumps(
        {
            "resourceSpans": [
                {
                    "resource": {"attributes": attrs(spans[0].get("resource") or {})},
                    "scopeSpans": [{"scope": {"name": spans[0].get("scope", "")}, "spans": out}],
                }
            ]
        }
    ).encode()


def _protobuf_body(spans: list[dict[str, Any]]) -> bytes:
    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    doc = json.loads(_json_body(spans))
    for rs in doc["resourceSpans"]:  # protobuf JSON mapping: ids are base64, not hex
        for s in rs["scopeSpans"][0]["spans"]:
            for key in ("traceId", "spanId", "parentSpanId"):
                s[key] = __import__("base64").b64encode(bytes.fromhex(s[key])).decode()
    return ParseDict(doc, ExportTraceServiceRequest()).SerializeToString()


def _sdk_bodies() -> list[bytes]:
    """Spans from the OpenTelemetry SDK through its own OTLP protobuf encoder."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm-sdk"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("fuzz-seed")
    with tracer.start_as_current_span("POST /v1/chat/completions", attributes={"kvscope.tenant": "t0"}):
        with tracer.start_as_current_span(
            "llm_request",
            attributes={
                "gen_ai.latency.time_to_first_token": 0.016,
                "gen_ai.latency.e2e": 0.062,
                "gen_ai.usage.prompt_tokens": 9,
                "gen_ai.request.id": "chatcmpl-1",
                "tags": ["a", "b"],
            },
        ):
            pass
    provider.shutdown()
    return [encode_spans(exporter.get_finished_spans()).SerializeToString()]


def _span_groups(n: int = 12) -> list[list[dict[str, Any]]]:
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for s in _real_spans():
        by_trace.setdefault(s["trace_id"], []).append(s)
    return sorted(by_trace.values(), key=len, reverse=True)[:n]


def seeds_otlp_protobuf() -> list[bytes]:
    return [_protobuf_body(g) for g in _span_groups()] + _sdk_bodies()


def seeds_otlp_json() -> list[bytes]:
    return [_json_body(g) for g in _span_groups()]


# ------------------------------------------------------------------------------------ webhook
def parse_webhook_json(data: bytes) -> object:
    try:
        doc = parse_webhook(data)
    except WebhookError:
        return None
    from kvscope.diagnoser.alertmanager.payload import parse_alert

    alerts = [parse_alert(raw, i) for i, raw in enumerate(doc["alerts"])]
    return [diagnosis_window(a, 1.8e9, 1800.0, 6 * 3600.0) for a in alerts], instance_places([a.labels for a in alerts])


def seeds_webhook_json() -> list[bytes]:
    text = (SHARED / "research" / "toolchain-probe.md").read_text()
    block = re.search(r"Webhook JSON \(Alertmanager 0\.25.*?```json\n(.*?)```", text, re.S)
    assert block, "the captured Alertmanager webhook is no longer in toolchain-probe.md"
    real = json.loads(block.group(1))
    resolved = {
        **real,
        "status": "resolved",
        "alerts": [{**real["alerts"][0], "status": "resolved", "endsAt": "2026-11-22T05:17:47.169Z"}],
    }
    placed = {
        **real,
        "alerts": [
            {
                **real["alerts"][0],
                "labels": {
                    **real["alerts"][0]["labels"],
                    "instance": "10.0.0.5:8000",
                    "model": "llama",
                    "rule_id": "kv_pressure",
                },
            }
        ],
    }
    return [json.dumps(d).encode() for d in (real, resolved, placed)]


# ------------------------------------------------------------------------------------ KV events
def parse_kv_events_msgpack(data: bytes) -> object:
    bad: Counter[str] = Counter()
    try:
        events = parse_kv_batch(data, bad)
    except KvEventError:
        return None
    tracker = ResidencyTracker("fuzz", max_blocks=1000)
    tracker.apply(events)
    return tracker.render_samples(1e9), bad


def seeds_kv_events_msgpack() -> list[bytes]:
    text = (SHARED / "research" / "vllm-cpu-probe.md").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith('{"topic": "kv"') and "BlockStored" in ln)
    captured = json.loads(line)
    ev = {
        k: [x for x in v if not (isinstance(x, str) and x.startswith("..."))] if isinstance(v, list) else v
        for k, v in captured["event"].items()
    }  # the probe elided long lists ("...9 more")
    hashes = ev["block_hashes"]
    removed = {"type": "BlockRemoved", "block_hashes": hashes[:2], "medium": "GPU", "group_idx": 0}
    array = ["BlockStored", hashes, None, ev["token_ids"], ev["block_size"], None, "GPU"]
    enc = msgspec.msgpack.encode
    ts, dp = captured["ts"], captured["dp_rank"]
    return [
        enc([ts, [ev], dp]),
        enc([ts, [ev, removed], dp]),
        enc([ts, [{"type": "AllBlocksCleared"}], dp]),
        enc([ts, [array, ["BlockRemoved", hashes[:1]]]]),
        enc([ts + 1, [ev, removed, ev], dp]),
    ]


# ------------------------------------------------------------------------------------ config
def parse_config_yaml_target(data: bytes) -> object:
    try:
        return build_config(parse_config_yaml(data, "fuzz"), environ={})
    except ConfigError:
        return None


def seeds_config_yaml() -> list[bytes]:
    import yaml

    out = [(ROOT / "deploy" / "systemd" / "kvscope.yaml").read_bytes()]
    configmap = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "agent-configmap.yaml").read_text())
    out += [v.encode() for v in (configmap.get("data") or {}).values() if isinstance(v, str)]
    out.append(
        b"scrape: &s {interval_s: 5, timeout_s: 2}\notlp: {listen: '127.0.0.1:0'}\n"
        b"kv_events:\n  - {endpoint: 'ipc:///tmp/kv.sock', instance: 'e0:8000', topic: kv}\n"
    )
    return out


TARGETS = {
    "otlp-protobuf": (parse_otlp_protobuf, seeds_otlp_protobuf),
    "otlp-json": (parse_otlp_json, seeds_otlp_json),
    "webhook-json": (parse_webhook_json, seeds_webhook_json),
    "kv-events-msgpack": (parse_kv_events_msgpack, seeds_kv_events_msgpack),
    "config-yaml": (parse_config_yaml_target, seeds_config_yaml),
}
