"""Benchmark: `kvscope curve --prometheus URL --json` (the whole CLI) on a fleet in a real TSDB.

The fleet: N vLLM engines x `--hours` from the real vLLM 0.32 capture
(testbed/fleetgen/capture_fleet.py: 15 s scrapes unless `--interval` says otherwise, four models,
a tenth of the engines through a KV-pressure episode with more requests running and waiting),
streamed into a real VictoriaMetrics 1.79. By default only the capture's families the curve reads
are imported (`curve.window.SIGNALS` through the catalog: running / waiting / KV usage, the TTFT
and ITL histograms, finished requests, generated tokens, preemptions, `cache_config_info`); the
other series of an engine do not enter the curve's queries, and the whole capture (204 series
per engine) would not fit a week of a large fleet on a small box (`--all-families` imports it).
Data directories are kept under $KVSCOPE_BENCH_CACHE/curve, keyed by size, interval, families
and the generator's source.

Measured in one run, on the same data and window, each a subprocess under GNU time (wall, peak
RSS, CPU seconds), VictoriaMetrics' rollup cache emptied before each:
* `kvscope curve --prometheus URL --start S --end E --json`: what the user runs (step: the
  measured scrape interval, raised to window / 11,000, docs/curve.md "The curve's step");
* raw fetch (baseline): every engine's series of the curve's signals over the window at the
  same step, HTTP + JSON decoding only, in instance batches of about 4M points (the product's
  batch size): the floor of any client that fetches the fleet's series to compute the curve;
* with --promql, a cost probe of the server-side reduction: the TTFT and ITL histograms merged per
  pool and concurrency bucket by the TSDB (`reduction_query`, one instant query per bucket and
  histogram), in the curve's terms where its gauge window is an interval's two ends (a step of
  10 s or more) and on VictoriaMetrics (whose `increase` does not extrapolate); its TTFT request
  counts and p99 are compared with the curve's points, (model, bucket) by (model, bucket).

    .venv/bin/python bench/curve_fleet.py --engines 50 --hours 6
    .venv/bin/python bench/curve_fleet.py --engines 1000 --hours 24 --interval 60 --promql
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from diagnose_fleet import CACHE, GENERATOR, KVSCOPE, VM_FLAGS, VM_SHIFT_S, WINDOW_END, load, run_child, tsdb_hwm  # noqa: E402

from kvscope.agent.signals import load_catalog  # noqa: E402
from kvscope.diagnoser.curve.window import SIGNALS  # noqa: E402
from kvscope.diagnoser.sources.promapi import MAX_POINTS  # noqa: E402
from kvscope.diagnoser.sources.prometheus import selector_for, wire_pattern  # noqa: E402
from testbed.fleetgen.capture_fleet import import_capture_fleet  # noqa: E402
from testbed.victoria import reset_cache, running_victoria  # noqa: E402

GOAL_S = 30.0  # issue 36 item 6: 1000 engines x 7 days end to end
BATCH_POINTS = 4_000_000


def instance(i: int) -> str:
    """The generator's instance label of engine i (capture_fleet._engine_labels)."""
    return f"10.{i // 62500}.{i // 250 % 250}.{i % 250}:8000"


def _digest() -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in GENERATOR)).hexdigest()[:12]


def window(hours: float) -> tuple[float, float]:
    """(start, end) of the curve's window; VictoriaMetrics refuses samples far in the future."""
    end = WINDOW_END + VM_SHIFT_S
    return end - hours * 3600, end


def dataset(engines: int, hours: float, interval: float, every_family: bool) -> tuple[Path, dict]:
    """A VictoriaMetrics data directory holding the fleet over the window (plus one scrape before
    it), kept between runs."""
    tag = f"{engines}x{hours:g}h-{interval:g}s-{'all' if every_family else 'curve'}-{_digest()}"
    d = CACHE / "curve" / tag
    meta = d / "meta.json"
    if not meta.exists():
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        start, end = window(hours)
        names = None if every_family else re.compile(wire_pattern(set(SIGNALS), load_catalog(), facts=True))
        with running_victoria(d / "data", *VM_FLAGS, log_path=d / "import.log") as vm:
            t0, l0 = time.perf_counter(), load()
            info = import_capture_fleet(vm.url, engines, start - interval, end, interval, names=names)
            info.update(import_s=time.perf_counter() - t0, import_load=[l0, load()])
        info.pop("incident_instances", None)
        meta.write_text(json.dumps(info))
    info = json.loads(meta.read_text())
    print(
        f"dataset {tag}: {info['samples']:,} samples ({info['samples'] / engines / info['steps']:.0f} series per "
        f"engine), streamed import {info['import_s']:.0f} s (load {info['import_load'][0]:.1f}-"
        f"{info['import_load'][1]:.1f})",
        flush=True,
    )
    return d / "data", info


def raw_fetch(url: str, start: float, end: float, step: float, engines: int, per_engine: int) -> dict:
    """Every engine's series of the curve's signals over [start, end] at `step`, HTTP + JSON only,
    in instance batches of about BATCH_POINTS points."""
    steps = int((end - start) // step) + 1
    size = max(1, BATCH_POINTS // max(1, per_engine * steps))
    catalog = load_catalog()
    total_bytes, points, series = 0, 0, 0
    for i in range(0, engines, size):
        sel = selector_for(set(SIGNALS), catalog, [instance(e) for e in range(i, min(engines, i + size))])
        body = urllib.parse.urlencode(
            {"query": sel, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        ).encode()
        with urllib.request.urlopen(url + "/api/v1/query_range", data=body, timeout=1800) as resp:  # noqa: S310
            raw = resp.read()
        total_bytes += len(raw)
        result = json.loads(raw)["data"]["result"]
        series += len(result)
        points += sum(len(s["values"]) for s in result)
        del raw, result
    return {"mb": total_bytes / 1e6, "points": points, "series": series, "batch": size}


RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
LATENCY = ("vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket")


def _in_engine(offset: str) -> str:
    """Requests in each engine (running + waiting) at the evaluation time less `offset`."""
    run, wait = (f"sum by (instance) ({name}{offset})" for name in (RUNNING, WAITING))
    return f"({run} + on (instance) {wait})"


def reduction_query(bucket: str, lo: float, hi: float, start: float, end: float, step: float) -> str:
    """The per-concurrency-bucket merge as PromQL, in the curve's terms at a step of one scrape
    interval (intervals.WINDOW_S under two steps: an interval's gauge window is its two ends):
    each instance's bucket increases over the intervals whose requests in the engine (running +
    waiting, the mean of the two ends) fall in [lo, hi) and whose standard error (half the
    difference of the ends) is within the bucket's width, summed per pool and `le` over the
    window: one instant query at `end`, its subquery's steps the curve's interval ends."""
    s = f"{step:g}s"
    now, before = _in_engine(""), _in_engine(f" offset {s}")
    placed = f"(({now} + {before}) / 2 >= {lo:g} < {hi:g}) and on (instance) (abs({now} - {before}) / 2 <= {hi - lo:g})"
    inner = f"increase({bucket}[{s}]) and on (instance) ({placed})"
    return f"sum by (model_name, le) (sum_over_time(({inner})[{end - start:.0f}s:{s}]))"


def promql_reduction(url: str, start: float, end: float, step: float) -> dict:
    """Seconds and answer size of the server-side reduction: one query per concurrency bucket and
    latency histogram (points.EDGES), what the TSDB would have to do per pool instead of handing
    over every engine's series, and the merged TTFT requests per (model, bucket) it answered. A
    cost probe of the histogram merge only (no rates, KV, peak, resets or changes)."""
    from kvscope.diagnoser.curve.points import EDGES

    t0, nbytes, series = time.perf_counter(), 0, 0
    merged: dict[str, dict[float, float]] = {}
    for bucket in LATENCY:
        for lo, hi in zip(EDGES[:-1], EDGES[1:], strict=True):
            body = urllib.parse.urlencode(
                {"query": reduction_query(bucket, lo, hi, start, end, step), "time": f"{end:.0f}"}
            ).encode()
            with urllib.request.urlopen(url + "/api/v1/query", data=body, timeout=1800) as resp:  # noqa: S310
                raw = resp.read()
            nbytes += len(raw)
            result = json.loads(raw)["data"]["result"]
            series += len(result)
            for r in result:
                if bucket == LATENCY[0]:
                    le = float(r["metric"].get("le", "nan"))
                    merged.setdefault(f"{r['metric'].get('model_name')} {lo:g}-{hi:g}", {})[le] = float(r["value"][1])
    took = time.perf_counter() - t0
    return {"promql_s": took, "promql_kb": nbytes / 1e3, "promql_series": series, "ttft": _ttft(merged)}


def _ttft(merged: dict[str, dict[float, float]]) -> dict[str, tuple[float, float | None]]:
    """(requests, TTFT p99) per (model, bucket) from the merged cumulative buckets, read as the
    curve reads them (points.quantile_ci)."""
    import numpy as np

    from kvscope.diagnoser.curve.points import quantile_ci

    out = {}
    for key, by_le in merged.items():
        les = np.array(sorted(by_le))
        counts = np.maximum.accumulate(np.array([by_le[le] for le in les]))
        out[key] = (float(counts[-1]), quantile_ci(0.99, les, counts)[0])
    return out


def curve_ttft(out: str) -> dict[str, tuple[float, float | None]]:
    """(TTFT requests, TTFT p99) per (model, bucket) in `kvscope curve --json`."""
    got = {}
    for pool in json.loads(out).get("pools") or []:
        for pt in pool.get("points") or []:
            lo, hi = pt["bucket"]
            got[f"{pool['labels'].get('model')} {lo:g}-{hi:g}"] = (pt.get("requests") or 0.0, pt.get("ttft_p99_s"))
    return got


def same_ttft(curve: dict[str, tuple], promql: dict[str, tuple]) -> str:
    """Whether the PromQL merge gives the curve's TTFT requests and p99 in every (model, bucket)."""

    def close(a: float | None, b: float | None) -> bool:
        return (a is None) == (b is None) and (a is None or math.isclose(a, b or 0.0, rel_tol=1e-9, abs_tol=1e-9))

    keys = sorted(set(curve) | set(promql))
    none = (0.0, None)
    off = [k for k in keys if not all(map(close, curve.get(k, none), promql.get(k, none)))]
    shown = ", ".join(f"{k}: curve {curve.get(k)} PromQL {promql.get(k)}" for k in off[:4])
    return f"{len(keys) - len(off)}/{len(keys)} (model, bucket) TTFT requests and p99 equal to the curve's" + (
        f"; differ: {shown}" if off else ""
    )


def curve_summary(out: str) -> str:
    """Pools, points and changes the curve's JSON holds."""
    try:
        doc = json.loads(out)
    except ValueError:
        return "no JSON"
    pools = doc.get("pools") or []
    points = sum(len(p.get("points") or []) for p in pools)
    changes = sum(len(p.get("changes") or []) for p in pools)
    knees = sum(p.get("knee_concurrency") is not None for p in pools)
    return f"{len(pools)} pools, {points} points, {knees} knees, {changes} changes"


def curve_step(start: float, end: float, interval: float) -> float:
    """The step `kvscope curve` reads at over this fleet: its scrape interval, at least the window
    over Prometheus' points-per-series limit (curve.window.curve_step)."""
    return max(interval, (end - start) / MAX_POINTS)


def bench(args: argparse.Namespace) -> dict:
    data, info = dataset(args.engines, args.hours, args.interval, args.all_families)
    start, end = window(args.hours)
    per_engine = round(info["samples"] / args.engines / info["steps"])
    step = curve_step(start, end, args.interval)
    row: dict = {"engines": args.engines, "hours": args.hours, "interval_s": args.interval, "step_s": step}
    with running_victoria(data, *VM_FLAGS, log_path=data.parent / "vm.log", cache=True) as vm:
        for run in range(args.runs):
            l0 = load()
            reset_cache(vm.url)
            argv = [KVSCOPE, "curve", "--prometheus", vm.url, "--start", f"{start:.0f}", "--end", f"{end:.0f}"]
            got = run_child([*argv, "--json", "--timeout", f"{args.limit:.0f}"], args.limit)
            print(
                f"  curve {run + 1}: {got['wall_s']:.2f} s, peak RSS {got['rss_gb']:.2f} GB, {got['cpu_s']:.1f} CPU-s, "
                f"exit {got['exit']}: {curve_summary(got['out'])} | load {l0:.1f}-{load():.1f}",
                flush=True,
            )
            if got["exit"] != 0 and got["err"]:
                print("    | " + "\n    | ".join(got["err"].strip().splitlines()[-6:]))
            row.setdefault("curve", []).append({k: v for k, v in got.items() if k not in ("out", "err")})
            l0 = load()
            reset_cache(vm.url)
            child = [sys.executable, __file__, "--raw-fetch", vm.url, "--engines", str(args.engines)]
            child += ["--start", f"{start:.0f}", "--end", f"{end:.0f}", "--step", f"{step:g}"]
            raw = run_child([*child, "--per-engine", str(per_engine)], args.limit)
            fetched = json.loads(raw["out"]) if raw["exit"] == 0 else {}
            print(
                f"  raw fetch {run + 1}: {raw['wall_s']:.2f} s, peak RSS {raw['rss_gb']:.2f} GB, "
                f"{raw['cpu_s']:.1f} CPU-s, exit {raw['exit']}: {fetched.get('series', 0):,} series, "
                f"{fetched.get('points', 0):,} points, {fetched.get('mb', 0):.0f} MB in batches of "
                f"{fetched.get('batch', 0)} engines | load {l0:.1f}-{load():.1f}",
                flush=True,
            )
            if raw["exit"] != 0 and raw["err"]:
                print("    | " + "\n    | ".join(raw["err"].strip().splitlines()[-6:]))
            row.setdefault("raw", []).append({**{k: v for k, v in raw.items() if k not in ("out", "err")}, **fetched})
        if args.promql:
            l0 = load()
            reset_cache(vm.url)
            row["promql"] = promql_reduction(vm.url, start, end, step)
            same = same_ttft(curve_ttft(got["out"]), row["promql"].pop("ttft")) if got["exit"] == 0 else ""
            print(
                f"  PromQL reduction: {row['promql']['promql_s']:.2f} s, {row['promql']['promql_series']} series "
                f"answered ({row['promql']['promql_kb']:.0f} kB); {same} | load {l0:.1f}-{load():.1f}",
                flush=True,
            )
        row["tsdb_rss_gb"] = tsdb_hwm(vm.proc.pid)
    return row


def report(row: dict) -> None:
    curve = min(r["wall_s"] for r in row["curve"])
    raw = min(r["wall_s"] for r in row["raw"])
    print(
        f"{row['engines']} engines x {row['hours']:g} h at {row['interval_s']:g} s scrapes (curve step "
        f"{row['step_s']:g} s): curve {curve:.2f} s (best of {len(row['curve'])}), raw fetch {raw:.2f} s, "
        f"curve / raw fetch {curve / raw:.2f}x; TSDB peak RSS {row['tsdb_rss_gb']:.2f} GB; "
        f"goal {GOAL_S:g} s at 1000 x 168 h"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=50)
    ap.add_argument("--hours", type=float, default=6.0, help="the curve's window")
    ap.add_argument("--interval", type=float, default=15.0, help="the engines' scrape interval (s)")
    ap.add_argument("--all-families", action="store_true", help="import every series of the capture")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--limit", type=float, default=1800.0, help="seconds one command may take")
    ap.add_argument(
        "--promql", action="store_true", help="also time the per-concurrency-bucket histogram merge done in PromQL"
    )
    ap.add_argument("--json-out", type=Path, help="append the row as one JSON line")
    ap.add_argument("--raw-fetch", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--end", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--step", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--per-engine", type=int, default=60, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.raw_fetch:  # the baseline's child process
        print(json.dumps(raw_fetch(args.raw_fetch, args.start, args.end, args.step, args.engines, args.per_engine)))
        return
    row = bench(args)
    report(row)
    if args.json_out:
        with args.json_out.open("a") as fh:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    try:
        main()
    except urllib.error.HTTPError as exc:
        sys.exit(f"{exc}: {exc.read()[:500]!r}")
