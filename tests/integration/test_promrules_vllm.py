"""The shipped rule files on a real engine: Prometheus 2.42 scrapes real vLLM on CPU (no agent)
and the generated recording rules turn its native names into canonical series."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
import yaml

from testbed.prometheus import query, running_prometheus, wait_query
from testbed.tiny_model import SERVED_NAME

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "You are a careful assistant for the kvscope test suite. " * 20  # shared prefix -> cache hits

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.prometheus,
    pytest.mark.needs("prometheus"),
]


def _complete(base_url: str, suffix: str) -> None:
    body = json.dumps({"model": SERVED_NAME, "prompt": PROMPT + suffix, "max_tokens": 4}).encode()
    req = urllib.request.Request(base_url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        resp.read()


@pytest.fixture
def prometheus_on_vllm(vllm_small_kv, tmp_path):
    target = vllm_small_kv.url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(p) for p in sorted((ROOT / "rules" / "prometheus").glob("*.yml"))],
                "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": [target]}]}],
            }
        )
    )
    with running_prometheus(
        tmp_path / "prometheus.yml", tmp_path / "tsdb", log_path=tmp_path / "prometheus.log"
    ) as prom:
        yield prom.url, vllm_small_kv, target


def test_real_vllm_native_names_become_canonical_series(prometheus_on_vllm):
    url, server, instance = prometheus_on_vllm
    wait_query(url, "kvscope:engine_requests_running", 40)  # canonical series from the real engine
    for i in range(6):
        _complete(server.url, f" request {i}")

    kv = query(url, "kvscope:engine_kv_cache_usage_ratio")
    assert len(kv) == 1
    assert kv[0]["metric"] == {
        "__name__": "kvscope:engine_kv_cache_usage_ratio",
        "instance": instance,
        "engine": "vllm",
        "model": SERVED_NAME,
        "dp_rank": "0",
    }
    assert 0.0 <= float(kv[0]["value"][1]) <= 1.0

    # the six requests (and whatever earlier tests sent this server) are counted in the +Inf bucket
    wait_query(url, 'kvscope:request_ttft_seconds_bucket{le="+Inf"} >= 6', 40)  # TTFT in the canonical layer
    p99 = wait_query(url, "instance:request_ttft_seconds:p99_5m > 0", 40)
    assert p99[0]["metric"]["instance"] == instance
    assert float(p99[0]["value"][1]) < 2560  # inside vLLM's finite buckets
    hit = wait_query(url, "instance:engine_prefix_cache_hit_ratio:rate5m > 0", 40)  # the shared prefix hits
    assert 0 < float(hit[0]["value"][1]) <= 1

    # vLLM 0.32 exports the current names: no rename alert, not even pending
    assert query(url, 'ALERTS{alertname="LlmEngineMetricRenamed"}') == []
