"""Dynamo 1.6.1's frontend names, checked on the real frontend (issue 38 item 6).

Expected, written before the first run:
* The real ai-dynamo 1.6.1 frontend in `--router-mode kv` (tests/fixtures/scrapes/
  dynamo-1.6.1-frontend-kv-mocker-loaded.txt, captured by tests/integration/test_dynamo_mocker.py)
  exports its KV router's series as `dynamo_component_router_kv_*` and none as `dynamo_frontend_kv_*`;
  the catalog maps them (router_prefix_match_ratio, 12 decisions; selected / best cached prefix).
* `dynamo_frontend_kv_hit_rate` is the same histogram as Dynamo's source spells it in its
  frontend_service module at 04070c75 (the outside corpus' rendered frontend body): it maps to the
  same router_prefix_match_ratio, as a fallback, so a payload with both counts once.
* The frontend's TTFT / ITL histograms (dynamo_frontend_time_to_first_token_seconds,
  _inter_token_latency_seconds) are not mapped to request_ttft_seconds / request_itl_seconds: the
  workers behind it export the engine's own (vLLM's, SGLang's) in the same fleet, and the model- and
  fleet-level latency rules sum every instance's histogram, so each request would count twice.
"""

from pathlib import Path

from kvscope.agent.normalize.dialect import detect_engine, normalize
from kvscope.agent.scrape.exposition import parse_exposition

OUTSIDE = Path(__file__).resolve().parents[1] / "outside" / "bodies"
TARGET = {"instance": "frontend", "job": "dynamo"}


def canon(text: str):
    expo = parse_exposition(text)
    return normalize(expo, detect_engine(expo), TARGET, 100.0)


def total(norm, name: str) -> float:
    return sum(s.value for s in norm.samples if s.name == name)


def test_real_161_frontend_exports_router_series_under_the_component_prefix(load_fixture):
    text = load_fixture("scrapes/dynamo-1.6.1-frontend-kv-mocker-loaded.txt")
    raw = {s.name for s in parse_exposition(text).samples}
    assert not [n for n in raw if n.startswith("dynamo_frontend_kv_")]
    assert "dynamo_component_router_kv_hit_rate_count" in raw
    assert "dynamo_frontend_time_to_first_token_seconds_count" in raw
    norm = canon(text)
    assert norm.engine == "dynamo"
    assert total(norm, "router_prefix_match_ratio_count") == 12
    assert total(norm, "router_selected_cached_prefix_tokens_total") == 6048
    names = {s.name for s in norm.samples}
    assert not names & {"request_ttft_seconds_count", "request_itl_seconds_count", "request_queue_seconds_count"}


def test_frontend_spelling_of_the_kv_hit_rate_maps_to_the_same_signal():
    text = (OUTSIDE / "dynamo-frontend-rendered.txt").read_text()
    raw = {s.name: s.value for s in parse_exposition(text).samples}
    assert "dynamo_frontend_kv_hit_rate_count" in raw and "dynamo_component_router_kv_hit_rate_count" not in raw
    norm = canon(text)
    assert total(norm, "router_prefix_match_ratio_count") == raw["dynamo_frontend_kv_hit_rate_count"]
    both = text + (
        "# TYPE dynamo_component_router_kv_hit_rate histogram\n"
        'dynamo_component_router_kv_hit_rate_bucket{le="+Inf"} 5\n'
        "dynamo_component_router_kv_hit_rate_sum 2\n"
        "dynamo_component_router_kv_hit_rate_count 5\n"
    )
    assert total(canon(both), "router_prefix_match_ratio_count") == 5  # the fallback yields
