"""Real vLLM on CPU exporting OTLP/HTTP protobuf to kvscope's receiver, requests sent through the tap.

The tap starts each trace and passes `traceparent`; vLLM's `llm_request` span joins it; the
receiver stitches the tap span (tenant) and the engine span (phases) into one request record.
"""

import asyncio
import threading
import time

import aiohttp
import pytest

from kvscope.agent.tap.proxy import RequestTap, TapConfig
from kvscope.agent.traces.export import SpanBatchExporter
from kvscope.agent.traces.receiver import OtlpConfig, OtlpTraceReceiver
from kvscope.agent.traces.stitch import StitchConfig
from testbed.tiny_model import SERVED_NAME
from testbed.vllm_server import VllmConfig, free_port

pytestmark = pytest.mark.vllm


class LoopThread:
    """An asyncio loop on a thread, so servers keep serving while the test blocks."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout=120):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def receiver():
    bg = LoopThread()
    port = free_port()
    rx = OtlpTraceReceiver(OtlpConfig(listen=f"127.0.0.1:{port}", stitch=StitchConfig(settle_s=0.5, ttl_s=60)))
    bg.run(rx.start())
    yield rx, bg, port
    bg.run(rx.stop())
    bg.close()


def test_vllm_llm_request_spans_are_stitched_with_the_taps_tenant(receiver, vllm_server_factory):
    rx, bg, port = receiver
    srv = vllm_server_factory(VllmConfig(otlp_endpoint=f"http://127.0.0.1:{port}/v1/traces"))
    # the tap's spans reach the receiver over OTLP/HTTP, as `kvscope tap --otlp-endpoint` sends them
    exporter = SpanBatchExporter(f"http://127.0.0.1:{port}/v1/traces", interval_s=0.2)
    tap = RequestTap(TapConfig(upstreams=(srv.url,), listen="127.0.0.1:0"), span_sink=exporter.add)
    bg.run(tap.start())
    sender = asyncio.run_coroutine_threadsafe(exporter.run(), bg.loop)

    async def send(tenant, i, stream):
        body = {
            "model": SERVED_NAME,
            "max_tokens": 12,
            "ignore_eos": True,
            "stream": stream,
            "messages": [{"role": "user", "content": f"the cache prefix metric trace {i}"}],
        }
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"http://127.0.0.1:{tap.port}/v1/chat/completions", json=body, headers={"X-Tenant": tenant}) as r,
        ):
            await r.read()
            return r.status

    try:
        statuses = [bg.run(send(t, i, i % 2 == 0)) for i, t in enumerate(["acme", "acme", "globex", "initech"])]
        # vLLM's BatchSpanProcessor exports every ~5 s, later on a CPU-starved box (a vLLM start took 13x
        # its idle time at load average 25); the wait ends as soon as the spans are in
        deadline = time.time() + 120
        while time.time() < deadline and sum(r.engine == "vllm" for r in list(rx.recent)) < 4:
            time.sleep(0.5)
    finally:
        bg.run(tap.stop())
        sender.cancel()
    assert statuses == [200] * 4 and exporter.sent >= 4 and not exporter.failed
    records = [r for r in list(rx.recent) if r.engine == "vllm"]
    assert len(records) == 4
    assert sorted(r.tenant for r in records) == ["acme", "acme", "globex", "initech"]
    for r in records:
        assert r.role == "unified" and r.completion_tokens == 12 and r.prompt_tokens > 0
        assert {p.phase for p in r.phases} == {"queue", "prefill", "decode"}
        assert 0 < r.phase("prefill") < r.e2e_s and r.phase("decode") > 0
        vllm_span = r.anchors["unified"]
        assert vllm_span.parent_id != "" and vllm_span.resource["service.name"] == "vllm-testbed"
    coll = bg.run(rx.collect())
    counts = {s.label("phase"): s.value for s in coll.samples if s.name == "request_phase_seconds_count"}
    assert counts["prefill"] >= 4 and counts["decode"] >= 4
    assert coll.health[0].up and not coll.health[0].errors
    # the tap counted these requests per tenant already: the receiver must not count them again
    assert all(r.tapped for r in records) and rx.tenants.stats["counted_by_tap"] >= 4
    assert not [s for s in coll.samples if s.name.startswith("tenant_")]
