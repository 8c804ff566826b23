"""Benchmark: `kvscope diagnose --prometheus` (the fleet path) on a fleet in a real TSDB, end to end.

The fleet is N vLLM engines x T from the real vLLM 0.32 /metrics capture
(testbed/fleetgen/capture_fleet.py: the 204 series the catalog reads per engine, 15 s scrapes, a
tenth of the engines through a KV-pressure episode from 55 % to 75 % of the span), with 1.1 h of
data before the window (a live fleet has history, and the rules reach up to an hour back).

The candidate records (rules/prometheus/kvscope-candidates.yml) are backfilled over the window as
a live TSDB would have evaluated them every 15 s: `promtool tsdb create-blocks-from rules` for
Prometheus 2.42 (Debian), `vmalert -replay` for VictoriaMetrics 1.79 (Debian; started with
-search.maxQueryLen=131072: the longest candidate expression is 44 kB). Data directories are kept
under $KVSCOPE_BENCH_CACHE (/tmp/kvscope-bench-fleet3) between runs, keyed by the generator's
source and, for the records, by the candidate file.

Measured per TSDB and size, in one run, each command a subprocess under GNU time: the whole
`kvscope diagnose --prometheus URL --start S --end E --json` (wall, peak RSS, CPU seconds, what
its summary says it read), the raw-fetch baseline (every raw series of every engine in one
`query_range`, cut only where 11k points per series forces it, HTTP + json only: the floor of any
client that fetches the fleet), and with --compare `--full-fetch` (the exact batched full fetch),
whose findings and evidence values must equal the fleet path's
(testbed/diagnoses.py `findings_differ`). Ratios are printed; the load average with
every number (the box is shared).

--tsdb-cost N: the records' continuous cost. N engines' last 70 minutes, ending now, backfilled
into a Prometheus that loads kvscope-candidates.yml and evaluates it live every 15 s; after a few
evaluations, `prometheus_rule_group_last_duration_seconds` and the process' CPU seconds per
evaluation, per 100 engines.

    .venv/bin/python bench/diagnose_fleet.py --prometheus 100x1 --compare
    .venv/bin/python bench/diagnose_fleet.py --prometheus 200x6 --victoria 1000x6
    .venv/bin/python bench/diagnose_fleet.py --tsdb-cost 100,200
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
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

from kvscope.core.signals import load_catalog  # noqa: E402
from kvscope.diagnoser.evaluate.evaluator import sample_names  # noqa: E402
from kvscope.diagnoser.rulebook.rule import read_rules  # noqa: E402
from kvscope.diagnoser.sources.prometheus import selector_for  # noqa: E402
from testbed.diagnoses import findings_differ  # noqa: E402
from testbed.prometheus import EMPTY_CONFIG, backfill_openmetrics, backfill_rules, running_prometheus  # noqa: E402
from testbed.victoria import replay_rules, reset_cache, running_victoria  # noqa: E402

CACHE = Path(os.environ.get("KVSCOPE_BENCH_CACHE", "/tmp/kvscope-bench-fleet3"))
WINDOW_END = 1_800_000_000.0 + 8 * 3600
WARMUP_S = 1.1 * 3600
STEP = 15.0
GOALS = {(1000, 6.0): (5.0, 0.5)}
VM_SHIFT_S = -120 * 86400.0
"""VictoriaMetrics refuses samples far in the future: its copy of the fleet is 120 days earlier."""
TREE = Path(os.environ.get("KVSCOPE_BENCH_TREE") or ROOT)
"""The checkout whose kvscope is timed: its .venv's commands, its UI and its rule files (another
commit's under bench/against.py). The data, the harness and the baselines are this checkout's."""
CANDIDATES = TREE / "rules" / "prometheus" / "kvscope-candidates.yml"
FLEETGEN = ROOT / "testbed" / "fleetgen"
VM_FLAGS = ("-search.maxQueryDuration=30m", "-search.maxQueryLen=131072")
KVSCOPE = str(TREE / ".venv" / "bin" / "kvscope")
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
def _digest(*paths: Path) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()[:12]


GENERATOR = (FLEETGEN / "capture_fleet.py", FLEETGEN / "calibration.yaml")


def dataset_dir(tsdb: str, engines: int, hours: float) -> Path:
    """The kept data of one size, keyed by the generator's source (a changed fleet is rebuilt)."""
    return CACHE / tsdb / f"{size_name(engines, hours)}-{_digest(*GENERATOR)}"


def vm_dataset(engines: int, hours: float) -> Path:
    """A VictoriaMetrics data directory holding the fleet (kept) and, in a copy per version of the
    candidate file, its candidate records replayed by vmalert over the window (kept)."""
    from testbed.fleetgen.capture_fleet import import_capture_fleet

    d = dataset_dir("vm", engines, hours)
    meta = d / "meta.json"
    first, start, end = span(hours, VM_SHIFT_S)
    if not meta.exists():
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        with running_victoria(d / "data", *VM_FLAGS, log_path=d / "import.log") as vm:
            t0, l0 = time.perf_counter(), load()
            info = import_capture_fleet(vm.url, engines, first, end, STEP, shift_s=0.0)
            info.update(import_s=time.perf_counter() - t0, import_load=[l0, load()])
        info.pop("incident_instances", None)
        meta.write_text(json.dumps(info))
    info = json.loads(meta.read_text())
    rd = d / ("records-" + _digest(CANDIDATES))
    if not (rd / "meta.json").exists():
        shutil.rmtree(rd, ignore_errors=True)
        shutil.copytree(d / "data", rd / "data")
        with running_victoria(rd / "data", *VM_FLAGS, log_path=rd / "replay.log") as vm:
            l0 = load()
            took = replay_rules(vm.url, CANDIDATES, start - 60, end, rd / "vmalert.log")
        (rd / "meta.json").write_text(json.dumps({"records_s": took, "load": [l0, load()]}))
    rec = json.loads((rd / "meta.json").read_text())
    print(
        f"  dataset {size_name(engines, hours)} (+{WARMUP_S / 3600:.1f} h before) on VictoriaMetrics: "
        f"{info['samples']:,} samples, streamed import {info['import_s']:.0f} s (load {info['import_load'][0]:.1f}-"
        f"{info['import_load'][1]:.1f}); candidate records replayed by vmalert in {rec['records_s']:.0f} s "
        f"(load {rec['load'][0]:.1f}-{rec['load'][1]:.1f})",
        flush=True,
    )
    return rd / "data"


def prom_dataset(engines: int, hours: float) -> Path:
    """A Prometheus data directory holding the fleet (OpenMetrics + promtool backfill) and its
    candidate records (promtool rule backfill over the window), kept."""
    from testbed.fleetgen.capture_fleet import write_capture_fleet

    d = dataset_dir("prom", engines, hours)
    meta = d / "meta.json"
    if not meta.exists():
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        first, start, end = span(hours)
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
        f"(load {info['backfill_load'][0]:.1f}-{info['backfill_load'][1]:.1f})",
        flush=True,
    )
    rd = d / ("records-" + _digest(CANDIDATES))  # the records of these rules
    if not (rd / "meta.json").exists():  # the candidate records of the current rules, over the window
        shutil.rmtree(rd, ignore_errors=True)
        shutil.copytree(d / "data", rd / "data")
        _, start, end = span(hours)
        l0 = load()
        took = backfill_rules(_config(d), rd / "data", CANDIDATES, start - 60, end, timeout_s=7200)
        (rd / "meta.json").write_text(json.dumps({"records_s": took, "load": [l0, load()]}))
    rec = json.loads((rd / "meta.json").read_text())
    print(
        f"  + candidate records backfilled by promtool in {rec['records_s']:.0f} s (load {rec['load'][0]:.1f}-"
        f"{rec['load'][1]:.1f})",
        flush=True,
    )
    return rd / "data"


def _config(d: Path) -> Path:
    cfg = d / "prometheus.yml"
    cfg.write_text(EMPTY_CONFIG)
    return cfg


# ------------------------------------------------------------------------------ measuring
def run_child(argv: list[str], limit_s: float | None = None) -> dict:
    """Wall, peak RSS, CPU seconds, exit status, stdout and stderr of one command. Run under GNU
    time: a child forked from this process would count this process's memory in its peak RSS. A
    command still running after `limit_s` is killed and reads as exit "timeout", wall inf."""
    stats = CACHE / f"time-{os.getpid()}.txt"  # one file per bench process: two may run at once
    stats.parent.mkdir(parents=True, exist_ok=True)  # webhook_fleet's first use on a fresh machine
    stats.unlink(missing_ok=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            ["/usr/bin/time", "-f", "%M %U %S %x", "-o", str(stats), *argv],
            capture_output=True,
            text=True,
            timeout=limit_s,
        )
    except subprocess.TimeoutExpired:
        return {"wall_s": math.inf, "rss_gb": math.nan, "cpu_s": math.nan, "exit": "timeout", "out": "", "err": ""}
    wall = time.perf_counter() - t0
    fields = stats.read_text().split()[-4:]
    stats.unlink()
    return {
        "wall_s": wall,
        "rss_gb": int(fields[0]) / 1e6,
        "cpu_s": float(fields[1]) + float(fields[2]),
        "exit": int(fields[3]),
        "out": proc.stdout,
        "err": proc.stderr,
    }


def fleet_summary(err: str) -> dict:
    """Numbers from the fleet path's summary line on stderr."""
    out: dict = {}
    m = re.search(r"evidence: (\d+) series, ([\d,]+) points", err)
    if m:
        out["evidence_points"] = int(m.group(2).replace(",", ""))
    m = re.search(r"(\d+) queries, ([\d.]+) MB", err)
    if m:
        out["queries"], out["mb"] = int(m.group(1)), float(m.group(2))
    m = re.search(r"(\d+) rules read from kvscope:candidate, (\d+) with candidates \((\d+) groups\)", err)
    if m:
        out["rules_read"], out["rules_fired"], out["groups"] = (int(x) for x in m.groups())
    out["fallback"] = "exact full fetch" in err
    for phase in ("candidates", "evidence", "evaluate"):
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
    raw: bool = True,
) -> dict:
    """One TSDB and size: the fleet path (`repeat` times, the median run kept), with `raw` the
    baseline, and with `compare` the full fetch. `fresh()` runs before each timed command (empties
    a cache)."""
    _, start, end = span(hours, shift_s)
    argv = [KVSCOPE, "diagnose", "--prometheus", url, "--start", f"{start:.0f}", "--end", f"{end:.0f}", "--json"]
    row: dict = {"tsdb": tsdb, "engines": engines, "hours": hours, "load_before": load()}
    runs = []
    for i in range(max(1, repeat)):
        print(
            f"  {tsdb} {size_name(engines, hours)}: kvscope diagnose ({i + 1}/{max(1, repeat)}, load {load():.1f}) ...",
            flush=True,
        )
        fresh()
        runs.append(run_child(argv))
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
        **fleet_summary(got["err"]),
    )
    row["same_each_run"] = all(diagnosis(r["out"]) == pushed for r in runs)
    if pushed is None:
        print("    | " + "\n    | ".join(got["err"].strip().splitlines()[-6:]))
    row["load_after"] = load()
    if raw:
        print(f"  {tsdb} {size_name(engines, hours)}: baseline raw fetch (load {load():.1f}) ...", flush=True)
        fresh()
        row.update(baseline_fetch(url, start, end, engines))
    if compare:
        print(
            f"  {tsdb} {size_name(engines, hours)}: kvscope diagnose --full-fetch (load {load():.1f}) ...", flush=True
        )
        fresh()
        full = run_child(argv + ["--full-fetch"])
        full_d = diagnosis(full["out"])
        row.update(
            full_wall_s=full["wall_s"],
            full_rss_gb=full["rss_gb"],
            full_cpu_s=full["cpu_s"],
            full_exit=full["exit"],
            identical=full_d is not None and pushed is not None and not findings_differ(pushed, full_d),
        )
        if full_d is None:
            row["full_error"] = (full["err"].strip().splitlines() or ["?"])[-1][:200]
        elif pushed is None or findings_differ(pushed, full_d):
            print(f"    DIFFERENT in {findings_differ(pushed or {}, full_d)}")
    row["tsdb_rss_gb"] = tsdb_hwm(pid)
    return row


BATCHED_NOTE = ", in batches of 25 engines: the one answer was over the old 256 MB limit or refused"


def show(row: dict) -> str:
    name = size_name(row["engines"], row["hours"])
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
        f"{row.get('rules_read', 0)} rules read from the records, {row.get('rules_fired', 0)} with "
        f"{row.get('groups', 0)} candidate groups{' (SOME RULES FELL BACK)' if row.get('fallback') else ''}; "
        f"candidates {row.get('candidates_s', float('nan')):.1f} s, "
        f"evidence {row.get('evidence_s', float('nan')):.1f} s "
        f"({row.get('evidence_points', 0):,} points), {row.get('queries', 0)} queries {row.get('mb', 0):.1f} MB; "
        f"TSDB peak RSS {row['tsdb_rss_gb']:.2f} GB"
    )
    if "baseline_s" in row:
        line += (
            f" | baseline raw fetch {row['baseline_s']:.2f} s ({row['baseline_points']:,} points, "
            f"{row['baseline_mb']:.0f} MB{BATCHED_NOTE if row['baseline_batched'] else ''}): "
            f"baseline/fleet {row['baseline_s'] / row['wall_s'] if row['wall_s'] else float('nan'):.1f}x"
        )
    if "full_wall_s" in row:
        if row.get("full_error"):
            line += f" | full fetch exit {row['full_exit']}: {row['full_error']}"
        else:
            line += (
                f" | full fetch {row['full_wall_s']:.2f} s, {row['full_rss_gb']:.2f} GB "
                f"(full/fleet {row['full_wall_s'] / row['wall_s']:.1f}x time, "
                f"{row['full_rss_gb'] / row['rss_gb']:.1f}x RSS), "
                f"same findings and evidence: {row['identical']}"
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


def parse_sizes(text: str) -> list[tuple[int, float]]:
    out = []
    for part in filter(None, text.split(",")):
        e, h = part.lower().split("x")
        out.append((int(e), float(h)))
    return out


def tsdb_cost(engines: int, seconds: float = 75.0) -> dict:
    """The candidate records' continuous cost: `engines` engines' last 70 minutes, ending now,
    backfilled into a Prometheus that evaluates kvscope-candidates.yml live every 15 s."""
    from testbed.fleetgen.capture_fleet import write_capture_fleet

    d = CACHE / "cost" / str(engines)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    now = time.time()
    with (d / "fleet.om").open("w") as fh:
        write_capture_fleet(fh, engines, now - 4200, now - 30, STEP)
    backfill_openmetrics(d / "fleet.om", d / "data", timeout_s=3600)
    (d / "fleet.om").unlink()
    cfg = d / "prometheus.yml"
    cfg.write_text(EMPTY_CONFIG + f"rule_files: [{CANDIDATES}]\n")
    with running_prometheus(cfg, d / "data", "--storage.tsdb.retention.time=100y", log_path=d / "p.log") as prom:
        time.sleep(10)
        cpu0, l0 = sum(_own(prom.url, "process_cpu_seconds_total").values()), load()
        it0 = _own(prom.url, "prometheus_rule_group_iterations_total", group=True)
        time.sleep(seconds)
        cpu1 = sum(_own(prom.url, "process_cpu_seconds_total").values())
        it1 = _own(prom.url, "prometheus_rule_group_iterations_total", group=True)
        durations = _own(prom.url, "prometheus_rule_group_last_duration_seconds", group=True)
        held = _prom_value(prom.url, "count(kvscope:candidate)")
        failed = sum(_own(prom.url, "prometheus_rule_evaluation_failures_total", group=True).values())
        missed = sum(_own(prom.url, "prometheus_rule_group_iterations_missed_total", group=True).values())
    n_evals = max(1.0, sum(it1.values()) - sum(it0.values())) / max(1, len(it1))  # per group
    last = sum(durations.values())
    slowest = sorted(durations.items(), key=lambda kv: -kv[1])[:3]
    row = {
        "engines": engines,
        "last_duration_s": last,
        "cpu_per_eval_s": (cpu1 - cpu0) / n_evals,
        "iterations": n_evals,
        "candidates_held": held,
        "failures": failed,
        "missed": missed,
        "load": [l0, load()],
    }
    print(
        f"records' cost, {engines} engines: one evaluation of the {len(durations)} candidate groups {last:.2f} s "
        f"summed (prometheus_rule_group_last_duration_seconds; slowest "
        + ", ".join(f"{k.split('kvscope-candidates-')[1].split(chr(34))[0]} {v:.2f} s" for k, v in slowest)
        + f"), Prometheus CPU {row['cpu_per_eval_s']:.2f} s per "
        f"evaluation ({n_evals:.0f} evaluations in {seconds:.0f} s, process CPU, nothing else to do) = "
        f"{row['cpu_per_eval_s'] / 15:.2f} cores at 15 s; per 100 engines {row['cpu_per_eval_s'] * 100 / engines:.2f} "
        f"CPU-s per evaluation; {held:.0f} candidate series held, {failed:.0f} failed, {missed:.0f} missed "
        f"evaluations | load {l0:.1f}-{load():.1f}",
        flush=True,
    )
    return row


def _prom_value(url: str, expr: str) -> float:
    body = json.loads(urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})).read())  # noqa: S310
    result = body["data"]["result"]
    return float(result[0]["value"][1]) if result else float("nan")


def _own(url: str, name: str, group: bool = False) -> dict[str, float]:
    """Samples of Prometheus' own /metrics named `name`, by label text (`group`: the candidate
    groups' only)."""
    text = urllib.request.urlopen(f"{url}/metrics").read().decode()  # noqa: S310
    out = {}
    for line in text.splitlines():
        if line.startswith(name) and (not group or "kvscope-candidates" in line) and line[len(name)] in " {":
            labels, value = line.rsplit(" ", 1)
            out[labels] = float(value)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--victoria", default="", help="engines x hours on VictoriaMetrics, comma-separated (e.g. 1000x6)")
    ap.add_argument("--prometheus", default="", help="engines x hours on Prometheus 2.42 (e.g. 100x1,200x6)")
    ap.add_argument("--compare", action="store_true", help="also --full-fetch; the findings must be equal")
    ap.add_argument("--tsdb-cost", default="", help="engine counts whose live record evaluation to measure (100,200)")
    ap.add_argument(
        "--vm-cache",
        choices=("on", "off"),
        default="on",
        help="VictoriaMetrics' rollup cache: on as it ships, emptied before every timed command "
        "(default), or off (-search.disableCache)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="time the fleet path this many times, report the median")
    ap.add_argument("--no-raw", action="store_true", help="skip the raw-fetch baseline")
    args = ap.parse_args()
    cache = args.vm_cache == "on"
    for binary in ("victoria-metrics", "prometheus", "promtool", "vmalert", "/usr/bin/time"):
        if shutil.which(binary) is None:
            sys.exit(f"{binary} not installed (scripts/setup.sh)")
    print(f"load average {load():.1f} on {os.cpu_count()} cores; kvscope from {TREE}", flush=True)
    for n in filter(None, args.tsdb_cost.split(",")):
        tsdb_cost(int(n))
    rows: list[dict] = []
    for engines, hours in parse_sizes(args.victoria):
        data = vm_dataset(engines, hours)
        tsdb = "victoria-metrics" + ("" if cache else " nocache")
        with running_victoria(data, *VM_FLAGS, log_path=data.parent / "vm.log", cache=cache) as vm:
            fresh = (lambda url=vm.url: reset_cache(url)) if cache else (lambda: None)
            rows.append(
                bench(
                    tsdb,
                    engines,
                    hours,
                    vm.url,
                    vm.proc.pid,
                    args.compare,
                    VM_SHIFT_S,
                    fresh,
                    args.repeat,
                    not args.no_raw,
                )
            )
        print(show(rows[-1]), flush=True)
    for engines, hours in parse_sizes(args.prometheus):
        data = prom_dataset(engines, hours)
        with running_prometheus(
            _config(data.parent),
            data,
            "--storage.tsdb.retention.time=100y",
            "--query.timeout=10m",
            log_path=data.parent / "prometheus.log",
        ) as prom:
            rows.append(
                bench(
                    "prometheus",
                    engines,
                    hours,
                    prom.url,
                    prom.proc.pid,
                    args.compare,
                    0.0,
                    lambda: None,
                    args.repeat,
                    not args.no_raw,
                )
            )
        print(show(rows[-1]), flush=True)
    print("\nsummary:")
    for row in rows:
        print(show(row))
    growth(rows)


if __name__ == "__main__":
    main()
