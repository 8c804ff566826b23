"""Tenant counters from traces alone: the real OTel SDK exporter -> the agent's OTLP receiver -> /metrics."""

import asyncio
import time

from agentharness import fetch_metrics, running_agent, value
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

# (tenant, how the tenant is carried, engine shape, prompt tokens, cached tokens or None, ttft s)
TRAFFIC = (
    [("acme", "span", "sglang", 1000, 800, 0.05)] * 6
    + [("tail", "resource", "sglang", 400, 40, 0.30)] * 5
    + [("plain", "span", "vllm", 120, None, 0.02)] * 3
)


def _export(port: int) -> None:
    """Send every request of TRAFFIC as its own trace through the SDK's OTLP/HTTP protobuf exporter,
    plus one trace that the request tap already measured (its span's scope is `kvscope.tap`)."""
    providers = {}

    def tracer(service: str, scope: str, resource_tenant: str | None):
        key = (service, scope, resource_tenant)
        if key not in providers:
            attrs = {"service.name": service} | ({"tenant.id": resource_tenant} if resource_tenant else {})
            p = TracerProvider(resource=Resource.create(attrs))
            p.add_span_processor(
                SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=5))
            )
            providers[key] = p
        return providers[key].get_tracer(scope)

    for i, (tenant, carried, engine, prompt, cached, ttft) in enumerate(TRAFFIC):
        attrs = {
            "gen_ai.usage.prompt_tokens": prompt,
            "gen_ai.usage.completion_tokens": 8,
            "gen_ai.latency.time_to_first_token": ttft,
            "gen_ai.request.id": f"r{i}",
            "kvscope.instance": "10.0.0.5:8000",
        }
        if cached is not None:
            attrs["gen_ai.usage.cached_tokens"] = cached
        if carried == "span":
            attrs["kvscope.tenant"] = tenant
        t = tracer(f"{engine}-0", "engine", tenant if carried == "resource" else None)
        with t.start_as_current_span(
            "llm_request" if engine == "vllm" else f"Req {i:08x}", kind=SpanKind.SERVER, attributes=attrs
        ):
            time.sleep(0.001)
    tap = tracer("kvscope-tap", "kvscope.tap", None)
    with tap.start_as_current_span("POST /v1/chat/completions", attributes={"kvscope.tenant": "acme"}):
        with tracer("vllm-0", "engine", None).start_as_current_span(
            "llm_request", attributes={"gen_ai.usage.prompt_tokens": 999, "kvscope.instance": "10.0.0.5:8000"}
        ):
            pass
    for p in providers.values():
        p.shutdown()


def test_traced_tenants_get_the_tap_series_with_the_right_totals():
    doc = {"otlp": {"listen": "127.0.0.1:0", "settle_s": 0.05}}

    async def main():
        async with running_agent(doc, only=("otlp",)) as (runtime, base):
            [rx] = runtime.collectors
            await rx.start()
            await asyncio.to_thread(_export, rx.port)
            deadline = time.monotonic() + 300  # ends when all requests arrived; a hang guard only
            while rx.stats["requests"] < len(TRAFFIC) + 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await runtime.run_cycle()
            return rx, await fetch_metrics(base)

    rx, (text, expo) = asyncio.run(main())
    assert rx.stats["requests"] == len(TRAFFIC) + 1
    assert rx.tenants.stats["counted_by_tap"] == 1  # the tapped request is not counted twice
    for tenant in ("acme", "tail", "plain"):
        rows = [r for r in TRAFFIC if r[0] == tenant]
        lab = {"tenant": tenant, "instance": "10.0.0.5:8000"}
        assert value(expo, "kvscope_tenant_requests_total", **lab) == len(rows)
        assert value(expo, "kvscope_tenant_prompt_tokens_total", **lab) == sum(r[3] for r in rows)
        assert value(expo, "kvscope_tenant_ttft_seconds_count", **lab) == len(rows)
        assert abs(value(expo, "kvscope_tenant_ttft_seconds_sum", **lab) - sum(r[5] for r in rows)) < 1e-9
    assert value(expo, "kvscope_tenant_cached_tokens_total", tenant="acme") == 6 * 800
    assert value(expo, "kvscope_tenant_cached_tokens_total", tenant="tail") == 5 * 40
    assert value(expo, "kvscope_tenant_cached_tokens_total", tenant="plain") is None  # vLLM span: absent, not 0
    assert value(expo, "kvscope_tenant_prefix_hit_ratio", tenant="acme") == 0.8
    assert value(expo, "kvscope_tenant_prefix_hit_ratio", tenant="tail") == 0.1
    assert value(expo, "kvscope_tenant_prefix_hit_ratio", tenant="plain") is None
    gap = value(expo, "kvscope_fleet_tenant_hit_ratio_tail_gap_ratio")
    assert abs(gap - ((4800 + 200) / 8000 - 0.1)) < 1e-9
    assert "kvscope_tenant_reusable_tokens_total" not in text  # only the tap can estimate reuse
