"""Per-tenant accounting of stitched trace records (agent/traces/tenants.py) and its config keys."""

import pytest

from kvscope.agent.config import ConfigError
from kvscope.agent.derive.fairness import parse_tenant_usage
from kvscope.agent.traces.receiver import parse_otlp_config
from kvscope.agent.traces.stitch import RequestRecord
from kvscope.agent.traces.tenants import TenantAccounting


def _rec(tenant, instance="10.0.0.5:8000", prompt=100, cached=None, ttft=0.1, tapped=False):
    return RequestRecord(
        trace_id="t",
        request_id=None,
        engine="sglang",
        start_ns=0,
        end_ns=1,
        phases=[],
        tenant=tenant,
        instance=instance,
        prompt_tokens=prompt,
        cached_tokens=cached,
        ttft_s=ttft,
        tapped=tapped,
    )


def test_usage_sums_instances_and_keeps_unknown_cached_tokens_absent():
    acct = TenantAccounting()
    for inst in ("a:1", "b:1"):
        acct.observe(_rec("acme", inst, prompt=100, cached=60))
    acct.observe(_rec("plain", prompt=50, cached=None, ttft=None))
    u = parse_tenant_usage(acct.render())
    assert (u["acme"].requests, u["acme"].prompt_tokens, u["acme"].cached_tokens) == (2, 200, 120)
    assert u["plain"].cached_tokens is None and u["plain"].ttft_buckets == []
    names = {(s.name, s.label("instance")) for s in acct.render() if s.label("tenant") == "acme"}
    assert ("tenant_requests_total", "a:1") in names and ("tenant_requests_total", "b:1") in names


def test_records_without_tenant_or_measured_by_the_tap_are_not_counted():
    acct = TenantAccounting()
    assert not acct.observe(_rec(None))
    assert not acct.observe(_rec("acme", tapped=True))
    assert acct.render() == [] and acct.stats == {"no_tenant": 1, "counted_by_tap": 1}


def test_tenant_labels_are_bounded():
    acct = TenantAccounting(max_tenants=3)
    for i in range(100):
        acct.observe(_rec(f"t{i}", instance=None))
    tenants = {s.label("tenant") for s in acct.render()}
    assert len(tenants) == 4 and "other" in tenants
    assert (
        sum(u.requests for u in parse_tenant_usage(acct.render()).values()) == 100
    )  # nothing lost, folded into `other`


def test_config_keys():
    cfg = parse_otlp_config({"max_tenants": 7, "fairness_window_s": "2m"})
    assert cfg.max_tenants == 7 and cfg.fairness_window_s == 120
    for bad in (0, -1, "many", True):
        with pytest.raises(ConfigError, match="otlp.max_tenants"):
            parse_otlp_config({"max_tenants": bad})
