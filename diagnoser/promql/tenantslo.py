"""Per-tenant SLO burn-rate rules (`kvscope-tenant-slo.yml`), cardinality bounded by top-N.

Two SLOs per tenant, fleet-wide (summed over every agent, tap and gateway that reports the
tenant), with the same multiwindow, multi-burn-rate pattern as the fleet TTFT SLO
(rulefiles.py `slo_rules`):

* TTFT: `ttft_target` of a tenant's requests see a first token within `ttft_seconds`, from
  `kvscope:tenant_ttft_seconds_bucket` (the request tap's and the trace receiver's per-tenant
  histogram; its buckets are the OTel GenAI TTFT advice, which has the 1 s bound);
* errors: at most 1 - `error_target` of a tenant's requests fail upstream, from
  `kvscope:tenant_request_errors_total` / `kvscope:tenant_requests_total` (the tap counts an
  unreachable or broken upstream and 5xx answers; a client that hangs up is not an error).

Cardinality: one recording picks the `top_n` tenants by request rate over the longest window
(`tenant:tenant_requests:top_rate<w>`, at most `top_n` series); every other tenant, the agents'
own `other` included, is summed into `tenant="other"`. So each recording holds at most
`top_n + 1` series whatever the number of tenants (tests/unit/test_tenant_slo.py, 10k tenants).
"""

from __future__ import annotations

from typing import Any

from kvscope.core.scalars import parse_duration
from kvscope.diagnoser.promql import compose
from kvscope.diagnoser.promql.ranges import range_text
from kvscope.diagnoser.promql.signals import le_regex

TTFT_BUCKET = "kvscope:tenant_ttft_seconds_bucket"
REQUESTS = "kvscope:tenant_requests_total"
ERRORS = "kvscope:tenant_request_errors_total"
OTHER = "other"


def top_record(window: str) -> str:
    return f"tenant:tenant_requests:top_rate{window}"


def ttft_record(window: str) -> str:
    return f"tenant:tenant_ttft_seconds:slo_error_ratio_rate{window}"


def error_record(window: str) -> str:
    return f"tenant:tenant_request_errors:ratio_rate{window}"


def split_ratio(num: str, den: str, top: str, window: str, good: bool) -> str:
    """`num/den` per top tenant, or summed over the rest as `tenant="other"`; with `good`, the
    ratio is of good events and the error ratio is 1 minus it."""
    one = "1 - " if good else ""

    def part(by: str, op: str) -> str:
        n = f"sum{by} (rate({num}[{range_text(window)}]) {op} on (tenant) {top})"
        d = f"sum{by} (rate({den}[{range_text(window)}]) {op} on (tenant) {top})"
        return f"{one}(\n    {n}\n    /\n    ({d} > 0)\n  )"

    return (
        f"(\n  {part(' by (tenant)', 'and')}\n)\nor\nlabel_replace(\n  {part('', 'unless')},\n"
        f'  "tenant", "{OTHER}", "", ""\n)'
    )


def tenant_slo_rules(
    ttft_seconds: float,
    ttft_target: float,
    error_target: float,
    top_n: int,
    windows: tuple[tuple[str, str, float, str], ...],
) -> list[dict[str, Any]]:
    """The top-N selection, per-window error ratios for both SLOs, then their burn-rate alerts."""
    if top_n < 1:
        raise ValueError(f"top_n must be >= 1, got {top_n}")
    spans = sorted({w for pair in windows for w in pair[:2]}, key=parse_duration)
    longest = spans[-1]
    top = top_record(longest)
    rules: list[dict[str, Any]] = [
        {
            "record": top,
            "expr": f'topk({top_n}, sum by (tenant) (rate({REQUESTS}{{tenant!="{OTHER}"}}[{range_text(longest)}])))',
        }
    ]
    good = f'{TTFT_BUCKET}{{le=~"{le_regex(ttft_seconds)}"}}'
    total = f'{TTFT_BUCKET}{{le="+Inf"}}'
    for w in spans:
        rules.append({"record": ttft_record(w), "expr": split_ratio(good, total, top, w, good=True)})
    for w in spans:
        # a tenant without a single error has its 0 (the tap creates the error series at 0)
        rules.append({"record": error_record(w), "expr": split_ratio(ERRORS, REQUESTS, top, w, good=False)})
    ttft = (f"took longer than {ttft_seconds:g}s to the first token", f"{ttft_target:.4g} within {ttft_seconds:g}s")
    errors = ("failed upstream (unreachable, broken or 5xx)", f"{error_target:.4g} succeed")
    for kind, target, record_of, (what, slo) in (
        ("ttft", ttft_target, ttft_record, ttft),
        ("errors", error_target, error_record, errors),
    ):
        label = "TTFT" if kind == "ttft" else "Error"
        rules += [
            compose.burn_rate_alert(
                f"LlmTenant{label.title()}SloBurnRate",
                f"tenant_{kind}",
                record_of,
                window,
                target,
                f"{label} SLO of tenant {{{{ $labels.tenant }}}}",
                f"tenant {{{{ $labels.tenant }}}}'s requests {what}",
                f" ({slo}).",
                f' Tenant "{OTHER}" is every tenant outside the top by request rate, summed.',
            )
            for window in windows
        ]
    return rules
