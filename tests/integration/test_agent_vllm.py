"""The agent against a real vLLM on CPU: kvscope's engine collector scrapes the real /metrics
while the test bed's load driver sends tenant traffic, and the canonical counters must move the
way the engine's own per-request usage says they should."""

from __future__ import annotations

import asyncio

import pytest
from kvscope.agent.collectors.engine import EngineCollector
from kvscope.agent.config import AgentConfig, Target

from testbed.loadgen import LoadSpec, run_load
from testbed.tenants import Dist, Tenant

pytestmark = pytest.mark.vllm

HITS = "engine_prefix_cache_hits_tokens_total"
QUERIES = "engine_prefix_cache_queries_tokens_total"
PREEMPTIONS = "engine_preemptions_total"
KV_USAGE = "engine_kv_cache_usage_ratio"


def _totals(collection) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in collection.samples:
        out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def _collect_around(srv, spec: LoadSpec, watch_kv: bool = False):
    """Collect before, drive the load (collecting KV usage meanwhile), collect after."""
    collector = EngineCollector(AgentConfig(targets=[Target(url=srv.metrics_url, job="vllm", instance="replica-0")]))
    try:
        before = await collector.collect()
        assert [h.up for h in before.health] == [True], before.health
        assert before.engines == {"replica-0": "vllm"}
        load = asyncio.create_task(run_load(spec, [srv.url]))
        peak_kv = 0.0
        while watch_kv and not load.done():
            peak_kv = max(peak_kv, _totals(await collector.collect()).get(KV_USAGE, 0.0))
            await asyncio.sleep(0.05)
        result = await load
        after = await _settled(collector)
    finally:
        await collector.close()
    return _totals(before), after, result, peak_kv


async def _settled(collector, attempts: int = 25) -> dict[str, float]:
    """Collect until two consecutive scrapes agree: the engine publishes stats asynchronously."""
    prev = _totals(await collector.collect())
    for _ in range(attempts):
        await asyncio.sleep(0.2)
        cur = _totals(await collector.collect())
        if all(cur.get(k) == prev.get(k) for k in (HITS, QUERIES, PREEMPTIONS)):
            return cur
        prev = cur
    return prev


def test_shared_prefixes_raise_canonical_prefix_cache_hits(vllm_small_kv):
    # Two tenants, each with its own 200-word system prompt (~6 KV blocks), light load: no
    # preemption, so every cached token the engine reports per request is one counted hit.
    tenants = [Tenant("alpha", system_words=200), Tenant("beta", system_words=200)]
    spec = LoadSpec(tenants, max_requests=16, duration_s=60, concurrency=2, seed=1)
    before, after, result, _ = asyncio.run(_collect_around(vllm_small_kv, spec))
    assert result.summary()["errors"] == 0
    hits = after[HITS] - before[HITS]
    queries = after[QUERIES] - before[QUERIES]
    client_cached = sum(r.cached_tokens for r in result.records)
    client_prompt = sum(r.prompt_tokens for r in result.records)
    assert hits > 0
    assert queries == client_prompt        # every prompt token was looked up once
    assert hits == client_cached           # and the counter agrees with per-request usage
    # only each tenant's first request misses its system prompt: most tokens must hit
    assert hits / queries > 0.5
    assert after.get(PREEMPTIONS, 0.0) - before.get(PREEMPTIONS, 0.0) == 0


def test_small_kv_pool_under_load_raises_canonical_preemptions(vllm_small_kv):
    # 12 concurrent requests of ~300-500 prompt + 400 output tokens want ~250 blocks of 32
    # tokens; the pool has 128, so the scheduler must preempt running requests.
    tenants = [Tenant("bulk", system_words=300, prompt_words=Dist("uniform", 50, 200),
                      output_tokens=Dist("fixed", 400))]
    spec = LoadSpec(tenants, max_requests=24, duration_s=120, concurrency=12, seed=2, request_timeout_s=300)
    before, after, result, peak_kv = asyncio.run(_collect_around(vllm_small_kv, spec, watch_kv=True))
    assert result.summary()["errors"] == 0, [(r.error, round(r.e2e_s, 1)) for r in result.records if not r.ok]
    assert all(r.completion_tokens == 400 for r in result.records)  # preempted requests still finish
    assert after[PREEMPTIONS] - before[PREEMPTIONS] > 0
    # The gauge is sampled between engine steps and preemption frees blocks at once, so polling
    # can miss the full pool (0.76 seen in CI; 0.20 on a CPU-starved box, where the 50 ms poll
    # becomes seconds). The counter above is the proof of pressure; this only checks that the
    # canonical KV usage signal moved off idle with the load (an unmapped or stuck gauge reads 0).
    assert peak_kv > 0.1, f"KV usage peaked at {peak_kv:.2f}; the canonical gauge did not follow the load"
