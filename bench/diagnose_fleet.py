"""Benchmark: `kvscope diagnose --prometheus` on a fleet in a real TSDB, end to end, at several sizes.

The fleet is N vLLM engines x T from the real vLLM 0.32 /metrics capture
(testbed/fleetgen/capture_fleet.py: the 204 series the catalog reads per engine, 15 s scrapes, a
tenth of the engines through a KV-pressure episode from 55 % to 75 % of the span), with 1.1 h of
data before the window (a live fleet has history, and the rules reach up to an hour back).

TSDBs (say which one each number is from):
* VictoriaMetrics 1.79 (Debian `victoria-metrics`), every size: the fleet is streamed into
  `/api/v1/import` as JSON lines, 120 days earlier than the Prometheus copy (VictoriaMetrics
  refuses samples far in the future). Its data directories are kept under $KVSCOPE_BENCH_CACHE
  (/tmp/kvscope-bench-fleet2) between runs. It runs as it ships, with its rollup cache on, and
  the cache is emptied before every timed command, so that no command reuses another's work
  (`--vm-cache off`: `-search.disableCache`, what rounds 1-3 measured).
* Prometheus 2.42 (Debian), the sizes of --prometheus: the fleet written as OpenMetrics and
  backfilled with `promtool tsdb create-blocks-from openmetrics` (much slower to build).
* With --recorded-quantiles, a copy of each --prometheus size with kvscope's recorded quantiles
  (rules/prometheus/kvscope-quantiles.yml, diagnoser/promql/quantiles.py) backfilled the same way.
* With --recording-rules, a copy of each with kvscope's canonical recording rules
  (rules/prometheus/kvscope-canonical.yml) evaluated over the whole span: `promtool tsdb
  create-blocks-from rules` for Prometheus (which evaluates rules only live), `vmalert
  -replay.timeFrom/-replay.timeTo` (shipped in the Debian package) for VictoriaMetrics.

Measured per TSDB and size, in one run, each command a subprocess: the whole `kvscope diagnose
--prometheus URL --start S --end E --json --pushdown on` (wall, peak RSS, CPU seconds, what its
summary line says it fetched), the named baseline: the old path's raw query (every raw series of
every engine in one `query_range`, cut only where 11k points per series forces it, read with the
json module as round 1's client did: HTTP + JSON only, the floor of what the old path cost), and
with --compare the full fetch (`--pushdown off`), whose whole Diagnosis (findings, onsets,
evidence, scores, skipped rules) must equal the pushdown's. The load average is printed with
every number: the box is shared. `--repeat N` times the pushdown N times and reports the median
(and the range): this box's speed changes by up to 2x within the hour.

    .venv/bin/python bench/diagnose_fleet.py --sizes 50x1,100x1,200x1,200x6 --compare
    .venv/bin/python bench/diagnose_fleet.py --sizes 100x1 --prometheus 100x1 --recording-rules
    .venv/bin/python bench/diagnose_fleet.py --sizes "" --prometheus 200x6 --recorded-quantiles --compare
    .venv/bin/python bench/diagnose_fleet.py --sizes 1000x6 --weekly 100x168
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvscope.agent.signals import load_catalog  # noqa: E402
from kvscope.diagnoser.evaluate.evaluator import sample_names  # noqa: E402
from kvscope.diagnoser.rulebook.rule import read_rules  # noqa: E402
from kvscope.diagnoser.sources.prometheus import selector_for  # noqa: E402
from testbed.prometheus import EMPTY_CONFIG, backfill_openmetrics, running_prometheus  # noqa: E402
from testbed.victoria import reset_cache, running_victoria  # noqa: E402

CACHE = Path(os.environ.get("KVSCOPE_BENCH_CACHE", "/tmp/kvscope-bench-fleet2"))
WINDOW_END = 1_800_000_000.0 + 8 * 3600
WARMUP_S = 1.1 * 3600
STEP = 15.0
GOALS = {(100, 1.0): (5.0, None), (200, 6.0): (15.0, 1.0)}
WEEKLY_GOAL_S = 30.0
VM_SHIFT_S = -120 * 86400.0
"""VictoriaMetrics refuses samples far in the future: its copy of the fleet is 120 days earlier."""
CANONICAL_RULES = ROOT / "rules" / "prometheus" / "kvscope-canonical.yml"
QUANTILE_RULES = ROOT / "rules" / "prometheus" / "kvscope-quantiles.yml"
KVSCOPE = str(ROOT / ".venv" / "bin" / "kvscope")
OLD_MAX_RESPONSE = 256 * 1024 * 1024
"""The old client refused answers over this size ("narrow the window or raise --step")."""


def load() -> float:
    return os.getloadavg()[0]


def size_name(engines: int, hours: float) -> str:
    return f"{engines}x{hours:g}h"


def span(hours: float, shift_s: float = 0.0) -> tuple[float, float, float]:
    """(data start, window start, window end)."""
    end = WINDOW_END + shift_s
    return end - hours * 3600 - WARMUP_S, end - hours * 3600, end


# ------------------------------------------------------------------------------ datasets
def vm_dataset(engines: int, hours: float, rules: bool = False) -> Path:
    """A VictoriaMetrics data directory holding the fleet (imported once, kept)."""
    from testbed.fleetgen.capture_fleet import import_capture_fleet

    d = CACHE / "vm" / (size_name(engines, hours) + ("-rules" if rules else ""))
    meta = d / "meta.json"
    if not meta.exists():
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        first, _, end = span(hours, VM_SHIFT_S)
        with running_victoria(d / "data", log_path=d / "import.log") as vm:
            t0, l0 = time.perf_counter(), load()
            info = import_capture_fleet(vm.url, engines, first, end, STEP, shift_s=0.0)
            info.update(import_s=time.perf_counter() - t0, import_load=[l0, load()])
            if rules:
                t0 = time.perf_counter()
                vmalert_replay(vm.url, first, end, d / "vmalert.log")
                info.update(rules_s=time.perf_counter() - t0)
        info.pop("incident_instances", None)
        meta.write_text(json.dumps(info))
    info = json.loads(meta.read_text())
    extra = f", vmalert replay of the canonical recording rules {info['rules_s']:.0f} s" if rules else ""
    print(
        f"  dataset {size_name(engines, hours)} (+{WARMUP_S / 3600:.1f} h before) on VictoriaMetrics: "
        f"{info['samples']:,} samples, streamed import {info['import_s']:.0f} s "
        f"({info['samples'] / info['import_s'] / 1e6:.1f} M samples/s, load {info['import_load'][0]:.1f}-"
        f"{info['import_load'][1]:.1f}){extra}",
        flush=True,
    )
    return d / "data"


def vmalert_replay(url: str, start: float, end: float, log: Path) -> None:
    """kvscope's canonical recording rules evaluated over [start, end] at 15 s into VictoriaMetrics."""
    iso = lambda t: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))  # noqa: E731
    argv = [
        "vmalert",
        f"-rule={CANONICAL_RULES}",
        f"-datasource.url={url}",
        f"-remoteWrite.url={url}",
        f"-replay.timeFrom={iso(start)}",
        f"-replay.timeTo={iso(end)}",
        "-evaluationInterval=15s",
        "-replay.disableProgressBar",
        "-replay.rulesDelay=0s",
        "-replay.maxDatapointsPerQuery=10000",
    ]
    with log.open("w") as fh:
        subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, check=True, timeout=7200)
    urllib.request.urlopen(url + "/internal/force_flush", timeout=600).read()  # noqa: S310


def prom_dataset(engines: int, hours: float, rules: bool = False, quantiles: bool = False) -> Path:
    """A Prometheus data directory holding the fleet (OpenMetrics + promtool backfill, kept); with
    `rules` a copy with the canonical recording rules backfilled, with `quantiles` one with the
    recorded quantiles (rules/prometheus/kvscope-quantiles.yml)."""
    from testbed.fleetgen.capture_fleet import write_capture_fleet

    d = CACHE / "prom" / size_name(engines, hours)
    meta = d / "meta.json"
    if not meta.exists():
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        first, _, end = span(hours)
        t0, l0 = time.perf_counter(), load()
        with (d / "fleet.om").open("w") as fh:
            info = write_capture_fleet(fh, engines, first, end, STEP)
        info.update(generate_s=time.perf_counter() - t0)
        t0 = time.perf_counter()
        backfill_openmetrics(d / "fleet.om", d / "data", timeout_s=7200)
        info.update(backfill_s=time.perf_counter() - t0, backfill_load=[l0, load()])
        (d / "fleet.om").unlink()
        info.pop("incident_instances", None)
        meta.write_text(json.dumps(info))
    info = json.loads(meta.read_text())
    print(
        f"  dataset {size_name(engines, hours)} on Prometheus: {info['samples']:,} samples, OpenMetrics written in "
        f"{info['generate_s']:.0f} s, promtool backfill {info['backfill_s']:.0f} s "
        f"({info['samples'] / info['backfill_s'] / 1e6:.2f} M samples/s, load {info['backfill_load'][0]:.1f}-"
        f"{info['backfill_load'][1]:.1f})",
        flush=True,
    )
    if not rules and not quantiles:
        return d / "data"
    rule_file = QUANTILE_RULES if quantiles else CANONICAL_RULES
    rd = d / ("with-quantiles" if quantiles else "with-rules")
    if not (rd / "meta.json").exists():
        shutil.rmtree(rd, ignore_errors=True)
        shutil.copytree(d / "data", rd / "data")
        first, _, end = span(hours)
        t0 = time.perf_counter()
        with running_prometheus(_config(d), d / "data", "--storage.tsdb.retention.time=100y") as prom:
            res = subprocess.run(
                [
                    "promtool",
                    "tsdb",
                    "create-blocks-from",
                    "rules",
                    f"--start={int(first)}",
                    f"--end={int(end)}",
                    f"--url={prom.url}",
                    f"--output-dir={rd / 'blocks'}",
                    "--eval-interval=15s",
                    str(rule_file),
                ],
                capture_output=True,
                text=True,
                timeout=7200,
            )
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        for block in (rd / "blocks").iterdir():
            shutil.move(str(block), rd / "data" / block.name)
        (rd / "meta.json").write_text(json.dumps({"rules_s": time.perf_counter() - t0}))
    print(
        f"  + {'recorded quantiles' if quantiles else 'canonical recording rules'} backfilled with promtool in "
        f"{json.loads((rd / 'meta.json').read_text())['rules_s']:.0f} s",
        flush=True,
    )
    return rd / "data"


def _config(d: Path) -> Path:
    cfg = d / "prometheus.yml"
    cfg.write_text(EMPTY_CONFIG)
    return cfg


# ------------------------------------------------------------------------------ measuring
def run_child(argv: list[str]) -> dict:
    """Wall, peak RSS, CPU seconds, exit status, stdout and stderr of one command. Run under GNU
    time: a child forked from this process would count this process's memory in its peak RSS."""
    stats = CACHE / "time.txt"
    stats.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        ["/usr/bin/time", "-f", "%M %U %S %x", "-o", str(stats), *argv], capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    fields = stats.read_text().split()[-4:]
    return {
        "wall_s": wall,
        "rss_gb": int(fields[0]) / 1e6,
        "cpu_s": float(fields[1]) + float(fields[2]),
        "exit": int(fields[3]),
        "out": proc.stdout,
        "err": proc.stderr,
    }


def pushdown_summary(err: str) -> dict:
    """Numbers from the pushdown's summary line on stderr."""
    out: dict = {}
    m = re.search(r"evidence: (\d+) series, ([\d,]+) points", err)
    if m:
        out["evidence_points"] = int(m.group(2).replace(",", ""))
    m = re.search(r"(\d+) queries, ([\d.]+) MB", err)
    if m:
        out["queries"], out["mb"] = int(m.group(1)), float(m.group(2))
    for phase in ("prefilter", "evidence", "evaluate"):
        m = re.search(rf"{phase} ([\d.]+) s", err)
        if m:
            out[phase + "_s"] = float(m.group(1))
    return out


def diagnosis(out: str) -> dict | None:
    if not out.strip():
        return None
    d = json.loads(out)
    d.pop("source", None)
    return d


def n_findings(d: dict | None) -> int:
    return 0 if d is None else int(bool(d.get("likely_cause"))) + len(d.get("competing", [])) + len(d.get("other", []))


def tsdb_hwm(pid: int) -> float:
    """Peak resident memory (GB) of the TSDB process so far."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1e6
    return float("nan")


def baseline_fetch(url: str, start: float, end: float, engines: int) -> dict:
    """The old path's raw fetch: every raw series of every engine, one query_range (cut in time
    only at 11k points per series), HTTP + json.loads. An answer over the old client's 256 MB
    limit was refused, and so may the TSDB refuse the one query (422: VictoriaMetrics' series
    limit at 1000 engines); then it is read in batches of 25 engines to time what it would cost."""
    names = set().union(*(sample_names(r) for r in read_rules()))
    catalog = load_catalog()
    t0 = time.perf_counter()
    total_bytes, points, batched = 0, 0, False
    selectors = [selector_for(names, catalog)]
    for attempt in range(2):
        try:
            for sel in selectors:
                body = urllib.parse.urlencode(
                    {"query": sel, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{STEP:g}"}
                ).encode()
                with urllib.request.urlopen(url + "/api/v1/query_range", data=body, timeout=1800) as resp:  # noqa: S310
                    raw = resp.read(OLD_MAX_RESPONSE + 1)
                if len(raw) > OLD_MAX_RESPONSE and not batched:
                    raise OverflowError
                total_bytes += len(raw)
                doc = json.loads(raw)
                points += sum(len(s["values"]) for s in doc["data"]["result"])
                del raw, doc
            break
        except (OverflowError, urllib.error.HTTPError) as exc:
            if attempt or (isinstance(exc, urllib.error.HTTPError) and exc.code != 422):
                raise
            batched = True  # over the old 256 MB limit, or the TSDB refused the one query (422)
            total_bytes, points, t0 = 0, 0, time.perf_counter()
            insts = [f"10.{i // 62500}.{i // 250 % 250}.{i % 250}:8000" for i in range(engines)]
            selectors = [selector_for(names, catalog, insts[i : i + 25]) for i in range(0, engines, 25)]
    return {
        "baseline_s": time.perf_counter() - t0,
        "baseline_mb": total_bytes / 1e6,
        "baseline_points": points,
        "baseline_batched": batched,
    }


def bench(
    tsdb: str,
    engines: int,
    hours: float,
    url: str,
    pid: int,
    compare: bool,
    shift_s: float,
    fresh: Callable[[], None],
    repeat: int = 1,
) -> dict:
    """One TSDB and size: the pushdown (`repeat` times, the median run kept), the baseline, and
    with `compare` the full fetch. `fresh()` runs before each timed command (empties a cache)."""
    _, start, end = span(hours, shift_s)
    argv = [KVSCOPE, "diagnose", "--prometheus", url, "--start", f"{start:.0f}", "--end", f"{end:.0f}", "--json"]
    row: dict = {"tsdb": tsdb, "engines": engines, "hours": hours, "load_before": load()}
    runs = []
    for i in range(max(1, repeat)):
        print(
            f"  {tsdb} {size_name(engines, hours)}: kvscope diagnose --pushdown on "
            f"({i + 1}/{max(1, repeat)}, load {load():.1f}) ...",
            flush=True,
        )
        fresh()
        runs.append(run_child(argv + ["--pushdown", "on"]))
    walls = [r["wall_s"] for r in runs]
    got = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]
    pushed = diagnosis(got["out"])
    row.update(
        wall_s=got["wall_s"],
        walls=walls,
        rss_gb=got["rss_gb"],
        cpu_s=got["cpu_s"],
        exit=got["exit"],
        findings=n_findings(pushed),
        **pushdown_summary(got["err"]),
    )
    row["same_each_run"] = all(diagnosis(r["out"]) == pushed for r in runs)
    if pushed is None:
        print("    | " + "\n    | ".join(got["err"].strip().splitlines()[-6:]))
    row["load_after"] = load()
    print(f"  {tsdb} {size_name(engines, hours)}: baseline raw fetch (load {load():.1f}) ...", flush=True)
    fresh()
    row.update(baseline_fetch(url, start, end, engines))
    if compare:
        print(
            f"  {tsdb} {size_name(engines, hours)}: kvscope diagnose --pushdown off (load {load():.1f}) ...", flush=True
        )
        fresh()
        full = run_child(argv + ["--pushdown", "off"])
        full_d = diagnosis(full["out"])
        row.update(
            full_wall_s=full["wall_s"],
            full_rss_gb=full["rss_gb"],
            full_cpu_s=full["cpu_s"],
            full_exit=full["exit"],
            identical=full_d is not None and full_d == pushed,
        )
        if full_d is None:
            row["full_error"] = (full["err"].strip().splitlines() or ["?"])[-1][:200]
        elif full_d != pushed:
            keys = [k for k in full_d if full_d.get(k) != (pushed or {}).get(k)]
            print(f"    DIFFERENT in {keys}")
    row["tsdb_rss_gb"] = tsdb_hwm(pid)
    return row


BATCHED_NOTE = ", in batches of 25 engines: the one answer was over the old 256 MB limit or refused"


def show(row: dict) -> str:
    name = size_name(row["engines"], row["hours"])
    ratio = row["baseline_s"] / row["wall_s"] if row["wall_s"] else float("nan")
    walls = row.get("walls") or [row["wall_s"]]
    spread = (
        f" (median of {len(walls)}: {min(walls):.2f}-{max(walls):.2f} s, same diagnosis each run: "
        f"{row.get('same_each_run')})"
        if len(walls) > 1
        else ""
    )
    line = (
        f"{row['tsdb']:24s} {name:>9s}: diagnose {row['wall_s']:6.2f} s{spread} (exit {row['exit']}, "
        f"{row['findings']} findings), client {row['cpu_s']:.2f} CPU-s, peak RSS {row['rss_gb']:.2f} GB; "
        f"prefilter {row.get('prefilter_s', float('nan')):.1f} s, "
        f"evidence {row.get('evidence_s', float('nan')):.1f} s "
        f"({row.get('evidence_points', 0):,} points), {row.get('queries', 0)} queries {row.get('mb', 0):.1f} MB; "
        f"TSDB peak RSS {row['tsdb_rss_gb']:.2f} GB | baseline raw fetch {row['baseline_s']:.2f} s "
        f"({row['baseline_points']:,} points, {row['baseline_mb']:.0f} MB"
        f"{BATCHED_NOTE if row['baseline_batched'] else ''}"
        f"): {ratio:.1f}x"
    )
    if "full_wall_s" in row:
        if row.get("full_error"):
            line += f" | full fetch exit {row['full_exit']}: {row['full_error']}"
        else:
            line += (
                f" | full fetch {row['full_wall_s']:.2f} s, {row['full_rss_gb']:.2f} GB "
                f"({row['full_wall_s'] / row['wall_s']:.1f}x), whole diagnosis identical: {row['identical']}"
            )
    goal = GOALS.get((row["engines"], row["hours"]))
    if goal:
        line += f" | goal < {goal[0]:g} s: {row['wall_s'] / goal[0]:.2f}x of it"
        if goal[1]:
            line += f"; < {goal[1]:g} GB: {row['rss_gb'] / goal[1]:.2f}x of it"
    return line + f" | load {row['load_before']:.1f}-{row['load_after']:.1f}"


def growth(rows: list[dict]) -> None:
    """Client cost against engine-hours, and a straight-line extrapolation to 1000 x 6 h."""
    import numpy as np

    for tsdb in sorted({r["tsdb"] for r in rows}):
        mine = [r for r in rows if r["tsdb"] == tsdb and r["exit"] in (0, 1, 2)]
        if len(mine) < 2:
            continue
        eh = np.array([r["engines"] * r["hours"] for r in mine])
        print(f"\nclient cost against engines x window ({tsdb}):")
        for r in mine:
            print(
                f"  {size_name(r['engines'], r['hours']):>9s} ({r['engines'] * r['hours']:6g} engine-hours): "
                f"wall {r['wall_s']:6.2f} s, client CPU {r['cpu_s']:5.2f} s, peak RSS {r['rss_gb']:.2f} GB, "
                f"evidence {r.get('evidence_points', 0):,} points, {r.get('mb', 0):.1f} MB transferred"
            )
        for key, unit in (("wall_s", "s"), ("cpu_s", "CPU-s"), ("rss_gb", "GB")):
            y = np.array([r[key] for r in mine])
            slope, icpt = np.polyfit(eh, y, 1)
            print(
                f"  {key}: {icpt:.2f} {unit} + {slope * 1000:.3f} {unit} per 1000 engine-hours (least squares over "
                f"{len(mine)} sizes) -> 1000 x 6 h: {icpt + slope * 6000:.2f} {unit}"
            )


def weekly(engines: int, hours: float, rules: bool, cache: bool) -> dict:
    """`kvscope report weekly --prometheus` over the fleet's last 7 days, on VictoriaMetrics."""
    data = vm_dataset(engines, hours, rules)
    _, _, end = span(hours, VM_SHIFT_S)
    out = CACHE / "weekly.md"
    with running_victoria(data, "-search.maxQueryDuration=30m", log_path=data.parent / "vm.log", cache=cache) as vm:
        print(f"  weekly report {size_name(engines, hours)} (load {load():.1f}) ...", flush=True)
        l0 = load()
        if cache:
            reset_cache(vm.url)
        got = run_child(
            [
                KVSCOPE,
                "report",
                "weekly",
                "--prometheus",
                vm.url,
                "--end",
                f"{end:.0f}",
                "--no-progress",
                "--markdown",
                str(out),
            ]
        )
        row = {
            "engines": engines,
            "hours": hours,
            "wall_s": got["wall_s"],
            "rss_gb": got["rss_gb"],
            "cpu_s": got["cpu_s"],
            "exit": got["exit"],
            "load": [l0, load()],
            "tsdb_rss_gb": tsdb_hwm(vm.proc.pid),
        }
    text = out.read_text() if out.exists() else ""
    row["findings_section"] = "No findings" not in text and "finding" in text.lower()
    if got["exit"] != 0:
        print("    | " + "\n    | ".join(got["err"].strip().splitlines()[-6:]))
    print(
        f"weekly report {size_name(engines, hours)} on VictoriaMetrics{' (recording rules)' if rules else ''}"
        f" (rollup cache {'on, emptied first' if cache else 'off'}): "
        f"{row['wall_s']:.1f} s (exit {row['exit']}), client peak RSS {row['rss_gb']:.2f} GB, "
        f"{row['cpu_s']:.1f} CPU-s, TSDB peak RSS {row['tsdb_rss_gb']:.2f} GB; goal < {WEEKLY_GOAL_S:g} s: "
        f"{row['wall_s'] / WEEKLY_GOAL_S:.2f}x of it | load {l0:.1f}-{load():.1f}",
        flush=True,
    )
    return row


def parse_sizes(text: str) -> list[tuple[int, float]]:
    out = []
    for part in filter(None, text.split(",")):
        e, h = part.lower().split("x")
        out.append((int(e), float(h)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--sizes",
        default="50x1,100x1,200x1,200x6",
        help="engines x hours on VictoriaMetrics, comma-separated (default 50x1,100x1,200x1,200x6)",
    )
    ap.add_argument("--prometheus", default="", help="these sizes also on Prometheus 2.42 (promtool backfill)")
    ap.add_argument(
        "--recording-rules",
        action="store_true",
        help="also each TSDB with kvscope's canonical recording rules evaluated over the span",
    )
    ap.add_argument(
        "--recorded-quantiles",
        action="store_true",
        help="also each --prometheus size with kvscope's recorded quantiles (kvscope-quantiles.yml) "
        "backfilled over the span",
    )
    ap.add_argument("--compare", action="store_true", help="also the full fetch; the whole diagnosis must be equal")
    ap.add_argument("--weekly", default="", help="engines x hours for `kvscope report weekly` (e.g. 100x168)")
    ap.add_argument(
        "--vm-cache",
        choices=("on", "off"),
        default="on",
        help="VictoriaMetrics' rollup cache: on as it ships, emptied before every timed command "
        "(default), or off (-search.disableCache)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="time the pushdown this many times, report the median")
    args = ap.parse_args()
    cache = args.vm_cache == "on"
    for binary in ("victoria-metrics", "prometheus", "promtool", "vmalert", "/usr/bin/time"):
        if shutil.which(binary) is None:
            sys.exit(f"{binary} not installed (scripts/setup.sh)")
    print(
        f"load average {load():.1f} on {os.cpu_count()} cores; kvscope from {ROOT}; VictoriaMetrics' rollup "
        f"cache {'on (emptied before every timed command)' if cache else 'off'}",
        flush=True,
    )
    rows: list[dict] = []
    variants = [False, True] if args.recording_rules else [False]
    for engines, hours in parse_sizes(args.sizes):
        for rules in variants:
            data = vm_dataset(engines, hours, rules)
            tsdb = "victoria-metrics" + (" +rules" if rules else "") + ("" if cache else " nocache")
            with running_victoria(
                data, "-search.maxQueryDuration=30m", log_path=data.parent / "vm.log", cache=cache
            ) as vm:
                fresh = (lambda url=vm.url: reset_cache(url)) if cache else (lambda: None)
                rows.append(
                    bench(tsdb, engines, hours, vm.url, vm.proc.pid, args.compare, VM_SHIFT_S, fresh, args.repeat)
                )
            print(show(rows[-1]), flush=True)
    prom_variants = [(r, False) for r in variants] + ([(False, True)] if args.recorded_quantiles else [])
    for engines, hours in parse_sizes(args.prometheus):
        for rules, quantiles in prom_variants:
            data = prom_dataset(engines, hours, rules, quantiles)
            tsdb = "prometheus" + (" +rules" if rules else "") + (" +quantiles" if quantiles else "")
            with running_prometheus(
                _config(data.parent),
                data,
                "--storage.tsdb.retention.time=100y",
                "--query.timeout=10m",
                log_path=data.parent / "prometheus.log",
            ) as prom:
                rows.append(
                    bench(tsdb, engines, hours, prom.url, prom.proc.pid, args.compare, 0.0, lambda: None, args.repeat)
                )
            print(show(rows[-1]), flush=True)
    weekly_rows = [weekly(e, h, False, cache) for e, h in parse_sizes(args.weekly)]
    print("\nsummary:")
    for row in rows:
        print(show(row))
    growth(rows)
    for row in weekly_rows:
        print(
            f"weekly {size_name(row['engines'], row['hours'])}: {row['wall_s']:.1f} s, {row['rss_gb']:.2f} GB, "
            f"exit {row['exit']}"
        )


if __name__ == "__main__":
    main()
