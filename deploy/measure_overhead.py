"""Agent overhead benchmark: CPU and resident memory of a real `kvscope agent` scraping a node's
worth of targets, against a named baseline, Prometheus (Debian 2.42) scraping the same targets
at the same interval, in one run. The numbers size the DaemonSet's requests/limits and the
systemd unit's MemoryHigh/MemoryMax (deploy/README.md, "Resources").

Targets are local HTTP servers in this process replaying real captures: N vLLM engines
(tests/fixtures/scrapes/vllm-0.32.0-cpu-after-load.txt) and one dcgm-exporter (2 GPUs). Only
the measured process (and its children) is counted, never the target servers. The agent keeps
its SQLite history on disk, as deployed.

    .venv/bin/python deploy/measure_overhead.py --engines 8 --interval 5 --seconds 120
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import yaml
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
SCRAPES = ROOT / "tests" / "fixtures" / "scrapes"
VLLM = SCRAPES / "vllm-0.32.0-cpu-after-load.txt"
DCGM = SCRAPES / "dcgm-exporter-4.5.3-constructed-2gpu.txt"


def serve_capture(path: Path) -> tuple[ThreadingHTTPServer, int]:
    """Serve one capture as /metrics on a free 127.0.0.1 port, from a daemon thread."""
    body = path.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server API
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            if not isinstance(sys.exc_info()[1], ConnectionError):  # a scraper that gave up
                super().handle_error(request, client_address)

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_command(work: Path, targets: list[tuple[str, int]], interval: float, port: int) -> list[str]:
    cfg = {
        "scrape": {"interval_s": interval, "timeout_s": min(5.0, interval / 2)},
        "targets": [
            {"url": f"http://127.0.0.1:{p}/metrics", "job": job, **({"engine": "dcgm"} if job == "dcgm" else {})}
            for job, p in targets
        ],
        "store": {"path": str(work / "kvscope.db")},
    }
    (work / "kvscope.yaml").write_text(yaml.safe_dump(cfg))
    kvscope = str(Path(sys.executable).with_name("kvscope"))
    return [
        kvscope,
        "agent",
        f"--config={work / 'kvscope.yaml'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log-level=warning",
    ]


def prometheus_command(work: Path, targets: list[tuple[str, int]], interval: float, port: int) -> list[str]:
    jobs: dict[str, list[str]] = {}
    for job, p in targets:
        jobs.setdefault(job, []).append(f"127.0.0.1:{p}")
    cfg = {
        "global": {
            "scrape_interval": f"{round(interval * 1000)}ms",
            "scrape_timeout": f"{round(min(5.0, interval / 2) * 1000)}ms",
        },
        "scrape_configs": [{"job_name": j, "static_configs": [{"targets": t}]} for j, t in jobs.items()],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    return [
        shutil.which("prometheus") or "prometheus",
        f"--config.file={work / 'prometheus.yml'}",
        f"--storage.tsdb.path={work / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready after {timeout_s}s")


def cpu_seconds(proc: psutil.Process) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def rss_bytes(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def targets_up(name: str, base_url: str) -> int:
    """How many targets the measured system reports up: a run that scraped nothing is void."""
    if name == "prometheus":
        with urllib.request.urlopen(f"{base_url}/api/v1/query?query=count(up%3D%3D1)", timeout=5) as r:
            result = json.load(r)["data"]["result"]
        return int(float(result[0]["value"][1])) if result else 0
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return sum(1 for x in lines if x.startswith("kvscope_target_up{") and float(x.rsplit(" ", 1)[1]) == 1)


def measure(name: str, argv: list[str], base_url: str, warmup_s: float, seconds: float) -> dict[str, float]:
    """Run `argv`, wait until ready plus warmup_s, then measure CPU and RSS for `seconds`."""
    ready_url = f"{base_url}/-/ready"
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        wait_ready(ready_url, proc)
        ps = psutil.Process(proc.pid)
        time.sleep(warmup_s)
        cpu0, t0, rss = cpu_seconds(ps), time.monotonic(), []
        with tqdm(total=int(seconds), desc=f"{name:<10}", unit="s", file=sys.stderr) as bar:
            while (elapsed := time.monotonic() - t0) < seconds:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}: {proc.stderr.read()[-2000:]!r}")
                rss.append(rss_bytes(ps))
                bar.update(int(elapsed) - bar.n)
                time.sleep(0.5)
        wall = time.monotonic() - t0
        cpu = cpu_seconds(ps) - cpu0
        return {
            "targets_up": targets_up(name, base_url),
            "cpu_cores": cpu / wall,
            "rss_peak_mib": max(rss) / 2**20,
            "rss_mean_mib": sum(rss) / len(rss) / 2**20,
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=8, help="vLLM targets to serve (plus one dcgm-exporter)")
    ap.add_argument("--interval", type=float, default=5.0, help="scrape interval in seconds for both systems")
    ap.add_argument("--seconds", type=float, default=120.0, help="measured window per system")
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds after ready before measuring")
    args = ap.parse_args(argv)

    servers = [serve_capture(VLLM) for _ in range(args.engines)] + [serve_capture(DCGM)]
    targets = [("vllm", p) for _, p in servers[:-1]] + [("dcgm", servers[-1][1])]
    results = {}
    with tempfile.TemporaryDirectory(prefix="kvscope-overhead-") as tmp:
        for name, build in (("kvscope", agent_command), ("prometheus", prometheus_command)):
            work = Path(tmp) / name
            work.mkdir()
            port = free_port()
            results[name] = measure(
                name, build(work, targets, args.interval, port), f"http://127.0.0.1:{port}", args.warmup, args.seconds
            )
    for server, _ in servers:
        server.shutdown()

    a, b = results["kvscope"], results["prometheus"]
    for name, r in results.items():
        if r["targets_up"] != len(targets):
            print(f"void run: {name} reports {r['targets_up']} of {len(targets)} targets up", file=sys.stderr)
            return 1
    print(
        f"targets: {args.engines} vLLM + 1 dcgm-exporter, interval {args.interval:g}s, "
        f"window {args.seconds:g}s after {args.warmup:g}s warm-up"
    )
    print(f"{'':<24}{'kvscope agent':>15}{'prometheus':>15}{'ratio':>9}")
    for key, label in (
        ("cpu_cores", "CPU (cores)"),
        ("rss_mean_mib", "RSS mean (MiB)"),
        ("rss_peak_mib", "RSS peak (MiB)"),
    ):
        print(f"{label:<24}{a[key]:>15.3f}{b[key]:>15.3f}{a[key] / b[key]:>8.2f}x")
    print(
        json.dumps(
            {
                "engines": args.engines,
                "interval_s": args.interval,
                **{f"{n}_{k}": round(v, 4) for n, r in results.items() for k, v in r.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
