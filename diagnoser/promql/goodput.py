"""Goodput recording rules and burn-rate alerts on the combined objective (`kvscope-goodput.yml`).

The objective (core/objectives.py): `target` of requests meet every latency bound at once. Its
error ratio, per pool (`model`) and per window, is read two ways (docs/goodput.md):

* exact, where the request tap counted each request (`kvscope:goodput_good_requests_total` /
  `kvscope:goodput_requests_total`): `pool:goodput:error_ratio_exact_rate<w>`;
* otherwise from the engines' per-objective histograms, as the Fréchet bound: the share missing
  at least one objective is at most the sum of the per-objective miss ratios (clamped to 1), so
  burning on it never misses a burn and may page on one that is not there:
  `pool:goodput:error_ratio_upper_rate<w>`. An objective without its histogram leaves it absent.

`pool:goodput:error_ratio_rate<w>` is the exact one where it exists, else the bound, labelled
`goodput_source="tap"` or `"histograms"`; the alerts burn on it and say which. Per tenant, only
the tap sees tenants: its exact counters, top-N tenants + `other` like the tenant TTFT SLO
(tenantslo.py, reusing its top-N record).
"""

from __future__ import annotations

import re
from typing import Any

from kvscope.core.objectives import HISTOGRAMS, Objectives, ObjectiveSet
from kvscope.core.scalars import parse_duration
from kvscope.diagnoser.promql import compose
from kvscope.diagnoser.promql.ranges import range_text
from kvscope.diagnoser.promql.signals import le_regex, quote
from kvscope.diagnoser.promql.tenantslo import split_ratio, top_record

REQUESTS = "kvscope:goodput_requests_total"
GOOD = "kvscope:goodput_good_requests_total"
POOL_BY = "model"


def attainment_record(kind: str, window: str) -> str:
    return f"pool:{HISTOGRAMS[kind]}:attainment_rate{window}"


def upper_record(window: str) -> str:
    return f"pool:goodput:error_ratio_upper_rate{window}"


def exact_record(window: str) -> str:
    return f"pool:goodput:error_ratio_exact_rate{window}"


def error_record(window: str) -> str:
    return f"pool:goodput:error_ratio_rate{window}"


def tenant_record(window: str) -> str:
    return f"tenant:goodput:error_ratio_rate{window}"


def _matchers(
    label: str, overrides: tuple[tuple[str, Objectives], ...], default: Objectives
) -> list[tuple[str, Objectives]]:
    """(matcher, objectives) per pool or tenant with its own objectives, then the default for the rest."""
    out = [(f'{label}="{quote(name)}"', obj) for name, obj in overrides]
    named = "|".join(quote(re.escape(name)) for name, _ in overrides)
    return [*out, (f'{label}!~"{named}"' if named else "", default)]


def _pools(objectives: ObjectiveSet) -> list[tuple[str, Objectives]]:
    return _matchers(POOL_BY, objectives.pools, objectives.default)


def _sel(*matchers: str) -> str:
    inner = ",".join(m for m in matchers if m)
    return f"{{{inner}}}" if inner else ""


def _attainment(kind: str, bound: float, matcher: str, window: str) -> str:
    bucket = f"kvscope:{HISTOGRAMS[kind]}_bucket"
    r = range_text(window)
    at, inf = f'le=~"{le_regex(bound)}"', 'le="+Inf"'
    good = compose.sum_rate(f"{bucket}{_sel(matcher, at)}", r, (POOL_BY,))
    total = compose.sum_rate(f"{bucket}{_sel(matcher, inf)}", r, (POOL_BY,))
    return compose.guard(good, total)


def goodput_rules(objectives: ObjectiveSet, windows: tuple[tuple[str, str, float, str], ...]) -> list[dict[str, Any]]:
    """Per-objective attainments, the bound and exact error ratios, the combined one, per-tenant
    error ratios, then the burn-rate alerts per pool matcher and per tenant."""
    spans = sorted({w for pair in windows for w in pair[:2]}, key=parse_duration)
    rules: list[dict[str, Any]] = []
    for w in spans:
        for matcher, obj in _pools(objectives):
            for kind, bound in obj.bounds().items():
                rules.append({"record": attainment_record(kind, w), "expr": _attainment(kind, bound, matcher, w)})
    for w in spans:
        for matcher, obj in _pools(objectives):
            misses = " + ".join(f"(1 - {attainment_record(k, w)}{_sel(matcher)})" for k in obj.bounds())
            if misses:
                # an objective the pool's engines do not export leaves the sum, and so the bound, absent
                rules.append({"record": upper_record(w), "expr": f"clamp_max({misses}, 1)"})
        r = range_text(w)
        rules.append(
            {
                "record": exact_record(w),
                "expr": "1 - "
                + compose.guard(compose.sum_rate(GOOD, r, (POOL_BY,)), compose.sum_rate(REQUESTS, r, (POOL_BY,))),
            }
        )
        rules.append(
            {
                "record": error_record(w),
                "expr": (
                    f'label_replace({exact_record(w)}, "goodput_source", "tap", "", "")\nor on ({POOL_BY})\n'
                    f'label_replace({upper_record(w)}, "goodput_source", "histograms", "", "")'
                ),
            }
        )
    top = top_record(spans[-1])
    for w in spans:
        rules.append({"record": tenant_record(w), "expr": split_ratio(GOOD, REQUESTS, top, w, good=True)})
    for matcher, obj in _pools(objectives):
        rules += [_alert(obj, matcher, pair) for pair in windows]
    for matcher, obj in _matchers("tenant", objectives.tenants, objectives.default):
        rules += [_tenant_alert(obj, matcher, pair) for pair in windows]
    return rules


def _alert(obj: Objectives, matcher: str, window: tuple[str, str, float, str]) -> dict[str, Any]:
    return compose.burn_rate_alert(
        "LlmGoodputSloBurnRate",
        "goodput",
        lambda w: f"{error_record(w)}{_sel(matcher)}",
        window,
        obj.target,
        "Goodput SLO of {{ $labels.model }}",
        f"{{{{ $labels.model }}}}'s requests missed at least one latency objective ({obj.describe()})",
        '. {{ if eq $labels.goodput_source "tap" }}Exact: each request the request tap saw, counted.'
        "{{ else }}A bound from the engines' per-objective histograms (no request tap): the sum of "
        "the objectives' miss ratios, the most that can have missed one; the true share may be lower.{{ end }}",
    )


def _tenant_alert(obj: Objectives, matcher: str, window: tuple[str, str, float, str]) -> dict[str, Any]:
    return compose.burn_rate_alert(
        "LlmTenantGoodputSloBurnRate",
        "tenant_goodput",
        lambda w: f"{tenant_record(w)}{_sel(matcher)}",
        window,
        obj.target,
        "Goodput SLO of tenant {{ $labels.tenant }}",
        "tenant {{ $labels.tenant }}'s requests missed at least one latency objective",
        f" ({obj.describe()}, each tenant's own objectives where declared). Counted exactly per request by the "
        "request tap.",
        ' Tenant "other" is every tenant outside the top by request rate, summed.',
    )
