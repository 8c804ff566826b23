"""The test bed's tap front: one real request tap per replica, one shared prefix index.

The upstreams are a tiny local SSE server (our wiring is under test, not an engine)."""

from __future__ import annotations

import asyncio
import urllib.request

from aiohttp import web

from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.agent.serve.site import HttpSite
from testbed.loadgen import LoadSpec, run_load
from testbed.tapfront import TapFront
from testbed.tenants import Tenant

HITS = web.AppKey("hits", list)


async def _upstream(request: web.Request) -> web.StreamResponse:
    await request.json()
    request.app[HITS].append(request.headers.get("X-Tenant-Id"))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n')
    await resp.write(
        b'data: {"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":1,'
        b'"prompt_tokens_details":{"cached_tokens":32}}}\n\ndata: [DONE]\n\n'
    )
    return resp


async def _drive(policy: str, route_by: str) -> tuple[float | None, list[list[str]], str]:
    apps, sites, urls = [], [], []
    try:
        for _ in range(2):
            app = web.Application()
            app[HITS] = []
            app.router.add_post("/v1/chat/completions", _upstream)
            apps.append(app)
            sites.append(HttpSite(app))
            urls.append(f"http://127.0.0.1:{await sites[-1].start('127.0.0.1', 0)}")
        with TapFront(urls) as front:
            spec = LoadSpec(
                [Tenant("a", system_words=200), Tenant("b", system_words=200)],
                max_requests=24,
                concurrency=2,
                route_by=route_by,
            )
            res = await run_load(spec, front.urls, policy=policy)
            assert all(r.ok for r in res.records), [r.error for r in res.records]
            text = await asyncio.to_thread(lambda: urllib.request.urlopen(front.metrics_urls[0], timeout=10).read())
            split = front.split_ratio()
    finally:
        for site in sites:
            await site.stop()
    return split, [app[HITS] for app in apps], text.decode()


def test_round_robin_through_the_taps_splits_prefixes_across_replicas():
    split, hits, text = asyncio.run(_drive("round_robin", "session"))
    assert len(hits[0]) == len(hits[1]) == 12  # each tap forwards to its own replica
    assert {*hits[0]} == {*hits[1]} == {"a", "b"}
    assert split is not None and split > 0.5
    names = {s.name for s in parse_exposition(text).samples}
    assert {
        "kvscope_prefix_split_ratio",
        "kvscope_tenant_requests_total",
        "kvscope_tenant_reusable_tokens_total",
    } <= names


def test_sticky_routing_through_the_taps_keeps_each_prefix_on_one_replica():
    split, hits, _ = asyncio.run(_drive("sticky_tenant", "tenant"))
    assert sorted(sorted(set(h)) for h in hits) == [["a"], ["b"]]
    assert split == 0.0
