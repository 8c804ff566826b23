"""diagnoser/promql/tenantslo.py: the per-tenant SLO rules' shape (their behaviour is tested with
promtool in rules/tests/tenant-slo.test.yml and on 10k tenants in
tests/integration/test_tenant_slo_prometheus.py)."""

from __future__ import annotations

import pytest

from kvscope.diagnoser.promql.rulefiles import SloConfig, build_rule_files, tenant_slo_rules_of
from kvscope.diagnoser.promql.tenantslo import top_record


def test_top_n_is_a_parameter_and_other_is_never_a_top_tenant():
    rules = tenant_slo_rules_of(SloConfig(tenant_top_n=7))
    assert rules[0]["record"] == top_record("6h")
    assert rules[0]["expr"].startswith("topk(7, ") and 'tenant!="other"' in rules[0]["expr"]
    records = [r for r in rules[1:] if "record" in r]
    assert len(records) == 8  # 4 windows x (TTFT, errors)
    for r in records:  # every per-tenant record is the top set or the rest relabelled other
        assert r["expr"].count(top_record("6h")) == 4 and '"tenant", "other"' in r["expr"]


def test_every_alert_pairs_a_long_and_a_short_window_per_slo():
    alerts = [r for r in tenant_slo_rules_of(SloConfig(error_target=0.995)) if "alert" in r]
    assert [(a["alert"], a["labels"]["window"], a["labels"]["severity"]) for a in alerts] == [
        ("LlmTenantTtftSloBurnRate", "1h/5m", "critical"),
        ("LlmTenantTtftSloBurnRate", "6h/30m", "warning"),
        ("LlmTenantErrorSloBurnRate", "1h/5m", "critical"),
        ("LlmTenantErrorSloBurnRate", "6h/30m", "warning"),
    ]
    assert "> 0.072\nand\n" in alerts[2]["expr"]  # 14.4 x (1 - 0.995)


def test_top_n_below_one_is_refused():
    with pytest.raises(ValueError, match="top_n"):
        tenant_slo_rules_of(SloConfig(tenant_top_n=0))


def test_the_tenant_file_is_built_and_reads_the_new_error_counter():
    files = build_rule_files(alert_groups=None)
    assert "kvscope-tenant-slo.yml" in files
    assert "record: kvscope:tenant_request_errors_total" in files["kvscope-canonical.yml"]
