"""A rule judges only a mechanism that runs (issue 26): engines export zeros for features that are
off (every SGLang server without speculation says `spec_accept_rate 0`), and a zero from a
feature that does not run is no evidence about it.

Each engine body in tests/fixtures/scrapes (vLLM 0.10.2, 0.11.0, 0.32; SGLang 0.4.6, 0.5.5, 0.5.8,
0.5.23; llama.cpp) is a healthy server with speculation, KV tiers and P/D off. Replayed as a
static recording (its values repeated at every scrape, as a server serving the body would be
recorded: 10 s at 2 s, and 15 min at 15 s), it must give no finding at all, and every rule
whose mechanism is off must say so in the skipped list (mechanism off or not evaluable), which
`kvscope diagnose -v` prints. docs/rules.md "Is the mechanism on?" has the audit table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvscope.agent.normalize.dialect import detect_engine, normalize
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.core.signals import load_catalog
from kvscope.diagnoser.evaluate.evaluator import diagnose
from kvscope.diagnoser.evaluate.frame import frame_from_samples, merge_facts
from kvscope.diagnoser.findings import Diagnosis, not_evaluable

SCRAPES = Path(__file__).resolve().parents[1] / "fixtures" / "scrapes"
BODIES = [
    "vllm-0.10.2-rendered.txt",
    "vllm-0.11.0-rendered.txt",
    "vllm-0.32.0-cpu-after-load.txt",
    "sglang-0.4.6.post5-rendered.txt",
    "sglang-0.5.5-rendered.txt",
    "sglang-0.5.8-rendered.txt",
    "sglang-0.5.8-tp2-radix-rendered.txt",
    "sglang-0.5.23-tp2-radix-rendered.txt",
    "llamacpp-11434-idle.txt",
    "llamacpp-11434-under-load.txt",
]
OFF_IN_EVERY_BODY = {
    "spec_decode_ineffective": "speculative decoding",
    "offload_stalls_interactive": "KV tier below the device",
    "remote_kv_slower_than_recompute": "external KV tier",
    "kv_transfer_slowing": "P/D KV transfer",
    "pd_decode_eviction": "P/D decode role",
    "pd_short_prompts": "P/D prefill role",
}


def static_diagnosis(body: str, every: float, span: float) -> Diagnosis:
    catalog = load_catalog()
    expo = parse_exposition((SCRAPES / body).read_text(encoding="utf-8"))
    norm = normalize(expo, detect_engine(expo, catalog), {"job": "engines", "instance": "e0"}, 0.0, catalog)
    t0 = 1.7e9
    samples = [s._replace(timestamp=t0 + k * every) for k in range(int(span / every) + 1) for s in norm.samples]
    frame = frame_from_samples(samples, t0, t0 + span, every)
    frame.facts = merge_facts({"e0": norm.facts})
    return diagnose(frame, workers=1)


@pytest.mark.parametrize("every,span", [(2.0, 10.0), (15.0, 900.0)])
@pytest.mark.parametrize("body", BODIES)
def test_healthy_body_is_quiet_and_says_which_mechanisms_are_off(body, every, span):
    d = static_diagnosis(body, every, span)
    assert [(f.rule_id, f.summary) for f in d.findings] == []
    why = {s.rule_id: s.reason for s in d.skipped}
    for rule_id, mechanism in OFF_IN_EVERY_BODY.items():
        assert rule_id in why, f"{rule_id} ({mechanism} off in {body}) is not in the skipped list"
    assert set(not_evaluable(d.skipped)) <= set(d.skipped)


@pytest.mark.parametrize("body", ["sglang-0.5.5-rendered.txt", "sglang-0.5.8-rendered.txt"])
def test_sglang_without_speculation_reads_as_mechanism_off(body):
    """SGLang exports spec_accept_rate 0 and spec_accept_length 0 without speculation: the rule
    that judges speculation says the mechanism is off, and no likely cause is named."""
    d = static_diagnosis(body, 2.0, 10.0)
    assert d.likely_cause is None
    reason = next(s.reason for s in d.skipped if s.rule_id == "spec_decode_ineffective")
    assert reason.startswith("mechanism off: speculative decoding")
    assert not any(s.rule_id == "spec_decode_ineffective" for s in not_evaluable(d.skipped))


def test_prefix_caching_setting_unknown_is_not_evaluable():
    """P1's prefix_caching_disabled reads vLLM's cache_config_info; SGLang does not export the
    setting, so the rule cannot look (named, not silently healthy)."""
    d = static_diagnosis("sglang-0.5.8-rendered.txt", 2.0, 10.0)
    blind = {s.rule_id: s.reason for s in not_evaluable(d.skipped)}
    assert blind["prefix_caching_disabled"].startswith("mechanism unknown: engine fact(s) enable_prefix_caching")
    d = static_diagnosis("vllm-0.11.0-rendered.txt", 2.0, 10.0)
    assert "prefix_caching_disabled" not in {s.rule_id for s in d.skipped}


def test_mfu_estimate_at_zero_is_off_and_no_lora_is_unknown():
    """The real vLLM 0.32 capture registers the MFU counters at 0 (no --enable-mfu-metrics): R5 says
    the mechanism is off; no body runs LoRA, so R7 and L13 cannot look (not a healthy verdict)."""
    d = static_diagnosis("vllm-0.32.0-cpu-after-load.txt", 15.0, 900.0)
    why = {s.rule_id: s.reason for s in d.skipped}
    assert why["mfu_low"].startswith("mechanism off: the engines' MFU estimate")
    blind = {s.rule_id: s.reason for s in not_evaluable(d.skipped)}
    for rule_id in ("lora_adapters_thrashing", "tenant_ttft_spike"):
        assert rule_id in blind, why.get(rule_id)
