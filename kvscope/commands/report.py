"""`kvscope report weekly`: the weekly efficiency review as HTML (with plots) and Markdown."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path

HELP = """\
Write the weekly efficiency review: output tokens per GPU-hour per model/pool, GPU utilisation and
the utilisation trap (002 §9.2), $ per 1M output tokens at --gpu-hour-cost, prefill tokens saved
by prefix caching, per-tenant usage and hit ratio, week-over-week deltas and the week's top
findings. Numbers the source lacks are printed as "absent", never as zero.

  kvscope report weekly --recording incident.om --gpu-hour-cost 2.5 --html week.html --markdown week.md
  kvscope report weekly --prometheus http://127.0.0.1:9090 --end 2026-11-22T00:00:00Z
  kvscope report weekly --store /var/lib/kvscope/kvscope.sqlite
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="weekly efficiency review (HTML + Markdown)", description=HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("period", choices=("weekly",), help="the report to write (weekly)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--recording", nargs="+", type=Path, metavar="FILE", help="one or more recordings")
    src.add_argument("--prometheus", metavar="URL", help="a Prometheus that scrapes the agent's kvscope_* series")
    src.add_argument("--store", type=Path, metavar="FILE", help="the agent's SQLite store")
    p.add_argument("--end", help="end of the week (ISO 8601, UTC; default: now, or the recording's end)")
    p.add_argument("--gpu-hour-cost", type=float, default=2.5, help="$ per GPU-hour (default 2.5)")
    p.add_argument("--html", type=Path, help="write the HTML report here")
    p.add_argument("--markdown", type=Path, help="write the Markdown report here (default: print it)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _end(args: argparse.Namespace, fallback: float) -> float:
    if not args.end:
        return fallback
    return datetime.fromisoformat(args.end.replace("Z", "+00:00")).timestamp()


def _load(args: argparse.Namespace):
    """(SeriesSet, end, source text, findings)."""
    from kvscope.diagnoser.report import WEEK_S, read_prometheus_series, read_store_series, series_set_from_samples

    if args.recording:
        from kvscope.agent.replay import replay_recording
        from kvscope.ui.data import Source, SourceError, triage_from_replay

        samples, findings, ends = [], [], []
        for path in args.recording:
            replay = replay_recording(path)
            samples += replay.samples
            ends.append(replay.end or 0.0)
            try:
                findings += list(triage_from_replay(Source("recording", str(path)), replay).diagnosis.findings)
            except SourceError as exc:
                raise ValueError(str(exc)) from exc
        names = ", ".join(p.name for p in args.recording)
        return series_set_from_samples(samples), _end(args, max(ends)), f"recordings {names}", findings
    end = _end(args, time.time())
    if args.prometheus:
        return read_prometheus_series(args.prometheus, end - 2 * WEEK_S, end), end, args.prometheus, []
    return read_store_series(str(args.store), end - 2 * WEEK_S, end), end, f"store {args.store}", []


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from kvscope.diagnoser.report import build_report
    from kvscope.diagnoser.report_render import render_html, render_markdown

    steps = tqdm(total=4, desc="weekly report", unit="step", disable=args.no_progress, file=sys.stderr)
    try:
        steps.set_postfix_str("reading")
        ss, end, source, findings = _load(args)
        steps.update()
        steps.set_postfix_str("computing")
        report = build_report(ss, end, args.gpu_hour_cost, source, findings)
        steps.update()
        steps.set_postfix_str("rendering")
        markdown = render_markdown(report)
        page = render_html(report) if args.html else None
        steps.update()
    except (OSError, ValueError) as exc:
        steps.close()
        print(f"kvscope report: {exc}", file=sys.stderr)
        return 4
    if page is not None:
        args.html.write_text(page)
    if args.markdown:
        args.markdown.write_text(markdown)
    steps.update()
    steps.close()
    if not args.markdown:
        print(markdown)
    for path in (args.html, args.markdown):
        if path:
            print(f"wrote {path}", file=sys.stderr)
    return 0
