"""Tenants & fairness: is a healthy aggregate hit ratio hiding tenants that never hit (P8)?"""

from kvscope.dashboards import queries as q
from kvscope.dashboards.board import Board, Panel, Row

UID = "kvscope-tenants"

FAIRNESS = Row("Per-tenant usage and cache fairness", (
    Panel("Prompt tokens / s by tenant", "Prompt tokens per second per tenant (SGLang custom label `tenant`, "
          "or the kvscope request tap).", (q.tenant_prompt_tokens(),), "tokens_per_s", stack=True, width=12),
    Panel("Requests / s by tenant", "Finished requests per second per tenant.", (q.tenant_request_rate(),),
          "reqps", stack=True, width=12),
    Panel("Prefix hit ratio by tenant", "Token-weighted hit ratio per tenant. 001: the aggregate can look "
          "healthy while long-tail tenants almost never hit.", (q.tenant_hit_ratio(),), "ratio",
          palette="hit_ratio", width=12),
    Panel("TTFT p99 by tenant", "99th percentile TTFT per tenant: unfair caching shows up here first.",
          (q.tenant_ttft_p99(),), "seconds", width=12),
))

BOARD = Board(UID, "kvscope / Tenants & fairness",
              "Per-tenant usage, prefix hit ratio and tail latency.", (FAIRNESS,), tenant_var=True)
