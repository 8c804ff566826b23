"""A real Prometheus scrapes a real `kvscope agent` process which scrapes a real target process
serving the vLLM capture; and a `kvscope record` recording is backfilled with promtool and
queried from a Prometheus started on those blocks.

Every process binds 127.0.0.1 on a free port, works in a temp dir and is killed in teardown.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agentharness import start_agent_process, start_target_process

from testbed.procs import ProcessGroup, free_port, http_get, wait_http, wait_until
from testbed.prometheus import backfill_openmetrics, prometheus_argv, query

pytestmark = [pytest.mark.prometheus, pytest.mark.needs("prometheus", "promtool"), pytest.mark.servers]

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "scrapes" / "vllm-0.32.0-cpu-after-load.txt"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


@pytest.fixture
def procs(tmp_path):
    with ProcessGroup(tmp_path) as group:
        yield group


def start_target(procs: ProcessGroup, tmp_path: Path) -> str:
    """A separate process serving the vLLM capture at /metrics."""
    root = tmp_path / "target"
    root.mkdir()
    shutil.copy(FIXTURE, root / "metrics")
    proc, base = start_target_process(root)
    procs.adopt(proc)
    return base + "/metrics"


def start_prometheus(procs: ProcessGroup, tmp_path: Path, name: str, data: Path, scrape: str | None) -> str:
    """Prometheus on `data`, scraping the agent at `scrape` (None: nothing); returns its URL."""
    port = free_port()
    config = tmp_path / f"{name}.yml"
    # honor_labels: the agent's series already carry the engine's job/instance (as with federation)
    jobs = (
        (
            f"scrape_configs:\n  - job_name: kvscope\n    honor_labels: true\n"
            f"    scrape_interval: 1s\n    scrape_timeout: 900ms\n"
            f"    static_configs: [{{targets: ['{scrape}']}}]\n"
        )
        if scrape
        else ""
    )
    config.write_text("global: {evaluation_interval: 1m}\n" + jobs)
    proc = procs.start(
        name, prometheus_argv(config, data, port, "--storage.tsdb.retention.time=1y", binary=PROMETHEUS), cwd=tmp_path
    )
    # alive and ready: a dead one (its log in the failure) means another process took the port
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/-/ready", 60, procs=(proc,), request_timeout_s=5, interval_s=0.25)
    return url


def test_prometheus_scrapes_the_agent_and_sees_canonical_series(procs, tmp_path):
    target = start_target(procs, tmp_path)
    agent, agent_url = start_agent_process(
        ["--target", target, "--job", "vllm", "--scrape.interval", "1s", "--store.path", ""]
    )
    procs.adopt(agent)
    wait_until(
        lambda: http_get(agent_url + "/-/ready")[0] == 200,
        30,
        "agent ready",
        interval_s=0.25,
        logs=lambda: "".join(agent.output_lines),
    )
    prom = start_prometheus(procs, tmp_path, "prometheus", tmp_path / "data", agent_url.split("/")[2])

    result = wait_until(
        lambda: query(prom, "kvscope_engine_kv_cache_usage_ratio"),
        30,
        "kvscope_engine_kv_cache_usage_ratio in Prometheus",
        interval_s=0.25,
        logs=lambda: procs.log("prometheus"),
    )
    labels = result[0]["metric"]
    assert (labels["engine"], labels["model"], labels["dp_rank"]) == ("vllm", "tiny-llama", "0")
    assert (labels["instance"], labels["job"]) == (target.split("/")[2], "vllm")
    assert float(result[0]["value"][1]) == 0.0
    up = query(prom, 'kvscope_target_up{job="vllm"}')
    assert [float(r["value"][1]) for r in up] == [1.0]
    hist = wait_until(
        lambda: query(prom, "sum(kvscope_request_ttft_seconds_count)"), 10, "ttft histogram", interval_s=0.25
    )
    assert float(hist[0]["value"][1]) > 0


def test_a_recording_backfills_into_prometheus_with_promtool(procs, tmp_path):
    target = start_target(procs, tmp_path)
    out = tmp_path / "incident.om"
    t0 = time.time()
    rec = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvscope",
            "record",
            "--target",
            target,
            "--job",
            "vllm",
            "--duration",
            "3s",
            "--interval",
            "1s",
            "--out",
            str(out),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only (slow on a loaded 2-core box)
    )
    assert rec.returncode == 0, rec.stderr
    assert "done: wrote" in rec.stderr
    blocks = tmp_path / "blocks"
    backfill_openmetrics(out, blocks, timeout_s=120, binary=PROMTOOL)
    prom = start_prometheus(procs, tmp_path, "prometheus-backfill", blocks, None)

    at = time.time()  # the recording lies in [t0, at]; instant queries look back 5 minutes
    kv = query(prom, "vllm:kv_cache_usage_perc", at)
    assert len(kv) == 1 and kv[0]["metric"]["job"] == "vllm"
    assert kv[0]["metric"]["instance"] == target.split("/")[2]
    queries = query(prom, "vllm:prefix_cache_queries_total", at)
    assert float(queries[0]["value"][1]) == 16028.0
    scrapes = query(prom, f"count_over_time(up[{int(at - t0) + 1}s])", at)
    assert 2 <= int(scrapes[0]["value"][1]) <= 3  # 3 s at 1 s: three scrapes (two if one was very slow)
