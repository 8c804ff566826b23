"""The request tap counts each request against every latency objective (exact goodput), and
that exact share lies inside the bounds the engine's per-objective histograms give."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web

from kvscope.agent.serve.site import HttpSite
from kvscope.agent.tap.proxy import TapConfig
from kvscope.commands.tap import build_tap
from kvscope.core.objectives import Objectives, ObjectiveSet
from kvscope.core.signals import Sample, load_catalog, make_labels
from kvscope.diagnoser.evaluate.frame import frame_from_samples
from kvscope.diagnoser.goodput import pool_goodput

OBJ = Objectives(ttft=0.25, tpot=0.1, e2e=None)  # bounds vLLM's default buckets have
SLOW_FIRST, SLOW_GAP, TOKENS = 0.6, 0.3, 3
"""Slow is far past each bound and fast far under it, so a loaded machine cannot move a request
across (no timing is asserted, only which side of a bound each request falls)."""


class Engine:
    """An SSE upstream that waits as the prompt says and, like an engine, keeps per-request
    histograms of its own TTFT, TPOT and e2e at vLLM's default bucket bounds."""

    def __init__(self) -> None:
        self.seen: dict[str, list[float]] = {"ttft": [], "tpot": [], "e2e": []}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        start = time.perf_counter()
        slow_first, slow_gap = body["prompt"].split("/")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(SLOW_FIRST if slow_first == "slow" else 0.0)
        first = time.perf_counter()
        for i in range(TOKENS):
            if i:
                await asyncio.sleep(SLOW_GAP if slow_gap == "slow" else 0.0)
            await resp.write(b'data: {"choices":[{"index":0,"text":"t"}]}\n\n')
        usage = b'{"prompt_tokens":4,"completion_tokens":%d,"total_tokens":%d}' % (TOKENS, TOKENS + 4)
        await resp.write(b'data: {"choices":[],"usage":' + usage + b"}\n\n")
        await resp.write(b"data: [DONE]\n\n")
        end = time.perf_counter()
        self.seen["ttft"].append(first - start)
        self.seen["tpot"].append((end - first) / (TOKENS - 1))
        self.seen["e2e"].append(end - start)
        await resp.write_eof()
        return resp

    def samples(self, t: float, zero: bool) -> list[Sample]:
        cat = load_catalog()
        out = []
        for kind, signal in (("ttft", "request_ttft_seconds"), ("tpot", "request_tpot_seconds")):
            for le in (*cat.buckets(signal, "vllm"), float("inf")):
                n = 0.0 if zero else float(sum(v <= le for v in self.seen[kind]))
                labels = make_labels(
                    {"model": "m", "engine": "vllm", "instance": "e", "le": f"{le:g}".replace("inf", "+Inf")}
                )
                out.append(Sample(f"{signal}_bucket", labels, n, t))
        return out


def test_exact_goodput_from_the_tap_lies_inside_the_histogram_bounds():
    engine = Engine()

    async def main():
        app = web.Application()
        app.router.add_post("/v1/completions", engine.handle)
        site = HttpSite(app)
        port = await site.start("127.0.0.1", 0)
        cfg = TapConfig(upstreams=(f"http://127.0.0.1:{port}",), listen="127.0.0.1:0", objectives=ObjectiveSet(OBJ))
        tap = build_tap(cfg)
        await tap.start()
        try:
            async with aiohttp.ClientSession() as s:

                async def one(prompt: str, tenant: str) -> None:
                    body = {"model": "m", "prompt": prompt, "stream": True}
                    async with s.post(
                        f"http://127.0.0.1:{tap.port}/v1/completions", json=body, headers={"X-Tenant": tenant}
                    ) as r:
                        assert r.status == 200
                        await r.read()

                prompts = ["fast/fast", "fast/fast", "slow/fast", "fast/slow", "slow/slow", "fast/fast"]
                await asyncio.gather(*(one(p, f"t{i % 2}") for i, p in enumerate(prompts)))
                deadline = asyncio.get_running_loop().time() + 120  # a hang guard only
                while tap.stats["requests"] < len(prompts) and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.02)
        finally:
            await tap.stop()
            await site.stop()
        return tap

    tap = asyncio.run(main())
    final = [s for s in tap.render_samples() if s.name.startswith("goodput_")]
    counts = {(s.name, s.label("tenant"), s.label("model")): s.value for s in final}
    assert counts[("goodput_requests_total", "t0", "m")] == 3 and counts[("goodput_requests_total", "t1", "m")] == 3
    good = sum(v for (n, _, _), v in counts.items() if n == "goodput_good_requests_total")
    assert good == 3  # the three fast/fast requests, whatever the machine's load
    assert sum(v for (n, _, _), v in counts.items() if n == "goodput_good_output_tokens_total") == 3 * TOKENS

    # the diagnoser reads both: the engine's histograms as bounds, the tap's counters as exact
    zero = [Sample(s.name, s.labels, 0.0, 100.0) for s in final]
    samples = (
        zero + [s._replace(timestamp=110.0) for s in final] + engine.samples(100.0, True) + engine.samples(110.0, False)
    )
    (pool,) = pool_goodput(frame_from_samples(samples, 100.0, 110.0, 5.0), ObjectiveSet(OBJ))
    g = pool.goodput
    assert g.read == ("ttft", "tpot") and g.lower is not None and g.upper is not None
    assert pool.exact == pytest.approx(0.5)
    assert g.lower <= pool.exact <= g.upper
    assert (g.lower, g.upper) == (pytest.approx(1 - 2 / 6 - 2 / 6), pytest.approx(4 / 6))


def test_a_request_of_one_token_or_no_first_token_is_judged_as_documented():
    o = Objectives(ttft=1.0, tpot=0.1, e2e=10.0)
    assert o.met({"ttft": 0.5, "tpot": 0.0, "e2e": 2.0})
    assert not o.met({"ttft": None, "tpot": 0.0, "e2e": 2.0})  # no first token: not good
    assert not o.met({"ttft": 0.5, "tpot": 0.0, "e2e": 12.0})
    assert Objectives(ttft=1.0).met({"ttft": 1.0})  # at the bound is within it, as le counts it


def test_the_agents_objectives_reach_the_tap_it_runs():
    from kvscope.agent.config import build_config
    from kvscope.agent.tap.collector import TapCollector

    objectives = ObjectiveSet(Objectives(ttft=2.0, tpot=0.05))
    cfg = build_config({"tap": {"upstreams": ["http://127.0.0.1:9"], "listen": "127.0.0.1:0"}}, environ={})
    cfg.objectives = objectives
    tap = TapCollector(cfg).tap
    assert tap is not None and tap.config.objectives == objectives
