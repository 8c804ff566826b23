"""Benchmark: how long `kvscope serve` takes from an Alertmanager webhook to a stored diagnosis.

A real Prometheus 2.42 scrapes N engines serving the real vLLM 0.32 CPU capture for a while;
then webhooks for alerts on those engines are POSTed to a real `kvscope serve` and each is
timed until `GET /api/v1/diagnoses/<id>` says `done`. Baseline: the same window read and
diagnosed in-process (`PrometheusSource.read_frame` + `diagnose`, what `kvscope diagnose
--prometheus` does), so the ratio is the receiver's own overhead (HTTP, queue, store, JSON).

    .venv/bin/python bench/webhook_latency.py [--engines 20] [--webhooks 5] [--scrape-seconds 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import yaml

from kvscope.diagnoser.evaluate.evaluator import diagnose, sample_names
from kvscope.diagnoser.rulebook.rule import read_rules
from kvscope.diagnoser.sources.prometheus import PrometheusSource

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # testbed/ (test tooling at the repo root, not installed)
from testbed.httpstub import serving, static_body_handler  # noqa: E402
from testbed.procs import ProcessGroup, free_port, wait_http  # noqa: E402
from testbed.prometheus import prometheus_argv  # noqa: E402

CAPTURE = ROOT / "tests" / "fixtures" / "scrapes" / "vllm-0.32.0-cpu-after-load.txt"
STEP_S, BEFORE_S = 15.0, 120.0


def _webhook(instance: str, starts_at: float) -> bytes:
    stamp = datetime.fromtimestamp(starts_at, UTC).isoformat().replace("+00:00", "Z")
    return json.dumps(
        {
            "version": "4",
            "status": "firing",
            "receiver": "kvscope",
            "alerts": [
                {
                    "status": "firing",
                    "startsAt": stamp,
                    "endsAt": "0001-01-01T00:00:00Z",
                    "fingerprint": instance,
                    "labels": {
                        "alertname": "LlmKvPressurePreemption",
                        "rule_id": "kv_pressure_preemption",
                        "instance": instance,
                        "severity": "warning",
                    },
                    "annotations": {},
                }
            ],
        }
    ).encode()


def _time_webhook(serve: str, body: bytes) -> float:
    t0 = time.perf_counter()
    req = urllib.request.Request(serve + "/api/v1/alerts", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        row = json.loads(resp.read())["id"]
    while True:
        with urllib.request.urlopen(f"{serve}/api/v1/diagnoses/{row}", timeout=10) as resp:
            if json.loads(resp.read())["status"] != "pending":
                return time.perf_counter() - t0
        time.sleep(0.02)


def _time_baseline(prom: str, start: float, end: float) -> float:
    rules = read_rules()
    names = set().union(*(sample_names(r) for r in rules))
    t0 = time.perf_counter()
    frame = PrometheusSource(prom).read_frame(names, start, end, STEP_S)
    diagnose(frame, rules)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=20)
    ap.add_argument("--webhooks", type=int, default=5)
    ap.add_argument("--scrape-seconds", type=float, default=30)
    args = ap.parse_args()
    prom_port, serve_port = free_port(), free_port()
    prom, serve = f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{serve_port}"
    capture = static_body_handler(CAPTURE.read_bytes())
    with (
        tempfile.TemporaryDirectory(prefix="kvscope-webhook-") as d,
        serving(capture) as target,
        ProcessGroup(Path(d), stop_timeout_s=30) as procs,
    ):
        tmp = Path(d)
        targets = [
            {
                "targets": [f"127.0.0.1:{target.server_address[1]}"],
                "labels": {"__metrics_path__": f"/e/{i}", "instance": f"engine-{i}:8000"},
            }
            for i in range(args.engines)
        ]
        (tmp / "prometheus.yml").write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s"},
                    "scrape_configs": [{"job_name": "vllm", "static_configs": targets}],
                }
            )
        )
        started = [
            procs.start("prometheus", prometheus_argv(tmp / "prometheus.yml", tmp / "tsdb", prom_port)),
            procs.start(
                "serve",
                [
                    sys.executable,
                    "-m",
                    "kvscope.cli",
                    "serve",
                    "--prometheus",
                    prom,
                    "--listen",
                    f"127.0.0.1:{serve_port}",
                    "--store",
                    str(tmp / "d.sqlite"),
                    "--step",
                    f"{STEP_S:g}s",
                    "--before",
                    f"{BEFORE_S:g}s",
                ],
            ),
        ]
        wait_http(prom + "/-/ready", 30, procs=started, request_timeout_s=1, interval_s=0.2)
        wait_http(serve + "/-/healthy", 30, procs=started, request_timeout_s=1, interval_s=0.2)
        time.sleep(args.scrape_seconds)
        now = time.time()
        hooks = [_time_webhook(serve, _webhook(f"engine-{i}:8000", now - 30)) for i in range(args.webhooks)]
        end = time.time()
        base = [_time_baseline(prom, end - 30 - BEFORE_S, end) for _ in range(args.webhooks)]
    hook_med, base_med = statistics.median(hooks), statistics.median(base)
    print(
        f"{args.engines} engines (real vLLM 0.32 capture) in Prometheus 2.42, window {BEFORE_S + 30:g}s "
        f"at {STEP_S:g}s steps, {args.webhooks} webhooks"
    )
    print(
        f"webhook -> stored diagnosis   median {hook_med * 1000:8.1f} ms  (min {min(hooks) * 1000:.1f}, "
        f"max {max(hooks) * 1000:.1f})"
    )
    print(f"baseline read + diagnose      median {base_med * 1000:8.1f} ms  (in-process, same window)")
    print(f"ratio webhook / baseline      {hook_med / base_med:8.2f}x")


if __name__ == "__main__":
    main()
