"""Dialects of the layers where fleets route and cache (issue 27): llm-d EPP and the GIE EPP,
NVIDIA Dynamo's frontend and KV router, SMG, TGI, LMCache, vLLM's offload tier and P/D families,
SGLang HiCache and P/D queues, DCGM's NVLink / row-remap / power-limit fields and 1.x names.

Every body is rendered from the layer's own source at a tag (tests/fixtures/scrapes/*-rendered.txt,
each header names the files and the tag; LMCache's by its own PrometheusLogger class). The numbers
asserted were written from the bodies' stated values before the dialects existed."""

import pytest

from kvscope.agent.normalize.dialect import detect_engine, normalize
from kvscope.agent.scrape.exposition import parse_exposition

TARGET = {"instance": "t", "job": "j"}


def canon(load_fixture, *names):
    expo = parse_exposition("".join(load_fixture(f"scrapes/{n}") for n in names))
    return normalize(expo, detect_engine(expo), TARGET, 100.0)


def val(norm, name, **labels):
    """Sum of the canonical samples of `name` whose labels include `labels`."""
    hits = [
        s.value for s in norm.samples if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items())
    ]
    assert hits, f"no {name} {labels}"
    return sum(hits)


def by(norm, name, label):
    return {dict(s.labels).get(label): s.value for s in norm.samples if s.name == name}


@pytest.mark.parametrize(
    "body, engine",
    [
        ("llm-d-router-0.10.0-rendered.txt", "epp"),
        ("gie-epp-1.0.0-rendered.txt", "epp"),
        ("dynamo-1.6.1-frontend-rendered.txt", "dynamo"),
        ("smg-1.9.0-rendered.txt", "sglang_router"),
        ("tgi-3.3.7-rendered.txt", "tgi"),
        ("lmcache-0.5.6-rendered.txt", "lmcache"),
        ("lmcache-0.5.5-rendered.txt", "lmcache"),
        ("dcgm-exporter-1.x-compat-rendered.txt", "dcgm"),
    ],
)
def test_every_layer_is_read_none_is_an_unknown_engine(load_fixture, body, engine):
    norm = canon(load_fixture, body)
    assert norm.engine == engine and norm.samples


def test_llm_d_epp_flows_prefix_match_and_event_feed(load_fixture):
    n = canon(load_fixture, "llm-d-router-0.10.0-rendered.txt")
    # the deprecated twins (inference_objective_*, kvcache_index_*) are fallbacks: never added
    assert val(n, "gateway_requests_total") == 100
    assert by(n, "gateway_requests_total", "tenant") == {"tenant-a": 60, "tenant-b": 40}
    assert val(n, "router_cached_tokens_sum", tenant="tenant-a") == 60 * 1024
    assert val(n, "router_cached_tokens_sum", tenant="tenant-b") == 0
    assert val(n, "router_prompt_tokens_sum") == 60 * 2048 + 40 * 512
    assert val(n, "router_prefix_match_ratio_count") == 100
    assert val(n, "router_prefix_match_ratio_sum") == pytest.approx(30.0)
    assert val(n, "router_prefix_match_ratio_bucket", le="0") == 40
    assert val(n, "gateway_requests_running") == 7
    assert by(n, "gateway_requests_waiting", "tenant") == {"tenant-b": 4}
    assert by(n, "router_kv_events_total", "status") == {"received": 800}
    assert by(n, "router_kv_event_errors_total", "reason") == {"recv": 2}
    assert val(n, "router_kv_event_reconnections_total") == 1
    assert val(n, "router_kv_events_waiting") == 3
    assert val(n, "router_kv_index_blocks_added_total") == 800
    assert val(n, "router_kv_index_blocks_removed_total") == 120
    assert "engine_requests_running" not in {s.name for s in n.samples}  # a gateway is not an engine


def test_gie_1_0_names_are_read(load_fixture):
    n = canon(load_fixture, "gie-epp-1.0.0-rendered.txt")
    assert val(n, "gateway_requests_total") == 100
    assert val(n, "gateway_requests_running") == 7
    assert val(n, "router_prompt_tokens_count") == 100
    assert val(n, "router_prefix_match_ratio_sum") == pytest.approx(30.0)


def test_dynamo_frontend_and_kv_router(load_fixture):
    n = canon(load_fixture, "dynamo-1.6.1-frontend-rendered.txt")
    assert val(n, "gateway_requests_total") == 100
    assert val(n, "gateway_requests_running") == 7
    assert val(n, "gateway_requests_waiting", role="decode") == 3
    assert val(n, "router_cached_tokens_sum") == 60 * 1024
    assert val(n, "router_prefix_match_ratio_sum") == pytest.approx(30.0)
    assert by(n, "router_kv_events_total", "status") == {"ok": 780, "block_not_found": 20}


def test_dynamo_kv_router_selected_vs_best_cached_prefix_real_capture(load_fixture):
    """Real ai-dynamo 1.6.1 frontends over 2 CPU mockers (docs/testbed-gateways.md): in kv mode
    every request went to the best worker (6048 = 6048, 0 passed over); round-robin has no pair."""
    kv = canon(load_fixture, "dynamo-1.6.1-frontend-kv-mocker-loaded.txt")
    assert val(kv, "router_selected_cached_prefix_tokens_total", model="tiny-llama") == 6048
    assert val(kv, "router_best_cached_prefix_tokens_total", model="tiny-llama") == 6048
    assert val(kv, "router_non_max_overlap_selections_total", role="prefill") == 0
    assert val(kv, "router_prefix_match_ratio_count") == 12
    rr = canon(load_fixture, "dynamo-1.6.1-frontend-round_robin-mocker-loaded.txt")
    names = {s.name for s in rr.samples}
    assert not names & {"router_selected_cached_prefix_tokens_total", "router_best_cached_prefix_tokens_total"}


def test_smg_round_robin_declares_its_load_only_policy_real_capture(load_fixture):
    """Real SMG 1.13.0 round_robin in front of 2 vLLM engines: no branch or match families, only
    the policy label of its decisions and its pool size say how it routed (R1's policy reading)."""
    n = canon(load_fixture, "smg-1.13.0-round_robin-2x-vllm-0.32-loaded.txt")
    assert by(n, "router_decisions_total", "policy") == {"round_robin": 16}
    assert val(n, "router_workers", model="tiny-llama") == 2
    assert not {s.name for s in n.samples} & {"router_policy_branch_total", "router_prefix_match_ratio_count"}


def test_smg_policy_branches_say_where_locality_was_given_away(load_fixture):
    n = canon(load_fixture, "smg-1.9.0-rendered.txt")
    assert by(n, "router_policy_branch_total", "branch") == {
        "ring_hit": 30,
        "load_balance_walk": 50,
        "fallback_least_load": 20,
    }
    assert {dict(s.labels)["policy"] for s in n.samples if s.name == "router_policy_branch_total"} == {"prefix_hash"}
    assert by(n, "router_decisions_total", "policy") == {"prefix_hash": 100}
    assert val(n, "gateway_requests_total") == 100
    assert val(n, "gateway_requests_running") == 7 and val(n, "gateway_requests_waiting") == 4
    assert by(n, "router_kv_event_errors_total", "reason") == {"panic": 2}


def test_tgi_reads_as_an_engine(load_fixture):
    n = canon(load_fixture, "tgi-3.3.7-rendered.txt")
    assert val(n, "engine_requests_waiting") == 3 and val(n, "engine_requests_running") == 4
    assert val(n, "engine_kv_capacity_tokens") == 16000
    assert val(n, "engine_requests_finished_total") == 10
    assert val(n, "engine_prompt_tokens_total") == 10000  # _sum of the input-length histogram
    assert val(n, "engine_generation_tokens_total") == 2000
    assert val(n, "request_e2e_seconds_count") == 10 and val(n, "request_e2e_seconds_sum") == 20
    assert val(n, "request_queue_seconds_sum") == pytest.approx(0.5)
    assert val(n, "request_tpot_seconds_sum") == pytest.approx(0.2)
    assert val(n, "request_prompt_tokens_bucket", le="1024") == 10  # 1024 = 4096/100 * 25
    assert val(n, "request_prompt_tokens_bucket", le="983.04") == 0


@pytest.mark.parametrize("version", ["0.5.6", "0.5.5"])
def test_lmcache_alone_and_inside_vllm(load_fixture, version):
    alone = canon(load_fixture, f"lmcache-{version}-rendered.txt")
    assert val(alone, "kv_tier_lookup_tokens_total", tier="lmcache") == 10000
    assert val(alone, "kv_tier_hit_tokens_total", tier="lmcache") == 6000
    assert val(alone, "kv_tier_stored_tokens_total", tier="lmcache") == 4000
    assert val(alone, "kv_tier_loaded_tokens_total", tier="lmcache") == 6000
    assert val(alone, "kv_tier_evictions_total", tier="local_cpu") == 4
    assert val(alone, "kv_tier_failures_total", tier="local_cpu", op="evict") == 1
    assert val(alone, "kv_tier_used_bytes", tier="local_cpu") == 2**30
    assert val(alone, "kv_tier_lookup_seconds_count", tier="lmcache") == 10
    assert dict(next(s for s in alone.samples if s.name == "kv_tier_used_bytes").labels)["model"] == "Qwen/Qwen3-8B"
    # LMCache runs inside vLLM: one payload; vLLM wins detection and LMCache's series still map
    both = canon(load_fixture, "vllm-0.32.0-cpu-after-load.txt", f"lmcache-{version}-rendered.txt")
    assert both.engine == "vllm"
    assert val(both, "kv_tier_hit_tokens_total", tier="lmcache") == 6000
    assert val(both, "engine_requests_running") >= 0


def test_vllm_033_offload_tier_and_pd_families(load_fixture):
    n = canon(load_fixture, "vllm-0.33.0-tiers-pd-rendered.txt")
    assert val(n, "kv_tier_pinned_ratio", tier="cpu") == pytest.approx(0.9)
    assert val(n, "kv_tier_failures_total", tier="cpu", op="allocate") == 5
    assert val(n, "kv_tier_lookup_seconds_count", tier="cpu") == 50
    assert by(n, "engine_pd_requests_waiting", "queue") == {
        "waiting_to_start": 3,
        "in_progress": 2,
        "completed_waiting": 1,
    }
    assert val(n, "kv_transfer_expired_requests_total") == 2
    assert val(n, "kv_transfer_notification_failures_total") == 1
    assert val(n, "kv_transfer_failures_total") == 0  # exported 0 stays 0; absent stays absent


def test_sglang_hicache_storage_and_pd_queues(load_fixture):
    n = canon(load_fixture, "sglang-0.5.23-hicache-pd-rendered.txt")
    # storage and radix counters are reported once per TP rank with the same value: not doubled
    assert val(n, "kv_tier_stored_tokens_total", tier="host") == 2000
    assert val(n, "kv_tier_stored_tokens_total", tier="storage") == 1500
    assert val(n, "kv_tier_loaded_tokens_total", tier="storage") == 800
    assert val(n, "kv_tier_hit_tokens_total", tier="storage") == 900
    assert val(n, "kv_tier_dropped_tokens_total", tier="host", reason="host_pressure") == 64
    assert val(n, "kv_tier_dropped_tokens_total", tier="storage") == 100
    assert val(n, "engine_kv_offload_loaded_tokens_total") == 1000
    assert by(n, "engine_pd_requests_waiting", "queue") == {
        "prefill_bootstrap": 1,
        "prefill_inflight": 2,
        "decode_prealloc": 0,
        "decode_transfer": 0,
    }


def test_dcgm_nvlink_row_remap_power_limit_and_1x_names(load_fixture):
    n = canon(load_fixture, "dcgm-exporter-4.5.3-custom-csv-rendered.txt")
    assert val(n, "gpu_power_limit_watts") == 500  # the enforced limit wins over the management limit
    assert val(n, "gpu_nvlink_bandwidth_total") == 123456789
    assert by(n, "gpu_remapped_rows_total", "kind") == {"correctable": 2, "uncorrectable": 1}
    assert val(n, "gpu_row_remap_failure_code") == 0
    old = canon(load_fixture, "dcgm-exporter-1.x-compat-rendered.txt")
    assert val(old, "gpu_utilization_ratio") == pytest.approx(0.87)
    assert val(old, "gpu_memory_used_bytes") == 70000 * 1048576
    assert val(old, "gpu_energy_joules_total") == 5000
    assert dict(next(s for s in old.samples if s.name == "gpu_power_watts").labels)["gpu_uuid"].startswith("GPU-")


# ------------------------------------------------ SGLang hit counts across versions (issue 26)
def test_sglang_hit_series_say_which_hits_they_hold(load_fixture):
    """<= 0.5.8 has no cache_source label: its cached tokens are every tier's (device only while no
    HiCache tier runs); 0.5.23 with HiCache splits device | host | storage_<backend>."""
    for version in ("0.5.5", "0.5.8"):
        old = canon(load_fixture, f"sglang-{version}-rendered.txt")
        assert by(old, "engine_prefix_cache_hits_tokens_total", "cache_scope") == {"all_tiers": 4000}
    new = canon(load_fixture, "sglang-0.5.23-hicache-pd-rendered.txt")
    assert by(new, "engine_prefix_cache_hits_tokens_total", "cache_scope") == {"device": 3000}
    # like with like across the upgrade: all-tier hits are the sum over sources in every version
    assert val(new, "engine_prompt_tokens_cached_total") == 4500
    assert val(canon(load_fixture, "sglang-0.5.8-rendered.txt"), "engine_prompt_tokens_cached_total") == 4000


def test_an_alias_of_the_wrong_kind_is_reported_not_dropped_silently(load_fixture):
    """SGLang 0.5.8 exports kv_transfer_latency_ms and kv_transfer_total_mb as gauges; the aliases read
    the histograms later versions export. Each such series is counted as kind_mismatch in the target's
    health (kvscope_samples_dropped_total{reason="kind_mismatch"})."""
    norm = canon(load_fixture, "sglang-0.5.8-rendered.txt")
    assert norm.dropped["kind_mismatch"] == 2
    assert not any(s.name.startswith("kv_transfer_") for s in norm.samples)
    assert canon(load_fixture, "sglang-0.5.23-hicache-pd-rendered.txt").dropped["kind_mismatch"] == 0


def test_sglang_preempted_prompt_tokens_the_recompute_tax(load_fixture):
    n = canon(load_fixture, "sglang-0.5.8-rendered.txt")
    assert by(n, "engine_preempted_prompt_tokens_total", "model") == {"tiny": 0}  # exported 0, present
    assert not [
        s
        for s in canon(load_fixture, "vllm-0.11.0-rendered.txt").samples
        if s.name == "engine_preempted_prompt_tokens_total"
    ]  # vLLM: absent, never 0


def test_smg_1_13_real_capture_cache_aware(load_fixture):
    """The real SMG 1.13.0 binary (PyPI smg) routing 40 requests with 4 shared prefixes (cache_aware)."""
    n = canon(load_fixture, "smg-1.13.0-cache_aware-loaded.txt")
    assert n.engine == "sglang_router"
    assert by(n, "router_policy_branch_total", "branch") == {"tree_match": 36, "expected_wait_fallback": 4}
    assert {dict(s.labels)["policy"] for s in n.samples if s.name == "router_policy_branch_total"} == {"cache_aware"}
    assert val(n, "router_prefix_match_ratio_count") == 40
    assert val(n, "router_prefix_match_ratio_sum") == pytest.approx(35.971, abs=0.001)
    assert val(n, "router_prefix_match_ratio_bucket", le="0.9") == 4
    assert val(n, "gateway_requests_total") == 40
    assert by(n, "router_decisions_total", "policy") == {"cache_aware": 40}


def test_smg_1_13_kv_event_feed_health(load_fixture):
    n = canon(load_fixture, "smg-1.13.0-kv-events-rendered.txt")
    assert by(n, "router_kv_events_total", "status") == {"applied": 1300, "stale": 3}
    # missed batches, the unrecovered gap (not the replayed ones), the resync; no panics
    assert by(n, "router_kv_event_errors_total", "reason") == {
        "missed_batches": 12,
        "unrecovered_cleared": 1,
        "publisher_restart": 1,
        "panic": 0,
    }


def test_catalog_rejects_a_set_label_the_signal_does_not_keep():
    from kvscope.core.signals import CatalogError, parse_catalog

    text = """
dialects:
  x: {prefixes: ["x:"], detect: ["x:"], labels: {}}
signals:
  router_policy_branch_total:
    kind: counter
    unit: count
    labels: [branch]
    aliases:
      - {engine: x, name: "x:branch", set: {policy: p}}
"""
    with pytest.raises(CatalogError, match="sets a label the signal does not keep"):
        parse_catalog(text)
    assert parse_catalog(text.replace("labels: [branch]", "labels: [branch, policy]"))


def test_vllm_mfu_estimates_and_lora_adapters_in_flight(load_fixture):
    n = canon(load_fixture, "vllm-0.33.0-mfu-lora-rendered.txt")
    assert val(n, "engine_estimated_flops_per_gpu_total", dp_rank="0") == 4e15
    assert val(n, "engine_estimated_read_bytes_per_gpu_total") == 2e13
    assert val(n, "engine_estimated_write_bytes_per_gpu_total") == 1e12
    assert val(n, "engine_lora_max_adapters") == 2
    # the newest series (largest value: its update time) names alice, bob, carol; the older ones
    # (none, alice alone) stay in the registry and must not be read, nor summed
    assert val(n, "engine_lora_in_flight_adapters") == 3


def test_sglang_mfu_estimates(load_fixture):
    from pathlib import Path

    body = Path(__file__).parents[1] / "outside" / "bodies" / "sglang-0.5.23-eagle-rendered.txt"
    expo = parse_exposition(body.read_text())
    n = normalize(expo, detect_engine(expo), TARGET, 100.0)
    assert val(n, "engine_estimated_flops_per_gpu_total") == 3500.0
    assert val(n, "engine_estimated_read_bytes_per_gpu_total") == 2500000.0
