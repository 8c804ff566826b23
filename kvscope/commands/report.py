"""`kvscope report weekly`: the weekly efficiency review as HTML (with plots) and Markdown."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from kvscope.commands._checks import check_http_url, check_output_file, check_recording, parse_time, source_hint

HELP = """\
Write the weekly efficiency review: output tokens per GPU-hour per model/pool, GPU utilisation and
the utilisation trap (002 §9.2), $ per 1M output tokens at --gpu-hour-cost, prefill tokens saved
by prefix caching, per-tenant usage and hit ratio, week-over-week deltas and the week's top
findings, one row per incident (a likely cause with its supporting findings, as `kvscope diagnose`
groups them). Numbers the source lacks are printed as "absent", never as zero. When the data
covers part of the week, the SourceSpec line says how much data is held, over what span, with how
many gaps. The HTML plots share the week's UTC time axis and shade the stretches without data.

  kvscope report weekly --recording incident.om --gpu-hour-cost 2.5 --html week.html --markdown week.md
  kvscope report weekly --prometheus http://127.0.0.1:9090 --end 2026-11-22T00:00:00Z

With --prometheus the report reads kvscope's recording rules (kvscope:*), the agent's kvscope_*
series, or the engines' own series, whichever the TSDB has, as 15-minute server-side increases
and means (a week is 672 points per series), and runs the diagnosis rules in the TSDB over the
week (5-minute step) for its top findings.
  kvscope report weekly --store /var/lib/kvscope/kvscope.sqlite
  kvscope report weekly --recording fleet.om --gpu-mapping gpus.yaml   # gpus.yaml: {GPU-8f2c...: replica-0}

GPU-hours are split per pool through the engine-GPU join the agent records
(engine_gpu_memory_used_bytes: its gpu_mapping, Kubernetes pod labels, or the NVML process list),
else through a node that runs engines of one pool. GPUs that neither places are reported as
"unattributed", with the missing labels named; fleet totals count them either way. For
recordings, the join is re-derived from the recorded series, and --gpu-mapping supplies the map.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="weekly efficiency review (HTML + Markdown)",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "period",
        choices=("weekly",),
        nargs="?",
        default="weekly",
        help="the report to write: weekly (the default; the only one so far)",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--recording", nargs="+", type=Path, metavar="FILE", help="one or more recordings")
    src.add_argument(
        "--prometheus", metavar="URL", help="a Prometheus-compatible TSDB holding the engines' or the agent's series"
    )
    src.add_argument("--store", type=Path, metavar="FILE", help="the agent's SQLite store")
    p.add_argument(
        "--end",
        metavar="TIME",
        help="end of the week: ISO 8601 (UTC if no zone) or unix seconds (default: now, or the recordings' end)",
    )
    p.add_argument("--gpu-hour-cost", type=float, default=2.5, help="$ per GPU-hour (default 2.5)")
    p.add_argument("--html", type=Path, help="write the HTML report here")
    p.add_argument("--markdown", type=Path, help="write the Markdown report here (default: print it)")
    p.add_argument(
        "--gpu-mapping",
        type=Path,
        metavar="FILE",
        help="with --recording: YAML mapping of GPU uuid (or index) to the engine instance(s) "
        "on it, the agent's gpu_mapping format, to split GPU-hours per pool when the "
        "recording has no pod labels or NVML process list",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--no-diagnose",
        action="store_true",
        help="--prometheus: skip the week's diagnosis (by default the rules run in the TSDB over the "
        "week at a 5-minute step, kvscope diagnose's fleet path)",
    )
    p.set_defaults(func=run)


def _end(args: argparse.Namespace, fallback: float) -> float:
    return parse_time("--end", args.end) if args.end else fallback


def check_args(args: argparse.Namespace) -> None:
    """Fail before any work on what can be known wrong up front. Raises ValueError (usage) or
    FileNotFoundError (a source that is not there)."""
    if args.recording and args.recording[-1] == Path("weekly") and not Path("weekly").exists():
        args.recording.pop()  # `report --recording a.om weekly`: nargs="+" took the period
        if not args.recording:
            raise ValueError("--recording: give at least one recording file")
    _end(args, 0.0)
    if not args.gpu_hour_cost > 0:
        raise ValueError(f"--gpu-hour-cost: must be > 0 ($ per GPU-hour), got {args.gpu_hour_cost:g}")
    for flag in ("html", "markdown"):
        if getattr(args, flag):
            check_output_file(f"--{flag}", getattr(args, flag))
    if getattr(args, "gpu_mapping", None) is not None:
        args.gpu_mapping_value = read_gpu_mapping(args)
    if args.prometheus:
        check_http_url("--prometheus", args.prometheus)
    if args.store and not args.store.is_file():
        raise FileNotFoundError(
            f"store {args.store} does not exist (the agent's --store.path, default kvscope.db in its working directory)"
        )
    for path in args.recording or ():
        try:
            check_recording(path)
        except ValueError as exc:
            raise FileNotFoundError(str(exc)) from None


def read_gpu_mapping(args: argparse.Namespace) -> dict:
    """The --gpu-mapping file, validated the way the agent validates its gpu_mapping. Raises
    ValueError (usage) or FileNotFoundError."""
    import yaml

    from kvscope.agent.config import parse_gpu_mapping

    if not args.recording:
        raise ValueError(
            "--gpu-mapping: only with --recording (the agent applies its own gpu_mapping "
            "to what it stores and re-exports)"
        )
    if not args.gpu_mapping.is_file():
        raise FileNotFoundError(f"--gpu-mapping: {args.gpu_mapping} does not exist")
    if args.gpu_mapping.stat().st_size > 1 << 20:
        raise ValueError(f"--gpu-mapping: {args.gpu_mapping} is over 1 MiB; expected a small YAML mapping")
    try:
        raw = yaml.safe_load(args.gpu_mapping.read_text())
        parse_gpu_mapping(raw)
    except (yaml.YAMLError, ValueError) as exc:
        raise ValueError(
            f"--gpu-mapping {args.gpu_mapping}: {exc} (expected e.g. 'GPU-8f2c...: replica-0' per line)"
        ) from None
    return raw


def _load(args: argparse.Namespace):
    """(SeriesSet, end, source text, diagnoses: one per recording)."""
    from kvscope.report.weekly import WEEK_S, read_prometheus_series, read_store_series, series_set_from_samples

    if args.recording:
        from kvscope.diagnoser.sources.recording import RecordingSource
        from kvscope.ui.data import SourceError, SourceSpec, triage_from_recording

        samples, diagnoses, ends = [], [], []
        for path in args.recording:
            recording = RecordingSource(path, spans=False, gpu_mapping=getattr(args, "gpu_mapping_value", None))
            try:
                replay = recording.replay()  # joins GPUs
                samples += replay.samples
                ends.append(replay.end or 0.0)
                for note in replay.notes:
                    print(f"kvscope report: {note}", file=sys.stderr)
                diagnoses.append(triage_from_recording(SourceSpec("recording", str(path)), recording).diagnosis)
            except SourceError as exc:
                raise ValueError(str(exc)) from exc
        names = ", ".join(p.name for p in args.recording)
        return series_set_from_samples(samples), _end(args, max(ends)), f"recordings {names}", diagnoses
    end = _end(args, time.time())
    if args.prometheus:
        from kvscope.diagnoser.pushdown.run import diagnose_fleet
        from kvscope.diagnoser.sources.promapi import PromClient

        client = PromClient(args.prometheus, timeout_s=300.0)
        ss = read_prometheus_series(args.prometheus, end - 2 * WEEK_S, end, client=client)
        diagnoses = []  # the week's findings from the TSDB itself (the fleet path), on a 5-minute grid
        if not args.no_diagnose:
            source = f"prometheus:{args.prometheus}"
            diagnoses = [diagnose_fleet(client, end - WEEK_S, end, 300.0, source=source, time_scale=1.0)[0]]
        for note in client.notes:
            print(f"split: {note}", file=sys.stderr)
        return ss, end, args.prometheus, diagnoses
    return read_store_series(str(args.store), end - 2 * WEEK_S, end), end, f"store {args.store}", []


def _check_not_empty(ss, source: str, end: float) -> None:
    """A source with none of the report's signals in the two weeks gets a message, not a crash."""
    from kvscope.report.weekly import WEEK_S

    if ss.first_ts() is None:
        raise ValueError(
            f"{source} has no kvscope samples between {_iso(end - 2 * WEEK_S)} and {_iso(end)} "
            "(does it hold the agent's series? is --end right?)"
        )


def coverage_note(ss, end: float) -> str:
    """'' when the data fills (nearly) the whole week ending at `end`; else a sentence naming both
    the data actually held and the span it is spread over, with its gaps, so a 10-minute
    recording's GPU cost is not read as a week's, nor two recordings 9 h apart as 9 h of data."""
    from kvscope.diagnoser.render import fmt_duration
    from kvscope.report.weekly import WEEK_S, data_coverage

    cov = data_coverage(ss, end - WEEK_S, end)
    if not cov.spans or cov.held_s >= 0.9 * WEEK_S:
        return ""
    first, last = cov.spans[0][0], cov.spans[-1][1]
    where = f"{_iso(first)} to {_iso(last)}"
    spread = ""
    if cov.inner_gaps:
        where += f", {cov.inner_gaps} gap{'s' if cov.inner_gaps > 1 else ''} without data"
        spread = f", spread across {fmt_duration(cov.span_s)}"
    return (
        f"; the data covers only {fmt_duration(cov.held_s)} of the 7 days{spread} ({where}): "
        "totals are for the data held, not a full week"
    )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from kvscope.diagnoser.sources import SourceError
    from kvscope.report.render import render_html, render_markdown
    from kvscope.report.weekly import build_report

    try:
        check_args(args)
    except ValueError as exc:
        print(f"kvscope report: {exc}", file=sys.stderr)
        return 3
    except FileNotFoundError as exc:
        print(f"kvscope report: {exc}", file=sys.stderr)
        return 4
    steps = tqdm(total=4, desc="weekly report", unit="step", disable=args.no_progress, file=sys.stderr)
    try:
        steps.set_postfix_str("reading")
        ss, end, source, diagnoses = _load(args)
        _check_not_empty(ss, source, end)
        source += coverage_note(ss, end)
        steps.update()
        steps.set_postfix_str("computing")
        report = build_report(ss, end, args.gpu_hour_cost, source, diagnoses=diagnoses)
        steps.update()
        steps.set_postfix_str("rendering")
        markdown = render_markdown(report)
        page = render_html(report) if args.html else None
        steps.update()
    except (OSError, ValueError, EOFError, SourceError) as exc:
        steps.close()
        print(
            f"kvscope report: {source_hint('prometheus', args.prometheus, str(exc)) if args.prometheus else exc}",
            file=sys.stderr,
        )
        return 4
    try:
        if page is not None:
            args.html.write_text(page)
        if args.markdown:
            args.markdown.write_text(markdown)
    except OSError as exc:
        steps.close()
        print(f"kvscope report: cannot write the report: {exc}", file=sys.stderr)
        return 4
    steps.update()
    steps.close()
    if not args.markdown:
        print(markdown)
    for path in (args.html, args.markdown):
        if path:
            print(f"wrote {path}", file=sys.stderr)
    return 0
