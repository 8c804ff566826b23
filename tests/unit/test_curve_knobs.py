"""The KV-cache settings vLLM exports in cache_config_info, read as gauges placed in time, and the
curve's lever follow-up on them.

Provenance: the cache_config_info lines of real vLLM scrapes (tests/fixtures/scrapes/: vLLM 0.32.0
on CPU, whose capture reads block_size 32, cache_dtype auto, enable_prefix_caching True,
gpu_memory_utilization 0.92; vLLM 0.10.2 and 0.11.0, whose cache_config_info renders
enable_prefix_caching "None", the V1 default not yet resolved when the info gauge is written).
vLLM's CacheDType literal: auto, float16 (older), bfloat16, int8, fp8, fp8_e4m3, fp8_e5m2, fp8_inc,
fp8_ds_mla. Expected values written from those before running.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from kvscope.agent.normalize.dialect import normalize
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.core.signals import load_catalog
from kvscope.diagnoser.curve.report import attach, pool_curves, regression_findings
from kvscope.diagnoser.evaluate.frame import Block
from kvscope.diagnoser.findings import Diagnosis, Finding, LeverAdvice
from tests.unit.test_curve import STAIRS, STEP, hump, synth

CATALOG = load_catalog()
KNOBS = (
    "engine_prefix_caching_mode_code",
    "engine_kv_cache_fp8_code",
    "engine_kv_block_size_tokens",
    "engine_gpu_memory_utilization_ratio",
)


def _knobs(text: str) -> dict[str, float]:
    lines = [ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info{")]
    expo = parse_exposition("# TYPE vllm:cache_config_info gauge\n" + "\n".join(lines) + "\n")
    norm = normalize(expo, "vllm", {"job": "vllm", "instance": "a:1"}, 1.0, CATALOG)
    return {s.name: s.value for s in norm.samples if s.name in KNOBS}


@pytest.mark.parametrize(
    "fixture, want",
    [
        (
            "vllm-0.32.0-cpu-after-load.txt",
            {
                "engine_prefix_caching_mode_code": 1.0,
                "engine_kv_cache_fp8_code": 0.0,
                "engine_kv_block_size_tokens": 32.0,
                "engine_gpu_memory_utilization_ratio": 0.92,
            },
        ),
        # enable_prefix_caching="None": unknown, so no value (never read as off)
        (
            "vllm-0.11.0-rendered.txt",
            {
                "engine_kv_cache_fp8_code": 0.0,
                "engine_kv_block_size_tokens": 16.0,
                "engine_gpu_memory_utilization_ratio": 0.9,
            },
        ),
        (
            "vllm-0.10.2-rendered.txt",
            {
                "engine_kv_cache_fp8_code": 0.0,
                "engine_kv_block_size_tokens": 16.0,
                "engine_gpu_memory_utilization_ratio": 0.9,
            },
        ),
    ],
)
def test_cache_config_info_settings_of_real_vllm_scrapes(load_fixture, fixture, want):
    assert _knobs(load_fixture(f"scrapes/{fixture}")) == want


@pytest.mark.parametrize(
    "dtype, want",
    [("fp8", 1.0), ("fp8_e4m3", 1.0), ("fp8_e5m2", 1.0), ("fp8_ds_mla", 1.0), ("bfloat16", 0.0), ("auto", 0.0)]
    + [("int8", None), ("nvfp4", None)],  # neither the model's dtype nor FP8: no value
)
def test_the_kv_cache_dtype_reads_fp8_or_not_and_nothing_for_other_types(load_fixture, dtype, want):
    text = load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt")
    got = _knobs(re.sub(r'cache_dtype="[^"]*"', f'cache_dtype="{dtype}"', text))
    assert got.get("engine_kv_cache_fp8_code") == want


def test_prefix_caching_off_reads_zero(load_fixture):
    text = load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt").replace(
        'enable_prefix_caching="True"', 'enable_prefix_caching="False"'
    )
    assert _knobs(text)["engine_prefix_caching_mode_code"] == 0.0


def _changed(knob: str, before: float, after: float, tail_after=lambda c: 1):
    """The staircase twice, restarted between with `knob` moved (the tail gone after: better)."""
    half = len(STAIRS)
    frame = synth(STAIRS + STAIRS, tail=lambda c, i: hump(c) if i < half else tail_after(c), resets=(half,))
    labels = frame.blocks["engine_requests_running"].labels
    frame.blocks[knob] = Block(labels, np.array([[before] * half + [after] * half]))
    (pc,) = pool_curves(frame, settle_s=0.0)
    return pc


def _finding(rule: str, lever: str, until: float, active: bool) -> Finding:
    return Finding(
        rule,
        "",
        f"{rule} title",
        "warning",
        {},
        1000.0,
        until,
        active,
        (0, 1),
        STEP,
        1,
        "s",
        levers=(LeverAdvice(lever, 1, "set"),),
    )


@pytest.mark.parametrize(
    "knob, lever",
    [
        ("engine_prefix_caching_mode_code", "vllm.enable_prefix_caching"),
        ("engine_kv_cache_fp8_code", "vllm.kv_cache_dtype"),
    ],
)
def test_turning_a_recommended_setting_on_is_followed_up(knob, lever):
    pc = _changed(knob, 0.0, 1.0)
    (j,) = pc.changes
    assert j.change.kind == "config" and j.change.diff == {knob.removeprefix("engine_"): [0.0, 1.0]}
    assert j.verdict == "improvement"
    t = j.change.time
    got = attach(Diagnosis((0, 1), "x", _finding("some_rule", lever, t - STEP, False)), [pc]).changes[0]
    assert got["follow_up"] == [{"finding": "some_rule", "levers_md": "", "lever": lever, "symptom_cleared": True}]
    assert got["text_follow_up"] == f"lever follow-up: some_rule title ({lever}): cleared; at matched load: improvement"
    # turned off again: the lever was not applied, nothing to follow up
    back = _changed(knob, 1.0, 0.0)
    assert (
        "follow_up"
        not in attach(Diagnosis((0, 1), "x", _finding("some_rule", lever, t - STEP, False)), [back]).changes[0]
    )


def test_fp8_and_the_capacity_it_doubles_follow_up_the_dtype_lever():
    """FP8 KV doubles the KV capacity in the same restart: the finding's dtype lever is the one
    applied, not the memory lever that the capacity alone would also match."""
    half = len(STAIRS)
    cap = [1000.0] * half + [2000.0] * half
    frame = synth(STAIRS + STAIRS, tail=lambda c, i: hump(c) if i < half else 1, resets=(half,), kv_cap=cap)
    rows = frame.blocks["engine_requests_running"].labels
    frame.blocks["engine_kv_cache_fp8_code"] = Block(rows, np.array([[0.0] * half + [1.0] * half]))
    (pc,) = pool_curves(frame, settle_s=0.0)
    (j,) = pc.changes
    assert set(j.change.diff) == {"kv_capacity_tokens", "kv_cache_fp8_code"}
    levers = (LeverAdvice("vllm.gpu_memory_utilization", 1, "increase"), LeverAdvice("vllm.kv_cache_dtype", 2, "set"))
    k1 = replace(_finding("kv_pressure_preemption", "", j.change.time - STEP, False), levers=levers)
    got = attach(Diagnosis((0, 1), "x", k1), [pc]).changes[0]
    assert [x["lever"] for x in got["follow_up"]] == ["vllm.kv_cache_dtype"]


def test_a_block_size_change_is_judged_and_names_its_flag_but_has_no_lever():
    pc = _changed("engine_kv_block_size_tokens", 16.0, 32.0, tail_after=lambda c: 5)  # worse after
    (j,) = pc.changes
    assert j.change.diff == {"kv_block_size_tokens": [16.0, 32.0]} and j.verdict == "regression"
    (f,) = regression_findings([pc], (0.0, 1.0), STEP)
    assert "--block-size" in f.levers[1].changes[0].change
    got = attach(Diagnosis((0, 1), "x", _finding("r", "vllm.gpu_memory_utilization", 0.0, False)), [pc]).changes[0]
    assert "follow_up" not in got
