"""KV cache & prefix: pool usage, hit ratio per replica / DP rank / tier, evictions, residency."""

from kvscope.dashboards import queries as q
from kvscope.dashboards.board import Board, Panel, Row

POOL = Row(
    "KV pool",
    (
        Panel(
            "KV usage per engine and DP rank",
            "Device KV pool usage (0-1) per instance and data-parallel rank. "
            "vLLM counts evictable prefix blocks as free; SGLang reports used/total.",
            (q.kv_usage(("instance", "dp_rank")),),
            "ratio",
            palette="kv_usage",
            width=12,
        ),
        Panel(
            "KV capacity",
            "Tokens each engine's device KV pool can hold (from vLLM cache_config_info or "
            "SGLang max_total_num_tokens).",
            (q.KV_CAPACITY,),
            "tokens",
            width=12,
        ),
    ),
)

PREFIX = Row(
    "Prefix cache",
    (
        Panel(
            "Hit ratio per engine and DP rank",
            "Token-weighted local prefix hit ratio. DP ranks are separate "
            "cache domains (Why more GPUs is not enough for LLM inference): a spread between ranks "
            "means sessions land on several ranks (rule dp_rank_cache_split).",
            (q.prefix_hit_ratio(("instance", "dp_rank")),),
            "ratio",
            palette="hit_ratio",
        ),
        Panel(
            "Hit ratio by tier",
            "Local (device) vs external (KV connector / offload) tier hit ratios, LMCache's "
            "own lookup hit ratio, plus the host-memory tier usage where SGLang HiCache reports it.",
            (q.prefix_hit_ratio(), q.EXTERNAL_HIT_RATIO, q.TIER_HIT_RATIO, q.HOST_TIER_USAGE),
            "ratio",
            palette="hit_ratio",
        ),
        Panel(
            "Router prefix locality",
            "Where a router exports it: the mean share of a request's prefix found on "
            "the worker it was routed to (llm-d EPP, Dynamo KV router) and the share of decisions kept on the "
            "prefix's worker (SMG policy branches). A fall means locality given away (rule router_gave_locality_away).",
            q.ROUTER_LOCALITY,
            "ratio",
            palette="hit_ratio",
        ),
        Panel(
            "Prompt tokens by source",
            "Where prompt tokens came from: computed locally, local cache hit, or external KV transfer.",
            (q.PROMPT_TOKENS_BY_SOURCE,),
            "tokens_per_s",
            stack=True,
        ),
    ),
)

EVICTION = Row(
    "Eviction & preemption",
    (
        Panel(
            "Preemptions / s per engine",
            "Preemptions per second per instance. Sizing LLM Inference for Production §9.3: eviction above 5 % of "
            "active requests is a warning, above 20 % degraded.",
            (q.preemptions(("instance",)),),
            "per_s",
            palette="rate_bad",
        ),
        Panel(
            "Evicted KV tokens / s",
            "KV tokens evicted per second (SGLang), per instance.",
            (q.EVICTED_TOKENS,),
            "tokens_per_s",
        ),
        Panel(
            "Block residency",
            "Median KV block lifetime, idle time before eviction and reuse gap (vLLM KV "
            "residency histograms, sampled). A reuse gap near the idle-before-evict time means reused blocks "
            "are evicted just before they are needed (rule hot_prefix_churn).",
            q.RESIDENCY,
            "seconds",
        ),
    ),
)

CASCADE = Row(
    "Memory-pressure cascade & KV events",
    (
        Panel(
            "Cascade stage",
            "Cascade stage per engine (Sizing LLM Inference for Production §7.4): 0 healthy, 1 KV high, 2 evicting / "
            "preempting, 3 queueing, 4 latency symptom. Act at stage 2, before latency alerts.",
            (q.CASCADE_STAGE,),
            "stage",
        ),
        Panel(
            "Cascade lead time",
            "Seconds the root (KV high) preceded the latency symptom.",
            (q.CASCADE_LEAD,),
            "seconds",
        ),
        Panel(
            "KV block churn",
            "Blocks removed per second by medium, blocks evicted and then recomputed, and "
            "hot (reused) blocks evicted: the LRU failure that hot_prefix_churn reads (from the engines' KV events).",
            q.KV_EVENT_RATES,
            "per_s",
        ),
        Panel(
            "Block residency (KV events)",
            "Stored-to-removed time of every KV block, p50 and p99.",
            q.BLOCK_RESIDENCY_EVENTS,
            "seconds",
        ),
    ),
)

BOARD = Board(
    "kvscope-kv",
    "kvscope / KV cache & prefix",
    "KV pool usage, prefix-cache effectiveness per replica, DP rank and tier, evictions, "
    "preemptions and block residency.",
    (POOL, PREFIX, EVICTION, CASCADE),
)
