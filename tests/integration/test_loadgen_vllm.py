"""The load driver against two real vLLM replicas: what it says it routed and measured is what the
engines counted (request_success, prompt tokens, cached tokens), replica by replica."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections import Counter

import pytest

from testbed.loadgen import LoadSpec, run_load
from testbed.tenants import Tenant

pytestmark = pytest.mark.vllm

_COUNTERS = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:prefix_cache_hits_total")


def engine_counters(srv) -> dict[str, float]:
    """Sum of each counter over its label sets, read from the replica's /metrics."""
    text = urllib.request.urlopen(srv.metrics_url, timeout=10).read().decode()
    out = dict.fromkeys(_COUNTERS, 0.0)
    for name in _COUNTERS:
        for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M):
            out[name] += float(m.group(1))
    return out


def _drive(replicas, spec, policy):
    before = [engine_counters(r) for r in replicas]
    result = asyncio.run(run_load(spec, [r.url for r in replicas], policy))
    after = [engine_counters(r) for r in replicas]
    return result, [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]


def test_round_robin_and_sticky_routing_land_where_the_engines_say(vllm_replicas):
    replicas = vllm_replicas(2)
    tenants = [Tenant("red", system_words=120, turns=2), Tenant("blue", system_words=120, turns=2)]

    result, delta = _drive(replicas, LoadSpec(tenants, max_requests=12, concurrency=3, seed=4), "round_robin")
    assert result.summary()["errors"] == 0
    routed = Counter(r.replica for r in result.records)
    assert routed == {0: 6, 1: 6}
    for i in (0, 1):
        mine = [r for r in result.records if r.replica == i]
        assert delta[i]["vllm:request_success_total"] == len(mine)
        assert delta[i]["vllm:prompt_tokens_total"] == sum(r.prompt_tokens for r in mine)
        assert delta[i]["vllm:prefix_cache_hits_total"] == sum(r.cached_tokens for r in mine)
    assert all(r.ttft_s and r.ttft_s > 0 and r.e2e_s >= r.ttft_s for r in result.records)

    result, delta = _drive(
        replicas, LoadSpec(tenants, max_requests=12, concurrency=3, seed=5, route_by="tenant"), "sticky_tenant"
    )
    owner = {r.tenant: r.replica for r in result.records}
    assert all(r.replica == owner[r.tenant] for r in result.records)  # a tenant never moves
    assert sorted(owner.values()) == [0, 1]  # two tenants, two replicas
    for i in (0, 1):
        assert delta[i]["vllm:request_success_total"] == sum(r.replica == i for r in result.records)
    # warm, sticky tenants: every request after the first per tenant reuses the system prompt
    repeat = [r for r in result.records if r.cached_tokens]
    assert len(repeat) >= len(result.records) - 2
