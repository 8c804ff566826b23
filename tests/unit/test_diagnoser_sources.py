"""Source parsing without I/O: Prometheus matrices (native and kvscope_* series), agent answers."""

from __future__ import annotations

import re

import numpy as np

from kvscope.core.signals import load_catalog
from kvscope.diagnoser.evaluate.frame import merge_facts
from kvscope.diagnoser.sources.agent import parse_facts_answer, parse_samples_answer
from kvscope.diagnoser.sources.prometheus import frame_from_matrix, selector_for, wire_pattern


def test_selector_asks_for_every_upstream_alias_and_the_kvscope_reexport():
    sel = selector_for({"engine_kv_cache_usage_ratio", "request_ttft_seconds_bucket"}, load_catalog())
    for name in (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
        "vllm_kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds",
        "kvscope_engine_kv_cache_usage_ratio",
    ):
        assert name.replace(":", "\\:") in sel or name in sel, name
    assert "vllm:cache_config_info" in selector_for({"engine_requests_waiting"}, load_catalog())


def test_wire_pattern_asks_for_a_histograms_series_as_named():
    """A mean reads `_sum` and `_count`: its buckets (ten to twenty series each) are not fetched;
    counters still match every part a dialect may map (a histogram's `_sum` read as a counter)."""
    catalog = load_catalog()
    mean = wire_pattern({"request_ttft_seconds_sum", "request_ttft_seconds_count"}, catalog)
    assert re.fullmatch(mean, "vllm:time_to_first_token_seconds_count")
    assert re.fullmatch(mean, "vllm_time_to_first_token_seconds_sum")  # Ray's spelling
    assert not re.fullmatch(mean, "vllm:time_to_first_token_seconds_bucket")
    assert re.fullmatch(
        wire_pattern({"request_ttft_seconds_bucket"}, catalog), "vllm:time_to_first_token_seconds_bucket"
    )
    assert re.fullmatch(wire_pattern({"engine_preemptions_total"}, catalog), "vllm:num_preemptions_total")
    assert re.fullmatch(wire_pattern({"engine_preemptions_total"}, catalog), "kvscope_engine_preemptions_total")


def test_frame_from_matrix_normalizes_native_series_per_target():
    result = [
        {
            "metric": {
                "__name__": "vllm:kv_cache_usage_perc",
                "job": "vllm",
                "instance": "r0",
                "engine": "0",
                "model_name": "m",
            },
            "values": [[100, "0.5"], [115, "0.97"]],
        },
        {
            "metric": {
                "__name__": "vllm:num_preemptions_total",
                "job": "vllm",
                "instance": "r0",
                "engine": "0",
                "model_name": "m",
            },
            "values": [[100, "3"], [115, "7"]],
        },
        {
            "metric": {
                "__name__": "vllm:cache_config_info",
                "job": "vllm",
                "instance": "r0",
                "engine": "0",
                "model_name": "m",
                "enable_prefix_caching": "False",
            },
            "values": [[100, "1"]],
        },
    ]
    frame = frame_from_matrix(result, 100, 115, 15, catalog=load_catalog())
    assert frame.blocks["engine_kv_cache_usage_ratio"].values.tolist() == [[0.5, 0.97]]
    pre = [dict(lab) for lab in frame.blocks["engine_preemptions_total"].labels]
    assert [(p["instance"], p["model"], p["engine"]) for p in pre] == [("r0", "m", "vllm")]
    assert frame.facts["r0"]["enable_prefix_caching"] == "False"


def test_frame_from_matrix_reads_an_old_name_only_where_the_new_one_is_missing_and_drops_sentinels():
    """The full fetch applies the catalog's version rules as the normalizer does (issue 18):
    vLLM 0.10 exports gpu_ and kv_ cache usage side by side (never added: the new name wins, the
    old one fills a step the new one lacks), and a DCGM blank code is no value."""

    def series(name: str, values: list, job: str = "vllm", **labels: str) -> dict:
        return {"metric": {"__name__": name, "job": job, "instance": "r0", **labels}, "values": values}

    result = [
        series("vllm:kv_cache_usage_perc", [[100, "0.25"]], model_name="m"),
        series("vllm:gpu_cache_usage_perc", [[100, "0.5"], [115, "0.6"]], model_name="m"),
        series("DCGM_FI_DEV_MEMORY_TEMP", [[100, "2147483632"], [115, "41"]], job="dcgm", gpu="0"),
    ]
    for r in result[2:]:
        r["metric"]["instance"] = "n0"
    frame = frame_from_matrix(result, 100, 115, 15, catalog=load_catalog(), lookback_s=1.0)
    assert frame.blocks["engine_kv_cache_usage_ratio"].values.tolist() == [[0.25, 0.6]]
    temp = next(b for n, b in frame.blocks.items() if n.startswith("gpu_memory_temp"))
    assert np.isnan(temp.values[0][0]) and temp.values[0][1] == 41


def test_frame_from_matrix_keeps_a_series_whose_newest_sample_is_a_blank_code():
    """A DCGM field that reads the blank code at the window's end still had values before it: the
    code is no value at its own steps only, not a reason to drop the series."""
    result = [
        {
            "metric": {"__name__": "DCGM_FI_DEV_MEMORY_TEMP", "job": "dcgm", "instance": "n0", "gpu": "0"},
            "values": [[100, "41"], [115, "2147483632"]],
        },
    ]
    frame = frame_from_matrix(result, 100, 115, 15, catalog=load_catalog(), lookback_s=1.0)
    temp = next(b for n, b in frame.blocks.items() if n.startswith("gpu_memory_temp"))
    assert temp.values[0][0] == 41 and np.isnan(temp.values[0][1])


def test_frame_from_matrix_maps_each_target_by_its_own_dialect():
    """Targets of different engines in one answer: each is detected from its own series' names."""

    def gauge(name: str, instance: str, value: str) -> dict:
        return {"metric": {"__name__": name, "job": "j", "instance": instance}, "values": [[100, value]]}

    result = [
        gauge("vllm:num_requests_waiting", "v0", "3"),
        gauge("sglang:num_queue_reqs", "s0", "4"),
        gauge("vllm:num_requests_waiting", "v1", "5"),
    ]
    frame = frame_from_matrix(result, 100, 100, 15, catalog=load_catalog())
    block = frame.blocks["engine_requests_waiting"]
    got = {
        (dict(lab)["instance"], dict(lab)["engine"]): row[0]
        for lab, row in zip(block.labels, block.values, strict=True)
    }
    assert got == {("v0", "vllm"): 3.0, ("s0", "sglang"): 4.0, ("v1", "vllm"): 5.0}


def test_frame_from_matrix_sums_collapsing_series_and_carries_points_within_the_lookback():
    def ttft(tp: str, values: list) -> dict:
        return {
            "metric": {
                "__name__": "vllm:num_requests_waiting",
                "job": "v",
                "instance": "r0",
                "model_name": "m",
                "tp": tp,
            },
            "values": values,
        }

    result = [
        ttft("0", [[0, "1"], [15, "2"]]),
        ttft("1", [[15, "5"]]),
        {
            "metric": {"__name__": "vllm:num_preemptions_total", "job": "v", "instance": "r0"},
            "values": [[0, "3"], [15, "NaN"], [600, "4"]],
        },
    ]
    frame = frame_from_matrix(result, 0, 600, 15, catalog=load_catalog())
    waiting = frame.blocks["engine_requests_waiting"].values[0]
    assert waiting[:2].tolist() == [1.0, 5.0]  # gauges collapsing: max (5 vs 2)
    pre = frame.blocks["engine_preemptions_total"].values[0]
    assert pre[0] == 3.0 and pre[19] == 3.0 and np.isnan(pre[20]) and pre[40] == 4.0  # carried < 300 s


def test_frame_from_matrix_takes_kvscope_series_as_canonical_and_restores_exported_labels():
    result = [
        {
            "metric": {
                "__name__": "kvscope_engine_requests_waiting",
                "job": "kvscope-agent",
                "instance": "node1:9464",
                "exported_instance": "r0",
                "exported_job": "vllm",
            },
            "values": [[100, "4"]],
        }
    ]
    frame = frame_from_matrix(result, 100, 100, 15, catalog=load_catalog())
    block = frame.blocks["engine_requests_waiting"]
    assert [(dict(lab)["instance"], dict(lab)["job"]) for lab in block.labels] == [("r0", "vllm")]
    assert block.values.tolist() == [[4.0]]


def test_agent_answers_parse_into_samples_and_merged_facts():
    data = {
        "series": [
            {"name": "engine_requests_waiting", "labels": {"instance": "r0"}, "points": [[1.0, 2.0], [2.0, 3.0]]}
        ]
    }
    assert [(s.timestamp, s.value) for s in parse_samples_answer(data)] == [(1.0, 2.0), (2.0, 3.0)]
    facts = parse_facts_answer({"r0": {"engine": "vllm", "facts": {"0": {"enable_prefix_caching": "True"}}}})
    assert facts == {"r0": {"enable_prefix_caching": "True"}}


def test_agent_facts_merge_ranks_as_every_source_does():
    # DP ranks that disagree: rank 0 wins, as in a recording or Prometheus (before: the last rank)
    ranks = {"0": {"max_num_seqs": "256"}, "1": {"max_num_seqs": "128"}}
    assert parse_facts_answer({"r0": {"facts": ranks}}) == merge_facts({"r0": ranks}) == {"r0": {"max_num_seqs": "256"}}


def test_frame_from_matrix_reads_a_series_held_natively_and_as_the_agents_reexport_once():
    """A TSDB scraping both the engine and the agent holds the engine's counter twice (native and
    `kvscope_*`); the frame reads it once (before: the two were added, doubling every rate)."""
    native = {"__name__": "vllm:num_preemptions_total", "job": "vllm", "instance": "r0", "model_name": "m"}
    reexport = {
        "__name__": "kvscope_engine_preemptions_total",
        "job": "kvscope-agent",
        "instance": "node1:9464",
        "exported_instance": "r0",
        "exported_job": "vllm",
        "engine": "vllm",
        "model": "m",
    }
    only_agent = dict(reexport, __name__="kvscope_engine_requests_waiting")
    result = [{"metric": m, "values": [[100, "7"]]} for m in (native, reexport, only_agent)]
    frame = frame_from_matrix(result, 100, 100, 15, catalog=load_catalog())
    assert frame.blocks["engine_preemptions_total"].values.tolist() == [[7.0]]
    assert frame.blocks["engine_requests_waiting"].values.tolist() == [[7.0]]


class _IndexOnly:
    """The index answers of a TSDB holding vLLM engines (`model_name`) and a Dynamo frontend
    (`model`): label -> {instance -> values}. What the pool lookups ask is recorded."""

    def __init__(self) -> None:
        self.by_label = {
            "model_name": {"e0": ["llama"], "e1": ["llama"], "e2": ["qwen"], "both": ["llama", "qwen"]},
            "model": {"fe": ["llama"]},
        }
        self.asked: list[tuple[str, list[str]]] = []

    def label_values(self, label, matchers, start, end):
        self.asked.append((label, list(matchers)))
        if label == "instance":  # matchers: {<model label>="<model>"}
            out = set()
            for m in matchers:
                key, value = re.fullmatch(r'\{(\w+)="(.*)"\}', m).groups()
                out |= {i for i, vs in self.by_label.get(key, {}).items() if value in vs}
            return sorted(out)
        (instance,) = re.fullmatch(r'\{instance="(.*)"\}', matchers[0]).groups()
        return self.by_label.get(label, {}).get(instance, [])


def test_a_pools_instances_are_found_under_every_dialects_model_label():
    """The webhook reads what changed for the alert's pool only: the model its instance served
    (one, else unknown) and that model's instances under any dialect's model label."""
    from kvscope.diagnoser.sources.prometheus import model_instances, model_of

    client, catalog = _IndexOnly(), load_catalog()
    assert model_of(client, catalog, "e2", 0.0, 60.0) == "qwen"
    assert model_of(client, catalog, "both", 0.0, 60.0) is None  # served two models: every pool is read
    assert model_of(client, catalog, "nowhere", 0.0, 60.0) is None
    assert model_instances(client, catalog, "llama", 0.0, 60.0) == ["both", "e0", "e1", "fe"]
    asked = {m for label, ms in client.asked if label == "instance" for m in ms}
    assert {'{model_name="llama"}', '{model="llama"}'} <= asked
    assert model_instances(client, catalog, 'a"b', 0.0, 60.0) == []  # quoted, not a broken selector
    assert '{model_name="a\\"b"}' in client.asked[-1][1]
