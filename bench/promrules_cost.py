"""Benchmark: what kvscope's generated Prometheus rules cost a real Prometheus.

N vLLM engines (the real vLLM 0.32 CPU capture from tests/fixtures, one target each) are
scraped by a real Prometheus 2.42 on 127.0.0.1 in three configurations, one after the other:

  baseline   no rule files: what scraping the engines costs on its own
  all        every generated file, the canonical layer recording every catalog signal
             (`kvscope rules build --canonical all`)
  used       as shipped: the canonical layer records only the kvscope:* series that the other
             generated files read (`--canonical used`, the default)

After a warm-up it reads Prometheus' own metrics: head series, rule-evaluation time per cycle
(prometheus_rule_group_last_duration_seconds, summed over groups; kvscope-curve.yml's group runs
every minute, the others every `--interval`) and CPU seconds per second, and prints each
configuration against the baseline and each group's last evaluation.

    .venv/bin/python bench/promrules_cost.py [--engines 50] [--seconds 60] [--interval 5]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from kvscope.core.signals import load_catalog
from kvscope.diagnoser.curve.records import curve_file
from kvscope.diagnoser.promql.build import build_all

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # testbed/ (test tooling at the repo root, not installed)
from testbed.httpstub import serving, static_body_handler  # noqa: E402
from testbed.procs import free_port, running  # noqa: E402
from testbed.prometheus import prometheus_argv  # noqa: E402

CAPTURE = ROOT / "tests" / "fixtures" / "scrapes" / "vllm-0.32.0-cpu-after-load.txt"


def _build(tmp: Path, canonical: str) -> list[Path]:
    """Every generated rule file, built with `--canonical used|all`, written under tmp."""
    out = tmp / f"rules-{canonical}"
    out.mkdir()
    curve = curve_file(load_catalog())  # kvscope-curve.yml at its default interval (1m)
    for name, text in build_all(canonical=canonical, curve=curve).rule_files.items():
        (out / name).write_text(text)
    return sorted(out.glob("*.yml"))


def _own_metric(port: int, name: str) -> float:
    """Sum of one of Prometheus' own metrics, read from its /metrics (it does not scrape itself here)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def _per_group(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    pattern = r'^prometheus_rule_group_last_duration_seconds{rule_group="[^"]*;([^"]+)"} (\S+)$'
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, text, re.M)}


def run(
    name: str, rule_files: list[Path], engines: int, seconds: float, interval: int, tmp: Path, target_port: int
) -> dict[str, float]:
    port = free_port()
    work = tmp / name
    work.mkdir()
    targets = [
        {
            "targets": [f"127.0.0.1:{target_port}"],
            "labels": {"__metrics_path__": f"/e/{i}", "instance": f"engine-{i}:8000"},
        }
        for i in range(engines)
    ]
    (work / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": f"{interval}s", "evaluation_interval": f"{interval}s"},
                "rule_files": [str(p) for p in rule_files],
                "scrape_configs": [{"job_name": "vllm", "static_configs": targets}],
            }
        )
    )
    with running(
        prometheus_argv(work / "prometheus.yml", work / "tsdb", port), work / "prometheus.log", stop_timeout_s=30
    ):
        time.sleep(seconds / 2)  # warm-up: targets scraped, rules evaluated
        cpu0, t0 = _own_metric(port, "process_cpu_seconds_total"), time.time()
        time.sleep(seconds / 2)
        cpu1, t1 = _own_metric(port, "process_cpu_seconds_total"), time.time()
        groups = _per_group(port)
        return {
            "groups": groups,
            "head_series": _own_metric(port, "prometheus_tsdb_head_series"),
            "rule_eval_s": _own_metric(port, "prometheus_rule_group_last_duration_seconds"),
            "rules": _own_metric(port, "prometheus_rule_group_rules"),
            "cpu_per_s": (cpu1 - cpu0) / (t1 - t0),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--interval", type=int, default=5)
    args = ap.parse_args()
    with (
        serving(static_body_handler(CAPTURE.read_bytes())) as server,
        tempfile.TemporaryDirectory(prefix="kvscope-promrules-") as d,
    ):
        tmp = Path(d)
        configs = {"baseline": [], "all": _build(tmp, "all"), "used": _build(tmp, "used")}
        results = {
            name: run(name, files, args.engines, args.seconds, args.interval, tmp, server.server_address[1])
            for name, files in configs.items()
        }
    base = results["baseline"]
    print(
        f"{args.engines} vLLM engines (real 0.32 capture), scrape + eval every {args.interval}s, "
        f"Prometheus 2.42, {args.seconds:g}s per run"
    )
    print(
        f"{'config':<10} {'rules':>6} {'head series':>12} {'x baseline':>10} {'rule eval/cycle':>16} "
        f"{'% of interval':>13} {'CPU s/s':>8} {'x baseline':>10}"
    )
    for name, r in results.items():
        ratio = r["head_series"] / base["head_series"]
        print(
            f"{name:<10} {r['rules']:>6.0f} {r['head_series']:>12.0f} {ratio:>10.2f} "
            f"{r['rule_eval_s'] * 1000:>13.1f} ms {100 * r['rule_eval_s'] / args.interval:>12.2f}% "
            f"{r['cpu_per_s']:>8.3f} {r['cpu_per_s'] / max(base['cpu_per_s'], 1e-9):>10.2f}"
        )
    for name, r in results.items():
        if r["groups"]:
            print(f"  {name}: " + ", ".join(f"{g} {v * 1000:.0f} ms" for g, v in sorted(r["groups"].items())))


if __name__ == "__main__":
    main()
