"""Benchmark: `kvscope diagnose --prometheus` on a real Prometheus holding a fleet, end to end.

The fleet is N vLLM engines x T written from the real vLLM 0.32 /metrics capture
(testbed/fleetgen/capture_fleet.py: its 204 series the catalog reads per engine, 15 s scrapes,
a tenth of the engines through a KV-pressure episode), with 1.1 h of data before the window (a
live fleet has history). It is backfilled into a real Prometheus (Debian 2.42) with promtool
(blocks cached under /tmp/kvscope-bench-fleet/ between runs) and, with --victoria, imported into
a real VictoriaMetrics.

Timed, per size: the whole `kvscope diagnose --prometheus URL --start S --end E --json` command
as a subprocess (`--pushdown on`), its peak RSS, and the TSDB's peak RSS (VmHWM); the named
baseline measured in the same run: the old path's raw query (every raw series of every engine,
one `query_range`, split only where Prometheus' 11k points per series forces it), HTTP + JSON
only, which is the floor of what the old path cost (it then spent 80 % more in parsing).
With --compare, the full-fetch path (`--pushdown off`) runs too and the findings must be equal.

    .venv/bin/python bench/diagnose_fleet.py --sizes 50x1,100x1,200x1 --compare
    .venv/bin/python bench/diagnose_fleet.py --sizes 200x6 --victoria
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvscope.diagnoser.evaluate.evaluator import sample_names  # noqa: E402
from kvscope.diagnoser.rulebook.rule import read_rules  # noqa: E402
from kvscope.diagnoser.sources.promapi import PromClient  # noqa: E402
from kvscope.diagnoser.sources.prometheus import selector_for  # noqa: E402

from testbed.prometheus import EMPTY_CONFIG, backfill_openmetrics, running_prometheus  # noqa: E402

CACHE = Path(os.environ.get("KVSCOPE_BENCH_CACHE", "/tmp/kvscope-bench-fleet"))
WINDOW_END = 1_800_000_000.0 + 8 * 3600
WARMUP_S = 1.1 * 3600
STEP = 15.0
GOALS = {(100, 1): (5.0, None), (200, 6): (15.0, 1.0)}
VM_SHIFT_S = -120 * 86400.0
"""VictoriaMetrics refuses samples far in the future: its copy of the fleet is 120 days earlier."""


def dataset(engines: int, hours: float, victoria: bool = False) -> Path:
    """The OpenMetrics file (and promtool blocks) for engines x hours, generated once."""
    from testbed.fleetgen.capture_fleet import write_capture_fleet

    d = CACHE / f"{engines}x{hours:g}h"
    om = d / "fleet.om"
    meta = d / "meta.json"
    if not meta.exists():
        d.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with om.open("w") as fh:
            info = write_capture_fleet(fh, engines, WINDOW_END - hours * 3600 - WARMUP_S, WINDOW_END, STEP)
        info["generate_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        backfill_openmetrics(om, d / "data", timeout_s=7200)
        info["backfill_s"] = time.perf_counter() - t0
        meta.write_text(json.dumps(info))
    info = json.loads(meta.read_text())
    print(f"dataset {engines} engines x {hours:g} h (+{WARMUP_S / 3600:.1f} h before): {info['samples']:,} samples; "
          f"generated in {info['generate_s']:.0f} s, promtool backfill {info['backfill_s']:.0f} s", flush=True)
    return d


def run_command(argv: list[str]) -> tuple[float, float, int, str]:
    """(wall s, peak RSS GB, exit status, stdout) of one command."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    # ru_maxrss of the children waited so far is a max over them: run the big ones last (see main)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6
    if err.strip():
        for line in err.strip().splitlines()[-8:]:
            print(f"    | {line}")
    return wall, rss, proc.returncode, out


def child_rss(argv: list[str]) -> tuple[float, float, int, str]:
    """Like run_command, but the peak RSS of this one child (wait4)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out_chunks = []
    import threading

    def read(stream, sink):
        sink.append(stream.read())
    errs: list[str] = []
    th = [threading.Thread(target=read, args=(proc.stdout, out_chunks)),
          threading.Thread(target=read, args=(proc.stderr, errs))]
    for t in th:
        t.start()
    _, status, usage = os.wait4(proc.pid, 0)
    for t in th:
        t.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    for line in "".join(errs).strip().splitlines()[-6:]:
        print(f"    | {line}")
    return wall, usage.ru_maxrss / 1e6, proc.returncode, "".join(out_chunks)


def vm_hwm(pid: int) -> float:
    """Peak resident memory (GB) of a process so far."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1e6
    return float("nan")


def findings(out: str) -> list[tuple]:
    d = json.loads(out)
    fs = ([d["likely_cause"]] if d.get("likely_cause") else []) + d.get("competing", []) + d.get("other", [])
    return sorted((f["rule_id"], tuple(sorted(f["where"].items())), f["since"], f["severity"]) for f in fs)


def baseline_fetch(url: str, start: float, end: float) -> tuple[float, float, int]:
    """The old path's raw fetch: every raw series of every engine (seconds, MB, points)."""
    names = set().union(*(sample_names(r) for r in read_rules()))
    client = PromClient(url, timeout_s=600)
    t0 = time.perf_counter()
    try:
        client.range_parts(selector_for(names, client_catalog()), start, end, STEP, what="baseline")
    except Exception as exc:  # noqa: BLE001 - report what the server said
        print(f"    baseline raw fetch failed: {exc}")
        return float("nan"), client.stats["bytes"] / 1e6, int(client.stats["points"])
    return time.perf_counter() - t0, client.stats["bytes"] / 1e6, int(client.stats["points"])


def client_catalog():
    from kvscope.agent.signals import load_catalog
    return load_catalog()


def bench_size(engines: int, hours: float, compare: bool, tsdb: str, url: str, pid: int,
               shift_s: float = 0.0) -> dict:
    start, end = WINDOW_END - hours * 3600 + shift_s, WINDOW_END + shift_s
    kv = [str(ROOT / ".venv" / "bin" / "kvscope"), "diagnose", "--prometheus", url, "--start", f"{start:.0f}",
          "--end", f"{end:.0f}", "--json"]
    print(f"  {tsdb}: kvscope diagnose --pushdown on ...", flush=True)
    wall, rss, code, out = child_rss(kv + ["--pushdown", "on"])
    got = findings(out) if out.strip() else []
    row = {"engines": engines, "hours": hours, "tsdb": tsdb, "wall_s": wall, "rss_gb": rss, "exit": code,
           "findings": len(got), "rules_fired": sorted({f[0] for f in got})}
    base_s, base_mb, base_pts = baseline_fetch(url, start, end)
    row.update(baseline_s=base_s, baseline_mb=base_mb, baseline_points=base_pts)
    if compare:
        print(f"  {tsdb}: kvscope diagnose --pushdown off (full fetch) ...", flush=True)
        fwall, frss, fcode, fout = child_rss(kv + ["--pushdown", "off"])
        full = findings(fout) if fout.strip() else None
        row.update(full_wall_s=fwall, full_rss_gb=frss, identical=(full == got))
        if full != got:
            print(f"    DIFFERENT: full only {sorted(set(full or []) - set(got))[:5]}, "
                  f"pushdown only {sorted(set(got) - set(full or []))[:5]}")
    row["tsdb_rss_gb"] = vm_hwm(pid)
    return row


def show(row: dict) -> None:
    goal = GOALS.get((row["engines"], int(row["hours"])))
    ratio = row["baseline_s"] / row["wall_s"] if row["wall_s"] else float("nan")
    line = (f"{row['tsdb']:10s} {row['engines']:5d} x {row['hours']:g} h: diagnose {row['wall_s']:6.2f} s "
            f"(exit {row['exit']}), kvscope peak RSS {row['rss_gb']:.2f} GB, "
            f"TSDB peak RSS {row['tsdb_rss_gb']:.2f} GB, "
            f"{row['findings']} findings | baseline raw fetch {row['baseline_s']:.2f} s "
            f"({row['baseline_points']:,} points, {row['baseline_mb']:.0f} MB): {ratio:.1f}x")
    if "full_wall_s" in row:
        line += (f" | full fetch {row['full_wall_s']:.2f} s, {row['full_rss_gb']:.2f} GB, "
                 f"findings identical: {row['identical']}")
    if goal:
        line += f" | goal < {goal[0]:g} s: {row['wall_s'] / goal[0]:.2f}x of it"
        if goal[1]:
            line += f"; < {goal[1]:g} GB: {row['rss_gb'] / goal[1]:.2f}x of it"
    print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="50x1,100x1,200x1", help="engines x hours, comma-separated")
    ap.add_argument("--compare", action="store_true", help="also run the full fetch and compare findings")
    ap.add_argument("--victoria", action="store_true", help="also against VictoriaMetrics")
    ap.add_argument("--no-prometheus", action="store_true")
    args = ap.parse_args()
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        sys.exit("prometheus/promtool not installed (scripts/setup.sh)")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    rows = []
    for size in args.sizes.split(","):
        engines, hours = (float(x) for x in size.split("x"))
        d = dataset(int(engines), hours)
        if not args.no_prometheus:
            cfg = d / "prometheus.yml"
            cfg.write_text(EMPTY_CONFIG)
            with running_prometheus(cfg, d / "data", "--storage.tsdb.retention.time=100y",
                                    log_path=d / "prometheus.log") as prom:
                rows.append(bench_size(int(engines), hours, args.compare, "prometheus", prom.url, prom.proc.pid))
                show(rows[-1])
        if args.victoria:
            from testbed.victoria import import_prometheus_text, running_victoria
            with running_victoria(d / "vm-data", "-search.maxQueryDuration=10m", log_path=d / "vm.log") as vm:
                if not (d / "vm-data" / "imported").exists():
                    t0 = time.perf_counter()
                    import_prometheus_text(vm.url, d / "fleet.om", shift_s=VM_SHIFT_S)
                    print(f"  victoria-metrics import {time.perf_counter() - t0:.0f} s", flush=True)
                    (d / "vm-data" / "imported").write_text("")
                rows.append(bench_size(int(engines), hours, args.compare, "victoria", vm.url, vm.proc.pid,
                                       shift_s=VM_SHIFT_S))
                show(rows[-1])
    print("\nsummary (client cost against engines x window):")
    for row in rows:
        show(row)


if __name__ == "__main__":
    main()
