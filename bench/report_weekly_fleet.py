"""Benchmark: `kvscope report weekly --prometheus URL` (the whole CLI) on a fleet in a real TSDB.

The fleet: N vLLM engines x `--days` from the real vLLM 0.32 capture (testbed/fleetgen: four
models, a tenth of the engines through a KV-pressure episode), at `--interval` scrapes, streamed
into a real VictoriaMetrics 1.79 (bench/curve_fleet.py's datasets). Imported: the capture's
families the report reads (`report.weekly.READ_SIGNALS`: its token and preemption counters, the
operating curve's histograms and gauges). The capture has no GPU series, so GPU-hours print as
absent; the week's diagnosis runs the rules over the same series (rules whose signals the
dataset lacks are not evaluable). Two weeks by default: the report reads the week before for its
week-over-week deltas.

Measured in one run, on the same data, each a subprocess under GNU time (wall, peak RSS, CPU
seconds), VictoriaMetrics' rollup cache emptied before each:
* `kvscope report weekly --prometheus URL --end E`: what the user runs (the report's read of
  two weeks, the week's diagnosis by the fleet path at a 5-minute step, Markdown);
* the same with --no-diagnose: the report's own read and maths;
* raw fetch (baseline): every engine's series of the report's signals over the two weeks at the
  report's step, HTTP + JSON decoding only, in instance batches of about 4M points: the floor of
  any client that fetches the fleet's series to compute the report (the diagnosis not included).

With --candidates, kvscope-candidates.yml's records are replayed by vmalert over the week first
(into a kept copy of the data), as a TSDB running kvscope's rules holds them: the diagnosis then
reads only its candidates' evidence. Without them every rule is judged on every engine's series.

    .venv/bin/python bench/report_weekly_fleet.py --engines 100 --days 14
    .venv/bin/python bench/report_weekly_fleet.py --engines 1000 --days 14 --candidates
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from curve_fleet import _fetched, _kept, _timed, add_raw_fetch_args, dataset, raw_fetch, window  # noqa: E402
from diagnose_fleet import CANDIDATES, KVSCOPE, VM_FLAGS, _digest, load, tsdb_hwm  # noqa: E402

from kvscope.report.weekly import READ_SIGNALS, WEEK_S, report_step  # noqa: E402
from testbed.victoria import replay_rules, running_victoria  # noqa: E402

GOAL_S = 60.0  # issue 37: 1000 engines x 7 days


def _report_summary(markdown: Path):
    """What the written report holds: its sections' headline lines."""

    def summary(_: str) -> str:
        text = markdown.read_text() if markdown.exists() else ""
        findings = sum(line.startswith(("| critical", "| warning", "| info")) for line in text.splitlines())
        pools = text.count(" / unified |") + text.count(" / prefill |") + text.count(" / decode |")
        return f"{len(text):,} characters, {pools} pool rows, {findings} top findings"

    return summary


def with_candidates(data: Path, start: float, end: float, engines: int) -> tuple[Path, dict]:
    """A copy of the dataset with kvscope-candidates.yml's records replayed by vmalert over
    [start, end] every 15 s, as a TSDB evaluating the rules live holds them (kept, per version of
    the candidate file). The replay writes many evaluations at once (a live vmalert writes one
    every 15 s), so the TSDB takes writes up to 512 MB for it, and evaluations per query fall with
    the fleet's size."""
    rd = data.parent / ("candidates-" + _digest(CANDIDATES))
    if not (rd / "meta.json").exists():
        shutil.rmtree(rd, ignore_errors=True)
        shutil.copytree(data, rd / "data")
        big = "-maxInsertRequestSize=536870912"
        with running_victoria(rd / "data", *VM_FLAGS, big, log_path=rd / "replay.log") as vm:
            l0 = load()
            points = max(500, 2_000_000 // engines)
            took = replay_rules(vm.url, CANDIDATES, start, end, rd / "vmalert.log", max_points=points)
        (rd / "meta.json").write_text(json.dumps({"records_s": took, "load": [l0, load()]}))
    return rd / "data", json.loads((rd / "meta.json").read_text())


def bench(args: argparse.Namespace) -> dict:
    hours = args.days * 24
    data, info = dataset(args.engines, hours, args.interval, False, frozenset(READ_SIGNALS), "report")
    start, end = window(hours)
    if args.candidates:
        data, rec = with_candidates(data, end - WEEK_S - 60, end, args.engines)
        print(f"  candidate records replayed by vmalert over the week in {rec['records_s']:.0f} s", flush=True)
    per_engine = round(info["samples"] / args.engines / info["steps"])
    read_start = max(start, end - 2 * WEEK_S)
    step = report_step(end - read_start)
    row: dict = {"engines": args.engines, "days": args.days, "interval_s": args.interval, "report_step_s": step}
    row["candidates"] = args.candidates
    out = Path(tempfile.mkdtemp(prefix="kvscope-weekly-bench-")) / "week.md"
    with running_victoria(data, *VM_FLAGS, log_path=data.parent / "vm.log", cache=True) as vm:
        cmd = [KVSCOPE, "report", "weekly", "--prometheus", vm.url, "--end", f"{end:.0f}", "--markdown", str(out)]
        cmd.append("--no-progress")
        raw = [sys.executable, __file__, "--raw-fetch", vm.url, "--engines", str(args.engines)]
        raw += ["--start", f"{read_start:.0f}", "--end", f"{end:.0f}", "--step", f"{step:g}"]
        raw += ["--per-engine", str(per_engine)]
        summary = _report_summary(out)
        for _ in range(args.runs):
            got = _timed("report weekly", cmd, args.limit, vm.url, summary)
            row.setdefault("report", []).append(_kept(got))
            got = _timed("report weekly --no-diagnose", [*cmd, "--no-diagnose"], args.limit, vm.url, summary)
            row.setdefault("no_diagnose", []).append(_kept(got))
            got = _timed("raw fetch of the report's signals (baseline)", raw, args.limit, vm.url, _fetched)
            row.setdefault("raw", []).append(_kept(got))
        row["tsdb_rss_gb"] = tsdb_hwm(vm.proc.pid)
    return row


def report(row: dict) -> None:
    best = {k: min(r["wall_s"] for r in row[k]) for k in ("report", "no_diagnose", "raw")}
    rss = max(r["rss_gb"] for r in row["report"])
    print(
        f"{row['engines']} engines x {row['days']:g} days at {row['interval_s']:g} s scrapes (report step "
        f"{row['report_step_s']:g} s): raw fetch {best['raw']:.2f} s; report weekly {best['report']:.2f} s "
        f"({best['report'] / best['raw']:.3g}x the raw fetch, peak RSS {rss:.2f} GB); without the diagnosis "
        f"{best['no_diagnose']:.2f} s ({best['no_diagnose'] / best['raw']:.3g}x); TSDB peak RSS "
        f"{row['tsdb_rss_gb']:.2f} GB; candidate records {'replayed' if row['candidates'] else 'absent'}; "
        f"goal {GOAL_S:g} s at 1000 engines x 7 days"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=100)
    ap.add_argument("--days", type=float, default=14.0, help="days of data (the report reads two weeks)")
    ap.add_argument("--interval", type=float, default=60.0, help="the engines' scrape interval (s)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument(
        "--candidates",
        action="store_true",
        help="replay kvscope-candidates.yml over the week first (a TSDB that runs kvscope's rules)",
    )
    ap.add_argument("--limit", type=float, default=1800.0, help="seconds one command may take")
    ap.add_argument("--json-out", type=Path, help="append the row as one JSON line")
    add_raw_fetch_args(ap)
    args = ap.parse_args()
    if args.raw_fetch:  # the baseline's child process
        got = raw_fetch(
            args.raw_fetch, args.start, args.end, args.step, args.engines, args.per_engine, frozenset(READ_SIGNALS)
        )
        print(json.dumps(got))
        return
    row = bench(args)
    report(row)
    if args.json_out:
        with args.json_out.open("a") as fh:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
