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
* with --recorded, `kvscope curve --prometheus URL --recorded`: the curve read back from
  kvscope-curve.yml's records (diagnoser/curve/records.py), which vmalert replays into the dataset
  first, once (the TSDB's work of evaluating the rules live, spread over the window; its seconds
  are printed, not part of the command's); its points are compared with the full read's.
  --skip-full leaves the full read out (a week of a large fleet does not fit this box beside it).

    .venv/bin/python bench/curve_fleet.py --engines 50 --hours 6
    .venv/bin/python bench/curve_fleet.py --engines 100 --hours 24 --interval 60 --recorded
    .venv/bin/python bench/curve_fleet.py --engines 1000 --hours 168 --interval 60 --recorded --skip-full
"""

from __future__ import annotations

import argparse
import hashlib
import json
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

from kvscope.core.signals import load_catalog  # noqa: E402
from kvscope.diagnoser.curve.records import curve_file  # noqa: E402
from kvscope.diagnoser.curve.window import SIGNALS  # noqa: E402
from kvscope.diagnoser.promql.rulefiles import render_rule_file  # noqa: E402
from kvscope.diagnoser.rulebook.rule import parse_duration  # noqa: E402
from kvscope.diagnoser.sources.promapi import MAX_POINTS  # noqa: E402
from kvscope.diagnoser.sources.prometheus import selector_for, wire_pattern  # noqa: E402
from testbed.fleetgen.capture_fleet import import_capture_fleet  # noqa: E402
from testbed.victoria import delete_series, replay_in_order, reset_cache, running_victoria  # noqa: E402

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


def dataset(
    engines: int,
    hours: float,
    interval: float,
    every_family: bool,
    signals: frozenset[str] = SIGNALS,
    family="curve",
    cut: float | None = None,
) -> tuple[Path, dict]:
    """A VictoriaMetrics data directory holding the fleet over the window (plus one scrape before
    it), kept between runs: the capture's families of `signals` (named `family` in the cache's
    key), or all of them; `cut`: where one pool restarts with half its KV cache (CaptureFleet)."""
    cut_tag = "" if cut is None else f"-cut{cut:g}"
    tag = f"{engines}x{hours:g}h-{interval:g}s-{'all' if every_family else family}{cut_tag}-{_digest()}"
    d = CACHE / "curve" / tag
    meta = d / "meta.json"
    if not meta.exists():
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        start, end = window(hours)
        names = None if every_family else re.compile(wire_pattern(set(signals), load_catalog(), facts=True))
        with running_victoria(d / "data", *VM_FLAGS, log_path=d / "import.log") as vm:
            t0, l0 = time.perf_counter(), load()
            info = import_capture_fleet(vm.url, engines, start - interval, end, interval, names=names, cut=cut)
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


def raw_fetch(
    url: str, start: float, end: float, step: float, engines: int, per_engine: int, signals: frozenset[str] = SIGNALS
) -> dict:
    """Every engine's series of `signals` (the curve's) over [start, end] at `step`, HTTP + JSON
    only, in instance batches of about BATCH_POINTS points."""
    steps = int((end - start) // step) + 1
    size = max(1, BATCH_POINTS // max(1, per_engine * steps))
    catalog = load_catalog()
    total_bytes, points, series = 0, 0, 0
    for i in range(0, engines, size):
        sel = selector_for(set(signals), catalog, [instance(e) for e in range(i, min(engines, i + size))])
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


def records(data: Path, url: str, start: float, end: float, interval: str) -> dict:
    """kvscope-curve.yml at `interval` replayed by vmalert over the window (what a TSDB evaluating
    the rules live spreads over the week), once per dataset and rule text; its seconds. One rule
    text's records at a time: an earlier text's records share their names, and kept beside the new
    ones every sum of the records would count each interval twice."""
    name, groups = curve_file(load_catalog(), interval)
    text = render_rule_file(groups, "# kvscope-curve.yml as `kvscope rules build --curve-interval` writes it\n")
    want = {"interval": interval, "rules": hashlib.sha256(text.encode()).hexdigest()[:12]}
    marker = data.parent / "records.json"
    done = json.loads(marker.read_text()) if marker.exists() else {}
    if {k: done.get(k) for k in want} != want:
        delete_series(url, '{__name__=~"kvscope:curve_.+"}')
        rules = data.parent / f"{name}.{want['rules']}"
        rules.write_text(text)
        logs = data.parent / f"replay-{want['rules']}"
        logs.mkdir(exist_ok=True)
        l0 = load()
        took = replay_in_order(url, rules, start - parse_duration(interval), end, logs)
        marker.write_text(json.dumps(want | {"replay_s": took, "load": [l0, load()]}))
    return json.loads(marker.read_text())


def curve_ttft(out: str) -> dict[str, tuple[float, float | None]]:
    """(TTFT requests, TTFT p99) per (model, bucket) in `kvscope curve --json`."""
    got = {}
    for pool in json.loads(out).get("pools") or []:
        for pt in pool.get("points") or []:
            lo, hi = pt["bucket"]
            got[f"{pool['labels'].get('model')} {lo:g}-{hi:g}"] = (pt.get("requests") or 0.0, pt.get("ttft_p99_s"))
    return got


def agreement(recorded: str, full: str) -> str:
    """How the recorded curve's points compare with the full read's, (model, bucket) by (model,
    bucket): TTFT requests (the same requests, in buckets placed by a coarser interval) and p99."""
    rec, ful = curve_ttft(recorded), curve_ttft(full)
    both = sorted(set(rec) & set(ful))
    if not both:
        return "no (model, bucket) in both"
    requests = sum(rec[k][0] for k in rec), sum(ful[k][0] for k in ful)
    ratios = [rec[k][1] / ful[k][1] for k in both if rec[k][1] and ful[k][1]]
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "none"
    return (
        f"{len(both)} (model, bucket) in both ({len(rec)} recorded, {len(ful)} full); TTFT requests "
        f"{requests[0]:,.0f} recorded vs {requests[1]:,.0f} full; TTFT p99 recorded / full {spread}"
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
    found = [
        f"{p['labels'].get('model')} {c['kind']}{' ' + json.dumps(c['diff']) if c.get('diff') else ''}: "
        f"{c.get('verdict')}"
        for p in pools
        for c in p.get("changes") or []
    ]
    return f"{len(pools)} pools, {points} points, {knees} knees, {changes} changes{' (' if found else ''}" + (
        "; ".join(found) + ")" if found else ""
    )


def curve_step(start: float, end: float, interval: float) -> float:
    """The step `kvscope curve` reads at over this fleet: its scrape interval, at least the window
    over Prometheus' points-per-series limit (curve.window.curve_step)."""
    return max(interval, (end - start) / MAX_POINTS)


def _timed(label: str, argv: list[str], limit: float, url: str, summary) -> dict:
    """One command under GNU time with the TSDB's rollup cache emptied first, printed."""
    l0 = load()
    reset_cache(url)
    got = run_child(argv, limit)
    print(
        f"  {label}: {got['wall_s']:.2f} s, peak RSS {got['rss_gb']:.2f} GB, {got['cpu_s']:.1f} CPU-s, "
        f"exit {got['exit']}: {summary(got['out']) if got['exit'] == 0 else ''} | load {l0:.1f}-{load():.1f}",
        flush=True,
    )
    if got["exit"] != 0 and got["err"]:
        print("    | " + "\n    | ".join(got["err"].strip().splitlines()[-6:]))
    return got


def _fetched(out: str) -> str:
    f = json.loads(out)
    return f"{f['series']:,} series, {f['points']:,} points, {f['mb']:.0f} MB in batches of {f['batch']} engines"


def bench(args: argparse.Namespace) -> dict:
    data, info = dataset(args.engines, args.hours, args.interval, args.all_families, cut=args.cut)
    start, end = window(args.hours)
    per_engine = round(info["samples"] / args.engines / info["steps"])
    step = curve_step(start, end, args.interval)
    row: dict = {"engines": args.engines, "hours": args.hours, "interval_s": args.interval, "step_s": step}
    window_args = ["--start", f"{start:.0f}", "--end", f"{end:.0f}"]
    with running_victoria(data, *VM_FLAGS, log_path=data.parent / "vm.log", cache=True) as vm:
        if args.recorded:
            interval = args.curve_interval or f"{max(60, 2 * int(args.interval))}s"
            rec = records(data, vm.url, start, end, interval)
            row["records"] = {"interval": interval, **rec}
            print(
                f"  records: kvscope-curve.yml at {interval}, replayed by vmalert in {rec['replay_s']:.0f} s",
                flush=True,
            )
        curve = [KVSCOPE, "curve", "--prometheus", vm.url, *window_args, "--json", "--timeout", f"{args.limit:.0f}"]
        raw = [sys.executable, __file__, "--raw-fetch", vm.url, "--engines", str(args.engines), *window_args]
        raw += ["--step", f"{step:g}", "--per-engine", str(per_engine)]
        for _ in range(args.runs):
            if args.recorded:
                got = _timed("curve --recorded", [*curve, "--recorded"], args.limit, vm.url, curve_summary)
                row.setdefault("recorded", []).append(_kept(got))
            if not args.skip_full:
                got_full = _timed("curve (every engine's series)", curve, args.limit, vm.url, curve_summary)
                row.setdefault("curve", []).append(_kept(got_full))
            fetched = _timed("raw fetch (baseline)", raw, args.limit, vm.url, _fetched)
            row.setdefault("raw", []).append(_kept(fetched))
        if args.recorded and not args.skip_full and got["exit"] == 0 and got_full["exit"] == 0:
            row["agreement"] = agreement(got["out"], got_full["out"])
            print(f"  recorded against full: {row['agreement']}", flush=True)
        row["tsdb_rss_gb"] = tsdb_hwm(vm.proc.pid)
    return row


def _kept(got: dict) -> dict:
    return {k: v for k, v in got.items() if k not in ("out", "err")}


def report(row: dict) -> None:
    best = {k: min(r["wall_s"] for r in row[k]) for k in ("recorded", "curve", "raw") if k in row}
    parts = [f"{k} {v:.2f} s ({v / best['raw']:.3g}x the raw fetch)" for k, v in best.items() if k != "raw"]
    print(
        f"{row['engines']} engines x {row['hours']:g} h at {row['interval_s']:g} s scrapes (curve step "
        f"{row['step_s']:g} s): raw fetch {best['raw']:.2f} s; {'; '.join(parts)}; TSDB peak RSS "
        f"{row['tsdb_rss_gb']:.2f} GB; goal {GOAL_S:g} s at 1000 x 168 h"
    )


def add_raw_fetch_args(ap: argparse.ArgumentParser) -> None:
    """The hidden arguments of the raw-fetch baseline's child process (`--raw-fetch URL`)."""
    ap.add_argument("--raw-fetch", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--end", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--step", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--per-engine", type=int, default=60, help=argparse.SUPPRESS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=50)
    ap.add_argument("--hours", type=float, default=6.0, help="the curve's window")
    ap.add_argument("--interval", type=float, default=15.0, help="the engines' scrape interval (s)")
    ap.add_argument("--all-families", action="store_true", help="import every series of the capture")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--limit", type=float, default=1800.0, help="seconds one command may take")
    ap.add_argument(
        "--recorded", action="store_true", help="also replay kvscope-curve.yml and time `kvscope curve --recorded`"
    )
    ap.add_argument("--curve-interval", help="the records' interval (default: 1m, or two scrapes if longer)")
    ap.add_argument("--skip-full", action="store_true", help="leave out the full `kvscope curve` (a week of a fleet)")
    ap.add_argument(
        "--cut",
        type=float,
        metavar="SHARE",
        help="one pool (model-1) restarts this far into the window with half its KV cache and runs pressured "
        "from then on: a real change for the changes to find (default: no restart)",
    )
    ap.add_argument("--json-out", type=Path, help="append the row as one JSON line")
    add_raw_fetch_args(ap)
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
