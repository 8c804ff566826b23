"""The engine collector fails a target whole on its limits or a parse past its timeout, and only
that target (agent/collectors/engine.py; the real-agent version is in
tests/integration/test_agent_bad_targets.py)."""

from __future__ import annotations

from pathlib import Path

from kvscope.agent.collectors.base import Collection
from kvscope.agent.collectors.engine import EngineCollector, TargetScrape
from kvscope.agent.config import build_config

VLLM = (Path(__file__).resolve().parents[1] / "fixtures" / "scrapes" / "vllm-0.32.0-cpu-after-load.txt").read_text()
BIG = "".join(f'vllm:num_requests_running{{engine="{i}",model_name="m"}} 1\n' for i in range(200_000))


def _collect(doc: dict, bodies: dict[str, tuple[str, float]]) -> dict[str, object]:
    config = build_config(doc, environ={}, flags=[])
    collector = EngineCollector(config)
    out = Collection()
    for target in config.targets:
        body, took = bodies[target.instance]
        collector._normalize_into(TargetScrape(target, 0.0, took, text=body), out)
    return {h.target: h for h in out.health}


def test_a_body_not_parsed_within_the_scrape_timeout_fails_that_target_alone():
    doc = {
        "scrape": {"interval_s": 2, "timeout_s": 1, "sample_limit": 0},
        "targets": ["http://big:1/metrics", "http://good:1/metrics"],
    }
    # the fetch of `big` took its whole timeout: 0.1 s is left to parse 200k lines
    health = _collect(doc, {"big:1": (BIG, 1.0), "good:1": (VLLM, 0.01)})
    assert (health["big:1"].up, health["big:1"].reason) == (False, "parse_timeout")
    assert health["big:1"].series == 0 and health["big:1"].errors["parse_timeout"] == 1
    assert health["good:1"].up and health["good:1"].series > 50


def test_limits_fail_the_target_whole_and_a_target_key_overrides_scrape():
    doc = {
        "scrape": {"sample_limit": 100},
        "targets": [
            "http://a:1/metrics",
            {"url": "http://b:1/metrics", "sample_limit": 0},
            {"url": "http://c:1/metrics", "sample_limit": 0, "label_value_length_limit": 5},
        ],
    }
    health = _collect(doc, {"a:1": (VLLM, 0.01), "b:1": (VLLM, 0.01), "c:1": (VLLM, 0.01)})
    assert (health["a:1"].up, health["a:1"].reason) == (False, "sample_limit_exceeded")
    assert health["b:1"].up and health["b:1"].series > 50
    assert (health["c:1"].up, health["c:1"].reason) == (False, "label_value_length_limit_exceeded")
