"""Source parsing without I/O: Prometheus matrices (native and kvscope_* series), agent answers."""

from __future__ import annotations

from kvscope.agent.signals import load_catalog
from kvscope.diagnoser.sources.agent import parse_facts_answer, parse_samples_answer
from kvscope.diagnoser.sources.prometheus import native_names, parse_matrix, selector_for


def test_selector_asks_for_every_upstream_alias_and_the_kvscope_reexport():
    sel = selector_for({"engine_kv_cache_usage_ratio", "request_ttft_seconds_bucket"}, load_catalog())
    for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
                 "vllm_kv_cache_usage_perc", "vllm:time_to_first_token_seconds",
                 "kvscope_engine_kv_cache_usage_ratio"):
        assert name.replace(":", "\\:") in sel or name in sel, name
    assert "vllm:cache_config_info" in native_names({"engine_requests_waiting"}, load_catalog())


def test_parse_matrix_normalizes_native_series_per_target_and_step():
    result = [
        {"metric": {"__name__": "vllm:kv_cache_usage_perc", "job": "vllm", "instance": "r0",
                    "engine": "0", "model_name": "m"}, "values": [[100, "0.5"], [115, "0.97"]]},
        {"metric": {"__name__": "vllm:num_preemptions_total", "job": "vllm", "instance": "r0",
                    "engine": "0", "model_name": "m"}, "values": [[100, "3"], [115, "7"]]},
        {"metric": {"__name__": "vllm:cache_config_info", "job": "vllm", "instance": "r0", "engine": "0",
                    "model_name": "m", "enable_prefix_caching": "False"}, "values": [[100, "1"]]},
    ]
    samples, facts = parse_matrix(result, load_catalog())
    kv = sorted((s.timestamp, s.value) for s in samples if s.name == "engine_kv_cache_usage_ratio")
    assert kv == [(100.0, 0.5), (115.0, 0.97)]
    pre = [s for s in samples if s.name == "engine_preemptions_total"]
    assert {s.label("instance") for s in pre} == {"r0"} and {s.label("model") for s in pre} == {"m"}
    assert facts["r0"]["enable_prefix_caching"] == "False"


def test_parse_matrix_takes_kvscope_series_as_canonical_and_restores_exported_labels():
    result = [{"metric": {"__name__": "kvscope_engine_requests_waiting", "job": "kvscope-agent",
                          "instance": "node1:9464", "exported_instance": "r0", "exported_job": "vllm"},
               "values": [[100, "4"]]}]
    samples, _ = parse_matrix(result, load_catalog())
    assert [(s.name, s.label("instance"), s.label("job"), s.value) for s in samples] == [
        ("engine_requests_waiting", "r0", "vllm", 4.0)]


def test_agent_answers_parse_into_samples_and_merged_facts():
    data = {"series": [{"name": "engine_requests_waiting", "labels": {"instance": "r0"},
                        "points": [[1.0, 2.0], [2.0, 3.0]]}]}
    assert [(s.timestamp, s.value) for s in parse_samples_answer(data)] == [(1.0, 2.0), (2.0, 3.0)]
    facts = parse_facts_answer({"r0": {"engine": "vllm", "facts": {"0": {"enable_prefix_caching": "True"}}}})
    assert facts == {"r0": {"enable_prefix_caching": "True"}}
