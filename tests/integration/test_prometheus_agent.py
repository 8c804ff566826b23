"""A real Prometheus scrapes a real `kvscope agent` process which scrapes a real target process
serving the vLLM capture; and a `kvscope record` recording is backfilled with promtool and
queried from a Prometheus started on those blocks.

Every process binds 127.0.0.1 on a free port, works in a temp dir and is killed in teardown.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from agentharness import start_agent_process, start_target_process, stop_process

pytestmark = pytest.mark.prometheus

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "scrapes" / "vllm-0.32.0-cpu-after-load.txt"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
if PROMETHEUS is None or PROMTOOL is None:
    pytest.skip("Debian prometheus/promtool not installed (scripts/setup.sh installs them)", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    """Starts processes and guarantees they are stopped."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[subprocess.Popen] = []
        self.owned: list[subprocess.Popen] = []    # started by agentharness helpers

    def start(self, name: str, argv: list[str], cwd: Path | None = None) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
        log.close()
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.logdir / f"{name}.log").read_text(errors="replace")[-3000:]

    def stop_all(self) -> None:
        for proc in self.owned:
            stop_process(proc)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def procs(tmp_path):
    p = Processes(tmp_path)
    yield p
    p.stop_all()


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except OSError:
        return 0, b""


def wait_for(predicate, timeout_s: float, what: str, logs: str = ""):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


def promql(port: int, query: str, at: float | None = None) -> list[dict]:
    params = {"query": query} | ({"time": f"{at:.3f}"} if at is not None else {})
    status, body = get(f"http://127.0.0.1:{port}/api/v1/query?{urllib.parse.urlencode(params)}")
    if status != 200:
        return []
    return json.loads(body)["data"]["result"]


def start_target(procs: Processes, tmp_path: Path) -> str:
    """A separate process serving the vLLM capture at /metrics."""
    root = tmp_path / "target"
    root.mkdir()
    shutil.copy(FIXTURE, root / "metrics")
    proc, base = start_target_process(root)
    procs.owned.append(proc)
    return base + "/metrics"


def start_prometheus(procs: Processes, tmp_path: Path, name: str, data: Path, scrape: str | None) -> int:
    port = free_port()
    config = tmp_path / f"{name}.yml"
    # honor_labels: the agent's series already carry the engine's job/instance (as with federation)
    jobs = (f"scrape_configs:\n  - job_name: kvscope\n    honor_labels: true\n"
            f"    scrape_interval: 1s\n    scrape_timeout: 900ms\n"
            f"    static_configs: [{{targets: ['{scrape}']}}]\n") if scrape else ""
    config.write_text("global: {evaluation_interval: 1m}\n" + jobs)
    procs.start(name, [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={data}",
                       f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1y"],
                cwd=tmp_path)
    proc = procs.procs[-1]     # alive and ready: a dead one means another process took the port
    wait_for(lambda: proc.poll() is None and get(f"http://127.0.0.1:{port}/-/ready")[0] == 200, 60,
             f"{name} ready", procs.log(name))
    return port


def test_prometheus_scrapes_the_agent_and_sees_canonical_series(procs, tmp_path):
    target = start_target(procs, tmp_path)
    agent, agent_url = start_agent_process(["--target", target, "--job", "vllm", "--scrape.interval", "1s",
                                            "--store.path", ""])
    procs.owned.append(agent)
    wait_for(lambda: get(agent_url + "/-/ready")[0] == 200, 30, "agent ready", "".join(agent.output_lines))
    prom = start_prometheus(procs, tmp_path, "prometheus", tmp_path / "data", agent_url.split("/")[2])

    result = wait_for(lambda: promql(prom, "kvscope_engine_kv_cache_usage_ratio"), 30,
                      "kvscope_engine_kv_cache_usage_ratio in Prometheus", procs.log("prometheus"))
    labels = result[0]["metric"]
    assert (labels["engine"], labels["model"], labels["dp_rank"]) == ("vllm", "tiny-llama", "0")
    assert (labels["instance"], labels["job"]) == (target.split("/")[2], "vllm")
    assert float(result[0]["value"][1]) == 0.0
    up = promql(prom, 'kvscope_target_up{job="vllm"}')
    assert [float(r["value"][1]) for r in up] == [1.0]
    hist = wait_for(lambda: promql(prom, "sum(kvscope_request_ttft_seconds_count)"), 10, "ttft histogram")
    assert float(hist[0]["value"][1]) > 0


def test_a_recording_backfills_into_prometheus_with_promtool(procs, tmp_path):
    target = start_target(procs, tmp_path)
    out = tmp_path / "incident.om"
    t0 = time.time()
    rec = subprocess.run([sys.executable, "-m", "kvscope", "record", "--target", target, "--job", "vllm",
                          "--duration", "3s", "--interval", "1s", "--out", str(out), "--no-progress"],
                         capture_output=True, text=True, timeout=60)
    assert rec.returncode == 0, rec.stderr
    assert "done: wrote" in rec.stderr
    blocks = tmp_path / "blocks"
    backfill = subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(out), str(blocks)],
                              capture_output=True, text=True, timeout=120)
    assert backfill.returncode == 0, backfill.stdout + backfill.stderr
    prom = start_prometheus(procs, tmp_path, "prometheus-backfill", blocks, None)

    at = time.time()       # the recording lies in [t0, at]; instant queries look back 5 minutes
    kv = promql(prom, "vllm:kv_cache_usage_perc", at)
    assert len(kv) == 1 and kv[0]["metric"]["job"] == "vllm"
    assert kv[0]["metric"]["instance"] == target.split("/")[2]
    queries = promql(prom, "vllm:prefix_cache_queries_total", at)
    assert float(queries[0]["value"][1]) == 16028.0
    scrapes = promql(prom, f"count_over_time(up[{int(at - t0) + 1}s])", at)
    assert 2 <= int(scrapes[0]["value"][1]) <= 3   # 3 s at 1 s: three scrapes (two if one was very slow)
