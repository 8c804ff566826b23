"""The Prometheus rule generator: golden files, canonical sources from the catalog, and the
diagnosis-rule compiler on literal rules (promtool itself runs in tests/integration)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kvscope.cli import main
from kvscope.core.objectives import Objectives, ObjectiveSet
from kvscope.core.signals import load_catalog, parse_catalog
from kvscope.diagnoser.curve.records import curve_file
from kvscope.diagnoser.promql.alerts import PythonOnly, alert_name, compile_rule
from kvscope.diagnoser.promql.build import RUNBOOK_MARK, build_all
from kvscope.diagnoser.promql.rulefiles import SloConfig, build_rule_files, slo_error_ratio
from kvscope.diagnoser.promql.signals import le_regex, source_terms, source_union, wire_names
from kvscope.diagnoser.rulebook.rule import parse_yaml, rule_from_doc

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- golden


def test_generated_rule_files_and_runbooks_are_up_to_date():
    built = build_all()
    for name, text in built.rule_files.items():
        path = ROOT / "rules" / "prometheus" / name
        assert path.exists() and path.read_text() == text, f"{path.name} is stale: run `kvscope rules build`"
    for name, text in built.runbooks.items():
        path = ROOT / "docs" / "runbooks" / name
        assert path.exists() and path.read_text() == text, f"runbook {name} is stale: run `kvscope rules build`"


def test_the_curve_records_file_is_up_to_date():
    """kvscope-curve.yml as `kvscope rules build` writes it (the CLI hands build_all the curve's
    rule groups: promql sits below diagnoser/curve)."""
    name, groups = curve_file(load_catalog())
    text = build_all(curve=(name, groups)).rule_files[name]
    assert (ROOT / "rules" / "prometheus" / name).read_text() == text, f"{name} is stale: run `kvscope rules build`"


def test_no_generated_runbook_outlives_its_rule():
    built = build_all()
    for path in (ROOT / "docs" / "runbooks").glob("*.md"):
        if path.read_text().startswith(RUNBOOK_MARK.split("{")[0]):
            assert path.name in built.runbooks, f"{path.name}: its rule is gone; delete the runbook"


def test_rules_build_check_reports_stale_files_and_writes_nothing(tmp_path, capsys):
    out, books = tmp_path / "prom", tmp_path / "books"
    assert main(["rules", "build", "--out", str(out), "--runbooks", str(books), "--check"]) == 1
    assert not out.exists()
    assert "stale:" in capsys.readouterr().out
    assert main(["rules", "build", "--out", str(out), "--runbooks", str(books)]) == 0
    assert (out / "kvscope-slo.yml").exists()
    assert main(["rules", "build", "--out", str(out), "--runbooks", str(books), "--check"]) == 0


def test_rules_build_rejects_a_target_outside_0_1(tmp_path):
    assert main(["rules", "build", "--out", str(tmp_path), "--slo-target", "99"]) == 3


def test_the_curve_records_interval_is_the_groups_and_each_rules_span(tmp_path, capsys):
    """--curve-interval sets kvscope-curve.yml's group interval and the span its rules read."""
    assert main(["rules", "build", "--out", str(tmp_path), "--runbooks", str(tmp_path), "--curve-interval", "1 m"]) == 3
    assert "--curve-interval must be a duration" in capsys.readouterr().err
    assert main(["rules", "build", "--out", str(tmp_path), "--runbooks", str(tmp_path), "--curve-interval", "2m"]) == 0
    (group,) = yaml.safe_load((tmp_path / "kvscope-curve.yml").read_text())["groups"]
    assert group["interval"] == "2m"
    exprs = [r["expr"] for r in group["rules"]]
    assert "[2m]" in exprs[0] and "[1m]" not in "".join(exprs)
    assert "last_over_time(kvscope:curve_bucket:avg[60s])" in exprs[-2]
    # the restarts are looked for over five intervals (at least RESTART_SPAN_S): a restart's gap
    assert group["rules"][-1]["record"] == "kvscope:curve_restarts:count" and "[600s]" in exprs[-1]


# ---------------------------------------------------------------- canonical sources


def test_wire_names_add_total_to_counters_and_the_ray_spelling():
    assert wire_names("vllm:num_preemptions", "counter") == ("vllm:num_preemptions_total", "vllm_num_preemptions_total")
    assert (
        wire_names("vllm:time_to_first_token_seconds", "histogram", "_bucket")[0]
        == "vllm:time_to_first_token_seconds_bucket"
    )
    assert wire_names("DCGM_FI_DEV_FB_USED", "gauge") == ("DCGM_FI_DEV_FB_USED",)


def test_kv_usage_reads_new_and_old_vllm_names_sglang_and_the_agent_from_the_catalog():
    expr = source_union(load_catalog().signals["engine_kv_cache_usage_ratio"], load_catalog())
    for name in (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
        "llamacpp:kv_cache_usage_ratio",
        "kvscope_engine_kv_cache_usage_ratio",
    ):
        assert name in expr
    # vllm's current name, its old name only where the instance has no current one, sglang, llamacpp, agent
    assert expr.count("\nor\n") == 4
    old = expr.split("\nor\n")[1]
    assert old.startswith("(max by") and "vllm:gpu_cache_usage_perc" in old
    assert "\nunless on (instance)\n(max by" in old and "vllm:kv_cache_usage_perc" in old.split("unless")[1]


def test_a_part_sum_alias_reads_the_histograms_sum_series():
    assert wire_names("sglang:num_retractions", "counter", part="sum") == (
        "sglang:num_retractions_sum",
        "sglang_num_retractions_sum",
    )


def test_worker_labels_become_the_instance_in_promql():
    expr = source_union(load_catalog().signals["engine_requests_running"], load_catalog())
    assert '"instance", "$1", "worker_addr", "(?:[a-z]+://)?([^/]+).*"' in expr


def test_the_pushdowns_folded_reads_keep_the_worker_as_the_instance():
    """Series scraped through sglang-router's /engine_metrics name their worker in worker_addr:
    the pushdown's reads (InlineSignals), also the ones that relabel only the labels the caller
    keeps and the `resets` form, must group by that worker, as the normalizer and the rule files do."""
    from kvscope.diagnoser.promql.signals import InlineSignals

    reader = InlineSignals(load_catalog())
    worker = '"instance", "$1", "worker_addr", "(?:[a-z]+://)?([^/]+).*"'
    for fn, outer in (("rate", "sum"), ("resets", "sum"), ("increase", None)):
        expr = reader.read("engine_preemptions_total", [], fn=fn, rng="1m", by=("instance",), outer=outer)
        assert worker in expr, (fn, outer)


def test_the_terms_a_matcher_on_a_set_label_keeps():
    """raw_reads (one selector per source term read): a term whose constant a matcher rejects is
    left out, one whose constant it accepts is read without that matcher; other terms (and the
    agent's, which carries the label itself) are read with it."""
    from kvscope.diagnoser.promql.signals import InlineSignals

    reader = InlineSignals(load_catalog())
    device = reader.raw_reads("engine_prefix_cache_hits_tokens_total", [("cache_scope", "=~", "device")])
    sglang = [r for r in device if "sglang:" in r]
    assert sglang == ['{__name__=~"sglang:cached_tokens_total|sglang_cached_tokens_total",cache_source=~"device"}']
    assert any(r.startswith("vllm:") or "vllm:prefix" in r for r in device)
    assert all('cache_scope=~"device"' in r for r in device if "sglang:" not in r)
    assert [
        r
        for r in reader.raw_reads("engine_prefix_cache_hits_tokens_total", [("cache_scope", "=~", "all_tiers|none")])
        if "sglang:" in r
    ] == ['{__name__=~"sglang:cached_tokens_total|sglang_cached_tokens_total",cache_source=~"total|"}']
    assert not [
        r
        for r in reader.raw_reads("engine_prefix_cache_hits_tokens_total", [("cache_scope", "=~", "host")])
        if "sglang:" in r
    ]
    assert (
        len(
            [
                r
                for r in reader.raw_reads("engine_prefix_cache_hits_tokens_total", [("cache_scope", "!=", "")])
                if "sglang:" in r
            ]
        )
        == 2
    )
    # `engine` is the term's dialect, never vLLM's own `engine` label (its dp rank)
    vllm = reader.raw_reads("engine_prefix_cache_hits_tokens_total", [("engine", "=~", "vllm")])
    assert vllm[-1] == 'kvscope_engine_prefix_cache_hits_tokens_total{engine=~"vllm"}'
    assert all("engine=" not in r for r in vllm[:-1]) and all("vllm" in r for r in vllm[:-1])
    # a renamed label is matched by its upstream name
    assert all(
        'model_name=~"m"' in r
        for r in reader.raw_reads("engine_prefix_cache_hits_tokens_total", [("model", "=~", "m")])
        if "sglang:" in r
    )
    # a label with two upstream spellings (DCGM's UUID and uuid; pod and pod_name) is matched on
    # the one the canonical label comes from, the later one present: one selector each, each
    # holding the later spellings empty
    util = "gpu_utilization_ratio"
    assert reader.raw_reads(util, [("gpu_uuid", "=~", "GPU-1")])[0] == (
        '(DCGM_FI_DEV_GPU_UTIL{UUID=~"GPU-1",uuid=""}\nor\nDCGM_FI_DEV_GPU_UTIL{uuid=~"GPU-1"})'
    )
    assert reader.raw_reads(util, [("pod", "=~", "p"), ("gpu", "=~", "0")], "last_over_time", "5m")[0] == (
        '(last_over_time(DCGM_FI_DEV_GPU_UTIL{pod=~"p",pod_name="",gpu=~"0"}[5m])'
        '\nor\nlast_over_time(DCGM_FI_DEV_GPU_UTIL{pod_name=~"p",gpu=~"0"}[5m]))'
    )
    # a matcher the empty value passes holds a later spelling present where it decides
    assert reader.raw_reads(util, [("node", "!=", "n1")])[0] == (
        '(DCGM_FI_DEV_GPU_UTIL{Hostname!="n1",hostname=""}\nor\nDCGM_FI_DEV_GPU_UTIL{hostname!="n1",hostname=~".+"})'
    )
    # a router's worker label names the instance of the engine behind it
    routed = reader.raw_reads("engine_prefix_cache_hits_tokens_total", [("instance", "=", "w:8000")])[0]
    assert routed.endswith('worker_addr=~"(?:[a-z]+://)?(?:w:8000)(?:/.*)?"})')
    assert 'instance="w:8000",worker_addr=""}' in routed


def test_the_compiler_leaves_out_an_aggregation_the_read_already_did():
    """`sum by (instance, le)` of a read summed by (instance, le) returns it unchanged: the
    compiler writes it once. A read it cannot see aggregated (the recordings) keeps it."""
    from kvscope.diagnoser.promql.series import SeriesCompiler
    from kvscope.diagnoser.promql.signals import InlineSignals, NamedSignals
    from kvscope.diagnoser.rulebook.rule import Rule, parse_yaml

    rule = Rule(
        "t",
        "",
        parse_yaml("""
by: [instance]
series:
  p99: {quantile: 0.99, histogram: request_ttft_seconds}
  waiting: {gauge: engine_requests_waiting, agg: sum}
"""),
    )
    inline = SeriesCompiler(rule, InlineSignals(load_catalog())).expr("p99")
    assert inline.count("sum by (instance, le)") == inline.count("\nor\n") + 1
    assert inline.startswith("histogram_quantile(0.99, (sum by (instance, le)")
    recorded = SeriesCompiler(rule, NamedSignals()).expr("p99")
    assert recorded.startswith(
        "histogram_quantile(0.99, sum by (instance, le) (rate(kvscope:request_ttft_seconds_bucket"
    )
    gauge = SeriesCompiler(rule, InlineSignals(load_catalog())).expr("waiting")
    assert gauge.startswith("sum by (instance) ((max by (instance, engine")


def test_a_catalog_rename_changes_the_generated_rules():
    text = """
dialects:
  vllm: {prefixes: ["vllm:"], detect: ["vllm:"], labels: {model_name: model, engine: dp_rank}}
signals:
  engine_kv_cache_usage_ratio:
    kind: gauge
    unit: ratio
    aliases:
      - {engine: vllm, name: "vllm:kv_cache_usage_fraction"}
"""
    catalog = parse_catalog(text)
    expr = source_union(catalog.signals["engine_kv_cache_usage_ratio"], catalog)
    assert "vllm:kv_cache_usage_fraction" in expr
    assert "label_replace(" in expr and '"dp_rank", "$1", "engine"' in expr


def test_histograms_that_need_rescaled_buckets_are_left_to_the_agent():
    catalog = load_catalog()
    terms, skipped = source_terms(catalog.signals["kv_transfer_seconds"], catalog, "_bucket")
    assert [a.name for a in skipped] == ["sglang:kv_transfer_latency_ms"]
    assert all("kv_transfer_latency_ms" not in n for t in terms for n in t.names)


def test_values_read_from_labels_are_left_to_the_agent():
    """vLLM's lora_requests_info value is its update time: PromQL cannot count the adapter names
    in its labels (nor read max_lora), so both LoRA signals come only from the agent's re-export."""
    catalog = load_catalog()
    for name in ("engine_lora_in_flight_adapters", "engine_lora_max_adapters"):
        terms, skipped = source_terms(catalog.signals[name], catalog)
        assert "vllm:lora_requests_info" in [a.name for a in skipped]
        assert all("lora_requests_info" not in n for t in terms for n in t.names)


def test_le_regex_matches_both_spellings_of_a_bound():
    assert le_regex(1.0) == "1|1\\\\.0"
    assert le_regex(0.25) == "0\\\\.25"


def test_slo_error_ratio_guards_against_no_traffic():
    expr = slo_error_ratio(SloConfig(ObjectiveSet(Objectives(ttft=2.5))), "5m")
    assert 'le="+Inf"' in expr and "> 0)" in expr and "2\\\\.5" in expr


def test_slo_bound_between_buckets_is_flagged_in_the_file():
    assert SloConfig(ObjectiveSet(Objectives(ttft=2.5))).unaligned_engines() == ["sglang"]
    text = build_rule_files(slo=SloConfig(ObjectiveSet(Objectives(ttft=0.3))))["kvscope-slo.yml"]
    assert "WARNING: 0.3s is not a default TTFT bucket bound of vllm, sglang" in text


# ---------------------------------------------------------------- diagnosis-rule compiler


def _rule(text: str):
    return rule_from_doc(parse_yaml(text, "t.yaml"), "t.yaml")


KV_RULE = """
id: kv_full
title: KV full
severity: warning
by: [instance]
params:
  kv_full: {default: 0.95}
  for: {default: 2m}
series:
  kv: {gauge: engine_kv_cache_usage_ratio, agg: max}
  preempt: {rate: engine_preemptions_total, range: 1m}
when:
  all:
    - {series: kv, op: ">=", value: $kv_full}
    - {series: preempt, op: ">", value: 0}
  for: $for
critical_when:
  all: [{series: preempt, op: ">", value: 1}]
levers: [{id: vllm.max_num_seqs, direction: decrease}]
"""


def test_alert_names_are_camel_case_with_prefix():
    assert alert_name("kv_cache_pressure") == "LlmKvCachePressure"


def test_compile_carries_threshold_for_and_severity_and_adds_a_critical_twin():
    warning, critical = compile_rule(_rule(KV_RULE))
    assert warning["alert"] == critical["alert"] == "LlmKvFull"
    assert "max by (instance) (kvscope:engine_kv_cache_usage_ratio)) >= 0.95" in warning["expr"]
    assert "rate(kvscope:engine_preemptions_total[1m1ms])" in warning["expr"]
    assert warning["for"] == "2m"
    assert (warning["labels"]["severity"], critical["labels"]["severity"]) == ("warning", "critical")
    assert critical["expr"].startswith(warning["expr"]) and "> 1" in critical["expr"]
    assert "runbook_url" not in warning["annotations"]  # no UI address given: no link (runbooklinks.py)


def test_compile_uses_case_parameter_overrides():
    (warning, _) = compile_rule(_rule(KV_RULE).with_params({"kv_full": 0.8}))
    assert ">= 0.8" in warning["expr"]


def test_a_coarser_series_is_joined_on_its_own_labels():
    rule = _rule("""
id: cold
by: [instance, model]
series:
  hit: {gauge: engine_kv_cache_usage_ratio}
  med: {aggregate: median, of: hit, by: [model]}
when:
  all: [{series: hit, op: "<", than: med, times: 0.3}]
""")
    (alert,) = compile_rule(rule)
    assert "< on (model) group_left() (0.3 * (quantile by (model) (0.5," in alert["expr"]


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ("cascade: {stages: []}", "cascade"),
        ("params: {bench: {default: null}}", "bench"),
    ],
)
def test_rules_without_a_promql_form_say_why(extra, reason):
    rule = _rule(KV_RULE.replace("params:\n  kv_full", "params_old:\n  kv_full") + extra + "\n")
    out = compile_rule(rule)
    assert isinstance(out, PythonOnly) and reason in out.reason


def test_facts_become_an_info_gauge_join():
    rule = _rule("""
id: caching_off
by: [instance]
facts: [{fact: enable_prefix_caching, op: "==", value: "False"}]
series:
  prompt: {rate: engine_prompt_tokens_total, range: 2m}
when:
  all: [{series: prompt, op: ">=", value: 1}]
""")
    (alert,) = compile_rule(rule)
    assert "and on (instance)" in alert["expr"]
    assert 'enable_prefix_caching="False"' in alert["expr"]
    assert "vllm:cache_config_info" in alert["expr"] and "kvscope_engine_info" in alert["expr"]


def test_canonical_layer_records_what_the_rules_read_or_everything():
    used = build_rule_files(canonical="used")
    every = build_rule_files(canonical="all")["kvscope-canonical.yml"]
    others = "\n".join(text for name, text in used.items() if name != "kvscope-canonical.yml")
    recorded = re.findall(r"record: (kvscope:\w+)", used["kvscope-canonical.yml"])
    assert "kvscope:request_ttft_seconds_bucket" in recorded  # SLO and p99 read it
    assert all(name in others for name in recorded)
    assert len(recorded) < len(re.findall(r"record: ", every))
    for name in load_catalog().series_names():
        assert f"record: kvscope:{name}\n" in every
    with pytest.raises(ValueError, match="used"):
        build_rule_files(canonical="some")


def test_schema_forms_map_to_their_promql():
    rule = _rule("""
id: forms
by: [instance, dp_rank]
require_labels: [dp_rank]
series:
  gpus: {count: gpu_utilization_ratio, distinct: [instance, gpu]}
  restarts: {resets: engine_prompt_tokens_total, range: 10m}
  sg: {gauge: engine_kv_cache_usage_ratio, agg: max}
  vl: {gauge: engine_requests_running, agg: max}
  kv: {coalesce: [sg, vl]}
when:
  all:
    - {series: kv, op: ">", baseline: {of: vl, agg: max, range: 20m}, times: 2}
    - {series: restarts, op: ">=", value: 1}
    - {series: gpus, op: ">=", value: 1}
""")
    (alert,) = compile_rule(rule)
    expr = alert["expr"]
    assert 'kvscope:engine_kv_cache_usage_ratio{dp_rank!=""}' in expr  # require_labels
    assert "count by (instance, dp_rank, gpu)" in expr  # distinct
    assert "resets(kvscope:engine_prompt_tokens_total" in expr and "[10m1ms]" in expr
    assert "\nor\n" in expr  # coalesce
    assert "max_over_time((max by (instance, dp_rank) (kvscope:engine_requests_running" in expr
    assert "[20m1ms:15s] offset 10m)" in expr  # the engine's default offset


def test_each_quantile_the_rules_read_is_recorded_once_with_its_grouping():
    """kvscope-quantiles.yml: one record per histogram, quantile, range and grouping, its
    expression the node's own."""
    from kvscope.diagnoser.promql.quantiles import quantile_rules
    from kvscope.diagnoser.promql.series import SeriesCompiler
    from kvscope.diagnoser.promql.signals import InlineSignals
    from kvscope.diagnoser.rulebook.rule import read_rules

    rules = quantile_rules(read_rules(), load_catalog())
    keys = [(r["record"], r["labels"]["quantile"], r["labels"]["kvscope_by"]) for r in rules]
    assert len(keys) == len(set(keys)) and keys == sorted(keys)
    assert ("kvscope:request_ttft_seconds:quantile_2m", "0.99", "instance,model") in keys  # ttft_knee's p99
    knee = next(r for r in read_rules() if r.id == "ttft_knee")
    p99 = next(
        r
        for r in rules
        if (r["record"], r["labels"]["quantile"], r["labels"]["kvscope_by"])
        == ("kvscope:request_ttft_seconds:quantile_2m", "0.99", "instance,model")
    )
    assert p99["expr"] == SeriesCompiler(knee, InlineSignals(load_catalog())).expr("p99")


def test_alerts_name_their_levers_by_title_and_a_section_a_user_can_open():
    """Issue 39: alerts carried `levers_md: R8`, a row of a file users do not have, and lever ids in
    the description. The `levers` annotation names each lever by title (and direction) with its
    section of docs/levers.md, and every such section exists."""
    import yaml

    root = Path(__file__).resolve().parents[2]
    alerts = [
        r
        for g in yaml.safe_load((root / "rules" / "prometheus" / "kvscope-alerts.yml").read_text())["groups"]
        for r in g["rules"]
    ]
    headings = re.findall(r"^## (\S+)$", (root / "docs" / "levers.md").read_text(), re.M)
    anchors = {h.replace(".", "") for h in headings}
    assert alerts and not [a["alert"] for a in alerts if "levers_md" in a["labels"]]
    assert not [a["alert"] for a in alerts if "Levers: " in a["annotations"]["description"]]
    named = [a for a in alerts if "levers" in a["annotations"]]
    assert len(named) == len(alerts)  # every diagnosis rule names levers
    for a in named:
        for part in a["annotations"]["levers"].split("; "):
            title, _, link = part.rpartition(": docs/levers.md#")
            assert title and link in anchors, part
    hung = next(a for a in alerts if a["alert"] == "LlmEngineHung")
    assert hung["annotations"]["levers"] == (
        "Restart the hung engine, after capturing why it hung: docs/levers.md#opsrestart_hung_engine"
    )


_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_LOOKUP = re.compile(r"last_over_time\([^()\[]*\[[^\]]*\]")
_RANGE = re.compile(r"\[([0-9][0-9a-z]*)(?::[0-9a-z]+)?\]")


def _unedged_ranges(text: str) -> list[str]:
    """The ranges in generated rule text that Prometheus 2.x and 3.x read differently on grid-aligned
    samples: every `[r]` and `[r:step]` not one millisecond past the rule's range, other than a
    plain selector's `last_over_time` (a presence lookup: the same latest sample on both)."""
    text = _LOOKUP.sub("", _QUOTED.sub('""', text))
    return [m.group(1) for m in _RANGE.finditer(text) if not m.group(1).endswith("1ms")]


def test_every_range_in_the_rule_files_reads_the_same_samples_on_prometheus_2_and_3():
    """Prometheus 3 ranges are left-open, (t - r, t]; 2.x reads [t - r, t]. On grid-aligned samples
    (a group's records read by its alerts, subquery steps, promtool tests) a rule written `[1m]`
    would read one sample less on 3.x; the generated rules write `[1m1ms]` (promql/ranges.py). The
    curve's records are the exception: their windows tile the time axis, one per evaluation, and
    read engine scrapes, never samples on the group's grid (diagnoser/curve/records.py)."""
    assert _unedged_ranges("rate(x[1m]) + (y)[10m:15s] + last_over_time(z[30s])") == ["1m", "10m"]
    for path in sorted((ROOT / "rules" / "prometheus").glob("*.yml")):
        if path.name == "kvscope-curve.yml":
            continue
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                assert not _unedged_ranges(rule["expr"]), (path.name, rule.get("record") or rule.get("alert"))
