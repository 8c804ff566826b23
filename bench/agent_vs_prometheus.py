"""CPU cost of the kvscope agent against a real Prometheus scraping the same targets, in one run.

One local server process serves 9 targets on 9 ports: 8 vLLM engines (the real vLLM 0.32 CPU
capture, with gauges and counters moving on every scrape) and 1 dcgm-exporter (two GPUs, built
from the verified dcgm-exporter names in tests/fixtures). Then, at the same time and for the
same --duration:

* `kvscope agent` scrapes the 9 targets every --interval, normalizes and stores them in its
  SQLite store (host/NVML collectors off: only the shared scrape work is compared);
* the Debian `prometheus` binary scrapes the same 9 targets every --interval into its TSDB.

CPU-seconds of each process (utime + stime from /proc/<pid>/stat, all threads) are measured
between two snapshots taken once both have completed their first scrapes. Printed: each
process's CPU-seconds, the ratio agent / Prometheus (goal <= 1.0), and peak RSS (VmHWM; goal
for the agent < 100 MB).

    .venv/bin/python bench/agent_vs_prometheus.py --duration 60              # few values move
    .venv/bin/python bench/agent_vs_prometheus.py --duration 60 --churn all  # every value moves
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
VLLM = ROOT / "tests/fixtures/scrapes/vllm-0.32.0-cpu-after-load.txt"
DCGM = ROOT / "tests/fixtures/scrapes/dcgm-exporter-4.5.3-constructed-2gpu.txt"
ENGINES = 8
TICK = os.sysconf("SC_CLK_TCK")

# value updates per scrape: (line prefix, function of the scrape number n)
_VLLM_MOVES = (
    ("vllm:num_requests_running{", lambda n: n % 7),
    ("vllm:num_requests_waiting{", lambda n: n % 3),
    ("vllm:kv_cache_usage_perc{", lambda n: (n % 100) / 100),
    ("vllm:prefix_cache_queries_total{", lambda n: 16028 + 37 * n),
    ("vllm:prefix_cache_hits_total{", lambda n: 1152 + 11 * n),
    ("vllm:prompt_tokens_total{", lambda n: 20000 + 40 * n),
    ("vllm:generation_tokens_total{", lambda n: 9000 + 25 * n),
)
_DCGM_MOVES = (
    ("DCGM_FI_DEV_GPU_UTIL{", lambda n: 90 + n % 10),
    ("DCGM_FI_DEV_POWER_USAGE{", lambda n: 400 + (n * 7) % 100),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{", lambda n: 91827364512 + 450000 * n),
)


class MovingExposition:
    """A fixed exposition whose chosen lines get new values on every render.

    `churn="all"` moves every sample line instead (each value + n): the worst case for the
    agent's per-family memo, where every family changes on every scrape.
    """

    def __init__(self, text: str, moves, churn: str = "few") -> None:
        self.lines = text.splitlines()
        if churn == "all":
            self.slots = [(i, None) for i, ln in enumerate(self.lines) if ln and not ln.startswith("#")]
        else:
            self.slots = [(i, fn) for i, ln in enumerate(self.lines) for prefix, fn in moves if ln.startswith(prefix)]
        self.n = 0

    def render(self) -> bytes:
        self.n += 1
        lines = list(self.lines)
        for i, fn in self.slots:
            key, value = lines[i].rsplit(" ", 1)
            lines[i] = f"{key} {float(fn(self.n)) if fn else float(value) + self.n}"
        return ("\n".join(lines) + "\n").encode()


async def serve_targets(ports: list[int], churn: str) -> None:
    """The target server process: ENGINES vLLM ports, then one dcgm port."""
    from aiohttp import web

    runners = []
    for i, port in enumerate(ports):
        src = (
            MovingExposition(DCGM.read_text(), _DCGM_MOVES, churn)
            if i == ENGINES
            else MovingExposition(VLLM.read_text(), _VLLM_MOVES, churn)
        )

        async def handler(request, src=src):
            return web.Response(body=src.render(), content_type="text/plain", charset="utf-8")

        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
    print("serving", flush=True)
    await asyncio.Event().wait()


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.read()
    except OSError:
        return None


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (all threads)


def peak_rss_mb(pid: int) -> float:
    m = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(m.group(1)) / 1024 if m else float("nan")


def wait_for(pred, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.25)
    raise SystemExit(f"timed out waiting for {what}")


def prom_value(port: int, query: str) -> float | None:
    body = get(f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(query)}")
    if not body:
        return None
    result = json.loads(body)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def metric_value(text: str, name: str) -> float:
    total = 0.0
    for ln in text.splitlines():
        if ln.startswith(name + " ") or ln.startswith(name + "{"):
            total += float(ln.rsplit(" ", 1)[1])
    return total


def errors_by_reason(text: str) -> dict[str, float]:
    """kvscope_scrape_errors_total summed by its `reason` label."""
    out: dict[str, float] = {}
    for ln in text.splitlines():
        if ln.startswith("kvscope_scrape_errors_total{"):
            m = re.search(r'reason="([^"]*)"', ln)
            reason = m.group(1) if m else "?"
            out[reason] = out.get(reason, 0.0) + float(ln.rsplit(" ", 1)[1])
    return out


def start(argv: list[str], log: Path, **kw) -> subprocess.Popen:
    with open(log, "wb") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, **kw)


def agent_config(tmp: Path, urls: list[str], port: int, interval: float, store: str) -> Path:
    from kvscope.agent.runtime import known_collectors

    lines = [
        f"listen_address: 127.0.0.1:{port}",
        f"scrape: {{interval_s: {interval}, timeout_s: {interval * 0.8}}}",
        f"store: {{path: '{tmp / 'kvscope.db' if store == 'sqlite' else ''}'}}",
        "collectors: {" + ", ".join(f"{c}: {str(c == 'engine').lower()}" for c in known_collectors()) + "}",
        "targets:",
    ]
    for i, url in enumerate(urls):
        job = "dcgm" if i == ENGINES else "vllm"
        lines.append(f"  - {{url: '{url}', job: {job}}}")
    path = tmp / "kvscope.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def prometheus_config(tmp: Path, urls: list[str], interval: float) -> Path:
    hosts = [u.split("/")[2] for u in urls]
    path = tmp / "prometheus.yml"
    path.write_text(
        f"global: {{scrape_interval: {round(interval * 1000)}ms, "
        f"scrape_timeout: {round(interval * 800)}ms}}\n"
        "scrape_configs:\n  - job_name: engines\n"
        f"    static_configs: [{{targets: {json.dumps(hosts)}}}]\n"
    )
    return path


def run(args: argparse.Namespace) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise SystemExit("prometheus not installed (scripts/setup.sh installs the Debian package)")
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="kvscope-bench-") as d:
        tmp = Path(d)
        ports = free_ports(ENGINES + 3)
        target_ports, agent_port, prom_port = ports[: ENGINES + 1], ports[-2], ports[-1]
        urls = [f"http://127.0.0.1:{p}/metrics" for p in target_ports]
        try:
            procs.append(
                start(
                    [sys.executable, __file__, "--churn", args.churn, "--serve", ",".join(map(str, target_ports))],
                    tmp / "targets.log",
                )
            )
            wait_for(lambda: all(get(u) for u in urls), 30, "target server")
            config = agent_config(tmp, urls, agent_port, args.interval, args.agent_store)
            agent = start([sys.executable, "-m", "kvscope", "agent", "--config", str(config)], tmp / "agent.log")
            procs.append(agent)
            prom = start(
                [
                    prometheus,
                    f"--config.file={prometheus_config(tmp, urls, args.interval)}",
                    f"--storage.tsdb.path={tmp / 'prom'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                tmp / "prometheus.log",
                cwd=tmp,
            )
            procs.append(prom)
            wait_for(lambda: get(f"http://127.0.0.1:{agent_port}/-/ready"), 60, "agent ready")
            wait_for(lambda: prom_value(prom_port, "sum(up)") == ENGINES + 1, 60, "prometheus scraping all targets")
            measure(args, agent, prom, agent_port, prom_port)
            if args.agent_store == "sqlite":
                print_store_rows(tmp / "kvscope.db")
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()


def measure(args, agent, prom, agent_port: int, prom_port: int) -> None:
    appended = "prometheus_tsdb_head_samples_appended_total"  # read from Prometheus's own /metrics
    p_samples0 = metric_value((get(f"http://127.0.0.1:{prom_port}/metrics") or b"").decode(), appended)
    metrics0 = (get(f"http://127.0.0.1:{agent_port}/metrics") or b"").decode()
    a_samples0 = metric_value(metrics0, "kvscope_store_samples_written_total")
    cycles0 = metric_value(metrics0, "kvscope_cycles_total")
    a0, p0, t0 = cpu_seconds(agent.pid), cpu_seconds(prom.pid), time.monotonic()
    for _ in tqdm(range(int(args.duration)), desc="both scraping", unit="s"):
        time.sleep(1)
    a1, p1, wall = cpu_seconds(agent.pid), cpu_seconds(prom.pid), time.monotonic() - t0
    metrics = (get(f"http://127.0.0.1:{agent_port}/metrics") or b"").decode()
    a_samples = metric_value(metrics, "kvscope_store_samples_written_total") - a_samples0
    p_samples = metric_value((get(f"http://127.0.0.1:{prom_port}/metrics") or b"").decode(), appended) - p_samples0
    up = metric_value(metrics, "kvscope_target_up")
    cycles = metric_value(metrics, "kvscope_cycles_total") - cycles0
    errors = metric_value(metrics, "kvscope_scrape_errors_total")
    reasons = ", ".join(f"{r} {n:.0f}" for r, n in sorted(errors_by_reason(metrics).items()))
    agent_cpu, prom_cpu = a1 - a0, p1 - p0
    window = f"{max(1, round(wall))}s"  # scrapes Prometheus saw fail in the window (same targets)
    p_failed = prom_value(prom_port, f"sum(count_over_time(up[{window}])) - sum(sum_over_time(up[{window}]))")
    print(
        f"\n{ENGINES} vLLM + 1 dcgm target, interval {args.interval:g}s, churn {args.churn}, "
        f"agent store {args.agent_store}, "
        f"measured over {wall:.1f}s wall"
    )
    print(
        f"kvscope agent : {agent_cpu:6.2f} CPU-s ({100 * agent_cpu / wall:5.1f}% of a core), "
        f"peak RSS {peak_rss_mb(agent.pid):6.1f} MB, {a_samples:,.0f} canonical samples stored, "
        f"targets up {up:.0f}/{ENGINES + 1}, scrape errors {errors:.0f}" + (f" ({reasons})" if reasons else "")
    )
    print(
        f"prometheus    : {prom_cpu:6.2f} CPU-s ({100 * prom_cpu / wall:5.1f}% of a core), "
        f"peak RSS {peak_rss_mb(prom.pid):6.1f} MB, {p_samples:,.0f} raw samples appended, "
        f"failed scrapes {p_failed if p_failed is None else round(p_failed)} (last {window})"
    )
    print(
        f"per cycle: agent {1000 * agent_cpu / max(1.0, cycles):.1f} ms CPU over {cycles:.0f} cycles "
        f"(last cycle took {1000 * metric_value(metrics, 'kvscope_cycle_duration_seconds'):.1f} ms wall); "
        f"prometheus {1000 * prom_cpu / max(1.0, wall / args.interval):.1f} ms CPU per interval"
    )
    print(f"CPU ratio agent / prometheus: {agent_cpu / prom_cpu:.2f}  (goal <= 1.0)")
    print(f"agent peak RSS: {peak_rss_mb(agent.pid):.1f} MB  (goal < 100 MB)")


def print_store_rows(path: Path) -> None:
    """How the agent's SQLite store holds what it was given (change points, agent/store/sqlite.py)."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        counts = {
            t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]  # noqa: S608 - fixed names
            for t in ("samples", "stamps", "marks")
        }
    except sqlite3.Error as e:
        print(f"agent store: cannot read {path}: {e}")
        return
    finally:
        conn.close()
    print(
        f"agent store rows (whole run): {counts['samples']:,} change points, {counts['stamps']:,} scrape "
        f"stamps, {counts['marks']:,} run marks"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds measured (default 60)")
    ap.add_argument("--interval", type=float, default=1.0, help="scrape interval of both, seconds (default 1)")
    ap.add_argument(
        "--churn",
        choices=("few", "all"),
        default="few",
        help="few: 7 vLLM and 3 dcgm values move per scrape (default); all: every value moves",
    )
    ap.add_argument(
        "--agent-store",
        choices=("sqlite", "memory"),
        default="sqlite",
        help="the agent's history: SQLite file (default, as deployed) or in memory, to "
        "separate the store's share of the CPU",
    )
    ap.add_argument("--serve", help=argparse.SUPPRESS)  # internal: run the target server process
    args = ap.parse_args()
    if args.serve:
        asyncio.run(serve_targets([int(p) for p in args.serve.split(",")], args.churn))
    else:
        run(args)


if __name__ == "__main__":
    main()
