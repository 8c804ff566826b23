"""OTLP push: the real agent scrapes a real vLLM capture, the OpenTelemetry SDK's OTLP/HTTP exporter
pushes its metrics, and a local HTTP receiver decodes the protobuf with opentelemetry-proto.

No real OTLP receiver is installable here: the Debian VictoriaMetrics (1.79) answers
"unsupported path" at /opentelemetry/v1/metrics (its OpenTelemetry ingestion came in 1.92), the
Debian Prometheus (2.42) has no OTLP receiver (2.47+), and no OpenTelemetry Collector ships as a
Debian, PyPI or npm package. So the receiver is the OTLP protobuf schema itself, and the values
read back are compared with the agent's own /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from unittest import mock

from agentharness import fetch_metrics, fetch_text, running_agent, start_target_process, target_server, value
from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from kvscope.agent.otel.push import OtlpPusher, push_config
from kvscope.agent.serve.site import HttpSite
from testbed.procs import start_reporting_port, stop_process

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "scrapes"
VLLM = (FIXTURES / "vllm-0.32.0-cpu-after-load.txt").read_text()  # real vLLM 0.32 on CPU after load


@contextlib.asynccontextmanager
async def otlp_receiver(status: int = 200) -> AsyncIterator[tuple[str, list[tuple[Any, ExportMetricsServiceRequest]]]]:
    """POST /v1/metrics decoding OTLP protobuf; yields (endpoint URL, [(headers, request)])."""
    got: list[tuple[Any, ExportMetricsServiceRequest]] = []

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        req = ExportMetricsServiceRequest()
        req.ParseFromString(body)
        got.append((request.headers.copy(), req))
        if status != 200:
            return web.Response(status=status, text="receiver refuses\n")
        return web.Response(
            body=ExportMetricsServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/metrics", receive)
    site = HttpSite(app, handle_signals=False, shutdown_timeout=0.2, access_log=None)
    port = await site.start("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}/v1/metrics", got
    finally:
        await site.stop()


def _metrics(req: ExportMetricsServiceRequest) -> dict[str, object]:
    return {m.name: m for rm in req.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def _attrs(point) -> dict[str, object]:
    out = {}
    for kv in point.attributes:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which)
    return out


async def _run(environ: dict[str, str], status: int = 200, pushes: int = 1):
    async def vllm(request: web.Request) -> web.Response:
        return web.Response(text=VLLM)

    async with target_server({"/metrics": vllm}) as base, otlp_receiver(status) as (endpoint, got):
        doc = {"targets": [{"url": base + "/metrics", "job": "vllm"}], "store": {"path": ""}}
        environ = {k: v.replace("{endpoint}", endpoint) for k, v in environ.items()}
        async with running_agent(doc) as (runtime, agent):
            with mock.patch.dict(os.environ, environ):  # the SDK's exporter reads the process's
                cfg = push_config(None)
            assert cfg is not None
            pusher = OtlpPusher(cfg, runtime.state)
            results = []
            for _ in range(pushes):
                await runtime.run_cycle()
                results.append(await pusher.push_once())
            await asyncio.to_thread(pusher.exporter.shutdown)
            text, expo = await fetch_metrics(agent)
            _, health = await fetch_text(agent + "/api/v1/health")
    return results, got, expo, health, base


def test_agent_pushes_genai_server_metrics_equal_to_its_own_metrics():
    env = {
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "{endpoint}".removesuffix("/v1/metrics"),
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "{endpoint}",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=team%20a,authorization=Bearer abc",
    }
    results, got, expo, health, base = asyncio.run(_run(env))
    assert results == ["ok"]
    assert len(got) == 1
    headers, req = got[0]
    assert headers["x-tenant"] == "team a" and headers["authorization"] == "Bearer abc"
    assert headers["Content-Type"] == "application/x-protobuf"
    metrics = _metrics(req)
    instance = base.removeprefix("http://")
    host, port = instance.rsplit(":", 1)
    for name, canonical in (
        ("gen_ai.server.time_to_first_token", "kvscope_request_ttft_seconds"),
        ("gen_ai.server.request.duration", "kvscope_request_e2e_seconds"),
        ("gen_ai.server.time_per_output_token", "kvscope_request_tpot_seconds"),
    ):
        m = metrics[name]
        assert m.unit == "s" and m.WhichOneof("data") == "histogram"
        assert m.histogram.aggregation_temporality == 2  # cumulative
        (point,) = m.histogram.data_points
        assert _attrs(point) == {
            "gen_ai.operation.name": "text_completion",
            "gen_ai.provider.name": "vllm",
            "gen_ai.system": "vllm",
            "gen_ai.request.model": "tiny-llama",
            "server.address": host,
            "server.port": int(port),
        }
        labels = {"instance": instance, "model": "tiny-llama"}
        assert point.count == value(expo, canonical + "_count", **labels)
        assert abs(point.sum - value(expo, canonical + "_sum", **labels)) < 1e-9
        assert sum(point.bucket_counts) == point.count
        assert len(point.bucket_counts) == len(point.explicit_bounds) + 1
        cumulative = 0
        for bound, n in zip(point.explicit_bounds, point.bucket_counts, strict=False):
            cumulative += n
            assert cumulative == value(expo, canonical + "_bucket", le=_le(bound), **labels)
        assert not point.HasField("min") and not point.HasField("max")  # unknown from buckets: absent
    ttft = metrics["gen_ai.server.time_to_first_token"].histogram.data_points[0]
    assert list(ttft.explicit_bounds) == [
        0.001,
        0.005,
        0.01,
        0.02,
        0.04,
        0.06,
        0.08,
        0.1,
        0.25,
        0.5,
        0.75,
        1.0,
        2.5,
        5.0,
        7.5,
        10.0,
    ]  # vLLM's buckets contain the conventions' advice: merged onto it exactly
    # the whole /metrics rides along: a gauge, a counter and the agent's own health
    running = metrics["kvscope_engine_requests_running"].gauge.data_points[0]
    assert running.as_double == value(expo, "kvscope_engine_requests_running", instance=instance)
    assert metrics["kvscope_target_up"].gauge.data_points[0].as_double == 1.0
    assert metrics["kvscope_engine_prompt_tokens_total"].sum.is_monotonic
    # the push is counted where the agent reports its own health
    assert value(expo, "kvscope_exports_total", exporter="otlp", result="ok") == 1.0
    assert '"otlp_push": {"up": true, "reason": "ok"' in health


def _le(bound: float) -> str:
    text = repr(float(bound))
    return text


def test_a_failing_receiver_is_counted_and_shown_down_and_delta_sends_increases():
    env = {"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "{endpoint}"}
    results, got, expo, health, _ = asyncio.run(_run(env, status=400))
    assert results == ["failed"]
    assert got, "the exporter reached the receiver"
    assert value(expo, "kvscope_exports_total", exporter="otlp", result="failed") == 1.0
    assert value(expo, "kvscope_collector_up", collector="otlp_push") == 0.0

    env |= {"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta"}
    results, got, expo, _, _ = asyncio.run(_run(env, pushes=2))
    assert results == ["ok", "ok"]
    first, second = (_metrics(req)["gen_ai.server.time_to_first_token"].histogram for _, req in got)
    assert first.aggregation_temporality == 1  # delta
    # the same capture scraped twice: everything in the first delta, nothing new in the second
    assert first.data_points[0].count == value(expo, "kvscope_request_ttft_seconds_count", model="tiny-llama")
    assert second.data_points[0].count == 0 and sum(second.data_points[0].bucket_counts) == 0
    assert second.data_points[0].start_time_unix_nano == first.data_points[0].time_unix_nano


def test_kvscope_agent_process_pushes_when_the_standard_variables_say_so(tmp_path):
    """`kvscope agent` as users run it: only OTEL_* variables switch the push on."""
    (tmp_path / "metrics").write_text(VLLM)

    async def main():
        async with otlp_receiver() as (endpoint, got):
            target, url = await asyncio.to_thread(start_target_process, tmp_path)
            env = {
                **os.environ,
                "OTEL_METRICS_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint.removesuffix("/v1/metrics"),
                "OTEL_METRIC_EXPORT_INTERVAL": "300",
            }
            argv = [sys.executable, "-m", "kvscope", "agent", "--target", url + "/metrics"]
            argv += ["--scrape.interval", "1s", "--web.listen-address", "127.0.0.1:0", "--store.path", ""]
            agent, port = await asyncio.to_thread(
                start_reporting_port, argv, r"listening on http://127\.0\.0\.1:(\d+)/metrics", env=env
            )
            try:
                for _ in range(600):  # until a push carried the scraped engine (bounded wait, no timing)
                    if any("gen_ai.server.time_to_first_token" in _metrics(req) for _, req in got):
                        break
                    await asyncio.sleep(0.1)
                _, expo = await fetch_metrics(f"http://127.0.0.1:{port}")
            finally:
                await asyncio.to_thread(stop_process, agent)
                await asyncio.to_thread(stop_process, target)
            return got, expo, agent.output_lines

    got, expo, lines = asyncio.run(main())
    pushed = [_metrics(req) for _, req in got if "gen_ai.server.time_to_first_token" in _metrics(req)]
    assert pushed, "".join(lines)
    point = pushed[-1]["gen_ai.server.time_to_first_token"].histogram.data_points[0]
    assert point.count == value(expo, "kvscope_request_ttft_seconds_count", model="tiny-llama") == 247
    assert any("pushing metrics over OTLP to " + "http://127.0.0.1" in line for line in lines)
