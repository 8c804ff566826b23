"""The `predict` series form (PromQL `predict_linear`), added as one case per backend of the typed
rule tree: a K1-style early warning that KV usage is on course to fill within 15 minutes. The
same rule and input series are judged by the numpy evaluator (a rule-test case) and by promtool
running the alert the compiler writes, and the validator accepts the form."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvscope.core.signals import load_catalog
from kvscope.diagnoser.promql.alerts import compile_rule
from kvscope.diagnoser.rulebook.rule import parse_yaml, rule_from_doc
from kvscope.diagnoser.rulebook.tree import Predict
from kvscope.diagnoser.rulebook.validate import Context, check_series
from testbed.prometheus import promtool_test_rules, require_binaries
from testbed.rulecases import Case, check_case

RULE = """
id: kv_fills_soon
title: KV cache on course to fill
severity: warning
by: [instance]
series:
  kv: {gauge: engine_kv_cache_usage_ratio, agg: max}
  kv_ahead: {predict: kv, range: 10m, ahead: 15m}
when:
  all: [{series: kv_ahead, op: ">=", value: 1.0}, {series: kv, op: "<", value: 0.95}]
  for: 2m
evidence: [{series: kv_ahead, name: KV usage in 15 min, unit: ratio, stat: max}]
"""
STEEP = "0.4+0.01x60"  # +0.04/min: 0.80 at 10 min, 1.4 predicted 15 min later: fires
RISING = "0.4+0.0025x60"  # +0.01/min: 0.50 at 10 min, 0.65 predicted: quiet
FLAT = "0.9x60"  # high but not moving: quiet


def _rule():
    return rule_from_doc(parse_yaml(RULE, "kv_fills_soon.yaml"), "kv_fills_soon.yaml")


def _case(values: str, fire: bool) -> Case:
    series = [{"series": 'engine_kv_cache_usage_ratio{instance="e0"}', "values": values}]
    expect = [{"labels": {"instance": "e0"}}] if fire else []
    return Case(name=values, input_series=series, eval_time=600.0, expect=expect, params={}, line=0, facts={})


def test_tree_parses_and_validator_accepts_the_form():
    assert _rule().tree.series["kv_ahead"] == Predict(of="kv", rng=600.0, ahead=900.0)
    assert list(check_series(_rule(), Context(load_catalog(), {}))) == []


@pytest.mark.parametrize(("values", "fire"), [(STEEP, True), (RISING, False), (FLAT, False)])
def test_evaluator_fires_only_on_a_trend_that_reaches_full(values, fire):
    assert check_case(_rule(), _case(values, fire), 15.0, {}) == []


def test_alert_is_predict_linear_and_promtool_agrees(tmp_path: Path):
    alerts = compile_rule(_rule())
    assert isinstance(alerts, list), alerts
    assert (
        "predict_linear((max by (instance) (kvscope:engine_kv_cache_usage_ratio))[10m1ms:15s], 900)"
        in alerts[0]["expr"]
    )
    require_binaries("promtool")
    rules = [{k: v for k, v in a.items() if k != "annotations"} for a in alerts]
    fired = [{"exp_labels": {"instance": "e0", "severity": "warning", "rule_id": "kv_fills_soon"}}]
    tests = [
        {
            "interval": "15s",
            "input_series": [{"series": 'kvscope:engine_kv_cache_usage_ratio{instance="e0"}', "values": v}],
            "alert_rule_test": [{"eval_time": "10m", "alertname": "LlmKvFillsSoon", "exp_alerts": exp}],
        }
        for v, exp in ((STEEP, fired), (RISING, []), (FLAT, []))
    ]
    returncode, out = promtool_test_rules(tmp_path, tests, [{"name": "t", "rules": rules}])
    assert returncode == 0, out
