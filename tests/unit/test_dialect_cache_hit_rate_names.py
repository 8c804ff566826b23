"""Where a `cache_hit_rate` gauge outside SGLang's own `sglang:` name lands (issue 38 item 7).

Expected, written before the first run:
* `sglang_cache_hit_rate` is SGLang's `sglang:cache_hit_rate` as collectors that rewrite `:` to `_`
  spell it (the form sgl-project/sglang's SMG data-parallel guide quotes as `sglang_cache_hit_rate{...}`
  and public tuning notes show in `curl /metrics | grep` output): it folds back and reads as
  engine_prefix_cache_hit_ratio, the same signal the colon name gives.
* The real SMG 1.13 gateway exports no `sglang_cache_hit_rate`; what its load poll read from each
  engine is `smg_engine_cache_hit_rate{worker,model,dp_rank}` (HELP "Engine-reported prefix cache hit
  rate (0.0-1.0) by worker, model, dp_rank", in the committed capture of SMG 1.13 in front of two
  vLLM 0.32 engines). It reads as router_worker_engine_prefix_hit_ratio, one series per worker and
  DP rank, and never as the engine's own engine_prefix_cache_hit_ratio (a router series describes
  what the router saw, issue 27).
"""

from kvscope.agent.normalize.dialect import detect_engine, normalize
from kvscope.agent.scrape.exposition import parse_exposition

TARGET = {"instance": "x", "job": "j"}


def canon(text: str):
    expo = parse_exposition(text)
    return normalize(expo, detect_engine(expo), TARGET, 100.0)


def test_underscored_sglang_cache_hit_rate_reads_as_the_engine_prefix_hit_ratio():
    norm = canon(
        'sglang_num_running_reqs{model_name="q"} 24.0\n'
        'sglang_token_usage{model_name="q"} 0.61\n'
        'sglang_cache_hit_rate{model_name="q"} 0.34\n'
    )
    assert norm.engine == "sglang"
    hits = [s.value for s in norm.samples if s.name == "engine_prefix_cache_hit_ratio"]
    assert hits == [0.34]


def test_smg_engine_cache_hit_rate_is_the_gateways_per_worker_view(load_fixture):
    text = load_fixture("scrapes/smg-1.13.0-cache_aware-2x-vllm-0.32-loaded.txt")
    assert "\nsmg_engine_cache_hit_rate{" in text and "sglang_cache_hit_rate" not in text
    raw = {
        dict(s.labels)["worker"]: s.value
        for s in parse_exposition(text).samples
        if s.name == "smg_engine_cache_hit_rate"
    }
    norm = canon(text)
    assert norm.engine == "sglang_router"
    got = [
        dict(s.labels) | {"value": s.value} for s in norm.samples if s.name == "router_worker_engine_prefix_hit_ratio"
    ]
    assert {g["worker"]: g["value"] for g in got} == raw and len(raw) == 2
    assert {g["dp_rank"] for g in got} == {"0"} and {g["model"] for g in got} == {"tiny-llama"}
    assert not [s for s in norm.samples if s.name == "engine_prefix_cache_hit_ratio"]
