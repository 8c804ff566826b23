"""The OTLP receiver fed by the real OpenTelemetry SDK exporter (opentelemetry-exporter-otlp-proto-http)."""

import asyncio
import gzip
import io
import json
import time

import aiohttp
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from kvscope.agent.traces.receiver import OtlpConfig, OtlpTraceReceiver, parse_otlp_config
from kvscope.agent.traces.stitch import StitchConfig

VLLM_ATTRS = {
    "gen_ai.latency.time_to_first_token": 0.016,
    "gen_ai.latency.e2e": 0.062,
    "gen_ai.latency.time_in_queue": 0.004,
    "gen_ai.latency.time_in_model_prefill": 0.010,
    "gen_ai.latency.time_in_model_decode": 0.046,
    "gen_ai.usage.prompt_tokens": 9,
    "gen_ai.usage.completion_tokens": 16,
    "gen_ai.request.id": "chatcmpl-1",
}


def _sdk_export(port: int, compression: Compression = Compression.NoCompression, n: int = 3) -> None:
    """Emit n tap-root + vLLM-shaped request traces through the SDK's OTLP/HTTP protobuf exporter."""
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", compression=compression, timeout=5)
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm-sdk"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    for i in range(n):
        with tracer.start_as_current_span(
            "POST /v1/chat/completions", kind=SpanKind.SERVER, attributes={"kvscope.tenant": f"t{i % 2}"}
        ):
            with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER, attributes=VLLM_ATTRS):
                time.sleep(0.001)
    provider.shutdown()


async def until(cond, timeout_s=120.0):
    """Wait until cond() holds: stitching runs on a timer, and a busy machine is slow (the
    generous ceiling is a hang guard only; the wait ends as soon as cond() holds)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)


async def _with_receiver(cfg: OtlpConfig, body):
    rx = OtlpTraceReceiver(cfg)
    await rx.start()
    try:
        return await body(rx)
    finally:
        await rx.stop()


FAST = StitchConfig(settle_s=0.05, ttl_s=2.0)


def test_sdk_exporter_protobuf_and_gzip_requests_are_stitched_into_phase_histograms():
    async def body(rx):
        await asyncio.to_thread(_sdk_export, rx.port)
        await asyncio.to_thread(_sdk_export, rx.port, Compression.Gzip)
        await until(lambda: rx.stats["requests"] >= 6)
        coll = await rx.collect()
        return rx, coll

    rx, coll = asyncio.run(_with_receiver(OtlpConfig(listen="127.0.0.1:0", stitch=FAST), body))
    assert rx.stats["spans"] == 12 and rx.stats["requests"] == 6
    assert {r.tenant for r in rx.recent} == {"t0", "t1"}
    counts = {s.label("phase"): s.value for s in coll.samples if s.name == "request_phase_seconds_count"}
    assert counts == {"queue": 6, "prefill": 6, "decode": 6}
    sums = {s.label("phase"): s.value for s in coll.samples if s.name == "request_phase_seconds_sum"}
    assert abs(sums["decode"] - 6 * 0.046) < 1e-9
    [h] = coll.health
    assert h.up and not h.errors


def test_malformed_payloads_get_400_and_the_receiver_keeps_serving():
    async def body(rx):
        url = f"http://127.0.0.1:{rx.port}/v1/traces"
        async with aiohttp.ClientSession() as s:
            r1 = await s.post(url, data=b"\x0a\xff\xff garbage", headers={"Content-Type": "application/x-protobuf"})
            r2 = await s.post(url, data=b"{oops", headers={"Content-Type": "application/json"})
            r3 = await s.post(url, data=b"x" * 5000, headers={"Content-Type": "application/x-protobuf"})
            r4 = await s.post(
                url,
                data=gzip.compress(b"\0" * 8000),
                headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"},
            )
            statuses = [r1.status, r2.status, r3.status, r4.status]
        await asyncio.to_thread(_sdk_export, rx.port, Compression.NoCompression, 1)
        await until(lambda: rx.stats["requests"] >= 1)
        return statuses, await rx.collect(), rx

    statuses, coll, rx = asyncio.run(
        _with_receiver(OtlpConfig(listen="127.0.0.1:0", max_body_bytes=4096, stitch=FAST), body)
    )
    assert statuses == [400, 400, 413, 400]
    assert rx.stats["requests"] == 1  # still serving after the bad ones
    assert coll.health[0].errors["bad_payload"] == 3


def test_json_export_is_accepted_and_answered_in_json():
    doc = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "sg"}}]},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "0af7651916cd43dd8448eb211c80319c",
                                "spanId": "b7ad6b7169203331",
                                "name": "Req 1a2b3c4d",
                                "kind": 2,
                                "startTimeUnixNano": "1000000000",
                                "endTimeUnixNano": "1100000000",
                                "attributes": [
                                    {"key": "gen_ai.latency.time_in_model_prefill", "value": {"doubleValue": 0.02}}
                                ],
                            }
                        ]
                    }
                ],
            }
        ]
    }

    async def body(rx):
        async with aiohttp.ClientSession() as s:
            r = await s.post(
                f"http://127.0.0.1:{rx.port}/v1/traces",
                data=json.dumps(doc),
                headers={"Content-Type": "application/json"},
            )
            text = await r.text()
        await until(lambda: len(rx.recent) >= 1)
        await rx.collect()
        return r.status, text, list(rx.recent)

    status, text, recent = asyncio.run(_with_receiver(OtlpConfig(listen="127.0.0.1:0", stitch=FAST), body))
    assert (status, text) == (200, "{}")
    assert recent[0].engine == "sglang" and recent[0].phase("prefill") == 0.02


def test_pass_through_forwards_the_original_bytes_and_stitched_phase_spans():
    async def body(sink):
        cfg = OtlpConfig(
            listen="127.0.0.1:0",
            stitch=FAST,
            forward_url=f"http://127.0.0.1:{sink.port}/v1/traces",
            stitched_url=f"http://127.0.0.1:{sink.port}/v1/traces",
        )
        rx = OtlpTraceReceiver(cfg)
        await rx.start()
        try:
            await asyncio.to_thread(_sdk_export, rx.port, Compression.Gzip, 2)
            await until(lambda: rx.stats["forwarded"] >= 6 and sink.stats["spans"] >= 10)
            return dict(rx.stats), dict(sink.stats), list(sink.recent)
        finally:
            await rx.stop()

    sink_cfg = OtlpConfig(listen="127.0.0.1:0", stitch=StitchConfig(settle_s=5.0))
    rx_stats, sink_stats, _ = asyncio.run(_with_receiver(sink_cfg, body))
    # SimpleSpanProcessor exports span by span: 4 raw gzip bodies forwarded as received + 2 stitched requests
    assert rx_stats["forwarded"] == 4 + 2
    assert sink_stats["spans"] == 4 + 2 * 3  # 4 original spans + 3 phase spans per request


def test_config_section_validation_names_the_key():
    cfg = parse_otlp_config(
        {
            "listen": "127.0.0.1:4319",
            "max_body_bytes": "1MiB",
            "ttl_s": 10,
            "service_labels": {"vllm-p": {"role": "prefill"}},
        }
    )
    assert cfg.max_body_bytes == 1 << 20 and cfg.stitch.ttl_s == 10
    for bad, key in (
        ({"listen": "nope"}, "otlp.listen"),
        ({"lisen": "x"}, "unknown keys"),
        ({"service_labels": ["a"]}, "otlp.service_labels"),
    ):
        try:
            parse_otlp_config(bad)
        except ValueError as e:
            assert key in str(e)
        else:
            raise AssertionError(f"{bad} accepted")


def test_spans_over_the_per_trace_limit_get_an_otlp_partial_success():
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    from kvscope.agent.traces.export import encode_spans
    from kvscope.agent.traces.otlp import Span

    spans = [Span("0af7651916cd43dd8448eb211c80319c", f"{i + 1:016x}", "", "x", 1, 1, 2, {}, {}) for i in range(5)]

    async def body(rx):
        async with aiohttp.ClientSession() as s:
            r = await s.post(
                f"http://127.0.0.1:{rx.port}/v1/traces",
                data=encode_spans(spans),
                headers={"Content-Type": "application/x-protobuf"},
            )
            return r.status, ExportTraceServiceResponse.FromString(await r.read())

    cfg = OtlpConfig(listen="127.0.0.1:0", stitch=StitchConfig(max_spans_per_trace=3))
    status, resp = asyncio.run(_with_receiver(cfg, body))
    assert status == 200 and resp.partial_success.rejected_spans == 2
    assert "limit" in resp.partial_success.error_message


def test_nested_json_and_protobuf_at_any_depth_are_400_and_the_receiver_keeps_serving():
    """Nesting in the body (100, 10k, 1M levels) and in a valid OTLP attribute (arrayValue in
    arrayValue, 300 levels; protobuf AnyValue, 200 levels) is a 400 naming the limit, never a 500."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    def attr_json(depth: int) -> bytes:
        value = {"stringValue": "x"}
        for _ in range(depth):
            value = {"arrayValue": {"values": [value]}}
        span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "s", "attributes": [{"key": "k", "value": value}]}
        return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()

    def attr_proto(depth: int) -> bytes:
        req = ExportTraceServiceRequest()
        value = req.resource_spans.add().scope_spans.add().spans.add().attributes.add().value
        for _ in range(depth):
            value = value.array_value.values.add()
        value.string_value = "x"
        return req.SerializeToString()

    bodies = [(b"[" * d + b"]" * d, "application/json") for d in (100, 10_000, 1_000_000)]
    bodies += [(attr_json(300), "application/json"), (attr_proto(200), "application/x-protobuf")]

    async def body(rx):
        url = f"http://127.0.0.1:{rx.port}/v1/traces"
        async with aiohttp.ClientSession() as s:
            answers = []
            for data, ctype in bodies:
                async with s.post(url, data=io.BytesIO(data), headers={"Content-Type": ctype}) as r:
                    answers.append((r.status, await r.text()))
        await asyncio.to_thread(_sdk_export, rx.port, Compression.NoCompression, 1)
        await until(lambda: rx.stats["requests"] >= 1)
        return answers, await rx.collect(), rx

    answers, coll, rx = asyncio.run(_with_receiver(OtlpConfig(listen="127.0.0.1:0", stitch=FAST), body))
    assert [s for s, _ in answers] == [400] * 5, answers
    assert all("nested deeper than 64" in t for _, t in answers[:4]) and "protobuf" in answers[4][1]
    assert rx.stats["requests"] == 1 and coll.health[0].up and coll.health[0].errors["bad_payload"] == 5


def test_a_stitching_error_is_a_counted_500_and_a_dead_flush_loop_shows_in_health():
    """Our own guard logic, with the stitcher made to fail once (a fake for that one call): the
    request gets a 500, `internal_<error>` is counted in health, the next export is stitched; a
    flush loop that ended shows the receiver down with the reason."""

    async def body(rx):
        real_add, calls = rx.stitcher.add, []

        def failing_once(spans):
            calls.append(1)
            if len(calls) == 1:
                raise KeyError("stitcher bug")
            return real_add(spans)

        rx.stitcher.add = failing_once
        async with aiohttp.ClientSession() as s:
            first = await s.post(
                f"http://127.0.0.1:{rx.port}/v1/traces", data=b"", headers={"Content-Type": "application/x-protobuf"}
            )
        await asyncio.to_thread(_sdk_export, rx.port, Compression.NoCompression, 1)
        await until(lambda: rx.stats["requests"] >= 1)
        up = await rx.collect()
        rx._tasks[0].cancel()  # the flush loop ends with an error:
        rx._tasks[0] = asyncio.create_task(_boom())
        await asyncio.sleep(0.05)
        return first.status, up, await rx.collect()

    async def _boom():
        raise RuntimeError("flush loop bug")

    status, up, down = asyncio.run(_with_receiver(OtlpConfig(listen="127.0.0.1:0", stitch=FAST), body))
    assert status == 500 and up.health[0].up and up.health[0].errors["internal_KeyError"] == 1
    assert not down.health[0].up and down.health[0].reason == "loop_RuntimeError"
