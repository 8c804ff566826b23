"""Every PromQL query the dashboards use, each written once.

Panels read the agent's canonical re-export `kvscope_<signal>` (agent/serve/export.py), so one set of
panels serves vLLM and SGLang fleets: the agent has already mapped the native names (old and new)
and units through agent/normalize/catalog.yaml. Per-instance tail latencies read the recorded
`instance:<signal>:<op>` series of rules/prometheus/kvscope-derived.yml where those exist. The
`kvscope:<signal>` canonical recordings are not read directly: the rules generator records only
the ones its own files use (a TSDB-cost choice), and a dashboard must not depend on that set.
Target health reads the agent's `kvscope_target_up` and Prometheus' own `up`. Helpers keep the
patterns right by construction:

* quantiles are always `histogram_quantile(q, sum by (le, ...) (rate(<h>_bucket[w])))`;
* means are `rate(_sum) / rate(_count)`, never a bare rate of `_sum` shown as a latency;
* every division is guarded, `num / (den > 0)`, so idle periods give no series, not NaN;
* `rate()`/`increase()` only ever wrap counters, histogram buckets, `_sum` or `_count`.

dashboards/lint.py checks all of this again on the generated queries.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.agent.signals import KVSCOPE_PREFIX

W = "$__rate_interval"
RANGE = "$__range"
SELECTOR = 'job=~"$job", namespace=~"$namespace", model=~"$model", instance=~"$instance"'
"""The dashboard-variable selector. Every variable's All value is `.*`, which also matches a
series without that label (a vLLM series has no `namespace` outside Kubernetes)."""
TENANT = 'tenant=~"$tenant"'


@dataclass(frozen=True)
class Query:
    """One panel target: the expression, its legend, and the canonical signals it reads."""

    expr: str
    legend: str = ""
    signals: tuple[str, ...] = ()
    instant: bool = False


def series(signal: str, suffix: str = "") -> str:
    """The exported sample name of a canonical signal."""
    return f"{KVSCOPE_PREFIX}{signal}{suffix}"


def _sel(extra: str = "") -> str:
    return "{" + SELECTOR + (", " + extra if extra else "") + "}"


def _by(labels: tuple[str, ...]) -> str:
    return f" by ({', '.join(labels)})" if labels else ""


def sum_rate(signal: str, by: tuple[str, ...] = (), suffix: str = "", extra: str = "", w: str = W) -> str:
    """sum by (...) (rate(kvscope_<signal><suffix>{sel}[w])) for a counter."""
    return f"sum{_by(by)} (rate({series(signal, suffix)}{_sel(extra)}[{w}]))"


def guard(num: str, den: str) -> str:
    """num / (den > 0): no series instead of NaN or Inf when the denominator is zero."""
    return f"({num}) / (({den}) > 0)"


def quantile(q: float, signal: str, by: tuple[str, ...] = (), extra: str = "") -> str:
    """histogram_quantile over a windowed rate, summed by le (plus `by`)."""
    return f"histogram_quantile({q}, {sum_rate(signal, ('le',) + by, '_bucket', extra)})"


def mean(signal: str, by: tuple[str, ...] = (), extra: str = "", w: str = W) -> str:
    """Windowed mean of a histogram: rate(_sum) / rate(_count)."""
    return guard(sum_rate(signal, by, "_sum", extra, w), sum_rate(signal, by, "_count", extra, w))


def gauge(signal: str, agg: str = "sum", by: tuple[str, ...] = (), extra: str = "") -> str:
    """agg by (...) (kvscope_<signal>{sel}) for a gauge."""
    return f"{agg}{_by(by)} ({series(signal)}{_sel(extra)})"


def latency(signal: str, by: tuple[str, ...] = (), extra: str = "", what: str = "") -> list[Query]:
    """p50, p99 and the mean of a seconds histogram."""
    tag = "{{" + "}} {{".join(by) + "}} " if by else ""
    return [
        Query(quantile(0.5, signal, by, extra), f"{tag}p50{what}", (signal,)),
        Query(quantile(0.99, signal, by, extra), f"{tag}p99{what}", (signal,)),
        Query(mean(signal, by, extra), f"{tag}mean{what}", (signal,)),
    ]


# ------------------------------------------------------------------------------ request latency


def ttft() -> list[Query]:
    return latency("request_ttft_seconds")


def itl() -> list[Query]:
    return latency("request_itl_seconds")


def e2e() -> list[Query]:
    return latency("request_e2e_seconds")


def p99(signal: str, by: tuple[str, ...] = (), extra: str = "") -> Query:
    tag = "{{" + "}} {{".join(by) + "}}" if by else "p99"
    return Query(quantile(0.99, signal, by, extra), tag, (signal,))


RECORDED_SELECTOR = 'model=~"$model", instance=~"$instance"'
"""Recorded level:signal:op series keep instance/model/engine/role only (the rules aggregate the rest)."""


def recorded(name: str, agg: str = "max", by: tuple[str, ...] = ("instance",)) -> Query:
    """A series recorded by rules/prometheus/kvscope-derived.yml, e.g. instance:request_ttft_seconds:p99_5m.
    It reads the canonical signal in the name's middle too: an engine without it leaves the panel empty."""
    signal = name.split(":")[1]
    return Query(f"{agg}{_by(by)} ({name}{{{RECORDED_SELECTOR}}})", "{{" + "}} {{".join(by) + "}}", (name, signal))


def phase_means(by: tuple[str, ...] = ()) -> list[Query]:
    """Mean time per request phase (queue, prefill, decode): stacked, they add up to E2E."""
    tag = "{{" + "}} {{".join(by) + "}} " if by else ""
    return [
        Query(mean(f"request_{p}_seconds", by), f"{tag}{p}", (f"request_{p}_seconds",))
        for p in ("queue", "prefill", "decode")
    ]


def slo_attainment(signal: str, var: str) -> Query:
    """Share of requests under the SLO bucket chosen in `$var` (a histogram bucket bound)."""
    le = f'le=~"${var}(\\\\.0)?"'
    return Query(
        guard(sum_rate(signal, (), "_bucket", le), sum_rate(signal, (), "_count")), f"share under ${var} s", (signal,)
    )


# ------------------------------------------------------------------------------ throughput


def request_rate(by: tuple[str, ...] = ()) -> Query:
    return Query(
        sum_rate("engine_requests_finished_total", by),
        "{{" + "}} {{".join(by) + "}}" if by else "req/s",
        ("engine_requests_finished_total",),
    )


def token_rates(by: tuple[str, ...] = ()) -> list[Query]:
    tag = "{{" + "}} {{".join(by) + "}} " if by else ""
    return [
        Query(sum_rate("engine_prompt_tokens_total", by), f"{tag}input", ("engine_prompt_tokens_total",)),
        Query(sum_rate("engine_generation_tokens_total", by), f"{tag}output", ("engine_generation_tokens_total",)),
    ]


def finish_reasons() -> Query:
    return Query(
        sum_rate("engine_requests_finished_total", ("reason",)), "{{reason}}", ("engine_requests_finished_total",)
    )


def gpu_count() -> str:
    """GPUs reporting utilisation in the selection (DCGM or NVML)."""
    return f"count ({series('gpu_utilization_ratio')}{_sel()})"


def tokens_per_gpu_hour(by: tuple[str, ...] = ()) -> Query:
    """Output tokens per GPU-hour (002 §9.3's core efficiency number)."""
    num = f"{sum_rate('engine_generation_tokens_total', by)} * 3600"
    den = f"count{_by(by)} ({series('gpu_utilization_ratio')}{_sel()})"
    return Query(
        guard(num, den),
        "{{" + "}} {{".join(by) + "}}" if by else "tokens / GPU-hour",
        ("engine_generation_tokens_total", "gpu_utilization_ratio"),
    )


def tokens_per_gpu_hour_by_engine() -> Query:
    """Output tokens per GPU-hour per engine, GPUs counted from the agent's engine-GPU join
    (engine_gpu_memory_used_bytes: one series per engine and GPU)."""
    num = f"{sum_rate('engine_generation_tokens_total', ('instance',))} * 3600"
    den = f"count by (instance) ({series('engine_gpu_memory_used_bytes')}{_sel()})"
    return Query(guard(num, den), "{{instance}}", ("engine_generation_tokens_total", "engine_gpu_memory_used_bytes"))


def cost_per_million_tokens() -> Query:
    """$ per 1M output tokens at `$gpu_hour_cost` $/GPU-hour; idle GPUs count (002 §9.2)."""
    num = f"{gpu_count()} * $gpu_hour_cost / 3600"
    den = f"{sum_rate('engine_generation_tokens_total')} / 1e6"
    return Query(guard(num, den), "$ / 1M output tokens", ("gpu_utilization_ratio", "engine_generation_tokens_total"))


def joules_per_token() -> Query:
    num = f"sum (rate({series('gpu_energy_joules_total')}{_sel()}[{W}]))"
    return Query(
        guard(num, sum_rate("engine_generation_tokens_total")),
        "J / output token",
        ("gpu_energy_joules_total", "engine_generation_tokens_total"),
    )


# ------------------------------------------------------------------------------ saturation


def running_waiting(by: tuple[str, ...] = ()) -> list[Query]:
    tag = "{{" + "}} {{".join(by) + "}} " if by else ""
    return [
        Query(gauge("engine_requests_running", "sum", by), f"{tag}running", ("engine_requests_running",)),
        Query(gauge("engine_requests_waiting", "sum", by), f"{tag}waiting", ("engine_requests_waiting",)),
    ]


def kv_usage_spread() -> list[Query]:
    return [
        Query(gauge("engine_kv_cache_usage_ratio", agg), agg, ("engine_kv_cache_usage_ratio",))
        for agg in ("max", "avg", "min")
    ]


def kv_usage(by: tuple[str, ...]) -> Query:
    return Query(
        gauge("engine_kv_cache_usage_ratio", "max", by),
        "{{" + "}} rank {{".join(by) + "}}",
        ("engine_kv_cache_usage_ratio",),
    )


def preemptions(by: tuple[str, ...] = ()) -> Query:
    return Query(
        sum_rate("engine_preemptions_total", by),
        "{{" + "}} {{".join(by) + "}}" if by else "preemptions/s",
        ("engine_preemptions_total",),
    )


def targets_down() -> Query:
    """Targets whose last scrape failed: the agent's (kvscope_target_up) plus Prometheus' own (up)."""
    sel = '{job=~"$job", instance=~"$instance"}'
    return Query(
        f"(count ({KVSCOPE_PREFIX}target_up{sel} == 0) or vector(0)) + (count (up{sel} == 0) or vector(0))",
        "targets down",
        ("target_up", "up"),
    )


# ------------------------------------------------------------------------------ prefix cache & KV


def prefix_hit_ratio(by: tuple[str, ...] = (), extra: str = "") -> Query:
    """Token-weighted local prefix-cache hit ratio over the window."""
    num = sum_rate("engine_prefix_cache_hits_tokens_total", by, extra=extra)
    den = sum_rate("engine_prefix_cache_queries_tokens_total", by, extra=extra)
    return Query(
        guard(num, den),
        "{{" + "}} {{".join(by) + "}}" if by else "hit ratio",
        ("engine_prefix_cache_hits_tokens_total", "engine_prefix_cache_queries_tokens_total"),
    )


def external_hit_ratio(by: tuple[str, ...] = ()) -> Query:
    num = sum_rate("engine_external_prefix_cache_hits_tokens_total", by)
    den = sum_rate("engine_external_prefix_cache_queries_tokens_total", by)
    return Query(
        guard(num, den),
        "external {{" + "}} {{".join(by) + "}}" if by else "external tier",
        ("engine_external_prefix_cache_hits_tokens_total", "engine_external_prefix_cache_queries_tokens_total"),
    )


def host_tier_usage(by: tuple[str, ...] = ("instance",)) -> Query:
    num = gauge("engine_kv_host_used_tokens", "sum", by)
    den = gauge("engine_kv_host_capacity_tokens", "sum", by)
    return Query(
        guard(num, den),
        "host tier {{" + "}} {{".join(by) + "}}",
        ("engine_kv_host_used_tokens", "engine_kv_host_capacity_tokens"),
    )


def tier_hit_ratio() -> Query:
    """Hit ratio of each KV tier beyond the device that counts its lookups (LMCache)."""
    num = sum_rate("kv_tier_hit_tokens_total", ("tier",))
    den = sum_rate("kv_tier_lookup_tokens_total", ("tier",))
    return Query(guard(num, den), "tier {{tier}}", ("kv_tier_hit_tokens_total", "kv_tier_lookup_tokens_total"))


def router_locality() -> list[Query]:
    """What the router did with prefixes: mean prefix match at routing (llm-d, Dynamo) and the share of
    decisions kept on the prefix's worker (SMG policy branches)."""
    kept = sum_rate(
        "router_policy_branch_total",
        ("policy",),
        extra='branch=~"ring_hit|target_worker_hit|routing_key_hit|tree_match"',
    )
    return [
        Query(
            mean("router_prefix_match_ratio", ("instance",)),
            "prefix match {{instance}}",
            ("router_prefix_match_ratio",),
        ),
        Query(
            guard(kept, sum_rate("router_policy_branch_total", ("policy",))),
            "kept on prefix worker {{policy}}",
            ("router_policy_branch_total",),
        ),
    ]


def prompt_tokens_by_source() -> Query:
    return Query(
        sum_rate("engine_prompt_tokens_by_source_total", ("source",)),
        "{{source}}",
        ("engine_prompt_tokens_by_source_total",),
    )


def prefill_tokens_saved() -> Query:
    """Prompt tokens per second not recomputed thanks to the local prefix cache."""
    return Query(
        sum_rate("engine_prefix_cache_hits_tokens_total"),
        "prefill tokens saved / s",
        ("engine_prefix_cache_hits_tokens_total",),
    )


def evicted_tokens(by: tuple[str, ...] = ("instance",)) -> Query:
    return Query(
        sum_rate("engine_kv_evicted_tokens_total", by),
        "{{" + "}} {{".join(by) + "}}",
        ("engine_kv_evicted_tokens_total",),
    )


def residency() -> list[Query]:
    """Block lifetime, idle time before eviction and reuse gap (vLLM KV residency histograms)."""
    return [
        Query(quantile(0.5, s), f"{label} p50", (s,))
        for s, label in (
            ("kv_block_lifetime_seconds", "lifetime"),
            ("kv_block_idle_before_evict_seconds", "idle before evict"),
            ("kv_block_reuse_gap_seconds", "reuse gap"),
        )
    ]


def kv_capacity(by: tuple[str, ...] = ("instance",)) -> Query:
    return Query(
        gauge("engine_kv_capacity_tokens", "max", by), "{{" + "}} {{".join(by) + "}}", ("engine_kv_capacity_tokens",)
    )


def cascade_stage() -> Query:
    """Memory-pressure cascade stage per engine (002 §7.4): 0 healthy .. 4 latency symptom."""
    return Query(
        gauge("engine_cascade_stage_code", "max", ("instance", "dp_rank")),
        "{{instance}} rank {{dp_rank}}",
        ("engine_cascade_stage_code",),
    )


def cascade_lead() -> Query:
    """How long the root (KV high) preceded the latency symptom: the time an operator had to act."""
    return Query(
        gauge("engine_cascade_lead_seconds", "max", ("instance",)), "{{instance}}", ("engine_cascade_lead_seconds",)
    )


def kv_event_rates() -> list[Query]:
    """Block churn from the engines' KV events: removed, evicted-then-recomputed, hot blocks evicted."""
    return [
        Query(sum_rate("kv_blocks_removed_total", ("medium",)), "removed {{medium}}", ("kv_blocks_removed_total",)),
        Query(
            sum_rate("kv_blocks_evicted_recomputed_total"),
            "evicted then recomputed",
            ("kv_blocks_evicted_recomputed_total",),
        ),
        Query(sum_rate("kv_hot_blocks_evicted_total"), "hot blocks evicted", ("kv_hot_blocks_evicted_total",)),
    ]


def block_residency_events() -> list[Query]:
    """Stored-to-removed time of every block (from KV events, not sampled)."""
    return [
        Query(quantile(0.5, "kv_block_residency_seconds"), "p50", ("kv_block_residency_seconds",)),
        Query(quantile(0.99, "kv_block_residency_seconds"), "p99", ("kv_block_residency_seconds",)),
    ]


def prefix_split() -> Query:
    return Query(gauge("prefix_split_ratio", "max"), "prefixes split across replicas", ("prefix_split_ratio",))


# ------------------------------------------------------------------------------ tenants


def tenant_rate(signal: str) -> Query:
    """Per-tenant rate of a kvscope tenant counter (top-K tenants + `other`)."""
    return Query(sum_rate(signal, ("tenant",), extra=TENANT), "{{tenant}}", (signal,))


def tenant_gauge(signal: str) -> Query:
    return Query(gauge(signal, "max", ("tenant",), TENANT), "{{tenant}}", (signal,))


def tenant_cache_hit_ratio() -> Query:
    """Cached / prompt tokens per tenant over the panel window (from usage objects)."""
    num = sum_rate("tenant_cached_tokens_total", ("tenant",), extra=TENANT)
    den = sum_rate("tenant_prompt_tokens_total", ("tenant",), extra=TENANT)
    return Query(guard(num, den), "{{tenant}}", ("tenant_cached_tokens_total", "tenant_prompt_tokens_total"))


def tenant_ttft_p99() -> Query:
    return p99("tenant_ttft_seconds", ("tenant",), TENANT)


def fleet_fairness() -> list[Query]:
    return [
        Query(gauge("fleet_tenant_hit_jain_ratio", "min"), "Jain index (1 = even)", ("fleet_tenant_hit_jain_ratio",)),
        Query(gauge("fleet_cold_tenant_ratio", "max"), "cold tenants", ("fleet_cold_tenant_ratio",)),
        Query(
            gauge("fleet_tenant_hit_ratio_tail_gap_ratio", "max"),
            "aggregate - worst tenant",
            ("fleet_tenant_hit_ratio_tail_gap_ratio",),
        ),
    ]


# ------------------------------------------------------------------------------ P/D phases


def phase_p99_by_phase() -> Query:
    """Stitched per-request phase p99 from traces: queue, prefill, kv_transfer, decode, per role
    (a P/D request's decode instance has its own prefill step, where a synchronous connector
    reads the KV: kept apart from the prefill instance's prefill)."""
    return p99("request_phase_seconds", ("phase", "role"))


def phase_mean_by_phase() -> Query:
    return Query(mean("request_phase_seconds", ("phase", "role")), "{{phase}} {{role}}", ("request_phase_seconds",))


def kv_transfer() -> list[Query]:
    return [
        p99("kv_transfer_seconds", ("role",)),
        Query(mean("kv_transfer_seconds", ("role",)), "{{role}} mean", ("kv_transfer_seconds",)),
    ]


def kv_transfer_bandwidth() -> Query:
    return Query(sum_rate("kv_transfer_bytes", ("role",), "_sum"), "{{role}}", ("kv_transfer_bytes",))


def kv_transfer_failures() -> Query:
    return Query(sum_rate("kv_transfer_failures_total", ("role",)), "{{role}}", ("kv_transfer_failures_total",))


# ------------------------------------------------------------------------------ GPU and host


def gpu_gauge(signal: str, agg: str = "avg") -> Query:
    return Query(gauge(signal, agg, ("node", "gpu")), "{{node}} gpu {{gpu}}", (signal,))


def gpu_memory_used_ratio() -> Query:
    num = gauge("gpu_memory_used_bytes", "sum", ("node", "gpu"))
    den = gauge("gpu_memory_total_bytes", "sum", ("node", "gpu"))
    return Query(guard(num, den), "{{node}} gpu {{gpu}}", ("gpu_memory_used_bytes", "gpu_memory_total_bytes"))


def tokens_per_sm_active() -> Query:
    """Output tokens/s per unit of SM activity, engine and GPU joined on `node`."""
    num = sum_rate("engine_generation_tokens_total", ("node",))
    den = gauge("gpu_sm_active_ratio", "sum", ("node",))
    return Query(guard(num, den), "{{node}}", ("engine_generation_tokens_total", "gpu_sm_active_ratio"))


def kv_vs_hbm() -> list[Query]:
    """KV pressure next to HBM used, per node: are the engines' pools and the GPUs' memory in step."""
    return [
        Query(
            gauge("engine_kv_cache_usage_ratio", "max", ("node",)), "{{node}} KV used", ("engine_kv_cache_usage_ratio",)
        ),
        Query(
            guard(gauge("gpu_memory_used_bytes", "sum", ("node",)), gauge("gpu_memory_total_bytes", "sum", ("node",))),
            "{{node}} HBM used",
            ("gpu_memory_used_bytes", "gpu_memory_total_bytes"),
        ),
    ]


def host_cpu() -> Query:
    return Query(gauge("host_cpu_utilization_ratio", "max", ("node",)), "{{node}}", ("host_cpu_utilization_ratio",))


def host_memory_ratio() -> Query:
    return Query(
        guard(gauge("host_memory_used_bytes", "sum", ("node",)), gauge("host_memory_total_bytes", "sum", ("node",))),
        "{{node}}",
        ("host_memory_used_bytes", "host_memory_total_bytes"),
    )


def engine_rss() -> Query:
    return Query(
        gauge("engine_process_resident_memory_bytes", "sum", ("instance", "process")),
        "{{instance}} {{process}}",
        ("engine_process_resident_memory_bytes",),
    )


def engine_cpu() -> Query:
    return Query(
        sum_rate("engine_process_cpu_seconds_total", ("instance", "process")),
        "{{instance}} {{process}}",
        ("engine_process_cpu_seconds_total",),
    )


# ------------------------------------------------------------------------------ findings


def firing_alerts() -> Query:
    """kvscope's diagnosis rules exported as Prometheus alerts (rules/prometheus/), firing now."""
    return Query(
        "sum by (alertname, severity, instance, model) "
        f'(ALERTS{{alertstate="firing", alertname=~"Llm.*", {SELECTOR}}})',
        "{{alertname}} {{instance}}",
        ("ALERTS",),
        instant=True,
    )


def alert_history() -> Query:
    return Query(
        f'sum by (alertname) (ALERTS{{alertstate="firing", alertname=~"Llm.*", {SELECTOR}}})',
        "{{alertname}}",
        ("ALERTS",),
    )
