"""The request tap in front of a real vLLM on CPU: byte-exact streams and the fairness proof."""

import asyncio
import json
import urllib.request

import aiohttp
import pytest

from kvscope.agent.derive.fairness import evaluate_fairness, parse_tenant_usage
from kvscope.agent.normalize.dialect import normalize
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.agent.tap.proxy import RequestTap, TapConfig
from testbed.loadgen import TENANT_HEADER, LoadSpec, run_load
from testbed.tenants import Dist, Tenant
from testbed.tiny_model import SERVED_NAME

pytestmark = pytest.mark.vllm


def engine_counters(metrics_url: str) -> dict[tuple[str, str | None], float]:
    """Canonical counter values of one scrape: (name, source label) -> value."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    norm = normalize(parse_exposition(text), "vllm", {"instance": "vllm"})
    return {(s.name, s.label("source")): s.value for s in norm.samples if s.name.endswith("_total")}


async def _post(session, url, body, headers=None):
    async with session.post(url, json=body, headers=headers or {}) as r:
        return r.status, await r.read()


def _with_tap(upstream: str, scenario, **cfg):
    async def main():
        tap = RequestTap(TapConfig(upstreams=(upstream,), listen="127.0.0.1:0", **cfg))
        await tap.start()
        try:
            async with aiohttp.ClientSession() as s:
                return await scenario(s, f"http://127.0.0.1:{tap.port}"), tap
        finally:
            await tap.stop()

    return asyncio.run(main())


def _content(stream: bytes) -> str:
    """Concatenated generated text of an SSE stream (chat delta content or completion text)."""
    out = []
    for ev in stream.split(b"\n\n"):
        if ev.startswith(b"data: {"):
            for c in json.loads(ev[6:]).get("choices", []):
                out.append((c.get("delta") or {}).get("content") or c.get("text") or "")
    return "".join(out)


class WireRecorder:
    """A TCP relay between the tap and vLLM that keeps the exact bytes vLLM sent (test tooling)."""

    def __init__(self, upstream_port: int):
        self.upstream_port, self.received, self.tasks = upstream_port, [], []

    async def start(self):
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _conn(self, cr, cw):
        self.tasks.append(asyncio.current_task())
        ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        buf = bytearray()
        self.received.append(buf)

        async def pipe(r, w, record):
            try:
                while data := await r.read(65536):
                    if record is not None:
                        record.extend(data)
                    w.write(data)
                    await w.drain()
            finally:
                w.close()

        try:
            await asyncio.gather(pipe(cr, uw, None), pipe(ur, cw, buf), return_exceptions=True)
        except asyncio.CancelledError:
            pass  # stop(): the keep-alive connection is cut

    async def stop(self):
        self.server.close()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()


def http_body(response: bytes) -> bytes:
    """The body of one raw HTTP/1.1 response, chunked transfer-encoding undone."""
    head, _, rest = response.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" not in head.lower():
        return rest
    out = bytearray()
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2 :]
    return bytes(out)


def _content(stream: bytes) -> str:
    """Concatenated generated text of an SSE stream (chat delta content or completion text)."""
    out = []
    for ev in stream.split(b"\n\n"):
        if ev.startswith(b"data: {"):
            for c in json.loads(ev[6:]).get("choices", []):
                out.append((c.get("delta") or {}).get("content") or c.get("text") or "")
    return "".join(out)


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "the cache prefix metric trace"}]}),
        ("/v1/completions", {"prompt": "the cache prefix metric trace span latency"}),
    ],
)
def test_stream_through_the_tap_is_byte_identical_to_what_the_client_would_get(vllm_small_kv, path, body):
    """The client did not ask for usage; the tap asks vLLM for it and strips exactly that chunk.

    vLLM coalesces tokens into fewer chunks when its consumer lags, so two runs of one request
    need not frame alike. The proof records the bytes vLLM put on the wire to the tap (a TCP
    relay) and shows client bytes == those bytes minus the one usage-only event; a direct run
    then shows the same text and no usage chunk."""
    req = {
        "model": SERVED_NAME,
        "max_tokens": 24,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "request_id": "kvscope-byte-test",
        **body,
    }
    port = int(vllm_small_kv.url.rsplit(":", 1)[1])

    async def main():
        wire = WireRecorder(port)
        await wire.start()
        tap = RequestTap(TapConfig(upstreams=(f"http://127.0.0.1:{wire.port}",), listen="127.0.0.1:0"))
        await tap.start()
        try:
            async with aiohttp.ClientSession() as s:
                tapped = await _post(s, f"http://127.0.0.1:{tap.port}" + path, req, {"X-Tenant": "bytes"})
                direct = await _post(s, vllm_small_kv.url + path, req)
        finally:
            await tap.stop()
            await wire.stop()
        return direct, tapped, tap, wire

    direct, tapped, tap, wire = asyncio.run(main())
    assert direct[0] == tapped[0] == 200
    [raw] = [http_body(bytes(r)) for r in wire.received if r]
    usage_events = [e for e in raw.split(b"\n\n") if b'"choices":[],"usage":{' in e]
    assert len(usage_events) == 1  # vLLM sent usage because the tap asked
    assert tapped[1] == raw.replace(usage_events[0] + b"\n\n", b"")  # ... and only that event was removed
    assert b'"usage"' not in direct[1] and b'"usage"' not in tapped[1]
    assert _content(tapped[1]) == _content(direct[1])
    assert tapped[1].endswith(b"data: [DONE]\n\n")
    # ... and the tap still learned the token counts from the usage chunk it stripped
    values = {(x.name, x.label("tenant")): x.value for x in tap.render_samples()}
    assert values[("tenant_prompt_tokens_total", "bytes")] == json.loads(usage_events[0][6:])["usage"]["prompt_tokens"]
    assert ("tenant_cached_tokens_total", "bytes") in values


def test_fairness_proof_long_tail_tenant_is_cold_and_tap_totals_match_the_engine(vllm_small_kv):
    """Four tenants, one long tail, every system prompt ~600 tokens, a 4096-token KV pool.

    The working set (4 prefixes + in-flight requests) does not fit, so LRU keeps the frequent
    tenants' prefixes and evicts the rare one's: a healthy aggregate hit ratio hiding a cold
    tenant (seeds/001). The tap's per-tenant sums must equal the engine's own counters.
    """
    tenants = [
        Tenant(
            f"hot-{i}", system_words=600, share=0.3, prompt_words=Dist("fixed", 300), output_tokens=Dist("fixed", 16)
        )
        for i in range(3)
    ]
    tenants.append(
        Tenant("tail", system_words=600, share=0.1, prompt_words=Dist("fixed", 300), output_tokens=Dist("fixed", 16))
    )
    spec = LoadSpec(tenants=tenants, max_requests=160, duration_s=240, concurrency=2, seed=3)
    before = engine_counters(vllm_small_kv.metrics_url)

    async def scenario(s, tap):
        return await run_load(spec, [tap])

    result, tap = _with_tap(vllm_small_kv.url, scenario, tenant_header=TENANT_HEADER)
    assert all(r.ok for r in result.records), [r.error for r in result.records if not r.ok][:5]
    after = engine_counters(vllm_small_kv.metrics_url)

    usage = parse_tenant_usage(tap.render_samples())
    assert set(usage) == {"hot-0", "hot-1", "hot-2", "tail"}
    delta_prompt = after[("engine_prompt_tokens_total", None)] - before[("engine_prompt_tokens_total", None)]
    delta_cached = (
        after[("engine_prompt_tokens_by_source_total", "local_cache_hit")]
        - before[("engine_prompt_tokens_by_source_total", "local_cache_hit")]
    )
    assert sum(u.prompt_tokens for u in usage.values()) == delta_prompt
    assert sum(u.cached_tokens or 0 for u in usage.values()) == delta_cached

    rep = evaluate_fairness(usage)
    tail = rep.tenants["tail"]
    print(
        json.dumps(
            {
                "aggregate": rep.aggregate_hit_ratio,
                "jain": rep.jain_index,
                "gap": rep.tail_gap_ratio,
                "tenants": {
                    k: [t.requests, t.hit_ratio, t.reuse_potential_ratio, t.lost_reuse_ratio]
                    for k, t in rep.tenants.items()
                },
            },
            indent=1,
        )
    )
    hot = [t for k, t in rep.tenants.items() if k != "tail"]
    assert rep.aggregate_hit_ratio > 0.5  # "the cache is working" ...
    assert rep.worst_tenant == "tail"  # ... except for the long tail:
    assert tail.hit_ratio < rep.aggregate_hit_ratio - 0.15  # measurable unfairness,
    assert tail.reuse_potential_ratio > 0.5  # although its prompts repeat,
    assert tail.lost_reuse_ratio > max(0.15, 2 * max(t.lost_reuse_ratio for t in hot))  # the reuse is lost
