"""Async tenant load driver for OpenAI-compatible servers (real vLLM in the test bed).

    result = asyncio.run(run_load(LoadSpec(tenants=[...], max_requests=200, duration_s=60),
                                  ["http://127.0.0.1:8001"], policy="round_robin"))

Bounded concurrency (`concurrency` workers), stops by itself at `max_requests` or `duration_s`
(whichever first), optional open-loop arrival rate. Streams chat completions and measures TTFT and
inter-token gaps on the client; reads `usage.prompt_tokens_details.cached_tokens` from the final
chunk. Each request carries the tenant header. Records hold tenant/session/turn, replica and
numbers only: prompt and completion text are never logged or kept.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import aiohttp

from testbed.routing import POLICIES, make_router
from testbed.tenants import Dist, Request, Tenant, TenantSampler, power_law_shares

TENANT_HEADER = "X-Tenant-Id"
MODEL = "tiny-llama"


@dataclass
class LoadSpec:
    """What to send and when to stop."""

    tenants: list[Tenant]
    max_requests: int = 100
    duration_s: float = 60.0
    concurrency: int = 4
    rate_per_s: float | None = None  # open-loop arrivals per second; None = closed loop
    arrivals: str = "poisson"  # open loop: "poisson" (exponential gaps) | "steady" (fixed gaps)
    route_by: str = "session"  # key for hashing routers: tenant | session | prefix
    request_timeout_s: float = 120.0
    seed: int = 0


@dataclass
class RequestRecord:
    """Client-side measurement of one request (no text)."""

    tenant: str
    session: str
    turn: int
    replica: int
    start: float  # wall clock
    ok: bool = False
    error: str = ""
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass
class LoadResult:
    records: list[RequestRecord]
    wall_s: float

    def by_tenant(self) -> dict[str, dict[str, float]]:
        """Per tenant: requests, errors, TTFT p50/p95, mean ITL and cached-token ratio."""
        groups: dict[str, list[RequestRecord]] = defaultdict(list)
        for r in self.records:
            groups[r.tenant].append(r)
        return {t: summarize(rs) for t, rs in sorted(groups.items())}

    def summary(self) -> dict[str, float]:
        return summarize(self.records)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s), max(1, math.ceil(q / 100 * len(s)))) - 1]


def summarize(records: list[RequestRecord]) -> dict[str, float]:
    ok = [r for r in records if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [g for r in ok for g in r.itl_s]
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok if r.cached_tokens is not None)
    return {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p95_s": percentile(ttft, 95),
        "itl_mean_s": statistics.fmean(itl) if itl else None,
        "cached_ratio": cached / prompt if prompt else None,
    }


def build_body(req: Request) -> dict:
    """The chat-completions body for one planned request."""
    return {
        "model": MODEL,
        "messages": req.messages,
        "max_tokens": req.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": req.temperature,
    }


async def send(
    session: aiohttp.ClientSession, base_url: str, req: Request, rec: RequestRecord, timeout_s: float
) -> None:
    """Stream one request, filling `rec` in place. Never raises for server/network errors."""
    t0 = time.monotonic()
    last = None
    try:
        async with session.post(
            f"{base_url}/v1/chat/completions",
            json=build_body(req),
            headers={TENANT_HEADER: req.tenant},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            if resp.status != 200:
                rec.error = f"http_{resp.status}"
                await resp.read()
                return
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                now = time.monotonic()
                if any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
                    if last is None:
                        rec.ttft_s = now - t0
                    else:
                        rec.itl_s.append(now - last)
                    last = now
                _read_usage(chunk.get("usage"), rec)
        rec.ok = True
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError) as e:
        rec.error = type(e).__name__
    finally:
        rec.e2e_s = time.monotonic() - t0


def _gap(spec: LoadSpec, rng: random.Random) -> float:
    """Seconds to the next open-loop arrival: exponential (Poisson process) or fixed (steady)."""
    if spec.arrivals == "steady":
        return 1.0 / spec.rate_per_s
    if spec.arrivals != "poisson":
        raise ValueError(f"unknown arrival process {spec.arrivals!r}; choose poisson or steady")
    return rng.expovariate(spec.rate_per_s)


def _read_usage(usage: dict | None, rec: RequestRecord) -> None:
    if not usage:
        return
    rec.prompt_tokens = usage.get("prompt_tokens")
    rec.completion_tokens = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details") or {}
    rec.cached_tokens = details.get("cached_tokens")


async def run_load(
    spec: LoadSpec, replicas: list[str], policy: str = "round_robin", on_done=None, stop: asyncio.Event | None = None
) -> LoadResult:
    """Drive `spec` against `replicas` (base URLs) with a routing policy.

    `on_done(record)` is called after each request (progress bars); `stop` ends the run early.
    """
    sampler = TenantSampler(spec.tenants, seed=spec.seed)
    router = make_router(policy, len(replicas))
    arrivals = random.Random(spec.seed + 1)
    records: list[RequestRecord] = []
    t_start = time.monotonic()
    deadline = t_start + spec.duration_s
    next_arrival = [t_start]
    stop = stop or asyncio.Event()

    def take() -> tuple[Request, int, float | None] | None:
        if len(records) >= spec.max_requests or time.monotonic() >= deadline or stop.is_set():
            return None
        arrival = None
        if spec.rate_per_s:
            # An idle worker claims the next arrival time; one that falls after the deadline is
            # never sent (sending it at the deadline would release every idle worker's claim at
            # once: a burst of up to `concurrency` requests the arrival process never asked for).
            next_arrival[0] += _gap(spec, arrivals)
            if next_arrival[0] >= deadline:
                return None
            arrival = next_arrival[0]
        req = sampler.next_request()
        rec = RequestRecord(req.tenant, req.session, req.turn, router.route(req.route_key(spec.route_by)), time.time())
        records.append(rec)
        return req, len(records) - 1, arrival

    async def worker(session: aiohttp.ClientSession) -> None:
        while (item := take()) is not None:
            req, i, arrival = item
            if arrival is not None:
                delay = arrival - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                records[i].start = time.time()
            rec = records[i]
            await send(session, replicas[rec.replica], req, rec, spec.request_timeout_s)
            if on_done:
                on_done(rec)

    # A fresh connection per request: the engine's HTTP server (uvicorn) closes idle keep-alive
    # connections after 5 s, and a request written on one it is closing fails before any reply
    # (a POST is not retried). Loopback connects are cheap next to a generation.
    conn = aiohttp.TCPConnector(limit=spec.concurrency, force_close=True)
    async with aiohttp.ClientSession(connector=conn) as session:
        await asyncio.gather(*(worker(session) for _ in range(spec.concurrency)))
    return LoadResult(records, time.monotonic() - t_start)


def default_tenants(n: int, alpha: float = 1.2, system_words: int = 256, turns: int = 3) -> list[Tenant]:
    """n tenants with power-law shares, each its own system prompt, multi-turn sessions."""
    return [
        Tenant(
            f"tenant-{i}",
            system_words=system_words,
            share=s,
            turns=turns,
            prompt_words=Dist("lognormal", 32, 0.5, 4, 256),
            output_tokens=Dist("lognormal", 32, 0.5, 4, 128),
        )
        for i, s in enumerate(power_law_shares(n, alpha))
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Drive tenant traffic at OpenAI-compatible servers and print "
        "client-side TTFT/ITL and cached-token ratios per tenant (no text is logged)."
    )
    ap.add_argument("urls", nargs="+", help="replica base URLs, e.g. http://127.0.0.1:8000")
    ap.add_argument("--tenants", type=int, default=4, help="number of tenants (power-law shares)")
    ap.add_argument("--alpha", type=float, default=1.2, help="power-law exponent of tenant shares")
    ap.add_argument("--requests", type=int, default=100, help="stop after this many requests")
    ap.add_argument("--duration", type=float, default=60.0, help="stop after this many seconds")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight at most")
    ap.add_argument("--rate", type=float, default=None, help="open-loop arrivals per second")
    ap.add_argument("--policy", choices=POLICIES, default="round_robin", help="routing across replicas")
    ap.add_argument("--route-by", choices=("tenant", "session", "prefix"), default="session")
    ap.add_argument("--json", action="store_true", help="print every request record as JSON lines")
    a = ap.parse_args(argv)
    spec = LoadSpec(default_tenants(a.tenants, a.alpha), a.requests, a.duration, a.concurrency, a.rate, a.route_by)
    result = asyncio.run(run_load(spec, a.urls, a.policy))
    if a.json:
        for r in result.records:
            print(json.dumps(asdict(r)))
    print(
        json.dumps(
            {"wall_s": round(result.wall_s, 2), "all": result.summary(), "tenants": result.by_tenant()}, indent=1
        ),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
