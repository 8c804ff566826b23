"""Tenants & fairness: is a healthy aggregate hit ratio hiding tenants that never hit (rule tenant_cache_unfairness)?

Per-tenant series come from kvscope's request tap / trace receiver (tenant_*, top-K tenants plus
`other`); the fleet fairness gauges from agent/derive (docs/requests.md).
"""

from kvscope.dashboards import queries as q
from kvscope.dashboards.board import Board, Panel, Row
from kvscope.dashboards.style import ui_link
from kvscope.diagnoser.promql.tenantslo import error_record, ttft_record

TTFT_1H = ttft_record("1h")
ERRORS_1H = error_record("1h")

FLEET = Row(
    "Fairness",
    (
        Panel(
            "Tenant fairness",
            "Traffic-weighted Jain index of tenant hit ratios (1 = even), the share of cold "
            "tenants (hit < 0.3 with reuse potential >= 0.5) and how far the worst tenant sits below the "
            "aggregate. llm-d on a GH200, multi-tenant test: the aggregate can look healthy while "
            "long-tail tenants almost never hit.",
            q.FLEET_FAIRNESS,
            "ratio",
            width=12,
            links=(ui_link("Tenants", "Tenants in the UI"),),
        ),
        Panel(
            "Prefix split across replicas",
            "Share of re-seen prompt prefixes served by more than one replica "
            "or DP rank: one prefix, several cache domains (Why more GPUs is not enough for LLM "
            "inference; Welcome to the Disaggregation Cliff).",
            (q.PREFIX_SPLIT,),
            "ratio",
            width=12,
        ),
    ),
)

USAGE = Row(
    "Per-tenant usage and cache",
    (
        Panel(
            "Requests / s by tenant",
            "Requests per second per tenant.",
            (q.tenant_rate("tenant_requests_total"),),
            "reqps",
            stack=True,
            width=12,
        ),
        Panel(
            "Prompt tokens / s by tenant",
            "Prompt tokens per second per tenant (usage.prompt_tokens).",
            (q.tenant_rate("tenant_prompt_tokens_total"),),
            "tokens_per_s",
            stack=True,
            width=12,
        ),
        Panel(
            "Cache hit ratio by tenant",
            "Cached / prompt tokens per tenant over the panel window.",
            (q.TENANT_CACHE_HIT_RATIO,),
            "ratio",
            palette="hit_ratio",
        ),
        Panel(
            "Lost reuse by tenant",
            "Reuse the cache did not deliver: max(0, reusable - cached) / prompt tokens.",
            (q.tenant_gauge("tenant_lost_reuse_ratio"),),
            "ratio",
        ),
        Panel(
            "Client TTFT p99 by tenant",
            "99th percentile client-side TTFT per tenant (request tap, network "
            "included): unfair caching shows up here first.",
            (q.TENANT_TTFT_P99,),
            "seconds",
        ),
    ),
)

SLO = Row(
    "Per-tenant SLOs",
    (
        Panel(
            "TTFT SLO miss ratio by tenant (1h)",
            "Share of each tenant's requests slower than the TTFT SLO bound over the last hour, from "
            "rules/prometheus/kvscope-tenant-slo.yml: the top-N tenants by request rate and `other` "
            "(the rest, summed). The SLO allows 1 - target; the fast-burn page fires at 14.4x that.",
            (
                q.Query(
                    f"max by (tenant) ({TTFT_1H}{{{q.TENANT}}})",
                    "{{tenant}}",
                    (TTFT_1H, "tenant_ttft_seconds"),
                ),
            ),
            "ratio",
        ),
        Panel(
            "Error SLO miss ratio by tenant (1h)",
            "Share of each tenant's requests that failed upstream (unreachable, broken, 5xx; counted by "
            "the request tap) over the last hour, top-N tenants and `other`.",
            (
                q.Query(
                    f"max by (tenant) ({ERRORS_1H}{{{q.TENANT}}})",
                    "{{tenant}}",
                    (ERRORS_1H, "tenant_request_errors_total"),
                ),
            ),
            "ratio",
        ),
        Panel(
            "Tenant SLO alerts firing",
            "LlmTenantTtftSloBurnRate and LlmTenantErrorSloBurnRate alerts firing, by tenant and severity.",
            (
                q.Query(
                    'count by (tenant, alertname, severity) (ALERTS{alertname=~"LlmTenant.*SloBurnRate", '
                    'alertstate="firing"})',
                    "{{tenant}} {{alertname}} {{severity}}",
                ),
            ),
            "count",
        ),
    ),
)

BOARD = Board(
    "kvscope-tenants",
    "kvscope / Tenants & fairness",
    "Per-tenant usage, prefix hit ratio, lost reuse and tail latency.",
    (FLEET, USAGE, SLO),
    tenant_var=True,
)
