"""Every PromQL query the dashboards use, each written once.

Panels read the agent's canonical re-export `kvscope_<signal>`, so one set of panels serves vLLM
and SGLang (docs/dashboards.md, "How they are built"). The helpers make the right pattern the only
one available: quantiles over `sum by (le, ...) (rate(..._bucket[w]))`, means as
`rate(_sum) / rate(_count)`, every division guarded (`num / (den > 0)`), rate() only over counters,
buckets, `_sum` or `_count`. dashboards/lint.py checks all of this again on the generated queries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvscope.core.signals import KVSCOPE_PREFIX
from kvscope.diagnoser.promql import compose
from kvscope.diagnoser.promql.compose import guard

W = "$__rate_interval"
SELECTOR = 'job=~"$job", namespace=~"$namespace", model=~"$model", instance=~"$instance"'
"""The dashboard-variable selector. Every variable's All value is `.*`, which also matches a
series without that label (a vLLM series has no `namespace` outside Kubernetes)."""
TENANT = 'tenant=~"$tenant"'
_READS = re.compile(rf"(?<![\w:])(?:{KVSCOPE_PREFIX}(\w+?)(?:_bucket|_sum|_count)?|(ALERTS|up))\{{")
"""A series an expression reads: the canonical signal of kvscope_<signal>[_bucket|_sum|_count], or ALERTS/up."""


@dataclass(frozen=True)
class Query:
    """One panel target: the expression, its legend, and the canonical signals it reads (by default
    the ones its expression names, in order of appearance)."""

    expr: str
    legend: str = ""
    signals: tuple[str, ...] = ()
    instant: bool = False

    def __post_init__(self) -> None:
        if not self.signals:
            found = (a or b for a, b in _READS.findall(self.expr))
            object.__setattr__(self, "signals", tuple(dict.fromkeys(found)))


def series(signal: str, suffix: str = "") -> str:
    """The exported sample name of a canonical signal."""
    return f"{KVSCOPE_PREFIX}{signal}{suffix}"


def _sel(extra: str = "") -> str:
    return "{" + SELECTOR + (", " + extra if extra else "") + "}"


def _legend(by: tuple[str, ...], default: str = "") -> str:
    """'{{a}} {{b}}' for the labels a query is grouped by, else `default`."""
    return "{{" + "}} {{".join(by) + "}}" if by else default


def _prefix(by: tuple[str, ...]) -> str:
    """The grouping labels' legend followed by a space, or nothing."""
    return _legend(by) + " " if by else ""


def sum_rate(signal: str, by: tuple[str, ...] = (), suffix: str = "", extra: str = "", w: str = W) -> str:
    """sum by (...) (rate(kvscope_<signal><suffix>{sel}[w])) for a counter."""
    return compose.sum_rate(series(signal, suffix) + _sel(extra), w, by)


def quantile(q: float, signal: str, by: tuple[str, ...] = (), extra: str = "") -> str:
    """histogram_quantile over a windowed rate, summed by le (plus `by`)."""
    return compose.quantile(q, series(signal, "_bucket") + _sel(extra), W, by)


def mean(signal: str, by: tuple[str, ...] = (), extra: str = "", w: str = W) -> str:
    """Windowed mean of a histogram: rate(_sum) / rate(_count)."""
    return guard(sum_rate(signal, by, "_sum", extra, w), sum_rate(signal, by, "_count", extra, w))


def gauge(signal: str, agg: str = "sum", by: tuple[str, ...] = (), extra: str = "") -> str:
    """agg by (...) (kvscope_<signal>{sel}) for a gauge."""
    return f"{agg}{compose.by(by)} ({series(signal)}{_sel(extra)})"


def ratio(num: str, den: str, by: tuple[str, ...] = (), extra: str = "") -> str:
    """Guarded ratio of two counters' summed rates."""
    return guard(sum_rate(num, by, extra=extra), sum_rate(den, by, extra=extra))


def gauge_ratio(num: str, den: str, by: tuple[str, ...]) -> str:
    """Guarded ratio of two summed gauges (used / total)."""
    return guard(gauge(num, "sum", by), gauge(den, "sum", by))


def latency(signal: str) -> tuple[Query, ...]:
    """p50, p99 and the mean of a seconds histogram."""
    return (Query(quantile(0.5, signal), "p50"), Query(quantile(0.99, signal), "p99"), Query(mean(signal), "mean"))


# ------------------------------------------------------------------------------ request latency
# Queries a single panel uses are constants; those used with different groupings are functions.

TTFT = latency("request_ttft_seconds")
ITL = latency("request_itl_seconds")
E2E = latency("request_e2e_seconds")


def p99(signal: str, by: tuple[str, ...] = (), extra: str = "") -> Query:
    return Query(quantile(0.99, signal, by, extra), _legend(by, "p99"))


RECORDED_SELECTOR = 'model=~"$model", instance=~"$instance"'
"""Recorded level:signal:op series keep instance/model/engine/role only (the rules aggregate the rest)."""


def recorded(name: str, agg: str = "max", by: tuple[str, ...] = ("instance",)) -> Query:
    """A series recorded by rules/prometheus/kvscope-derived.yml, e.g. instance:request_ttft_seconds:p99_5m.
    It reads the canonical signal in the name's middle too: an engine without it leaves the panel empty."""
    return Query(f"{agg}{compose.by(by)} ({name}{{{RECORDED_SELECTOR}}})", _legend(by), (name, name.split(":")[1]))


def phase_means(by: tuple[str, ...] = ()) -> list[Query]:
    """Mean time per request phase (queue, prefill, decode): stacked, they add up to E2E."""
    return [Query(mean(f"request_{p}_seconds", by), f"{_prefix(by)}{p}") for p in ("queue", "prefill", "decode")]


def slo_attainment(signal: str, var: str) -> Query:
    """Share of requests under the SLO bucket chosen in `$var` (a histogram bucket bound)."""
    le = f'le=~"${var}(\\\\.0)?"'
    return Query(guard(sum_rate(signal, (), "_bucket", le), sum_rate(signal, (), "_count")), f"share under ${var} s")


# ------------------------------------------------------------------------------ throughput

REQUEST_RATE = Query(sum_rate("engine_requests_finished_total"), "req/s")
FINISH_REASONS = Query(sum_rate("engine_requests_finished_total", ("reason",)), "{{reason}}")


def token_rates(by: tuple[str, ...] = ()) -> list[Query]:
    return [
        Query(sum_rate(f"engine_{s}_tokens_total", by), f"{_prefix(by)}{what}")
        for s, what in (("prompt", "input"), ("generation", "output"))
    ]


def tokens_per_gpu_hour(by: tuple[str, ...] = (), gpus: str = "gpu_utilization_ratio") -> Query:
    """Output tokens per GPU-hour (the sizing field guide §9.3's core number), GPUs counted from `gpus`:
    utilisation (DCGM or NVML), or per engine the agent's engine-GPU join
    (engine_gpu_memory_used_bytes: one series per engine and GPU)."""
    num = f"{sum_rate('engine_generation_tokens_total', by)} * 3600"
    return Query(guard(num, f"count{compose.by(by)} ({series(gpus)}{_sel()})"), _legend(by, "tokens / GPU-hour"))


COST_PER_MILLION_TOKENS = Query(
    guard(
        f"count ({series('gpu_utilization_ratio')}{_sel()}) * $gpu_hour_cost / 3600",
        f"{sum_rate('engine_generation_tokens_total')} / 1e6",
    ),
    "$ / 1M output tokens",
)
"""$ per 1M output tokens at `$gpu_hour_cost` $/GPU-hour; every GPU reporting utilisation counts,
idle ones too (Sizing LLM Inference for Production §9.2)."""
JOULES_PER_TOKEN = Query(ratio("gpu_energy_joules_total", "engine_generation_tokens_total"), "J / output token")

# ------------------------------------------------------------------------------ saturation

RUNNING_WAITING = tuple(Query(gauge(f"engine_requests_{s}", "sum"), s) for s in ("running", "waiting"))
KV_USAGE_SPREAD = tuple(Query(gauge("engine_kv_cache_usage_ratio", agg), agg) for agg in ("max", "avg", "min"))


def kv_usage(by: tuple[str, ...]) -> Query:
    return Query(gauge("engine_kv_cache_usage_ratio", "max", by), "{{" + "}} rank {{".join(by) + "}}")


def preemptions(by: tuple[str, ...] = ()) -> Query:
    return Query(sum_rate("engine_preemptions_total", by), _legend(by, "preemptions/s"))


_TARGETS = '{job=~"$job", instance=~"$instance"}'
TARGETS_DOWN = Query(
    f"(count ({KVSCOPE_PREFIX}target_up{_TARGETS} == 0) or vector(0)) + (count (up{_TARGETS} == 0) or vector(0))",
    "targets down",
)
"""Targets whose last scrape failed: the agent's (kvscope_target_up) plus Prometheus' own (up)."""

# ------------------------------------------------------------------------------ prefix cache & KV


def prefix_hit_ratio(by: tuple[str, ...] = (), extra: str = "") -> Query:
    """Token-weighted local prefix-cache hit ratio over the window."""
    hits, queries = "engine_prefix_cache_hits_tokens_total", "engine_prefix_cache_queries_tokens_total"
    return Query(ratio(hits, queries, by, extra), _legend(by, "hit ratio"))


EXTERNAL_HIT_RATIO = Query(
    ratio("engine_external_prefix_cache_hits_tokens_total", "engine_external_prefix_cache_queries_tokens_total"),
    "external tier",
)
HOST_TIER_USAGE = Query(
    gauge_ratio("engine_kv_host_used_tokens", "engine_kv_host_capacity_tokens", ("instance",)), "host tier {{instance}}"
)
TIER_HIT_RATIO = Query(ratio("kv_tier_hit_tokens_total", "kv_tier_lookup_tokens_total", ("tier",)), "tier {{tier}}")
"""Hit ratio of each KV tier beyond the device that counts its lookups (LMCache)."""
_BRANCH = "router_policy_branch_total"
_KEPT = 'branch=~"ring_hit|target_worker_hit|routing_key_hit|tree_match"'
ROUTER_LOCALITY = (
    Query(mean("router_prefix_match_ratio", ("instance",)), "prefix match {{instance}}"),
    Query(
        guard(sum_rate(_BRANCH, ("policy",), extra=_KEPT), sum_rate(_BRANCH, ("policy",))),
        "kept on prefix worker {{policy}}",
    ),
)
"""What the router did with prefixes: mean prefix match at routing (llm-d, Dynamo) and the share of
decisions kept on the prefix's worker (SMG policy branches)."""
PROMPT_TOKENS_BY_SOURCE = Query(sum_rate("engine_prompt_tokens_by_source_total", ("source",)), "{{source}}")
PREFILL_TOKENS_SAVED = Query(sum_rate("engine_prefix_cache_hits_tokens_total"), "prefill tokens saved / s")
"""Prompt tokens per second not recomputed thanks to the local prefix cache."""
EVICTED_TOKENS = Query(sum_rate("engine_kv_evicted_tokens_total", ("instance",)), "{{instance}}")
RESIDENCY = tuple(
    Query(quantile(0.5, s), f"{label} p50")
    for s, label in (
        ("kv_block_lifetime_seconds", "lifetime"),
        ("kv_block_idle_before_evict_seconds", "idle before evict"),
        ("kv_block_reuse_gap_seconds", "reuse gap"),
    )
)
"""Block lifetime, idle time before eviction and reuse gap (vLLM KV residency histograms)."""
KV_CAPACITY = Query(gauge("engine_kv_capacity_tokens", "max", ("instance",)), "{{instance}}")
CHANGE_WINDOW = "15m"
"""How far back each point of the changes panel looks. A restarted engine is down while it loads its
model, often for minutes, and resets()/changes() only see a drop between two samples inside one
window: $__rate_interval (1 m) would miss most restarts; a restart down for longer than this is
not counted either."""
CHANGES = (
    Query(
        f"max by (instance) (resets({series('engine_requests_finished_total')}{_sel()}[{CHANGE_WINDOW}]))",
        f"{{{{instance}}}} restarts in the last {CHANGE_WINDOW}",
    ),
    Query(
        f"max by (instance) (changes({series('engine_kv_capacity_tokens')}{_sel()}[{CHANGE_WINDOW}]))",
        f"{{{{instance}}}} KV-capacity changes in the last {CHANGE_WINDOW}",
    ),
)
"""What changed, per engine: restarts (its finished-requests counter dropped) and new KV capacities
(vLLM cache_config_info, SGLang max_total_num_tokens) in the CHANGE_WINDOW before each point:
where `kvscope curve` and the webhook judge the curve before against after (docs/curve.md)."""
CASCADE_STAGE = Query(
    gauge("engine_cascade_stage_code", "max", ("instance", "dp_rank")), "{{instance}} rank {{dp_rank}}"
)
"""Memory-pressure cascade stage per engine (sizing field guide §7.4): 0 healthy .. 4 latency symptom."""
CASCADE_LEAD = Query(gauge("engine_cascade_lead_seconds", "max", ("instance",)), "{{instance}}")
"""How long the root (KV high) preceded the latency symptom: the time an operator had to act."""
KV_EVENT_RATES = (
    Query(sum_rate("kv_blocks_removed_total", ("medium",)), "removed {{medium}}"),
    Query(sum_rate("kv_blocks_evicted_recomputed_total"), "evicted then recomputed"),
    Query(sum_rate("kv_hot_blocks_evicted_total"), "hot blocks evicted"),
)
"""Block churn from the engines' KV events: removed, evicted-then-recomputed, hot blocks evicted."""
BLOCK_RESIDENCY_EVENTS = tuple(Query(quantile(q, "kv_block_residency_seconds"), f"p{q * 100:g}") for q in (0.5, 0.99))
"""Stored-to-removed time of every block (from KV events, not sampled)."""
PREFIX_SPLIT = Query(gauge("prefix_split_ratio", "max"), "prefixes split across replicas")

# ------------------------------------------------------------------------------ tenants


def tenant_rate(signal: str) -> Query:
    """Per-tenant rate of a kvscope tenant counter (top-K tenants + `other`)."""
    return Query(sum_rate(signal, ("tenant",), extra=TENANT), "{{tenant}}")


def tenant_gauge(signal: str) -> Query:
    return Query(gauge(signal, "max", ("tenant",), TENANT), "{{tenant}}")


TENANT_CACHE_HIT_RATIO = Query(
    ratio("tenant_cached_tokens_total", "tenant_prompt_tokens_total", ("tenant",), TENANT), "{{tenant}}"
)
"""Cached / prompt tokens per tenant over the panel window (from usage objects)."""
TENANT_TTFT_P99 = p99("tenant_ttft_seconds", ("tenant",), TENANT)
FLEET_FAIRNESS = (
    Query(gauge("fleet_tenant_hit_jain_ratio", "min"), "Jain index (1 = even)"),
    Query(gauge("fleet_cold_tenant_ratio", "max"), "cold tenants"),
    Query(gauge("fleet_tenant_hit_ratio_tail_gap_ratio", "max"), "aggregate - worst tenant"),
)

# ------------------------------------------------------------------------------ P/D phases

PHASE_P99 = p99("request_phase_seconds", ("phase", "role"))
"""Stitched per-request phase p99 from traces: queue, prefill, kv_transfer, decode, per role
(a P/D request's decode instance has its own prefill step, where a synchronous connector
reads the KV: kept apart from the prefill instance's prefill)."""
PHASE_MEAN = Query(mean("request_phase_seconds", ("phase", "role")), "{{phase}} {{role}}")
KV_TRANSFER = (p99("kv_transfer_seconds", ("role",)), Query(mean("kv_transfer_seconds", ("role",)), "{{role}} mean"))
KV_TRANSFER_BANDWIDTH = Query(sum_rate("kv_transfer_bytes", ("role",), "_sum"), "{{role}}")
KV_TRANSFER_FAILURES = Query(sum_rate("kv_transfer_failures_total", ("role",)), "{{role}}")

# ------------------------------------------------------------------------------ GPU and host


def gpu_gauge(signal: str, agg: str = "avg") -> Query:
    return Query(gauge(signal, agg, ("node", "gpu")), "{{node}} gpu {{gpu}}")


GPU_MEMORY_USED_RATIO = Query(
    gauge_ratio("gpu_memory_used_bytes", "gpu_memory_total_bytes", ("node", "gpu")), "{{node}} gpu {{gpu}}"
)
TOKENS_PER_SM_ACTIVE = Query(
    guard(sum_rate("engine_generation_tokens_total", ("node",)), gauge("gpu_sm_active_ratio", "sum", ("node",))),
    "{{node}}",
)
"""Output tokens/s per unit of SM activity, engine and GPU joined on `node`."""
KV_VS_HBM = (
    Query(gauge("engine_kv_cache_usage_ratio", "max", ("node",)), "{{node}} KV used"),
    Query(gauge_ratio("gpu_memory_used_bytes", "gpu_memory_total_bytes", ("node",)), "{{node}} HBM used"),
)
"""KV pressure next to HBM used, per node: are the engines' pools and the GPUs' memory in step."""
HOST_CPU = Query(gauge("host_cpu_utilization_ratio", "max", ("node",)), "{{node}}")
HOST_MEMORY_RATIO = Query(gauge_ratio("host_memory_used_bytes", "host_memory_total_bytes", ("node",)), "{{node}}")
_PROCESS = ("instance", "process")
ENGINE_RSS = Query(gauge("engine_process_resident_memory_bytes", "sum", _PROCESS), "{{instance}} {{process}}")
ENGINE_CPU = Query(sum_rate("engine_process_cpu_seconds_total", _PROCESS), "{{instance}} {{process}}")

# ------------------------------------------------------------------------------ findings

_FIRING = f'ALERTS{{alertstate="firing", alertname=~"Llm.*", {SELECTOR}}}'
FIRING_ALERTS = Query(
    f"sum by (alertname, severity, instance, model) ({_FIRING})", "{{alertname}} {{instance}}", instant=True
)
"""kvscope's diagnosis rules exported as Prometheus alerts (rules/prometheus/), firing now."""
ALERT_HISTORY = Query(f"sum by (alertname) ({_FIRING})", "{{alertname}}")


def _in_engine_mean(state: str) -> str:
    """Mean requests `state` (running, waiting) per engine (instance x DP rank) over the window."""
    return f"sum by (instance, dp_rank) (avg_over_time({series(f'engine_requests_{state}')}{_sel()}[{W}]))"


OPERATING_POINT = (
    Query(
        f"avg ({_in_engine_mean('running')} + {_in_engine_mean('waiting')} or {_in_engine_mean('running')})",
        "requests in the engine (per engine)",
    ),
    Query(quantile(0.99, "request_ttft_seconds"), "TTFT p99"),
    Query(quantile(0.5, "request_ttft_seconds"), "TTFT p50"),
)
"""The operating curve as far as PromQL draws it (Sizing LLM Inference for Production §8.1): at each
point, the mean requests in an engine (running + waiting, running alone where the engine exports no
queue: `kvscope curve`'s concurrency) against TTFT p99 and p50 of the requests answered in the same
window, pooled over the selection. The first query is the x axis of the XY chart."""
