"""Benchmark: `kvscope diagnose --log` over one vLLM log line from each of N pods (issue 41 N4).

Writes N stats lines (vLLM's `loggers.py` "Engine 000: Avg prompt throughput ..." format, the
kubectl `--prefix` form `[pod/vllm-N/vllm]`), one per pod, spread over an hour, every pod's KV
cache at 95 %, and times the real CLI on it (a subprocess, start-up included). Prints the wall
time, the peak RSS of the child and the exit code.

    .venv/bin/python bench/diagnose_log_pods.py [--pods 5000] [--timeout 1800]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time


def line(pod: int, second: int, kv: float = 95.0) -> str:
    return (
        f"[pod/vllm-{pod}/vllm] INFO 05-01 10:{second // 60:02d}:{second % 60:02d} [loggers.py:335] Engine 000: "
        "Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 50.0 tokens/s, Running: 3 reqs, "
        f"Waiting: 1 reqs, GPU KV cache usage: {kv}%, Prefix cache hit rate: 10.0%\n"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pods.log")
        with open(path, "w") as f:
            f.writelines(line(pod, pod % 3600) for pod in range(args.pods))
        cmd = [sys.executable, "-m", "kvscope", "diagnose", "--log", path, "--date", "2026-05-01", "-q", "--json"]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            rc, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired:
            rc, err = None, f"killed after {args.timeout:g} s"
        wall = time.monotonic() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"pods={args.pods} wall={wall:.1f}s peak_rss={peak:.0f}MiB exit={rc}")
    print(err.strip()[-2000:], file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
