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
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml
from kvscope.diagnoser.engine import diagnose, sample_names
from kvscope.diagnoser.rule import read_rules
from kvscope.diagnoser.sources.prometheus import PrometheusSource

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = ROOT / "tests" / "fixtures" / "scrapes" / "vllm-0.32.0-cpu-after-load.txt"
STEP_S, BEFORE_S = 15.0, 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_capture() -> ThreadingHTTPServer:
    body = CAPTURE.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _wait(url: str, timeout_s: float = 30) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(url)


def _webhook(instance: str, starts_at: float) -> bytes:
    stamp = datetime.fromtimestamp(starts_at, UTC).isoformat().replace("+00:00", "Z")
    return json.dumps({"version": "4", "status": "firing", "receiver": "kvscope", "alerts": [{
        "status": "firing", "startsAt": stamp, "endsAt": "0001-01-01T00:00:00Z", "fingerprint": instance,
        "labels": {"alertname": "LlmKvPressurePreemption", "rule_id": "kv_pressure_preemption",
                   "instance": instance, "severity": "warning"}, "annotations": {}}]}).encode()


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
    target = _serve_capture()
    prom_port, serve_port = _free_port(), _free_port()
    prom, serve = f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{serve_port}"
    with tempfile.TemporaryDirectory(prefix="kvscope-webhook-") as d:
        tmp = Path(d)
        targets = [{"targets": [f"127.0.0.1:{target.server_address[1]}"],
                    "labels": {"__metrics_path__": f"/e/{i}", "instance": f"engine-{i}:8000"}}
                   for i in range(args.engines)]
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s"}, "scrape_configs": [{"job_name": "vllm", "static_configs": targets}]}))
        procs = [
            subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                              f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
            subprocess.Popen([sys.executable, "-m", "kvscope.cli", "serve", "--prometheus", prom,
                              "--listen", f"127.0.0.1:{serve_port}", "--store", str(tmp / "d.sqlite"),
                              "--step", f"{STEP_S:g}s", "--before", f"{BEFORE_S:g}s"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        ]
        try:
            _wait(prom + "/-/ready")
            _wait(serve + "/-/healthy")
            time.sleep(args.scrape_seconds)
            now = time.time()
            hooks = [_time_webhook(serve, _webhook(f"engine-{i}:8000", now - 30)) for i in range(args.webhooks)]
            end = time.time()
            base = [_time_baseline(prom, end - 30 - BEFORE_S, end) for _ in range(args.webhooks)]
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=30)
            target.shutdown()
            target.server_close()
    hook_med, base_med = statistics.median(hooks), statistics.median(base)
    print(f"{args.engines} engines (real vLLM 0.32 capture) in Prometheus 2.42, window {BEFORE_S + 30:g}s "
          f"at {STEP_S:g}s steps, {args.webhooks} webhooks")
    print(f"webhook -> stored diagnosis   median {hook_med * 1000:8.1f} ms  (min {min(hooks) * 1000:.1f}, "
          f"max {max(hooks) * 1000:.1f})")
    print(f"baseline read + diagnose      median {base_med * 1000:8.1f} ms  (in-process, same window)")
    print(f"ratio webhook / baseline      {hook_med / base_med:8.2f}x")


if __name__ == "__main__":
    main()
