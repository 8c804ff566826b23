"""The incident library's scenarios: real vLLM on CPU driven into LEVERS.md conditions.

A scenario is a set of replicas (engine flags) and a sequence of phases (load, routing, an
optional action such as a replica restart). `expected` names the LEVERS.md rows a correct
diagnoser should raise, and in which phase; an empty list means "no warning".
Rates are modest: one box, two cores, other work running.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from testbed.tenants import Dist, Tenant, power_law_shares
from testbed.vllm_server import VllmConfig


@dataclass(frozen=True)
class Phase:
    name: str
    duration_s: float
    tenants: tuple[Tenant, ...] = ()
    rate_per_s: float | None = None
    concurrency: int = 4
    policy: str = "round_robin"
    route_by: str = "session"
    arrivals: str = "poisson"  # open loop: poisson | steady (fixed gaps)
    replicas: tuple[int, ...] | None = None  # which replicas get traffic (None: all)
    action: str | None = None  # "restart:<i>" runs while this phase's load goes on
    # With a router in front (Scenario.router): the policy this phase runs under (the router is
    # restarted on the same ports when it changes), and router actions at the phase's start:
    # "router_remove:<i>", "router_add:<i>", "router_drain_restart:<i>" (remove replica i from the
    # router, restart it cold; the phase lasts as long as the restart, as "restart:<i>" does).
    router_policy: str | None = None
    alongside: tuple[Phase, ...] = ()  # independent loads run at the same time (own rate/clients)
    timeout_s: float = 120.0  # client-side limit per request (an overload needs more)


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    replicas: tuple[VllmConfig, ...]
    phases: tuple[Phase, ...]
    expected: tuple[dict, ...] = ()  # [{"levers": [...], "phase": name, "why": ...}]
    notes: str = ""
    interval_s: float = 2.0
    tail_s: float = 6.0  # keep recording after the last phase
    tap_front: bool = False  # traffic through kvscope's request tap (recorded too)
    router: str | None = None  # sglang-router version in front (testbed/router.py)
    warm_up: int = 0  # direct requests per replica before recording starts
    seed: int = 0
    otlp: bool = True  # False: no OTLP spans (engine /metrics only)
    must_not: tuple[str, ...] = ()  # LEVERS.md rows that would be a wrong diagnosis
    extra: dict = field(default_factory=dict)


def chat_tenants(
    n: int, system_words: int = 256, alpha: float = 1.0, turns: int = 3, out: int = 48, prefix: str = "tenant"
) -> tuple[Tenant, ...]:
    """n chat tenants with power-law shares, each with its own system prompt and sessions."""
    return tuple(
        Tenant(
            f"{prefix}-{i}",
            system_words=system_words,
            share=s,
            turns=turns,
            prompt_words=Dist("lognormal", 24, 0.5, 4, 128),
            output_tokens=Dist("lognormal", out, 0.4, 8, 160),
        )
        for i, s in enumerate(power_law_shares(n, alpha))
    )


ROOMY = VllmConfig(num_gpu_blocks=512, max_num_seqs=32)  # 16k KV tokens: no pressure at these rates
SMALL = VllmConfig(num_gpu_blocks=128, max_num_seqs=16)  # 4k KV tokens: pressure reachable
NO_PREFIX = VllmConfig(num_gpu_blocks=512, max_num_seqs=32, prefix_caching=False)
NOISY_CFG = VllmConfig(num_gpu_blocks=512, max_num_seqs=8)
TIGHT = VllmConfig(num_gpu_blocks=96, max_num_seqs=16)  # 3k tokens: < the 12 tenants' prefixes
NGRAM = VllmConfig(
    num_gpu_blocks=512,
    max_num_seqs=16,
    extra_args=(
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}',
    ),
)

QUIET3 = chat_tenants(3, turns=1)
NOISY = Tenant("noisy", system_words=40, prompt_words=Dist("uniform", 600, 750), output_tokens=Dist("fixed", 16))
LONG_OUT = Tenant("bulk", system_words=300, prompt_words=Dist("uniform", 50, 200), output_tokens=Dist("fixed", 400))

SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "healthy-shared-prefix",
        "4 tenants (power-law shares), each with its own 256-word system prompt, multi-turn chat at a "
        "steady rate on one replica with a roomy KV pool: high hit rate, no preemption, flat latency.",
        (ROOMY,),
        (Phase("steady", 90, chat_tenants(4), rate_per_s=4.0, concurrency=4),),
        expected=(),
    ),
    Scenario(
        "kv-pressure-cascade",
        "Small KV pool (128 blocks x 32 tokens). Light traffic, then a burst of long generations that "
        "fills the pool: KV usage pins near 100%, preemptions climb, requests wait, TTFT rises; then "
        "traffic drops back and the engine recovers.",
        (SMALL,),
        (
            Phase("baseline", 30, chat_tenants(2, out=32), rate_per_s=2.0, concurrency=2),
            Phase("pressure", 60, (LONG_OUT,), concurrency=16),
            Phase("recovery", 30, chat_tenants(2, out=32), rate_per_s=2.0, concurrency=2),
        ),
        expected=(
            {
                "levers": ["K1", "K2", "K3"],
                "phase": "pressure",
                "why": "KV usage ~1.0 with preemptions rising, then waiting requests and TTFT",
            },
        ),
    ),
    Scenario(
        "kv-pressure-tenants",
        "kv-pressure-cascade behind kvscope's request tap, with three chat tenants that keep sending "
        "through the burst. Small KV pool (128 blocks x 32 tokens). Light chat traffic, then a bulk "
        "tenant's long generations fill the pool while the chat tenants go on: KV usage pins near "
        "100%, preemptions climb, requests wait, every tenant's TTFT rises; then the burst stops and "
        "the engine recovers. The demo's incident (`kvscope demo`).",
        (SMALL,),
        (
            Phase("baseline", 30, chat_tenants(3, out=32), rate_per_s=2.0, concurrency=2),
            Phase(
                "pressure",
                60,
                (LONG_OUT,),
                concurrency=16,
                alongside=(Phase("chat", 0, chat_tenants(3, out=32), rate_per_s=1.0, concurrency=2),),
            ),
            Phase("recovery", 30, chat_tenants(3, out=32), rate_per_s=2.0, concurrency=2),
        ),
        expected=(
            {
                "levers": ["K1", "K2", "K3"],
                "phase": "pressure",
                "why": "KV usage ~1.0 with preemptions rising, then waiting requests and TTFT",
            },
        ),
        notes="Traffic passes kvscope's request tap (testbed/tapfront.py), recorded as job kvscope-tap: "
        "the tenant_* series (requests, prompt and cached tokens, TTFT and ITL per tenant, hit and "
        "lost-reuse ratios) are what the tap measured; no prompt text is kept. The replica gets two "
        "direct warm-up requests before recording, so no tenant's first request pays the engine's "
        "first-request start-up. No GPU: this box has none, so the recording has no GPU series.",
        tap_front=True,
        warm_up=2,
    ),
    Scenario(
        "prefix-caching-disabled",
        "The healthy shared-prefix workload on a replica started with --no-enable-prefix-caching: "
        "every request recomputes its tenant's system prompt; vllm:cache_config_info says "
        "enable_prefix_caching=False.",
        (NO_PREFIX,),
        (Phase("steady", 90, chat_tenants(4), rate_per_s=4.0, concurrency=4),),
        expected=(
            {
                "levers": ["P1"],
                "phase": "steady",
                "why": "hit rate 0 while every request shares a 256-word tenant prefix",
            },
        ),
    ),
    Scenario(
        "round-robin-vs-sticky",
        "Two replicas with tight KV pools (96 blocks each) and 12 tenants whose system prompts together "
        "(~108 blocks) exceed one replica's pool, behind kvscope's request tap. Sticky-by-tenant first: "
        "each replica holds half the prefixes. Then the routing falls back to round-robin: every tenant "
        "and every session turn lands on both replicas, so each cache thrashes and the tap sees the same "
        "prefixes served by both.",
        (TIGHT, TIGHT),
        (
            Phase(
                "sticky",
                75,
                chat_tenants(12, alpha=0.6),
                rate_per_s=6.0,
                concurrency=4,
                policy="sticky_tenant",
                route_by="tenant",
            ),
            Phase("round-robin", 75, chat_tenants(12, alpha=0.6), rate_per_s=6.0, concurrency=4, policy="round_robin"),
        ),
        expected=(
            {
                "levers": ["P2"],
                "phase": "round-robin",
                "why": "the same tenant prefixes land on both replicas; hit rate well below sticky's",
            },
        ),
        notes="Traffic passes one kvscope request tap per replica (one shared prefix index), recorded as "
        "job kvscope-tap: prefix_split_ratio and the tenant_* series are what the tap measured. "
        "Each replica gets two direct warm-up requests before recording, so no tenant's first "
        "request pays the engine's first-request start-up (seconds on this box).",
        tap_front=True,
        warm_up=2,
    ),
    Scenario(
        "replica-restart-cold-cache",
        "Two replicas, sticky by tenant, 40 tenants (flat-ish power law) so each replica owns ~20 "
        "distinct system prompts. Replica 1 is drained and restarted (its scrape target is down while "
        "it starts), then takes its tenants back with an empty prefix cache while replica 0 is warm: "
        "it misses each tenant's prefix (and each open session's history) once before it hits again.",
        (ROOMY, ROOMY),
        (
            Phase(
                "warm",
                60,
                chat_tenants(40, alpha=0.3),
                rate_per_s=6.0,
                concurrency=4,
                policy="sticky_tenant",
                route_by="tenant",
            ),
            Phase(
                "restart",
                0,
                chat_tenants(40, alpha=0.3),
                rate_per_s=3.0,
                concurrency=2,
                policy="sticky_tenant",
                route_by="tenant",
                replicas=(0,),
                action="restart:1",
            ),
            Phase(
                "rejoin",
                60,
                chat_tenants(40, alpha=0.3),
                rate_per_s=6.0,
                concurrency=4,
                policy="sticky_tenant",
                route_by="tenant",
            ),
        ),
        expected=(
            {
                "levers": ["P4"],
                "phase": "rejoin",
                "why": "the restarted replica starts with near-zero hits next to a warm replica",
            },
        ),
        notes="The restart phase lasts as long as the restart takes (30 s on an idle box, more under load). "
        "Sticky assignment is by first sight, so after the restart each tenant keeps its replica.",
    ),
    Scenario(
        "noisy-tenant-long-prompts",
        "Three interactive tenants with short prompts keep the same open-loop traffic (3 req/s) the whole "
        "time on a replica that runs at most 8 sequences. In the middle phase a fourth tenant floods it "
        "with long prompts (~700 words, near max-model-len 1024) from a closed loop of 16 clients: the "
        "batch fills with its prefills, requests queue, and the quiet tenants' TTFT rises although their "
        "own traffic did not change.",
        (NOISY_CFG,),
        (
            Phase("quiet", 30, QUIET3, rate_per_s=3.0, concurrency=3),
            Phase(
                "noisy",
                60,
                QUIET3,
                rate_per_s=3.0,
                concurrency=3,
                alongside=(Phase("noisy-tenant", 60, (NOISY,), concurrency=16),),
            ),
            Phase("quiet-again", 30, QUIET3, rate_per_s=3.0, concurrency=3),
        ),
        expected=(
            {
                "levers": ["L11"],
                "phase": "noisy",
                "why": "one tenant's long prompts fill the batch; the other tenants' TTFT rises",
            },
        ),
    ),
    Scenario(
        "spec-decode-poor-acceptance",
        "N-gram (prompt lookup, 1-3 token match, 4 speculative tokens) speculative decoding on a "
        "random-weight model. Two tenants sample at temperature 1.0 (drafts are never accepted), one "
        "is greedy (the model loops, so some drafts match): acceptance stays well below 50%.",
        (NGRAM,),
        (
            Phase(
                "steady",
                75,
                tuple(
                    replace(t, temperature=temp)
                    for t, temp in zip(chat_tenants(3, turns=1, out=96), (1.0, 1.0, 0.0), strict=True)
                ),
                rate_per_s=3.0,
                concurrency=3,
            ),
        ),
        expected=({"levers": ["L10"], "phase": "steady", "why": "accepted / draft tokens far below 0.5"},),
    ),
)


# ---------------------------------------------------------------- engine /metrics only (issue 15)
# How most fleets run: each replica's /metrics scraped, no request tap, no OTLP, no KV events, vLLM's
# default metric flags (no --kv-cache-metrics). 16 tenants with ~400-word system prompts (12 full
# 32-token blocks each, 192 blocks for all 16) and periodic traffic (equal shares). The fleet is
# sized as prefix-affinity routing assumes: its KV pools together hold every tenant's prompt once,
# each replica's pool its 16/N tenants plus the running requests (2 x 128 or 4 x 72 blocks), not
# all 16. Sticky-by-tenant routing gives each replica 16/N tenants; round-robin gives every
# replica all 16.
# Expected verdicts are written here, before any of these recordings is diagnosed.
POOL_2 = VllmConfig(num_gpu_blocks=128, max_num_seqs=16, kv_cache_metrics=False)
POOL_4 = VllmConfig(num_gpu_blocks=72, max_num_seqs=16, kv_cache_metrics=False)
ROOMIER_2 = VllmConfig(num_gpu_blocks=160, max_num_seqs=16, kv_cache_metrics=False)
ROOMY_ENGINE_ONLY = VllmConfig(num_gpu_blocks=512, max_num_seqs=32, kv_cache_metrics=False)
PREFIX_HEAVY = chat_tenants(16, system_words=400, alpha=0.0, turns=1, out=32)  # periodic: equal shares
SKEWED = chat_tenants(16, system_words=400, alpha=0.5, turns=1, out=32)  # a mild power law
LITTLE_SHARING = tuple(
    Tenant(
        f"tenant-{i}",
        system_words=6,
        share=s,
        turns=1,
        prompt_words=Dist("lognormal", 300, 0.3, 120, 700),
        output_tokens=Dist("lognormal", 32, 0.4, 8, 160),
    )
    for i, s in enumerate(power_law_shares(16, 0.5))
)
ROUTING_MUST_NOT = ("P3", "P4", "P5", "P6", "P8", "K1", "K3")
"""Rows a content-blind balancer on a steady fleet does not show: no scaling event, no restart,
no hot replica, no DP ranks, no tenant data, no preemption at these rates."""
QUIET_MUST_NOT = ("P1", "P2", "P3", "P4", "P5", "K1", "K3", "K6")
_MO_NOTE = (
    "Engine /metrics only: no request tap, no OTLP spans, no KV events, vLLM's default metric "
    "flags. The expected verdict was written in testbed/scenarios.py before the recording was "
    "diagnosed."
)


def _engine_only(
    name: str,
    summary: str,
    replicas: int,
    policy: str,
    arrivals: str,
    expected: tuple,
    must_not: tuple[str, ...],
    rate: float = 3.0,
    cfg: VllmConfig = POOL_2,
    tenants: tuple[Tenant, ...] = PREFIX_HEAVY,
    concurrency: int = 6,
    duration_s: float = 150,
) -> Scenario:
    phase = "round-robin" if policy == "round_robin" else "sticky"
    return Scenario(
        name,
        summary,
        (cfg,) * replicas,
        (
            Phase(
                phase,
                duration_s,
                tenants,
                rate_per_s=rate,
                concurrency=concurrency,
                policy=policy,
                route_by="tenant",
                arrivals=arrivals,
            ),
        ),
        expected=tuple({**e, "phase": phase} for e in expected),
        notes=_MO_NOTE,
        warm_up=2,
        otlp=False,
        must_not=must_not,
    )


_P2_LIKELY = (
    {
        "levers": ["P2"],
        "likely": True,
        "why": "content-blind routing: every replica must cache all 16 tenants' prompts, so most "
        "requests miss a prefix another replica holds (002 §7.3, 003)",
    },
    {"levers": ["P1", "K6"], "why": "the same lost reuse read as a cache budget problem: acceptable behind P2"},
)

SCENARIOS += (
    _engine_only(
        "metrics-only-round-robin-2-steady",
        "2 replicas behind round-robin, 16 prefix-heavy tenants (~400-word system prompts), steady "
        "arrivals at 3 req/s; engine /metrics only. Each 128-block pool holds about half the "
        "tenants' prompts.",
        2,
        "round_robin",
        "steady",
        _P2_LIKELY,
        ROUTING_MUST_NOT,
    ),
    _engine_only(
        "metrics-only-sticky-2-steady",
        "The twin of metrics-only-round-robin-2-steady with sticky-by-tenant routing: each replica "
        "serves 8 tenants whose prompts fit its pool; high hit rate.",
        2,
        "sticky_tenant",
        "steady",
        (),
        QUIET_MUST_NOT,
    ),
    _engine_only(
        "metrics-only-round-robin-2-poisson",
        "metrics-only-round-robin-2-steady with Poisson arrivals (bursty gaps, same mean rate).",
        2,
        "round_robin",
        "poisson",
        _P2_LIKELY,
        ROUTING_MUST_NOT,
    ),
    _engine_only(
        "metrics-only-sticky-2-poisson",
        "metrics-only-sticky-2-steady with Poisson arrivals.",
        2,
        "sticky_tenant",
        "poisson",
        (),
        QUIET_MUST_NOT,
    ),
    _engine_only(
        "metrics-only-round-robin-4-poisson",
        "4 replicas behind round-robin, the same 16 tenants, 72-block pools (a quarter of the "
        "prompts each), Poisson arrivals at 3 req/s: every replica sees every tenant.",
        4,
        "round_robin",
        "poisson",
        _P2_LIKELY,
        ROUTING_MUST_NOT,
        cfg=POOL_4,
    ),
    _engine_only(
        "metrics-only-sticky-4-poisson",
        "The 4-replica twin with sticky-by-tenant routing: 4 tenants per replica, whose prompts fit.",
        4,
        "sticky_tenant",
        "poisson",
        (),
        QUIET_MUST_NOT,
        cfg=POOL_4,
    ),
    _engine_only(
        "metrics-only-healthy-busy-sticky",
        "A healthy busy fleet: 2 replicas with roomy pools (512 blocks), sticky by tenant, the 16 "
        "prefix-heavy tenants at 6 req/s from up to 8 clients; high hit rate, no preemption.",
        2,
        "sticky_tenant",
        "poisson",
        (),
        QUIET_MUST_NOT,
        rate=6.0,
        cfg=ROOMY_ENGINE_ONLY,
        concurrency=8,
    ),
    _engine_only(
        "metrics-only-little-sharing-round-robin",
        "2 replicas behind round-robin serving 16 tenants whose prompts share almost nothing (a "
        "6-word system prompt, ~300-word unique user messages): the hit rate is low because there "
        "is nothing to reuse, not because of routing.",
        2,
        "round_robin",
        "poisson",
        (),
        QUIET_MUST_NOT,
        tenants=LITTLE_SHARING,
    ),
    # Recorded before the tenant mix above was made periodic (equal shares): a mild power law keeps
    # the busiest tenants' prompts cached on every replica, so round-robin loses less.
    _engine_only(
        "metrics-only-round-robin-2-skewed",
        "2 replicas behind round-robin, 128-block pools, 16 prefix-heavy tenants with power-law "
        "shares (alpha 0.5), steady arrivals at 3 req/s; engine /metrics only.",
        2,
        "round_robin",
        "steady",
        _P2_LIKELY,
        ROUTING_MUST_NOT,
        tenants=SKEWED,
    ),
    _engine_only(
        "metrics-only-sticky-2-skewed",
        "The sticky-by-tenant twin of metrics-only-round-robin-2-skewed.",
        2,
        "sticky_tenant",
        "steady",
        (),
        QUIET_MUST_NOT,
        tenants=SKEWED,
    ),
    # The pilot pair (recorded first, before the pools above were sized): 160-block pools hold 12 of
    # the 16 prompts, so round-robin loses only part of the reuse.
    _engine_only(
        "metrics-only-round-robin-2-roomier",
        "Pilot: 2 replicas behind round-robin with 160-block pools (12 of the 16 tenants' prompts "
        "fit each), steady arrivals asked at 4 req/s from 4 clients; engine /metrics only.",
        2,
        "round_robin",
        "steady",
        _P2_LIKELY,
        ROUTING_MUST_NOT,
        rate=4.0,
        cfg=ROOMIER_2,
        concurrency=4,
    ),
    _engine_only(
        "metrics-only-sticky-2-roomier",
        "Pilot: the sticky-by-tenant twin of metrics-only-round-robin-2-roomier.",
        2,
        "sticky_tenant",
        "steady",
        (),
        QUIET_MUST_NOT,
        rate=4.0,
        cfg=ROOMIER_2,
        concurrency=4,
    ),
)

# ------------------------------------------------------------------ behind the real SGLang router
# (issue 16). All traffic goes to one router URL; the router picks the replica. Its /metrics is
# recorded as job `sglang-router`, instance `router`; the YAML maps each replica to its worker URL.
ROUTER_TENANTS = chat_tenants(12, alpha=0.6, turns=1)
ROUTER_SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "router-cache-aware-vs-round-robin",
        "The round-robin-vs-sticky pools (two 96-block replicas, 12 tenants whose system prompts exceed "
        "one pool; single-turn chats) behind the real SGLang router 0.2.4: first its cache_aware policy (a prefix tree "
        "per worker), then the router is restarted with --policy round_robin, as when a deployment "
        "falls back to the default of most balancers. Round-robin lands every tenant on both "
        "replicas, so each pool has to hold all 12 prefixes and thrashes.",
        (TIGHT, TIGHT),
        (
            Phase("cache-aware", 150, ROUTER_TENANTS, rate_per_s=6.0, concurrency=4, router_policy="cache_aware"),
            Phase("round-robin", 90, ROUTER_TENANTS, rate_per_s=6.0, concurrency=4, router_policy="round_robin"),
        ),
        expected=(
            {
                "levers": ["P2"],
                "phase": "round-robin",
                "why": "the router says it routes round-robin; the fleet hit rate falls well below its "
                "cache-aware level on the same traffic (002 §7.3: ~1/N)",
            },
        ),
        notes="sglang-router 0.2.4 (the last release that exports its cache-aware tree's hits and "
        "misses). The router is restarted between the phases on the same ports, so its counters "
        "reset once; the policy is the `policy` label of router_decisions_total. The cache-aware "
        "phase is the longer one so that the level the round-robin phase is compared with is the "
        "warm cache-aware level, not the first minute in which the pools fill (a first take with "
        "75 s per phase: the hit rate took ~40 s to reach 0.72, and that fill weighed on the "
        "earlier level). kvscope's request tap runs as a sidecar in front of each replica (the "
        "router's workers are the taps; testbed/tapfront.py, one shared prefix index), recorded as job "
        "kvscope-tap: without it the recording shows the policy switch and the hit-rate fall, but no "
        "prefix seen on two replicas (takes without the tap: hit rate 0.72 -> 0.48 and 0.68 -> 0.51, "
        "x0.67 and x0.75 of the cache-aware level, at the edge of P2's ~1/N criterion, which held in "
        "neither take for its whole `for`). The chats are single-turn: a take with the multi-turn "
        "tenants of round-robin-vs-sticky and the tap in front showed a second, older condition - "
        "55 % of follow-up turns lost their conversation from the cache-aware phase on (K5 "
        "session_context_lost, ranked first by its earlier onset; P2 second) - which belongs to "
        "the 96-block pools, not to the routing change this scenario is about.",
        router="0.2.4",
        warm_up=2,
        tap_front=True,
    ),
    Scenario(
        "router-drain-restart-rejoin",
        "Two roomy replicas behind the real SGLang router 0.3.2 (round_robin), 40 tenants. Replica 1 is "
        "removed from the router through its API (DELETE /workers/<id>), restarted while out of the "
        "pool (maintenance), and added back (POST /workers): it rejoins with an empty prefix cache next "
        "to a warm replica, and round-robin gives it half the traffic at once.",
        (ROOMY, ROOMY),
        (
            Phase("warm", 60, chat_tenants(40, alpha=0.3), rate_per_s=6.0, concurrency=4, router_policy="round_robin"),
            Phase(
                "drained",
                0,
                chat_tenants(40, alpha=0.3),
                rate_per_s=2.0,
                concurrency=2,
                router_policy="round_robin",
                action="router_drain_restart:1",
            ),
            Phase(
                "rejoin",
                60,
                chat_tenants(40, alpha=0.3),
                rate_per_s=6.0,
                concurrency=4,
                router_policy="round_robin",
                action="router_add:1",
            ),
        ),
        expected=(
            {
                "levers": ["P4"],
                "phase": "rejoin",
                "why": "the restarted replica takes half the traffic at once with near-zero hits "
                "while replica 0 is warm (002 §7.3 cold start; the router did not ramp it in)",
            },
        ),
        notes="sglang-router 0.3.2. While drained, the router's pool size is 1 and the removed worker's "
        "health series reads -1; replica 1 is restarted (its scrape target is down while it starts) "
        "and then re-added. The drained phase lasts as long as that restart: 7.4 min in this take, "
        "on a box at load ~20 (vLLM on CPU pins each server's worker to core 0, so the restarting "
        "server competes with the busy replica 0; a first take at twice the drained load took 9 min "
        "and P4 fired in its rejoin phase as here).",
        router="0.3.2",
        warm_up=2,
    ),
)
SCENARIOS = SCENARIOS + ROUTER_SCENARIOS


def by_name(name: str) -> Scenario:
    for s in SCENARIOS:
        if s.name == name:
            return s
    raise KeyError(f"unknown scenario {name!r}; known: {', '.join(s.name for s in SCENARIOS)}")
