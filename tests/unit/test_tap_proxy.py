"""The tap's proxy logic against an in-process stub upstream (our logic only; real vLLM: integration)."""

import asyncio
import json
from types import SimpleNamespace

import aiohttp
from aiohttp import web

from kvscope.agent.derive.fairness import parse_tenant_usage
from kvscope.agent.serve.site import HttpSite
from kvscope.agent.tap.proxy import RequestTap, TapConfig, parse_traceparent
from kvscope.commands.tap import build_tap


def _chunk(i, text):
    return f'data: {{"id":"c1","object":"text_completion","choices":[{{"index":0,"text":"{text}"}}]}}\n\n'.encode()


USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15, "prompt_tokens_details": {"cached_tokens": 8}}


class Stub:
    """Mimics vLLM's SSE framing; records what it was sent."""

    def __init__(self):
        self.bodies, self.headers = [], []
        self.port = None

    async def handle(self, request):
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        if body.get("prompt") == "boom":
            return web.json_response({"error": "engine dead"}, status=503)
        if not body.get("stream"):
            return web.json_response({"id": "c1", "choices": [{"text": "abc"}], "usage": USAGE})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        n = 200 if body.get("prompt") == "long" else 3
        for i in range(n):
            await resp.write(_chunk(i, "t"))
            await asyncio.sleep(0.002)
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(b'data: {"id":"c1","choices":[],"usage":' + json.dumps(USAGE).encode() + b"}\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(self, request):
        return web.json_response({"data": [{"id": "m"}]})

    async def start(self):
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        app.router.add_get("/v1/models", self.models)
        self.site = HttpSite(app)
        self.port = await self.site.start("127.0.0.1", 0)

    async def stop(self):
        await self.site.stop()

    @property
    def runner(self):
        """The older spelling `stub.runner.cleanup()`, still used by test_tap_collector.py and
        test_tap_proxy_wire.py: the same as `stop()`."""
        return SimpleNamespace(cleanup=self.stop)


async def until(cond, timeout_s=120.0):
    """Wait until cond() holds (a busy machine may take a while to notice a closed socket); the
    generous ceiling is a hang guard only, the wait ends as soon as cond() holds."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)


def run(scenario, poll=None, **cfg):
    async def main():
        stub = Stub()
        await stub.start()
        spans = []
        tap = build_tap(
            TapConfig(upstreams=(f"http://127.0.0.1:{stub.port}",), listen="127.0.0.1:0", **cfg), span_sink=spans.extend
        )
        await tap.start()
        try:
            async with aiohttp.ClientSession() as s:
                out = await scenario(s, f"http://127.0.0.1:{tap.port}", f"http://127.0.0.1:{stub.port}")
            if poll is not None:
                await until(lambda: poll(tap))
        finally:
            await tap.stop()
            await stub.stop()
        return out, tap, stub, spans

    return asyncio.run(main())


async def _raw(s, url, body, headers=None):
    async with s.post(url + "/v1/completions", json=body, headers=headers or {}) as r:
        return r.status, await r.read()


def test_stream_without_usage_reaches_the_client_unchanged_and_usage_is_still_counted():
    body = {"model": "m", "prompt": "hello", "stream": True}

    async def scenario(s, tap, direct):
        return await _raw(s, direct, body), await _raw(s, tap, body, {"X-Tenant": "acme"})

    (direct, tapped), tap, stub, spans = run(scenario)
    assert tapped == direct  # byte for byte
    assert stub.bodies[1]["stream_options"] == {"include_usage": True}
    samples = {(x.name, x.label("tenant")): x.value for x in tap.render_samples()}
    assert samples[("tenant_requests_total", "acme")] == 1
    assert samples[("tenant_prompt_tokens_total", "acme")] == 12
    assert samples[("tenant_cached_tokens_total", "acme")] == 8
    assert samples[("tenant_ttft_seconds_count", "acme")] == 1
    assert samples[("tenant_itl_seconds_count", "acme")] == 2
    [span] = spans
    assert span.attributes["kvscope.tenant"] == "acme" and span.attributes["gen_ai.usage.cached_tokens"] == 8


def test_a_long_stream_and_a_plain_answer_are_counted():
    async def scenario(s, tap, _):
        return [await _raw(s, tap, {"prompt": "long", "stream": True}), await _raw(s, tap, {"prompt": "x"})]

    [(status, body), (status2, _)], tap, *_ = run(scenario, poll=lambda t: t.stats["requests"] == 2)
    assert status == status2 == 200 and body.count(b'"choices":[{') == 200 and body.endswith(b"data: [DONE]\n\n")
    ttft = {x.name: x.value for x in tap.render_samples() if x.name.startswith("tenant_itl_seconds_count")}
    assert ttft == {"tenant_itl_seconds_count": 199}  # 200 token events, 199 gaps


def test_client_that_asked_for_usage_gets_its_usage_chunk():
    body = {"model": "m", "prompt": "hello", "stream": True, "stream_options": {"include_usage": True}}

    async def scenario(s, tap, direct):
        return await _raw(s, direct, body), await _raw(s, tap, body)

    (direct, tapped), *_ = run(scenario)
    assert tapped == direct and b'"usage"' in tapped[1]


def test_traceparent_is_continued_and_the_engine_gets_the_taps_span_as_parent():
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    async def scenario(s, tap, direct):
        return await _raw(s, tap, {"model": "m", "prompt": "x"}, {"traceparent": tp, "user": "ignored"})

    _, tap, stub, spans = run(scenario)
    sent = parse_traceparent(stub.headers[0]["traceparent"])
    assert sent[0] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert sent[1] == spans[0].span_id and spans[0].parent_id == "00f067aa0ba902b7"


def test_upstream_5xx_passes_through_and_is_counted():
    async def scenario(s, tap, direct):
        return await _raw(s, tap, {"model": "m", "prompt": "boom"})

    (status, data), tap, *_ = run(scenario)
    assert status == 503 and b"engine dead" in data
    assert tap.stats["upstream_503"] == 1
    assert not [x for x in tap.render_samples() if x.name == "tenant_ttft_seconds_count"]


def test_unreachable_upstream_gives_502_and_the_tap_keeps_serving():
    async def main():
        tap = RequestTap(TapConfig(upstreams=("http://127.0.0.1:9",), listen="127.0.0.1:0"))
        await tap.start()
        try:
            async with aiohttp.ClientSession() as s:
                a = await _raw(s, f"http://127.0.0.1:{tap.port}", {"model": "m", "prompt": "x"})
                b = await _raw(s, f"http://127.0.0.1:{tap.port}", {"model": "m", "prompt": "x"})
        finally:
            await tap.stop()
        return a, b, tap

    a, b, tap = asyncio.run(main())
    assert a[0] == b[0] == 502 and tap.stats["upstream_unreachable"] == 2


def test_client_disconnect_mid_stream_closes_upstream_without_crashing():
    async def scenario(s, tap, direct):
        async with s.post(tap + "/v1/completions", json={"model": "m", "prompt": "long", "stream": True}) as r:
            await r.content.readany()
        ok = await _raw(s, tap, {"model": "m", "prompt": "after"})
        return ok

    (status, _), tap, *_ = run(scenario, poll=lambda t: t.stats["client_disconnect"] == 1)
    assert status == 200
    assert tap.stats["client_disconnect"] == 1 and tap.stats["requests"] == 2


def test_non_accounted_paths_are_plain_pass_through():
    async def scenario(s, tap, direct):
        async with s.get(tap + "/v1/models") as r:
            return r.status, await r.json()

    (status, doc), tap, *_ = run(scenario)
    assert status == 200 and doc == {"data": [{"id": "m"}]} and tap.stats["requests"] == 0


def test_tenant_cardinality_is_bounded_and_fairness_input_is_built():
    async def scenario(s, tap, direct):
        for i in range(5):
            await _raw(s, tap, {"model": "m", "prompt": "p" * 200, "user": f"u{i}"})

    _, tap, *_ = run(scenario, max_tenants=2)
    usage = parse_tenant_usage(tap.render_samples())
    assert set(usage) == {"u0", "u1", "other"} and usage["other"].requests == 3
    assert usage["u1"].reusable_tokens == 12  # same prompt as u0: every full block already seen


def test_adapter_series_are_bounded_and_a_request_without_model_has_none():
    """The request's `model` (a LoRA adapter or the base) is the `adapter` label, top-K + `other`;
    a request without a model (or an empty one) counts under its tenant only, in no adapter series."""

    async def scenario(s, tap, direct):
        for model in ("lora-a", "lora-a", "lora-b", "lora-c", "lora-d"):
            await _raw(s, tap, {"model": model, "prompt": "hi", "stream": True}, {"X-Tenant": "acme"})
        await _raw(s, tap, {"prompt": "hi", "stream": True}, {"X-Tenant": "acme"})
        await _raw(s, tap, {"model": " ", "prompt": "hi"}, {"X-Tenant": "acme"})

    _, tap, *_ = run(scenario, max_adapters=2, poll=lambda t: t.stats["requests"] == 7)
    samples = {(x.name, x.label("adapter") or x.label("tenant")): x.value for x in tap.render_samples()}
    assert samples[("tenant_requests_total", "acme")] == 7
    reqs = {k[1]: v for k, v in samples.items() if k[0] == "adapter_requests_total"}
    assert reqs == {"lora-a": 2, "lora-b": 1, "other": 2}
    assert samples[("adapter_prompt_tokens_total", "lora-a")] == 24
    assert samples[("adapter_completion_tokens_total", "lora-a")] == 6
    assert samples[("adapter_ttft_seconds_count", "lora-a")] == 2
    assert samples[("adapter_itl_seconds_count", "lora-b")] == 2
    assert samples[("adapter_request_seconds_total", "lora-a")] > 0
    assert samples[("tenant_completion_tokens_total", "acme")] == 21
    assert all(x.label("tenant") is None for x in tap.render_samples() if x.name.startswith("adapter_"))
