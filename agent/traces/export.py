"""Stitched requests -> explicit phase spans (queue, prefill, KV transfer, decode as child spans of
the engine span, with a `kvscope.phase` attribute, so a trace waterfall shows where the time
went), encoded as an OTLP protobuf export request."""

from __future__ import annotations

import asyncio
import hashlib

import aiohttp
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from kvscope.agent.traces.otlp import Span
from kvscope.agent.traces.stitch import RequestRecord
from kvscope.core.resolve import Connector

SCOPE = "kvscope.traces.stitch"
_INTERNAL = 1


def _span_id(trace_id: str, parent: str, phase: str) -> str:
    return hashlib.blake2b(f"{trace_id}/{parent}/{phase}".encode(), digest_size=8).hexdigest()


def render_phase_spans(record: RequestRecord) -> list[Span]:
    """One child span per known phase, placed back to back under the span that ran it."""
    out: list[Span] = []
    pre = record.anchors.get("prefill") or next(iter(record.anchors.values()), None)
    dec = record.anchors.get("decode") or pre
    if pre is None or dec is None:
        return out
    cursor = pre.start_ns
    for obs in record.phases:
        on_decode = obs.role == "decode" or (obs.role is None and obs.phase in ("kv_transfer", "decode"))
        anchor = dec if on_decode else pre
        if obs.phase == "kv_transfer" and record.kv_transfer_source == "gap":
            cursor = pre.end_ns
        elif anchor is dec and cursor < dec.start_ns:
            cursor = dec.start_ns
        end = cursor + int(obs.seconds * 1e9)
        attrs = {"kvscope.phase": obs.phase, "kvscope.phase.seconds": obs.seconds}
        if obs.instance:
            attrs["kvscope.instance"] = obs.instance
        if obs.phase == "kv_transfer" and record.kv_transfer_source:
            attrs["kvscope.kv_transfer.source"] = record.kv_transfer_source
        if record.tenant:
            attrs["kvscope.tenant"] = record.tenant
        out.append(
            Span(
                record.trace_id,
                _span_id(record.trace_id, anchor.span_id, obs.phase),
                anchor.span_id,
                f"phase {obs.phase}",
                _INTERNAL,
                cursor,
                end,
                attrs,
                anchor.resource,
                SCOPE,
            )
        )
        cursor = end
    return out


def _any(v: object) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    return AnyValue(string_value=str(v))


def encode_spans(spans: list[Span]) -> bytes:
    """An OTLP protobuf ExportTraceServiceRequest holding `spans` (grouped by resource)."""
    req = ExportTraceServiceRequest()
    groups: dict[tuple, dict[str, list[Span]]] = {}
    for s in spans:
        by_scope = groups.setdefault(tuple(sorted((k, str(v)) for k, v in s.resource.items())), {})
        by_scope.setdefault(s.scope or SCOPE, []).append(s)
    for by_scope in groups.values():
        rs = req.resource_spans.add()
        first = next(iter(by_scope.values()))[0]
        rs.resource.attributes.extend(KeyValue(key=k, value=_any(v)) for k, v in first.resource.items())
        for scope, members in by_scope.items():  # each span keeps its scope (the tap's `kvscope.tap`)
            ss = rs.scope_spans.add()
            ss.scope.name = scope
            for s in members:
                p = ss.spans.add(
                    trace_id=bytes.fromhex(s.trace_id),
                    span_id=bytes.fromhex(s.span_id),
                    name=s.name,
                    kind=s.kind,
                    start_time_unix_nano=s.start_ns,
                    end_time_unix_nano=s.end_ns,
                )
                if s.parent_id:
                    p.parent_span_id = bytes.fromhex(s.parent_id)
                p.attributes.extend(KeyValue(key=k, value=_any(v)) for k, v in s.attributes.items())
    return req.SerializeToString()


class SpanBatchExporter:
    """Ships spans to an OTLP/HTTP endpoint in batches from a bounded buffer (drops when full):
    `add()` never blocks; `run()` is the sending task and sends what is left when cancelled."""

    def __init__(self, url: str, max_buffer: int = 10_000, interval_s: float = 1.0, timeout_s: float = 5.0) -> None:
        self.url, self.max_buffer, self.interval_s, self.timeout_s = url, max_buffer, interval_s, timeout_s
        self._buf: list[Span] = []
        self.sent = self.dropped = self.failed = 0

    def add(self, spans: list[Span]) -> None:
        room = self.max_buffer - len(self._buf)
        self._buf.extend(spans[: max(0, room)])
        self.dropped += max(0, len(spans) - max(0, room))

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(connector=Connector(), timeout=timeout) as session:
            try:
                while True:
                    await asyncio.sleep(self.interval_s)
                    await self._send(session)
            finally:
                await self._send(session)

    async def _send(self, session: aiohttp.ClientSession) -> None:
        batch, self._buf = self._buf, []
        if not batch:
            return
        try:
            async with session.post(
                self.url, data=encode_spans(batch), headers={"Content-Type": "application/x-protobuf"}
            ) as r:
                await r.read()
                if r.status >= 300:
                    self.failed += len(batch)
                    return
            self.sent += len(batch)
        except (aiohttp.ClientError, OSError, TimeoutError):
            self.failed += len(batch)
