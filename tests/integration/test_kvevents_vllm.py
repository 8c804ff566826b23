"""KV events from a real vLLM on CPU over its ipc:// ZMQ socket: residency, churn, hot evictions."""

import asyncio
import json
import urllib.request

import aiohttp
import pytest

from kvscope.agent.kvevents.subscriber import KvEventSource, KvEventSubscriber
from kvscope.agent.normalize.dialect import normalize
from kvscope.agent.scrape.exposition import parse_exposition
from testbed.tenants import synthetic_text
from testbed.tiny_model import SERVED_NAME

pytestmark = pytest.mark.vllm


def evictions_sampled_by_engine(metrics_url: str) -> float:
    """vLLM's own count of evicted blocks (--kv-cache-metrics-sample 1.0 samples every block)."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    samples = normalize(parse_exposition(text), "vllm", {"instance": "vllm"}).samples
    return sum(s.value for s in samples if s.name == "kv_block_lifetime_seconds_count")


def _totals(sub) -> dict[str, float]:
    """The tracker's series summed over labels (bucket series left out)."""
    v: dict[str, float] = {}
    for smp in sub.tracker.render_samples():
        if smp.name != "kv_block_residency_seconds_bucket":
            v[smp.name] = v.get(smp.name, 0.0) + smp.value
    return v


async def _complete(session, base, key, words, max_tokens):
    body = {
        "model": SERVED_NAME,
        "prompt": synthetic_text(key, words),
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    async with session.post(base + "/v1/completions", json=body) as r:
        await r.read()
        return r.status


def test_vllm_kv_events_give_residency_churn_and_match_the_engines_eviction_count(vllm_small_kv):
    endpoint = vllm_small_kv.kv_events_endpoint
    assert endpoint and endpoint.startswith("ipc://")

    async def main():
        sub = KvEventSubscriber(KvEventSource(endpoint, "vllm-0", "kv"))
        await sub.start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
                # PUB/SUB slow joiner: probe until an event arrives, so the subscription is live
                for i in range(60):
                    await _complete(s, vllm_small_kv.url, f"probe/{i}", 40, 1)
                    await asyncio.sleep(0.5)
                    if sub.stats["batches"]:
                        break
                assert sub.stats["batches"], "no KV events from vLLM"
                await asyncio.sleep(1.0)
                before = evictions_sampled_by_engine(vllm_small_kv.metrics_url)
                removed_before = _totals(sub).get("kv_blocks_removed_total", 0.0)
                statuses = [await _complete(s, vllm_small_kv.url, "sysprompt", 600, 4) for _ in range(3)]
                # flood the 128-block pool: the shared prompt's blocks are evicted ...
                statuses += await asyncio.gather(
                    *[_complete(s, vllm_small_kv.url, f"flood/{i}", 300, 300) for i in range(16)]
                )
                # ... and the next request for it recomputes them (same chained block hashes)
                statuses += [await _complete(s, vllm_small_kv.url, "sysprompt", 600, 4)]
            await asyncio.sleep(2.0)  # events and stats are published per step
        finally:
            await sub.stop()
        return sub, statuses, before, removed_before, evictions_sampled_by_engine(vllm_small_kv.metrics_url)

    sub, statuses, before, removed_before, after = asyncio.run(main())
    assert set(statuses) == {200}
    v = _totals(sub)
    print(json.dumps({**v, **sub.stats, **sub.tracker.stats, "engine_evictions": after - before}))
    assert not sub.errors and sub.stats["batches"] > 0
    assert v["kv_blocks_stored_total"] > 0 and v["kv_blocks_removed_total"] > 0
    # one BlockRemoved hash per evicted block; vLLM's sampled-lifetime count runs a few % higher
    # (observed 392 events vs 419 samples), so the two are compared within 15%
    removed = v["kv_blocks_removed_total"] - removed_before
    assert 0.85 * (after - before) <= removed <= 1.05 * (after - before)
    assert v["kv_block_residency_seconds_count"] > 0
    assert v["kv_blocks_evicted_recomputed_total"] >= 18  # the 600-token prompt: ~19 blocks again
    assert "kv_hot_blocks_evicted_total" in v  # present (0 is a real value here)
