"""Per-tenant prefix-cache fairness: the unfairness a healthy aggregate hit rate hides (seeds/001).

Inputs are the `tenant_*` series of the request tap / stitched traces, or an SGLang engine's
`tenant`-labelled counters (vLLM has no tenant label). Per tenant: requests, hit ratio, reuse
potential, lost reuse, TTFT p50/p99. Fleet: the traffic-weighted Jain index of tenant hit ratios,
the share of cold tenants (low hit ratio despite high reuse potential) and the gap between the
aggregate and the worst tenant's hit ratio (docs/requests.md §3). Pure: no I/O."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvscope.core.quantiles import histogram_quantile
from kvscope.core.signals import Sample, make_labels

# Canonical series read per tenant: kvscope-produced first, then engine series with a tenant label.
_REQUESTS = ("tenant_requests_total", "engine_requests_finished_total")
_PROMPT = ("tenant_prompt_tokens_total", "engine_prompt_tokens_total")
_CACHED = ("tenant_cached_tokens_total", "engine_prefix_cache_hits_tokens_total")
_REUSABLE = ("tenant_reusable_tokens_total",)
_TTFT_BUCKETS = ("tenant_ttft_seconds_bucket", "request_ttft_seconds_bucket")
_USAGE_NAMES = frozenset(_REQUESTS + _PROMPT + _CACHED + _REUSABLE + _TTFT_BUCKETS)


@dataclass(frozen=True)
class FairnessConfig:
    """Thresholds. 002 §9.3: a hit rate below 30% on a workload with known reuse is a misconfiguration."""

    cold_hit_max: float = 0.30  # a tenant below this hit ratio ...
    cold_potential_min: float = 0.50  # ... while at least this share of its prompts was reusable is cold
    min_requests: int = 5  # tenants with fewer requests are reported but not judged


@dataclass
class TenantUsage:
    """What one tenant sent over a window. None means the source lacks the number (absent, not 0)."""

    tenant: str
    requests: float = 0.0
    prompt_tokens: float = 0.0
    cached_tokens: float | None = None
    reusable_tokens: float | None = None
    ttft_buckets: list[tuple[float, float]] = field(default_factory=list)  # cumulative (le, count)

    def minus(self, before: TenantUsage) -> TenantUsage:
        """The usage between two cumulative snapshots (counter resets: take the newer total)."""

        def d(a: float | None, b: float | None) -> float | None:
            if a is None:
                return None
            return a - b if b is not None and a >= b else a

        buckets = dict(before.ttft_buckets)
        return replace(
            self,
            requests=d(self.requests, before.requests) or 0.0,
            prompt_tokens=d(self.prompt_tokens, before.prompt_tokens) or 0.0,
            cached_tokens=d(self.cached_tokens, before.cached_tokens),
            reusable_tokens=d(self.reusable_tokens, before.reusable_tokens),
            ttft_buckets=[
                (le, c - buckets.get(le, 0.0) if c >= buckets.get(le, 0.0) else c) for le, c in self.ttft_buckets
            ],
        )


@dataclass(frozen=True)
class TenantFairness:
    tenant: str
    requests: float
    prompt_tokens: float
    cached_tokens: float | None
    hit_ratio: float | None
    reuse_potential_ratio: float | None
    lost_reuse_ratio: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    judged: bool  # enough requests to count in the fleet figures
    cold: bool | None  # None when the reuse potential is unknown


@dataclass(frozen=True)
class FairnessReport:
    tenants: dict[str, TenantFairness]
    aggregate_hit_ratio: float | None
    jain_index: float | None  # 1 = every tenant gets the same hit ratio
    cold_tenant_ratio: float | None  # cold tenants / judged tenants with a known potential
    tail_gap_ratio: float | None  # aggregate hit ratio - worst judged tenant's hit ratio
    worst_tenant: str | None


def evaluate_fairness(usage: Mapping[str, TenantUsage], config: FairnessConfig | None = None) -> FairnessReport:
    """Per-tenant and fleet fairness figures for one window of usage."""
    cfg = config or FairnessConfig()
    tenants = {name: _tenant(u, cfg) for name, u in sorted(usage.items())}
    judged = [t for t in tenants.values() if t.judged and t.hit_ratio is not None]
    agg = _aggregate_hit(usage.values())
    worst = min(judged, key=lambda t: (t.hit_ratio, t.tenant), default=None)
    with_potential = [t for t in judged if t.cold is not None]
    return FairnessReport(
        tenants=tenants,
        aggregate_hit_ratio=agg,
        jain_index=weighted_jain_index([(t.hit_ratio, t.prompt_tokens) for t in judged]),  # type: ignore[misc]
        cold_tenant_ratio=(sum(1 for t in with_potential if t.cold) / len(with_potential)) if with_potential else None,
        tail_gap_ratio=(agg - worst.hit_ratio) if agg is not None and worst and worst.hit_ratio is not None else None,
        worst_tenant=worst.tenant if worst else None,
    )


def _ratio(num: float | None, den: float) -> float | None:
    """num / den clamped to [0, 1]; None when num is absent or den is not positive."""
    return None if num is None or den <= 0 else min(1.0, max(0.0, num / den))


def _tenant(u: TenantUsage, cfg: FairnessConfig) -> TenantFairness:
    hit = _ratio(u.cached_tokens, u.prompt_tokens)
    potential = _ratio(u.reusable_tokens, u.prompt_tokens)
    lost = None
    if u.reusable_tokens is not None and u.cached_tokens is not None and u.prompt_tokens > 0:
        lost = max(0.0, u.reusable_tokens - u.cached_tokens) / u.prompt_tokens
    cold = None
    if hit is not None and potential is not None:
        cold = hit < cfg.cold_hit_max and potential >= cfg.cold_potential_min
    return TenantFairness(
        tenant=u.tenant,
        requests=u.requests,
        prompt_tokens=u.prompt_tokens,
        cached_tokens=u.cached_tokens,
        hit_ratio=hit,
        reuse_potential_ratio=potential,
        lost_reuse_ratio=lost,
        ttft_p50_s=histogram_quantile(0.5, u.ttft_buckets),
        ttft_p99_s=histogram_quantile(0.99, u.ttft_buckets),
        judged=u.requests >= cfg.min_requests,
        cold=cold,
    )


def _aggregate_hit(usage: Iterable[TenantUsage]) -> float | None:
    known = [u for u in usage if u.cached_tokens is not None]
    prompt = sum(u.prompt_tokens for u in known)
    return _ratio(sum(u.cached_tokens or 0.0 for u in known), prompt) if known else None


def weighted_jain_index(values: Sequence[tuple[float, float]]) -> float | None:
    """Jain's fairness index of `x` with weights `w` (traffic): (Σwx)² / (Σw · Σwx²), in (0, 1]; all-zero
    ratios are fair (1.0); None for no tenants."""
    pts = [(x, w) for x, w in values if w > 0]
    if not pts:
        return None
    sw = sum(w for _, w in pts)
    swx = sum(w * x for x, w in pts)
    swx2 = sum(w * x * x for x, w in pts)
    return 1.0 if swx2 == 0 else (swx * swx) / (sw * swx2)


def parse_tenant_usage(samples: Iterable[Sample]) -> dict[str, TenantUsage]:
    """Cumulative per-tenant usage from samples with a `tenant` label, summed over instances / ranks;
    kvscope's own `tenant_*` series win over engine series for a tenant that has both."""
    acc: dict[str, dict[str, float]] = {}
    buckets: dict[tuple[str, str], dict[float, float]] = {}
    for s in samples:
        tenant = s.label("tenant")
        if tenant is None or s.value != s.value:
            continue
        if s.name in _TTFT_BUCKETS:
            le = float(s.label("le") or "nan")
            b = buckets.setdefault((tenant, s.name), {})
            b[le] = b.get(le, 0.0) + s.value
        elif s.name in _REQUESTS + _PROMPT + _CACHED + _REUSABLE:
            t = acc.setdefault(tenant, {})
            t[s.name] = t.get(s.name, 0.0) + s.value
    return {t: _usage(t, vals, buckets) for t, vals in sorted(acc.items())}


def _first(vals: Mapping[str, float], names: Sequence[str]) -> float | None:
    return next((vals[n] for n in names if n in vals), None)


def _usage(
    tenant: str, vals: Mapping[str, float], buckets: Mapping[tuple[str, str], dict[float, float]]
) -> TenantUsage:
    b = next((buckets[(tenant, n)] for n in _TTFT_BUCKETS if (tenant, n) in buckets), {})
    return TenantUsage(
        tenant=tenant,
        requests=_first(vals, _REQUESTS) or 0.0,
        prompt_tokens=_first(vals, _PROMPT) or 0.0,
        cached_tokens=_first(vals, _CACHED),
        reusable_tokens=_first(vals, _REUSABLE),
        ttft_buckets=sorted(b.items()),
    )


def render_fairness_samples(report: FairnessReport, timestamp: float | None = None) -> list[Sample]:
    """The kvscope-produced fairness gauges (declared in core/catalog.yaml). Absent stays absent."""
    out: list[Sample] = []
    for name, t in report.tenants.items():
        lab = make_labels({"tenant": name})
        for series, v in (
            ("tenant_prefix_hit_ratio", t.hit_ratio),
            ("tenant_reuse_potential_ratio", t.reuse_potential_ratio),
            ("tenant_lost_reuse_ratio", t.lost_reuse_ratio),
        ):
            if v is not None:
                out.append(Sample(series, lab, v, timestamp))
    for series, v in (
        ("fleet_tenant_hit_jain_ratio", report.jain_index),
        ("fleet_cold_tenant_ratio", report.cold_tenant_ratio),
        ("fleet_tenant_hit_ratio_tail_gap_ratio", report.tail_gap_ratio),
    ):
        if v is not None:
            out.append(Sample(series, (), v, timestamp))
    return out


def fairness_since_start(samples: list[Sample]) -> list[Sample]:
    """Fairness gauges from cumulative tenant series, over everything since they started (the
    standalone tap's /kvscope/metrics)."""
    return render_fairness_samples(evaluate_fairness(parse_tenant_usage(samples)))


def fairness_json_since_start(samples: list[Sample]) -> dict[str, Any]:
    """The standalone tap's /kvscope/fairness answer (None stays null: absent, not zero)."""
    return asdict(evaluate_fairness(parse_tenant_usage(samples)))


def fairness_hook(window_s: float = 300.0) -> Callable[[Iterable[Sample]], list[Sample]]:
    """A derive hook: fleet fairness gauges over the last `window_s` from the `tenant_*` counters of
    kvscope's own sources (tap, OTLP receiver; engines export none). The usage is counted since the
    newest cumulative snapshot at least `window_s` old (else since start)."""
    snapshots: deque[tuple[float, dict[str, TenantUsage]]] = deque(maxlen=512)

    def fairness(cycle: Iterable[Sample]) -> list[Sample]:
        own = [s for s in cycle if s.name in _USAGE_NAMES]
        if not own:
            return []
        now = max((s.timestamp for s in own if s.timestamp is not None), default=None)
        t_now, current = now if now is not None else 0.0, parse_tenant_usage(own)
        base = next((snap for t, snap in reversed(snapshots) if t <= t_now - window_s), {})
        snapshots.append((t_now, current))
        usage = {t: u.minus(base[t]) if t in base else u for t, u in current.items()}
        return render_fairness_samples(evaluate_fairness(usage), now)

    return fairness
