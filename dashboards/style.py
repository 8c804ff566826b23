"""Shared look of every kvscope dashboard: variables, threshold palettes, units, links.

Threshold palettes follow vLLM's generated suite (anchor-dashboards.md §2.2) and 002 §9.3's
monitoring targets, so a colour means the same thing on every panel.
"""

from __future__ import annotations

from grafanalib.core import DashboardLink, Template

DATASOURCE = "$datasource"
TAG = "kvscope"
UI_URL_DEFAULT = "http://127.0.0.1:8501"

# (colour, from-value) steps; the first step has no lower bound.
PALETTES: dict[str, list[tuple[str, float | None]]] = {
    # 002 §9.3: KV cache utilisation target 75-90 %, near 100 % is the ceiling.
    "kv_usage": [("green", None), ("orange", 0.9), ("red", 0.98)],
    # Higher is better: prefix hit ratio below 30 % on a reuse workload is what
    # prefix_hit_low_with_reuse reads (002 §9.3).
    "hit_ratio": [("red", None), ("orange", 0.3), ("green", 0.6)],
    "slo": [("red", None), ("orange", 0.9), ("green", 0.99)],
    "rate_bad": [("green", None), ("orange", 0.001), ("red", 1.0)],
    "down": [("green", None), ("red", 1.0)],
    # 002 §9.3 GPU compute utilisation 60-85 % while serving; below 40 % is the utilisation trap.
    "gpu_util": [("red", None), ("orange", 0.4), ("green", 0.6)],
    "none": [("green", None)],
}

UNITS = {
    "seconds": "s",
    "ratio": "percentunit",
    "tokens_per_s": "suffix: tok/s",
    "tokens": "suffix: tok",
    "reqps": "reqps",
    "per_s": "suffix: /s",
    "bytes": "bytes",
    "bytes_per_s": "Bps",
    "count": "short",
    "watts": "watt",
    "celsius": "celsius",
    "currency": "currencyUSD",
    "joules": "suffix: J",
    "tokens_per_gpu_hour": "suffix: tok/GPU-h",
    "stage": "short",
    "cores": "short",
}
"""Grafana unit ids by meaning. Panels name a meaning, never a raw Grafana unit."""


def thresholds(palette: str) -> list[dict]:
    """Grafana threshold steps for a palette name."""
    return [{"color": c, "value": v} for c, v in PALETTES[palette]]


def _query_var(name: str, label: str, metric: str, chained: str = "") -> Template:
    sel = "{" + chained + "}" if chained else ""
    return Template(
        name=name,
        label=label,
        dataSource=DATASOURCE,
        type="query",
        query=f"label_values({metric}{sel}, {name})",
        includeAll=True,
        multi=True,
        allValue=".*",
        refresh=2,
        sort=1,
        default="$__all",
    )


def variables(tenant: bool = False, slo: bool = False, cost: bool = False) -> list[Template]:
    """datasource, job, namespace, model, instance (chained), plus optional tenant/SLO/cost vars."""
    anchor = "kvscope_target_up"
    engine_metric = "kvscope_engine_requests_running"
    out = [
        Template(name="datasource", label="Data source", query="prometheus", type="datasource", default="Prometheus"),
        _query_var("job", "Job", anchor),
        _query_var("namespace", "Namespace", engine_metric, 'job=~"$job"'),
        _query_var("model", "Model", engine_metric, 'job=~"$job", namespace=~"$namespace"'),
        _query_var("instance", "Instance", engine_metric, 'job=~"$job", namespace=~"$namespace", model=~"$model"'),
    ]
    if tenant:
        out.append(_query_var("tenant", "Tenant", "kvscope_tenant_requests_total", 'job=~"$job"'))
    if slo:
        # Must be histogram bucket bounds (vLLM's TTFT/TPOT buckets); queries match "1" and "1.0".
        out.append(_custom("ttft_slo", "TTFT SLO (s)", ["0.1", "0.25", "0.5", "1", "2.5", "5", "10"], "1"))
        out.append(
            _custom(
                "itl_slo", "ITL SLO (s)", ["0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5"], "0.1"
            )
        )
    if cost:
        out.append(Template(name="gpu_hour_cost", label="$ / GPU-hour", type="textbox", query="2.50", default="2.50"))
    out.append(
        Template(
            name="ui_url", label="kvscope UI", type="constant", query=UI_URL_DEFAULT, default=UI_URL_DEFAULT, hide=2
        )
    )
    return out


def _custom(name: str, label: str, values: list[str], default: str) -> Template:
    return Template(name=name, label=label, type="custom", query=",".join(values), default=default)


def dashboard_links() -> list[DashboardLink]:
    """The kvscope dashboards as a dropdown that keeps time range and variables."""
    return [
        DashboardLink(title="kvscope", type="dashboards", tags=[TAG], asDropdown=True, includeVars=True, keepTime=True),
        DashboardLink(title="Triage UI", type="link", uri="${ui_url}", targetBlank=True, icon="external link"),
    ]


def drilldown(uid: str, title: str) -> dict:
    """A panel link to another kvscope dashboard with the current time range and variables."""
    return {"title": title, "url": f"/d/{uid}?${{__url_time_range}}&${{__all_variables}}"}


def ui_link(page: str, title: str) -> dict:
    """A panel link into the Streamlit UI."""
    return {"title": title, "url": f"${{ui_url}}/{page}", "targetBlank": True}
