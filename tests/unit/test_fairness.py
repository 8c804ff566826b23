"""Per-tenant fairness analytics: the 001 'healthy aggregate hides a cold tenant' case."""

import math

import pytest

from kvscope.agent.derive.fairness import (
    FairnessConfig,
    TenantUsage,
    evaluate_fairness,
    fairness_hook,
    histogram_quantile,
    parse_tenant_usage,
    render_fairness_samples,
    weighted_jain_index,
)
from kvscope.core.signals import Sample, make_labels


def _usage():
    # Three hot tenants with ~90% hits carry the traffic; "tail" reuses its prompts too but misses.
    return {
        "a": TenantUsage("a", requests=400, prompt_tokens=400_000, cached_tokens=360_000, reusable_tokens=370_000),
        "b": TenantUsage("b", requests=300, prompt_tokens=300_000, cached_tokens=270_000, reusable_tokens=275_000),
        "c": TenantUsage("c", requests=200, prompt_tokens=200_000, cached_tokens=176_000, reusable_tokens=180_000),
        "tail": TenantUsage(
            "tail",
            requests=20,
            prompt_tokens=20_000,
            cached_tokens=1_000,
            reusable_tokens=15_000,
            ttft_buckets=[(0.4, 10), (0.9, 20), (math.inf, 20)],
        ),
    }


def test_healthy_aggregate_hides_a_cold_long_tail_tenant():
    rep = evaluate_fairness(_usage())
    assert rep.aggregate_hit_ratio == pytest.approx(807_000 / 920_000)
    assert rep.aggregate_hit_ratio > 0.85
    tail = rep.tenants["tail"]
    assert tail.hit_ratio == pytest.approx(0.05)
    assert tail.reuse_potential_ratio == pytest.approx(0.75)
    assert tail.lost_reuse_ratio == pytest.approx(0.70)
    assert tail.cold is True and rep.tenants["a"].cold is False
    assert rep.cold_tenant_ratio == 0.25
    assert rep.worst_tenant == "tail"
    assert rep.tail_gap_ratio == pytest.approx(807_000 / 920_000 - 0.05)
    assert tail.ttft_p50_s == 0.4 and tail.ttft_p99_s == pytest.approx(0.89)


def test_jain_index_is_one_for_equal_ratios_and_drops_with_weighted_spread():
    assert weighted_jain_index([(0.8, 1), (0.8, 5)]) == pytest.approx(1.0)
    assert weighted_jain_index([(1.0, 1), (0.0, 1)]) == pytest.approx(0.5)
    # traffic weighting: a tiny tenant at 0 barely moves the index, a big one halves it
    assert weighted_jain_index([(1.0, 99), (0.0, 1)]) == pytest.approx(0.99)
    assert weighted_jain_index([]) is None
    assert weighted_jain_index([(0.0, 3), (0.0, 1)]) == 1.0


def test_tenants_with_few_requests_are_reported_but_not_judged():
    usage = _usage()
    usage["tail"].requests = 2
    rep = evaluate_fairness(usage)
    assert rep.tenants["tail"].judged is False
    assert rep.worst_tenant != "tail" and rep.cold_tenant_ratio == 0.0


def test_unknown_cached_or_reusable_tokens_stay_absent():
    rep = evaluate_fairness({"x": TenantUsage("x", requests=10, prompt_tokens=1000)})
    t = rep.tenants["x"]
    assert t.hit_ratio is None and t.reuse_potential_ratio is None and t.cold is None
    assert rep.aggregate_hit_ratio is None and rep.jain_index is None and rep.cold_tenant_ratio is None
    assert render_fairness_samples(rep) == []


def test_histogram_quantile_interpolates_like_promql():
    buckets = [(0.1, 50.0), (0.5, 90.0), (1.0, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.7, buckets) == pytest.approx(0.3)
    assert histogram_quantile(0.5, []) is None


def test_parse_tenant_usage_reads_kvscope_series_then_sglang_tenant_labels():
    def s(name, tenant, v, **extra):
        return Sample(name, make_labels({"tenant": tenant, "instance": "i", **extra}), v, 1.0)

    samples = [
        s("tenant_requests_total", "a", 10),
        s("tenant_prompt_tokens_total", "a", 1000),
        s("tenant_cached_tokens_total", "a", 600),
        s("tenant_reusable_tokens_total", "a", 800),
        s("tenant_ttft_seconds_bucket", "a", 4, le="0.1"),
        s("tenant_ttft_seconds_bucket", "a", 10, le="+Inf"),
        # an SGLang engine started with --tokenizer-metrics-allowed-custom-labels tenant
        s("engine_requests_finished_total", "b", 7),
        s("engine_prompt_tokens_total", "b", 700),
        s("engine_prefix_cache_hits_tokens_total", "b", 70),
        s("engine_prompt_tokens_total", "b", 300, instance="j"),
        Sample("engine_prompt_tokens_total", make_labels({"instance": "i"}), 5.0, 1.0),  # no tenant: ignored
    ]
    u = parse_tenant_usage(samples)
    assert set(u) == {"a", "b"}
    assert (u["a"].requests, u["a"].prompt_tokens, u["a"].cached_tokens, u["a"].reusable_tokens) == (10, 1000, 600, 800)
    assert u["a"].ttft_buckets == [(0.1, 4.0), (math.inf, 10.0)]
    assert (u["b"].prompt_tokens, u["b"].cached_tokens, u["b"].reusable_tokens) == (1000, 70, None)


def test_window_usage_from_two_snapshots():
    before = TenantUsage(
        "a", requests=10, prompt_tokens=1000, cached_tokens=500, ttft_buckets=[(0.1, 4), (math.inf, 10)]
    )
    now = TenantUsage("a", requests=15, prompt_tokens=1600, cached_tokens=900, ttft_buckets=[(0.1, 5), (math.inf, 15)])
    w = now.minus(before)
    assert (w.requests, w.prompt_tokens, w.cached_tokens, w.reusable_tokens) == (5, 600, 400, None)
    assert w.ttft_buckets == [(0.1, 1), (math.inf, 5)]


def test_the_hook_counts_since_the_newest_snapshot_at_least_a_window_old():
    hook = fairness_hook(10.0)

    def cycle(t, prompt, cached):
        lab = make_labels({"tenant": "a"})
        names = ("tenant_requests_total", "tenant_prompt_tokens_total", "tenant_cached_tokens_total")
        return [Sample(n, lab, v, t) for n, v in zip(names, (10.0 * t + 1, prompt, cached), strict=True)]

    def hit(out):
        return next(s.value for s in out if s.name == "tenant_prefix_hit_ratio")

    assert hit(hook(cycle(0.0, 100.0, 90.0))) == pytest.approx(0.9)  # since start
    assert hit(hook(cycle(5.0, 200.0, 100.0))) == pytest.approx(0.5)  # no snapshot 10 s old: since start
    assert hit(hook(cycle(12.0, 300.0, 110.0))) == pytest.approx(20 / 200)  # since t=0
    assert hit(hook(cycle(16.0, 400.0, 250.0))) == pytest.approx(150 / 200)  # since t=5


def test_rendered_series_names_and_values():
    out = render_fairness_samples(evaluate_fairness(_usage(), FairnessConfig(cold_hit_max=0.1)), timestamp=5.0)
    by = {(s.name, s.label("tenant")): s.value for s in out}
    assert by[("tenant_prefix_hit_ratio", "tail")] == pytest.approx(0.05)
    assert by[("tenant_lost_reuse_ratio", "tail")] == pytest.approx(0.70)
    assert by[("fleet_cold_tenant_ratio", None)] == 0.25
    assert 0 < by[("fleet_tenant_hit_jain_ratio", None)] < 1
