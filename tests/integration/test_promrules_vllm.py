"""The shipped rule files on a real engine: Prometheus 2.42 scrapes real vLLM on CPU (no agent)
and the generated recording rules turn its native names into canonical series."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from testbed.tiny_model import SERVED_NAME

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "You are a careful assistant for the kvscope test suite. " * 20   # shared prefix -> cache hits

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.prometheus,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed (scripts/setup.sh)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())["data"]["result"]


def _complete(base_url: str, suffix: str) -> None:
    body = json.dumps({"model": SERVED_NAME, "prompt": PROMPT + suffix, "max_tokens": 4}).encode()
    req = urllib.request.Request(base_url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        resp.read()


@pytest.fixture
def prometheus_on_vllm(vllm_small_kv, tmp_path):
    port = _free_port()
    target = vllm_small_kv.url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in sorted((ROOT / "rules" / "prometheus").glob("*.yml"))],
        "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": [target]}]}],
    }))
    log = open(tmp_path / "prometheus.log", "w")
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if _query(port, "up"):
                    break
            except (urllib.error.URLError, OSError, KeyError):
                pass
            time.sleep(0.3)
        yield port, vllm_small_kv, target
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _wait_for(port: int, expr: str, timeout_s: float = 40) -> list[dict]:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        result = _query(port, expr)
        if result:
            return result
        time.sleep(0.5)
    return []


def test_real_vllm_native_names_become_canonical_series(prometheus_on_vllm):
    port, server, instance = prometheus_on_vllm
    assert _wait_for(port, "kvscope:engine_requests_running"), "no canonical series from the real engine"
    for i in range(6):
        _complete(server.url, f" request {i}")

    kv = _query(port, "kvscope:engine_kv_cache_usage_ratio")
    assert len(kv) == 1
    assert kv[0]["metric"] == {"__name__": "kvscope:engine_kv_cache_usage_ratio", "instance": instance,
                               "engine": "vllm", "model": SERVED_NAME, "dp_rank": "0"}
    assert 0.0 <= float(kv[0]["value"][1]) <= 1.0

    # the six requests (and whatever earlier tests sent this server) are counted in the +Inf bucket
    total = _wait_for(port, 'kvscope:request_ttft_seconds_bucket{le="+Inf"} >= 6')
    assert total, "TTFT histogram did not reach the canonical layer"
    p99 = _wait_for(port, "instance:request_ttft_seconds:p99_5m > 0")
    assert p99 and p99[0]["metric"]["instance"] == instance
    assert float(p99[0]["value"][1]) < 2560                  # inside vLLM's finite buckets
    hit = _wait_for(port, "instance:engine_prefix_cache_hit_ratio:rate5m > 0")
    assert hit, "the shared prefix should hit the prefix cache"
    assert 0 < float(hit[0]["value"][1]) <= 1

    # vLLM 0.32 exports the current names: no rename alert, not even pending
    assert _query(port, 'ALERTS{alertname="LlmEngineMetricRenamed"}') == []
