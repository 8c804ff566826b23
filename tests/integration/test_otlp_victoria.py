"""OTLP push into a real receiver: the agent scrapes a real vLLM capture and pushes with the
OpenTelemetry SDK's OTLP/HTTP exporter to VictoriaMetrics' `/opentelemetry/v1/metrics` (the
current generation's, testbed/servers.py: Debian 12's 1.79 has no OTLP ingestion); then what
VictoriaMetrics stored is read back with PromQL and compared with the agent's own /metrics.

What VictoriaMetrics stores (docs/otel.md): metric and attribute names as sent, dots kept, no unit
suffix (`gen_ai.server.time_to_first_token_bucket|_count|_sum`, `gen_ai.request.model`), the
resource's attributes (`service.name`, ...) and the scope's as labels on every series, and the
`kvscope_*` series with the labels the agent's /metrics gives them, which is what the generated
rules and dashboards read.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.parse
import urllib.request
from pathlib import Path
from unittest import mock

import pytest
from agentharness import fetch_metrics, running_agent, target_server, value
from aiohttp import web

from kvscope.agent.otel.push import OtlpPusher, push_config
from testbed import servers
from testbed.procs import wait_until
from testbed.victoria import running_victoria

VLLM = (Path(__file__).resolve().parents[1] / "fixtures" / "scrapes" / "vllm-0.32.0-cpu-after-load.txt").read_text()
VM = servers.CURRENT_HOME / "usr" / "bin" / "victoria-metrics"
GENAI = {
    "gen_ai.server.time_to_first_token": "kvscope_request_ttft_seconds",
    "gen_ai.server.request.duration": "kvscope_request_e2e_seconds",
    "gen_ai.server.time_per_output_token": "kvscope_request_tpot_seconds",
}


def _query(url: str, expr: str) -> list[dict]:
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=30) as resp:  # noqa: S310
        doc = json.load(resp)
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


async def _push(endpoint: str) -> tuple[str, str, str]:
    async def vllm(request: web.Request) -> web.Response:
        return web.Response(text=VLLM)

    async with target_server({"/metrics": vllm}) as base:
        doc = {"targets": [{"url": base + "/metrics", "job": "vllm"}], "store": {"path": ""}}
        async with running_agent(doc) as (runtime, agent):
            env = {"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": endpoint}
            with mock.patch.dict(os.environ, env):  # the SDK's exporter reads the process's
                cfg = push_config(None)
            assert cfg is not None
            pusher = OtlpPusher(cfg, runtime.state)
            await runtime.run_cycle()
            result = await pusher.push_once()
            await asyncio.to_thread(pusher.exporter.shutdown)
            _, expo = await fetch_metrics(agent)
    return result, expo, base.removeprefix("http://")


def test_victoria_metrics_stores_the_pushed_genai_and_kvscope_series(tmp_path):
    if not VM.is_file():
        pytest.fail(f"{VM} missing: run scripts/install-servers-current.sh (make test does)", pytrace=False)
    with running_victoria(tmp_path / "vm", binary=str(VM)) as vm:
        result, expo, instance = asyncio.run(_push(vm.url + "/opentelemetry/v1/metrics"))
        assert result == "ok"
        with urllib.request.urlopen(vm.url + "/internal/force_flush", timeout=30) as resp:  # noqa: S310
            resp.read()
        last = "kvscope_request_ttft_seconds_count"  # new series become searchable a moment after the flush
        wait_until(lambda: _query(vm.url, last), 60, f"{last} searchable in VictoriaMetrics", procs=(vm.proc,))
        for otel, canonical in GENAI.items():
            for suffix in ("_count", "_sum"):
                # dots kept, no unit suffix: a dotted name is a plain selector in MetricsQL
                (got,) = _query(vm.url, f'{otel}{suffix}{{gen_ai.request.model="tiny-llama"}}')
                labels = got["metric"]
                assert labels["__name__"] == otel + suffix
                assert labels["gen_ai.provider.name"] == "vllm" and labels["server.address"] == "127.0.0.1"
                assert labels["service.name"] == "kvscope-agent"  # resource attributes become labels
                want = value(expo, canonical + suffix, instance=instance, model="tiny-llama")
                assert float(got["value"][1]) == pytest.approx(want, rel=1e-12)
            # cumulative buckets with Prometheus' `le`, the +Inf one equal to the count
            buckets = _query(vm.url, f'{otel}_bucket{{gen_ai.request.model="tiny-llama"}}')
            by_le = {b["metric"]["le"]: float(b["value"][1]) for b in buckets}
            assert by_le["+Inf"] == value(expo, canonical + "_count", instance=instance, model="tiny-llama")
            assert sorted(by_le.values()) == [by_le[le] for le in sorted(by_le, key=float)]
        # the kvscope_* series keep the agent's labels: what the generated rules and dashboards read
        (ttft,) = _query(vm.url, "sum by (instance, model, engine) (kvscope_request_ttft_seconds_count)")
        assert ttft["metric"] == {"instance": instance, "model": "tiny-llama", "engine": "vllm"}
        assert float(ttft["value"][1]) == value(expo, "kvscope_request_ttft_seconds_count", model="tiny-llama")
