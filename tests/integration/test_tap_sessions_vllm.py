"""K5 on real vLLM: follow-up turns lose their context when the KV pool is too small, not when it is large.

Multi-turn chats go to vLLM on CPU one request at a time, round-robin over the conversations, so
between two turns of one conversation every other conversation runs a turn. The session tracker
links the turns by prefix chain alone (no session header, as for a client that sends none) and
judges each follow-up from the usage vLLM returned (`--enable-prompt-tokens-details`).
"""

import asyncio

import aiohttp
import pytest

from kvscope.agent.tap.prefix import PrefixIndex, render_prompt
from kvscope.agent.tap.sessions import SessionTracker
from testbed.fixtures import SMALL_KV
from testbed.tenants import synthetic_text
from testbed.tiny_model import SERVED_NAME
from testbed.vllm_server import VllmConfig

pytestmark = pytest.mark.vllm

SESSIONS, TURNS = 16, 4
LARGE_KV = VllmConfig(num_gpu_blocks=2048)  # 65,536 KV tokens: every conversation stays resident


async def _conversations(base: str) -> tuple[SessionTracker, list[tuple[int, int]]]:
    """Run the chats; returns the tracker and (prompt_tokens, cached_tokens) of every turn."""
    tracker, index = SessionTracker(), PrefixIndex()
    history = {s: [{"role": "system", "content": synthetic_text(f"system/{s}", 60)}] for s in range(SESSIONS)}
    usage = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        for turn in range(TURNS):
            for s in range(SESSIONS):
                history[s].append({"role": "user", "content": synthetic_text(f"user/{s}/{turn}", 110)})
                body = {
                    "model": SERVED_NAME,
                    "messages": history[s],
                    "max_tokens": 24,
                    "temperature": 0.0,
                    "ignore_eos": True,
                }
                t = tracker.begin(index.observe(render_prompt(body), base))
                async with http.post(base + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    doc = await r.json()
                u = doc["usage"]
                cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
                tracker.finish(t, "t", base, u["prompt_tokens"], cached)
                usage.append((u["prompt_tokens"], cached))
                history[s].append({"role": "assistant", "content": doc["choices"][0]["message"]["content"]})
    return tracker, usage


def _totals(tracker: SessionTracker) -> tuple[float, float]:
    return (sum(s.value for s in tracker.turns.render()), sum(s.value for s in tracker.misses.render()))


def test_turn_misses_rise_when_the_kv_pool_is_too_small(vllm_server_factory):
    results = {}
    for name, config in (("small", SMALL_KV), ("large", LARGE_KV)):
        srv = vllm_server_factory(config)
        tracker, usage = asyncio.run(_conversations(srv.url))
        results[name] = (*_totals(tracker), max(p for p, _ in usage))
    print({k: {"turns": t, "misses": m, "max_prompt_tokens": p} for k, (t, m, p) in results.items()})
    follow_ups = SESSIONS * (TURNS - 1)
    (small_turns, small_misses, small_max), (large_turns, large_misses, _) = results["small"], results["large"]
    assert small_turns == large_turns == follow_ups  # every follow-up linked by prefix chain alone
    assert small_max * SESSIONS > SMALL_KV.num_gpu_blocks * SMALL_KV.block_size  # the contexts do not fit
    assert large_misses == 0  # a pool that holds every conversation: no miss
    assert small_misses >= follow_ups // 2  # too small: most follow-ups recompute
