"""The real SGLang router in front of two real vLLM CPU servers, scraped by kvscope's collector.

sglang-router (PyPI, installed by scripts/install-sglang-router.sh) routes vLLM's OpenAI server
as it is. Tenant traffic goes through the router; the agent's engine collector scrapes the
router's /metrics, detects the `sglang_router` dialect and must produce the canonical router
series: per-worker request counts that equal what each vLLM server counted, the policy, worker
health; and, after a worker is removed through the router's API, the removal."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest

from kvscope.agent.collectors.engine import EngineCollector
from kvscope.agent.config import AgentConfig, Target
from testbed.loadgen import LoadSpec, run_load
from testbed.router import SglangRouter, router_unavailable_reason
from testbed.tenants import Dist, Tenant

pytestmark = pytest.mark.vllm

TENANTS = [
    Tenant(f"t{i}", system_words=120, share=1.0, turns=1, prompt_words=Dist("fixed", 8), output_tokens=Dist("fixed", 4))
    for i in range(3)
]


def _finished(srv) -> float:
    """vllm:request_success_total summed over finish reasons, read from the engine itself."""
    body = urllib.request.urlopen(srv.metrics_url, timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith("vllm:request_success_total{")
    )


async def _collect(router: SglangRouter):
    collector = EngineCollector(
        AgentConfig(targets=[Target(url=router.metrics_url, job="sglang-router", instance="router")])
    )
    try:
        return await collector.collect()
    finally:
        await collector.close()


def _by(collection, name: str, label: str) -> dict[str, float]:
    """Values of one canonical signal summed by one label (0.2.x counts decisions per worker too)."""
    out: dict[str, float] = {}
    for s in collection.samples:
        if s.name == name:
            key = dict(s.labels).get(label, "")
            out[key] = out.get(key, 0.0) + s.value
    return out


@pytest.mark.parametrize("version,policy", [("0.3.2", "round_robin"), ("0.2.4", "cache_aware")])
def test_router_routes_vllm_and_the_collector_reads_it(vllm_replicas, version, policy):
    reason = router_unavailable_reason(version)
    if reason:
        pytest.fail(reason, pytrace=False)  # `make test` installs it: missing is a broken install
    servers = vllm_replicas(2)
    before = [_finished(s) for s in servers]
    with SglangRouter([s.url for s in servers], policy=policy, version=version) as router:
        spec = LoadSpec(TENANTS, max_requests=12, duration_s=120, concurrency=2, seed=3)
        result = asyncio.run(run_load(spec, [router.url]))
        assert result.summary()["errors"] == 0, router.log_tail()
        got = asyncio.run(_collect(router))
        assert got.engines == {"router": "sglang_router"}
        served = {s.url: _finished(s) - b for s, b in zip(servers, before, strict=True)}
        # the router's per-worker count is what each real engine finished, request for request
        assert _by(got, "router_worker_requests_total", "worker") == pytest.approx(served)
        assert sum(served.values()) == 12
        assert _by(got, "router_decisions_total", "policy") == {policy: 12.0}
        assert _by(got, "router_worker_health_code", "worker") == {s.url: 1.0 for s in servers}
        if version == "0.2.4":
            hits = _by(got, "router_cache_hits_total", "")[""]
            misses = _by(got, "router_cache_misses_total", "")[""]
            assert hits + misses == 12 and hits >= 6  # 3 tenants: at most a first miss each, plus a tie
        else:
            assert policy == "round_robin" and set(served.values()) == {6.0}
            assert "router_cache_hits_total" not in {s.name for s in got.samples}  # 0.3.x lacks it

        router.remove_worker(servers[1].url)
        gone = asyncio.run(_collect(router))
        health = _by(gone, "router_worker_health_code", "worker")
        assert health[servers[0].url] == 1.0
        assert health[servers[1].url] == (-1.0 if version == "0.3.2" else 0.0)
        if version == "0.3.2":
            assert _by(gone, "router_workers", "model") == {"unknown": 1.0}
