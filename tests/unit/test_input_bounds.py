"""Issue 41 (agent and server side): every input surface bounded in time, memory and connections.
Real servers on ephemeral ports, real sockets."""

from __future__ import annotations

import asyncio
import itertools
import json
import re

import aiohttp
import pytest

from kvscope.agent.api import AgentServer
from kvscope.agent.config import build_config
from kvscope.agent.runtime import AgentRuntime
from kvscope.agent.signals import Sample
from kvscope.agent.store.sqlite import InMemoryStore


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as resp:
        return resp.status, await resp.text()


def _agent(store=None, doc=None) -> AgentServer:
    return AgentServer(AgentRuntime(build_config(doc or {}, environ={}, flags=[]), [], store))


# ------------------------------------------------------------------------- N1: linear name patterns


def test_hostile_match_pattern_is_refused_while_metrics_keeps_answering():
    """`([a-z_]+)+Z` backtracks exponentially in `re` on a name of [a-z_] without a Z: the API
    must refuse it (400 naming `match`) and /metrics must answer meanwhile."""
    store = InMemoryStore()
    store.write([Sample("engine_kv_cache_usage_rat", (("instance", "a"),), 0.5, 1000.0)])  # 25 chars

    async def main():
        server = _agent(store)
        port = await server.start("127.0.0.1", 0)
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as s:
                hostile = asyncio.ensure_future(
                    _get(s, base + "/api/v1/samples?match=([a-z_]%2B)%2BZ&start=0&end=2000")
                )
                metrics = await _get(s, base + "/metrics")
                good = await _get(s, base + "/api/v1/samples?match=engine_kv_.*&start=0&end=2000")
                return await hostile, metrics, good
        finally:
            await server.stop()

    hostile, metrics, good = asyncio.run(main())
    assert hostile[0] == 400, hostile
    assert json.loads(hostile[1])["error"].startswith("match: not a supported pattern")
    assert metrics[0] == 200 and "kvscope_cycles_total" in metrics[1]
    assert good[0] == 200 and [s["name"] for s in json.loads(good[1])["data"]["series"]] == [
        "engine_kv_cache_usage_rat"
    ]


NAMES = ["engine_kv_cache_usage_ratio", "engine_kv", "kvscope_target_up", "a:b", "aa", "a", "", "abcabc", "x_y_x_y"]
PATTERNS = [
    "engine_kv_.*",
    "engine_kv_.+",
    "engine_kv.*",
    ".*",
    ".+",
    "a",
    "a.*a",
    "a.+a",
    ".*a.*",
    "x_.*_y",
    "x_.+_y.*",
    "engine_kv_cache_usage_ratio|kvscope_target_up",
    "(engine_kv|a\\:b|aa)",
    ".*b.*c",
    "abc.*abc",
    "a.*b.*c.*",
    ".*target.+",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_name_patterns_match_exactly_as_the_anchored_regex_would(pattern):
    from kvscope.agent.namematch import compile_pattern

    matcher = compile_pattern(pattern)
    assert [n for n in NAMES if matcher.matches(n)] == [n for n in NAMES if re.fullmatch(pattern, n)]


@pytest.mark.parametrize("pattern", ["([a-z_]+)+Z", "(a|aa)+", "[a-z]*", "a{1,3}", "a||b", "(", "a\\d", "x?"])
def test_name_patterns_outside_the_linear_subset_are_refused(pattern):
    from kvscope.agent.namematch import compile_pattern

    with pytest.raises(ValueError, match="supported"):
        compile_pattern(pattern)


def test_name_pattern_scan_agrees_with_re_on_generated_inputs():
    """Every pattern of up to 4 tokens over {a, b, .*, .+} against every name over {a, b} up to 5."""
    from kvscope.agent.namematch import compile_pattern

    names = ["".join(p) for n in range(6) for p in itertools.product("ab", repeat=n)]
    for n in range(1, 5):
        for toks in itertools.product(["a", "b", ".*", ".+"], repeat=n):
            pattern = "".join(toks)
            m = compile_pattern(pattern)
            assert [x for x in names if m.matches(x)] == [x for x in names if re.fullmatch(pattern, x)], pattern
