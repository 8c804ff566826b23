from kvscope.agent.normalize.dialect import detect_engine, fold_name, normalize
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.core.signals import load_catalog

TARGET = {"instance": "127.0.0.1:8000", "job": "engines"}


def canon(text, engine=None):
    expo = parse_exposition(text)
    return normalize(expo, engine or detect_engine(expo), TARGET, 100.0)


def one(norm, name, **labels):
    hits = [s for s in norm.samples if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, f"{name} {labels}: {hits}"
    return hits[0]


def test_real_vllm_capture_maps_to_canonical_signals(load_fixture):
    norm = canon(load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt"))
    assert norm.engine == "vllm"
    assert one(norm, "engine_preemptions_total").value == 47.0
    hits = one(norm, "engine_prefix_cache_hits_tokens_total")
    assert hits.value == 1152.0
    assert dict(hits.labels) == {
        "instance": "127.0.0.1:8000",
        "job": "engines",
        "engine": "vllm",
        "model": "tiny-llama",
        "dp_rank": "0",
    }
    assert one(norm, "engine_kv_capacity_tokens").value == 4096.0
    assert one(norm, "engine_requests_finished_total", reason="length").value == 245.0
    assert one(norm, "request_ttft_seconds_bucket", le="+Inf").value > 0
    assert norm.facts["0"]["enable_prefix_caching"] == "True"
    assert norm.facts["0"]["block_size"] == "32"
    assert not any(s.name.endswith("_created") for s in norm.samples)


def test_absent_signal_is_absent_not_zero(load_fixture):
    norm = canon(load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt"))
    names = {s.name for s in norm.samples}
    assert "engine_spec_drafts_total" not in names  # no speculative decoding configured
    assert "kv_transfer_seconds_count" not in names  # no P/D connector


def test_old_and_new_vllm_names_give_the_same_signal():
    old = canon(
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        'vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 7\n'
    )
    new = canon(
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 7\n'
    )
    assert sorted(old.samples) == sorted(new.samples)


def test_ray_underscore_names_fold_back():
    assert fold_name("vllm_num_requests_waiting", load_catalog()) == "vllm:num_requests_waiting"
    norm = canon('vllm_num_requests_waiting{engine="1",model_name="m"} 3\n')
    assert one(norm, "engine_requests_waiting", dp_rank="1").value == 3.0


def test_sglang_maps_names_labels_and_units():
    text = (
        "# TYPE sglang:token_usage gauge\n"
        'sglang:token_usage{model_name="q",engine_type="decode",tp_rank="0",pp_rank="0",dp_rank="2"} 0.93\n'
        'sglang_num_queue_reqs{model_name="q",engine_type="decode",tp_rank="0",pp_rank="0",dp_rank="2"} 4\n'
        'sglang:cached_tokens_total{model_name="q",engine_type="unified",cache_source="device",tenant="acme"} 100\n'
        'sglang:cached_tokens_total{model_name="q",engine_type="unified",cache_source="host",tenant="acme"} 50\n'
        'sglang:kv_transfer_latency_ms_bucket{model_name="q",engine_type="prefill",tp_rank="0",le="5"} 3\n'
        'sglang:kv_transfer_latency_ms_bucket{model_name="q",engine_type="prefill",tp_rank="0",le="+Inf"} 4\n'
        'sglang:kv_transfer_latency_ms_sum{model_name="q",engine_type="prefill",tp_rank="0"} 12\n'
        'sglang:kv_transfer_latency_ms_count{model_name="q",engine_type="prefill",tp_rank="0"} 4\n'
    )
    norm = canon(text)
    assert norm.engine == "sglang"
    kv = one(norm, "engine_kv_cache_usage_ratio")
    assert kv.value == 0.93 and dict(kv.labels)["role"] == "decode" and dict(kv.labels)["dp_rank"] == "2"
    assert one(norm, "engine_requests_waiting").value == 4.0
    assert one(norm, "engine_prefix_cache_hits_tokens_total", tenant="acme").value == 100.0
    assert one(norm, "engine_prompt_tokens_cached_total", source="host").value == 50.0
    assert one(norm, "kv_transfer_seconds_bucket", le="0.005").value == 3.0
    assert one(norm, "kv_transfer_seconds_sum").value == 0.012
    assert one(norm, "kv_transfer_seconds_count").value == 4.0


def test_dcgm_units_and_labels_are_normalized():
    text = (
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",modelName="NVIDIA H100",Hostname="n1",pod="vllm-0",namespace="llm",container="vllm"} 87\n'
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",hostname="n1"} 1024\n'
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
        'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-1"} 5000\n'
    )
    norm = canon(text)
    assert norm.engine == "dcgm"
    util = one(norm, "gpu_utilization_ratio")
    assert util.value == 0.87
    assert dict(util.labels)["pod"] == "vllm-0" and dict(util.labels)["node"] == "n1"
    assert dict(util.labels)["gpu_uuid"] == "GPU-1"
    assert one(norm, "gpu_memory_used_bytes").value == 1024 * 1048576
    assert one(norm, "gpu_energy_joules_total").value == 5.0


def test_series_that_collapse_are_summed_for_counters_and_maxed_for_gauges():
    text = (
        'sglang:prompt_tokens_total{model_name="q",engine_type="unified",is_streaming="true"} 10\n'
        'sglang:prompt_tokens_total{model_name="q",engine_type="unified",is_streaming="false"} 5\n'
        'sglang:num_queue_reqs{model_name="q",engine_type="unified",tp_rank="0"} 2\n'
        'sglang:num_queue_reqs{model_name="q",engine_type="unified",tp_rank="1"} 3\n'
    )
    norm = canon(text)
    assert one(norm, "engine_prompt_tokens_total").value == 15.0
    assert one(norm, "engine_requests_waiting").value == 3.0


def test_an_alias_marked_collapse_max_keeps_one_copy_of_a_count_every_rank_repeats():
    """sglang:load_back_tokens_total: each TP rank reports the same count (and hybrid models add a
    series per pool), so the ranks collapse by max; load_back_bytes is a per-rank shard: summed.
    Both paths (first scrape, then the memoized plan) must agree."""
    from kvscope.agent.normalize.dialect import MappingMemo

    text = "".join(
        f'sglang:load_back_tokens_total{{cache_type="HiRadixCache",pool="{pool}",tp_rank="{r}",pp_rank="0"}} {v}\n'
        for r in range(4)
        for pool, v in (("kv", 640), ("swa", 512))
    )
    text += "".join(
        f'sglang:load_back_bytes_total{{cache_type="HiRadixCache",tp_rank="{r}",pp_rank="0"}} 2000\n' for r in range(4)
    )
    expo = parse_exposition(text)
    memo = MappingMemo()
    for ts in (100.0, 101.0):
        norm = normalize(expo, "sglang", TARGET, ts, load_catalog(), memo)
        assert one(norm, "engine_kv_offload_loaded_tokens_total").value == 640.0
        assert one(norm, "engine_kv_offload_load_bytes_total").value == 8000.0


def test_catalog_rejects_an_unknown_collapse_mode():
    from importlib import resources

    import pytest

    from kvscope.core.signals import CatalogError, parse_catalog

    text = resources.files("kvscope.core").joinpath("catalog.yaml").read_text()
    assert parse_catalog(text).signals["engine_kv_offload_loaded_tokens_total"].aliases[0].collapse == "max"
    bad = text.replace(
        'name: "sglang:load_back_tokens", collapse: max', 'name: "sglang:load_back_tokens", collapse: sum'
    )
    assert bad != text
    with pytest.raises(CatalogError, match="collapse must be 'max'"):
        parse_catalog(bad)


def test_nan_and_inf_samples_are_dropped_with_a_reason():
    norm = canon(
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} +Inf\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
    )
    assert [s.name for s in norm.samples] == ["engine_requests_running"]
    assert norm.dropped["non_finite"] == 2


def test_unknown_engine_maps_nothing():
    norm = canon("node_load1 0.5\nfoo_total 3\n")
    assert norm.engine is None and norm.samples == [] and norm.unmapped == 2


def test_catalog_signal_names_follow_the_naming_convention():
    catalog = load_catalog()
    units = (
        "_ratio",
        "_seconds",
        "_bytes",
        "_tokens",
        "_total",
        "_watts",
        "_celsius",
        "_hertz",
        "_per_second",
        "_running",
        "_waiting",
        "_reason",
        "_code",
        "_preemptions",
        "_workers",
        "_adapters",
        "_up",  # 1/0 as Prometheus' own `up`: kvscope's /health probe of an engine
    )
    for name, sig in catalog.signals.items():
        assert name.endswith(units), name
        assert sig.help, f"{name} has no help text"


def test_mapping_memo_gives_the_same_result_scrape_after_scrape(load_fixture):
    """The per-target memo of how each upstream series maps (the engine collector keeps one per
    target) changes nothing: values move, bad values and bad `le` come and go, labels change."""
    import random

    from kvscope.agent.normalize.dialect import MappingMemo

    catalog = load_catalog()
    lines = (
        load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt")
        + load_fixture("scrapes/dcgm-exporter-4.5.3-constructed-2gpu.txt")
    ).splitlines()
    rng = random.Random(3)
    memos = {"vllm": MappingMemo(), "dcgm": MappingMemo()}
    for i in range(8):
        out = []
        for ln in lines:
            if ln and not ln.startswith("#") and rng.random() < 0.3:
                key, value = ln.rsplit(" ", 1)
                ln = f"{key} {rng.choice(['NaN', '+Inf', '-7', str(float(value) * 3)])}"
                if "le=" in key and rng.random() < 0.2:
                    ln = ln.replace('le="', 'le="x', 1)  # a bad le, sometimes
            out.append(ln)
        expo = parse_exposition("\n".join(out) + "\n")
        target = TARGET if i < 5 else {**TARGET, "node": "n1"}  # target labels change: memo restarts
        for engine in ("vllm", "dcgm"):
            got = normalize(expo, engine, target, 100.0 + i, catalog, memos[engine])
            want = normalize(expo, engine, target, 100.0 + i, catalog)
            assert sorted(got.samples) == sorted(want.samples)
            assert got.dropped == want.dropped and got.facts == want.facts and got.unmapped == want.unmapped
    assert sum(want.dropped.values()) > 0, want.dropped


def test_catalog_buckets_are_increasing_and_only_on_histograms():
    from importlib import resources

    import pytest

    from kvscope.core.signals import CatalogError, parse_catalog

    text = resources.files("kvscope.core").joinpath("catalog.yaml").read_text()
    assert parse_catalog(text).buckets("request_ttft_seconds", "sglang")[:2] == (0.1, 0.2)
    assert parse_catalog(text).buckets("request_itl_seconds", "vllm") == ()
    with pytest.raises(CatalogError, match="buckets must increase"):
        parse_catalog(text.replace("buckets: [0.1, 0.2, 0.4,", "buckets: [0.2, 0.1, 0.4,"))
    gauge = text.replace('name: "vllm:num_requests_running"', 'name: "vllm:num_requests_running", buckets: [1]')
    assert gauge != text
    with pytest.raises(CatalogError, match="buckets are for histograms"):
        parse_catalog(gauge)
