"""Older and other engine versions read correctly (issue 18), on bodies rendered by the engines'
own metric classes (tests/fixtures/engine_names/README.md says how each was made).

Every case is checked with and without the memo the engine collector keeps per target
(`MappingMemo`: how each series mapped), including a second scrape whose values moved, because
they must give the same answer.
"""

from __future__ import annotations

import pytest

from kvscope.agent.normalize.dialect import MappingMemo, normalize
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.core.signals import load_catalog

CATALOG = load_catalog()
LABELS = {"job": "engines", "instance": "engine-a:8000"}


def both_paths(text: str, engine: str, second: str | None = None) -> list:
    """The result without a memo, then with one target's memo for a first and a second scrape
    (`second` defaults to the same text: every series a memo hit)."""
    whole = normalize(parse_exposition(text), engine, LABELS, 100.0, CATALOG)
    memo = MappingMemo()

    def memoized(body: str, timestamp: float):
        return normalize(parse_exposition(body), engine, LABELS, timestamp, CATALOG, memo)

    first = memoized(text, 100.0)
    later_text = second if second is not None else text
    later = memoized(later_text, 200.0)
    again = normalize(parse_exposition(later_text), engine, LABELS, 200.0, CATALOG)
    assert sorted((s.name, s.labels, s.value) for s in first.samples) == sorted(
        (s.name, s.labels, s.value) for s in whole.samples
    )
    assert sorted((s.name, s.labels, s.value) for s in later.samples) == sorted(
        (s.name, s.labels, s.value) for s in again.samples
    )
    assert first.dropped == whole.dropped and later.dropped == again.dropped
    return [whole, first, later]


def values(norm, name: str, **labels: str) -> list[float]:
    return [s.value for s in norm.samples if s.name == name and all(s.label(k) == v for k, v in labels.items())]


def total(norm, name: str, **labels: str) -> float | None:
    found = values(norm, name, **labels)
    return sum(found) if found else None


# ------------------------------------------------------------------ vLLM <= 0.11: old and new names
@pytest.mark.parametrize("fixture", ["vllm-0.10.2-rendered.txt", "vllm-0.11.0-rendered.txt"])
def test_vllm_old_and_new_itl_histograms_count_each_token_gap_once(load_fixture, fixture):
    """vLLM 0.10/0.11 observe every gap into both time_per_output_token_seconds and
    inter_token_latency_seconds (100 observations each): the new name wins, never the sum."""
    text = load_fixture(f"scrapes/{fixture}")
    assert "vllm:time_per_output_token_seconds_count" in text
    for norm in both_paths(text, "vllm"):
        assert total(norm, "request_itl_seconds_count") == 100.0
        assert total(norm, "request_itl_seconds_sum") == pytest.approx(2.0)
        assert values(norm, "request_itl_seconds_bucket", le="0.025") == [100.0]


@pytest.mark.parametrize("comments", [True, False])
def test_vllm_0_10_prefix_cache_and_kv_usage_are_not_double_counted(load_fixture, comments):
    """0.10.2 exports gpu_prefix_cache_* and gpu_cache_usage_perc beside their new names (without
    HELP lines the whole payload is one block: the precedence is resolved inside it)."""
    text = load_fixture("scrapes/vllm-0.10.2-rendered.txt")
    if not comments:
        text = "".join(ln + "\n" for ln in text.splitlines() if not ln.startswith("#"))
    assert "vllm:gpu_prefix_cache_queries_total" in text and "vllm:prefix_cache_queries_total" in text
    for norm in both_paths(text, "vllm"):
        assert total(norm, "engine_prefix_cache_queries_tokens_total") == 1000.0
        assert total(norm, "engine_prefix_cache_hits_tokens_total") == 400.0
        assert values(norm, "engine_kv_cache_usage_ratio") == [0.25]


def test_an_old_name_alone_still_reads():
    """A build that exports only the old names (vLLM V0, < 0.9) keeps its signals."""
    text = (
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        'vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 7\n'
        'vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 3\n'
    )
    for norm in both_paths(text, "vllm"):
        assert values(norm, "engine_kv_cache_usage_ratio") == [0.5]
        assert values(norm, "engine_prefix_cache_hits_tokens_total") == [7.0]
        assert values(norm, "request_itl_seconds_count") == [3.0]


def test_the_new_name_wins_even_when_the_old_one_is_larger_in_another_family():
    text = (
        "# HELP vllm:kv_cache_usage_perc new name\n# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        "# HELP vllm:gpu_cache_usage_perc old name\n# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
    )
    second = text.replace("} 0.25", "} 0.3").replace("} 0.5", "} 0.6")
    whole, first, later = both_paths(text, "vllm", second)
    assert values(first, "engine_kv_cache_usage_ratio") == [0.25]
    assert values(later, "engine_kv_cache_usage_ratio") == [0.3]


@pytest.mark.parametrize("fixture", ["vllm-0.10.2-rendered.txt", "vllm-0.11.0-rendered.txt"])
def test_vllm_kv_capacity_comes_from_blocks_times_block_size_without_kv_cache_size_tokens(load_fixture, fixture):
    """cache_config_info of 0.10/0.11 has num_gpu_blocks="1000" and block_size="16" but no
    kv_cache_size_tokens: the capacity is 16000 tokens and nothing is dropped."""
    text = load_fixture(f"scrapes/{fixture}")
    assert "kv_cache_size_tokens" not in text
    for norm in both_paths(text, "vllm"):
        assert values(norm, "engine_kv_capacity_tokens") == [16000.0]
        assert not norm.dropped


def test_vllm_kv_capacity_prefers_kv_cache_size_tokens_when_present(load_fixture):
    text = load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt")  # 128 blocks x 32 = 4096 = the label
    body = text.replace('kv_cache_size_tokens="4096"', 'kv_cache_size_tokens="4000"')
    for norm in both_paths(body, "vllm"):
        assert values(norm, "engine_kv_capacity_tokens") == [4000.0]


# ------------------------------------------------------------------ SGLang: TP ranks and old names
def test_sglang_evictions_repeated_by_every_tp_rank_count_once(load_fixture):
    """SGLang 0.5.23's radix cache reports evicted tokens per TP rank (tp_rank label), each rank
    the same 28240; rendered through prometheus_client's multiprocess collector as SGLang does."""
    text = load_fixture("scrapes/sglang-0.5.23-tp2-radix-rendered.txt")
    assert text.count("sglang:evicted_tokens_total{") == 2
    for norm in both_paths(text, "sglang"):
        assert values(norm, "engine_kv_evicted_tokens_total") == [28240.0]


@pytest.mark.parametrize(
    "fixture", ["sglang-0.4.6.post5-rendered.txt", "sglang-0.5.5-rendered.txt", "sglang-0.5.8-rendered.txt"]
)
def test_sglang_cached_tokens_without_cache_source_are_prefix_hits(load_fixture, fixture):
    """Up to 0.5.8 sglang:cached_tokens_total has no cache_source label: 10 requests x 400."""
    text = load_fixture(f"scrapes/{fixture}")
    assert 'sglang:cached_tokens_total{model_name="tiny"} 4000.0' in text
    for norm in both_paths(text, "sglang"):
        assert values(norm, "engine_prefix_cache_hits_tokens_total") == [4000.0]
        assert values(norm, "engine_prefix_cache_queries_tokens_total") == [10000.0]


@pytest.mark.parametrize("fixture", ["sglang-0.4.6.post5-rendered.txt", "sglang-0.5.8-rendered.txt"])
def test_sglang_cache_hit_rate_gauge_maps(load_fixture, fixture):
    for norm in both_paths(load_fixture(f"scrapes/{fixture}"), "sglang"):
        assert values(norm, "engine_prefix_cache_hit_ratio") == [0.4]


def test_sglang_0_5_5_retractions_give_a_preemption_signal(load_fixture):
    """0.5.5 has only the per-request retraction histogram (3 retractions over 10 requests)."""
    text = load_fixture("scrapes/sglang-0.5.5-rendered.txt")
    assert "sglang:num_retracted_requests_total" not in text
    for norm in both_paths(text, "sglang"):
        assert values(norm, "engine_preemptions_total") == [3.0]
        assert values(norm, "request_preemptions_count") == [10.0]
        assert values(norm, "request_preemptions_sum") == [3.0]


def test_sglang_0_5_8_preemptions_come_from_the_counter_once(load_fixture):
    """0.5.8 has the scheduler's counter (3) and the tokenizer's histogram (sum 3): read the
    counter, never both."""
    for norm in both_paths(load_fixture("scrapes/sglang-0.5.8-rendered.txt"), "sglang"):
        assert values(norm, "engine_preemptions_total") == [3.0]


# ------------------------------------------------------------------ DCGM "no value" sentinels
DCGM_BLANKS = ["9223372036854775792", "2147483632", "140737488355328.000000", "140737488355329.0"]


@pytest.mark.parametrize("blank", DCGM_BLANKS)
def test_dcgm_blank_values_are_dropped_and_counted(load_fixture, blank):
    """DCGM's blank/not-found/not-supported values (DCGM_INT64_BLANK, DCGM_INT32_BLANK,
    DCGM_FP64_BLANK and +1..3) mean "no value": never a 9.2e18 degree memory temperature."""
    text = load_fixture("scrapes/dcgm-exporter-4.5.3-constructed-2gpu.txt")
    line = next(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_MEMORY_TEMP{") and 'gpu="1"' in ln)
    blanked = text.replace(line, line.rsplit(" ", 1)[0] + " " + blank)
    whole, first, later = both_paths(text, "dcgm", blanked)  # the second scrape blanks one field
    assert len(values(first, "gpu_memory_temperature_celsius")) == 2
    assert values(later, "gpu_memory_temperature_celsius", gpu="1") == []
    assert len(values(later, "gpu_memory_temperature_celsius")) == 1
    assert later.dropped["sentinel"] == 1


# ------------------------------------------------------------------ the catalog fields themselves
def test_catalog_rejects_a_fallback_with_nothing_to_prefer_and_a_part_on_a_gauge():
    from kvscope.core.signals import CatalogError, parse_catalog

    head = 'dialects:\n  x: {prefixes: ["x:"], detect: ["x:"], labels: {}}\nsignals:\n'
    with pytest.raises(CatalogError, match="fallback but x has no other alias"):
        parse_catalog(
            head + '  a_total:\n    kind: counter\n    aliases:\n      - {engine: x, name: "x:old", fallback: true}\n'
        )
    with pytest.raises(CatalogError, match="part reads a histogram's _sum as a counter"):
        parse_catalog(head + '  a_ratio:\n    kind: gauge\n    aliases:\n      - {engine: x, name: "x:h", part: sum}\n')
    with pytest.raises(CatalogError, match="sentinels must be numbers"):
        parse_catalog('dialects:\n  x: {prefixes: ["x:"], detect: ["x:"], sentinels: [blank]}\n')


def test_renamed_alerts_pair_each_current_name_with_its_fallback_names():
    """A rename alert pairs an engine's current name with each of its fallback (old) names; aliases
    of one engine that are no fallback are parts of one count (llama.cpp) and raise none."""
    from kvscope.diagnoser.promql.rulefiles import RENAMED_SIGNALS, renamed_alerts

    exprs = [r["expr"] for r in renamed_alerts(CATALOG)]
    olds = {a.name for n in RENAMED_SIGNALS for a in CATALOG.signals[n].aliases if a.fallback}
    assert olds and len(exprs) == len(olds) and all(any(old in e for e in exprs) for old in olds)
    assert not any("llamacpp:" in e for e in exprs)


def test_sentinels_are_dropped_only_for_the_dialect_that_declares_them():
    """2147483632 is a DCGM blank, but a plain number for vLLM."""
    text = 'vllm:prompt_tokens_total{engine="0",model_name="m"} 2147483632\n'
    for norm in both_paths(text, "vllm"):
        assert values(norm, "engine_prompt_tokens_total") == [2147483632.0]
