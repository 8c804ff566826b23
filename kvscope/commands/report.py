"""`kvscope report weekly`: the weekly efficiency review as HTML (with plots) and Markdown."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kvscope.commands._checks import check_http_url, check_output_file, check_recording, parse_time, source_hint
from kvscope.commands._common import add_command, fail
from kvscope.commands._objectives import add_objective_flags, objectives_from_args
from kvscope.commands._source import add_recording_cap_flags, recording_limits

if TYPE_CHECKING:
    from kvscope.commands._progress import Stages
    from kvscope.report.weekly.coverage import DataCoverage

HELP = """\
Write the weekly efficiency review: output tokens per GPU-hour per model/pool, GPU utilisation,
$ per 1M output tokens at --gpu-hour-cost, prefill tokens saved by prefix caching, per-tenant
usage, week-over-week deltas, the week's incidents (as `kvscope diagnose` groups findings) and
what changed this week (restarts, config changes) with its effect at matched load (docs/curve.md).
Numbers the source lacks print as "absent", never zero; a partial week is said with its span and
gaps. GPU-hours are split per pool through the engine-GPU join (GPUs it cannot place are
"unattributed"). Goodput per pool is judged against the latency objectives of --objectives FILE
and --slo-* (each pool's own where the file sets one; default TTFT <= 1s for 0.99 of requests,
docs/goodput.md). What each section means: docs/ui.md.

From --prometheus the week's incidents come from the TSDB by the fleet path (a 5-minute step), which
reads kvscope's candidate records (kvscope-candidates.yml, docs/fleet.md): where the TSDB lacks them
every rule is judged on every engine's series, the longest part of the report for a large fleet;
stderr names those rules and the backfill command.

  kvscope report weekly --recording incident.om --gpu-hour-cost 2.5 --html week.html --markdown week.md
  kvscope report weekly --prometheus http://127.0.0.1:9090 --end 2026-11-22T00:00:00Z
  kvscope report weekly --store /var/lib/kvscope/kvscope.db
  kvscope report weekly --recording fleet.om --gpu-mapping gpus.yaml   # gpus.yaml: {GPU-8f2c...: replica-0}
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "report", "weekly efficiency review (HTML + Markdown)", HELP)
    p.add_argument("period", choices=("weekly",), nargs="?", default="weekly", help="the report to write")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--recording", nargs="+", type=Path, metavar="FILE", help="one or more recordings")
    prom_help = "a Prometheus-compatible TSDB holding the engines' or the agent's series"
    src.add_argument("--prometheus", metavar="URL", help=prom_help)
    src.add_argument("--store", type=Path, metavar="FILE", help="the agent's SQLite store")
    end_help = "end of the week: ISO 8601 (UTC if no zone) or unix seconds (default: now, or the recordings' end)"
    p.add_argument("--end", metavar="TIME", help=end_help)
    p.add_argument("--gpu-hour-cost", type=float, default=2.5, help="$ per GPU-hour")
    p.add_argument("--html", type=Path, help="write the HTML report here")
    p.add_argument("--markdown", type=Path, help="write the Markdown report here (default: print it)")
    p.add_argument(
        "--gpu-mapping",
        type=Path,
        metavar="FILE",
        help="with --recording: YAML mapping of GPU uuid (or index) to the engine instance(s) on it (the agent's "
        "gpu_mapping format), to split GPU-hours per pool when the recording has no pod labels or NVML process list",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_recording_cap_flags(p)
    no_diag_help = "--prometheus: skip the week's diagnosis (the rules run in the TSDB at a 5-minute step)"
    p.add_argument("--no-diagnose", action="store_true", help=no_diag_help)
    add_objective_flags(p)
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
    args.objectives_set = objectives_from_args(args)
    if not args.gpu_hour_cost > 0:
        raise ValueError(f"--gpu-hour-cost: must be > 0 ($ per GPU-hour), got {args.gpu_hour_cost:g}")
    for flag in ("html", "markdown"):
        if getattr(args, flag):
            check_output_file(f"--{flag}", getattr(args, flag))
    if getattr(args, "gpu_mapping", None) is not None:
        args.gpu_mapping_value = read_gpu_mapping(args)
    _check_source(args)


def _check_source(args: argparse.Namespace) -> None:
    """The source flag: a URL that can be one, a store or recordings that are there."""
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
    """The --gpu-mapping file (bounded YAML), validated the way the agent validates its gpu_mapping.
    Raises ValueError (usage) or FileNotFoundError."""
    from kvscope.agent.config import parse_gpu_mapping, read_config_file

    if not args.recording:
        raise ValueError("--gpu-mapping: only with --recording (the agent applies its own gpu_mapping)")
    if not args.gpu_mapping.is_file():
        raise FileNotFoundError(f"--gpu-mapping: {args.gpu_mapping} does not exist")
    try:
        raw = read_config_file(args.gpu_mapping, "--gpu-mapping")
        parse_gpu_mapping(raw)
    except ValueError as exc:  # ConfigError included
        raise ValueError(f"{exc} (expected e.g. 'GPU-8f2c...: replica-0' per line)") from None
    return raw


def _load(args: argparse.Namespace):
    """(Frame, end, source text, diagnoses: one per recording, the week's changes where the TSDB's
    curve records judged them: else None, judged on the frame), read by `report_window`."""
    from kvscope.diagnoser.sources.samples import SamplesSource, StoreSource
    from kvscope.report.weekly import WEEK_S, report_window

    if args.recording:
        from kvscope.diagnoser.sources.recording import RecordingSource
        from kvscope.ui.data import SourceError, SourceSpec, triage_from_recording

        samples, diagnoses, ends = [], [], []
        for path in args.recording:
            mapping, limits = getattr(args, "gpu_mapping_value", None), recording_limits(args)
            recording = RecordingSource(path, spans=False, gpu_mapping=mapping, limits=limits)
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
        read = SamplesSource(samples, f"recordings {names}", carry=False)
        return report_window(read), _end(args, max(ends)), read.description, diagnoses, None
    end = _end(args, time.time())
    if args.prometheus:
        from kvscope.diagnoser.pushdown.run import diagnose_fleet
        from kvscope.diagnoser.sources.promapi import PromClient
        from kvscope.diagnoser.sources.prometheus import PrometheusSource

        client = PromClient(args.prometheus, timeout_s=300.0)
        prometheus = PrometheusSource(args.prometheus, client=client)
        frame = report_window(prometheus, end)
        recorded = _recorded_changes(prometheus, end)
        diagnoses = []  # the week's findings from the TSDB itself (the fleet path), on a 5-minute grid
        if not args.no_diagnose:
            from kvscope.diagnoser.pushdown.candidates import describe

            source = f"prometheus:{args.prometheus}"
            diagnosis, fleet = diagnose_fleet(client, end - WEEK_S, end, 300.0, source=source, time_scale=1.0)
            diagnoses = [diagnosis]
            # rules judged on every engine's series (the records miss part of the week): always said, with
            # the backfill command, as `kvscope diagnose` says it (at 1000 engines that read is most of the wait)
            for line in describe(fleet.hits):
                print(line, file=sys.stderr)
        for note in client.notes:
            print(f"split: {note}", file=sys.stderr)
        return frame, end, args.prometheus, diagnoses, recorded
    return report_window(StoreSource(args.store, carry=False), end), end, f"store {args.store}", [], None


def _recorded_changes(source, end: float):  # noqa: ANN001, ANN202 - a PrometheusSource; WeekChanges | None
    """The week's changes judged from the TSDB's curve records over the two weeks the report reads
    (`kvscope curve --recorded`), None where it keeps none (judged on the report's frame then)."""
    from kvscope.diagnoser.curve.recorded import read_recorded, recorded_interval, settings_reader
    from kvscope.report.weekly import WEEK_S
    from kvscope.report.weekly.changes import changes_of

    start = end - 2 * WEEK_S
    interval = recorded_interval(source.client, start, end)
    if interval is None:
        return None
    curves = read_recorded(source.client, start, end, interval, settings=settings_reader(source))
    return changes_of(curves, interval, end - WEEK_S, end)


def coverage_note(cov: DataCoverage) -> str:
    """'' when the data fills (nearly) the whole week (`cov`: the week's, `WeekStats.coverage`);
    else a sentence naming both the data actually held and the span it is spread over, with its
    gaps, so a 10-minute recording's GPU cost is not read as a week's, nor two recordings 9 h
    apart as 9 h of data."""
    from kvscope.core.scalars import iso_utc
    from kvscope.diagnoser.render import fmt_duration
    from kvscope.report.weekly import WEEK_S

    if not cov.spans or cov.held_s >= 0.9 * WEEK_S:
        return ""
    first, last = cov.spans[0][0], cov.spans[-1][1]
    where = f"{iso_utc(first)} to {iso_utc(last)}"
    spread = ""
    if cov.inner_gaps:
        where += f", {cov.inner_gaps} gap{'s' if cov.inner_gaps > 1 else ''} without data"
        spread = f", spread across {fmt_duration(cov.span_s)}"
    return (
        f"; the data covers only {fmt_duration(cov.held_s)} of the 7 days{spread} ({where}): "
        "totals are for the data held, not a full week"
    )


def run(args: argparse.Namespace) -> int:
    from kvscope.commands._progress import Stages
    from kvscope.diagnoser.sources import SourceError
    from kvscope.report.render import PLOTS_NEED, plots_available

    try:
        check_args(args)
    except ValueError as exc:
        return fail("report", exc, 3)
    except FileNotFoundError as exc:
        return fail("report", exc, 4)
    steps = Stages("weekly report", 4, enabled=not args.no_progress)
    try:
        markdown, page = _report(args, steps)
    except (OSError, ValueError, SourceError) as exc:
        steps.close()
        return fail("report", source_hint("prometheus", args.prometheus, str(exc)) if args.prometheus else exc, 4)
    try:
        steps.stage("writing")
        _write(args, markdown, page)
    except OSError as exc:
        steps.close()
        return fail("report", f"cannot write the report: {exc}", 4)
    steps.done()
    steps.close()
    if not args.markdown:
        print(markdown)
    for path in (args.html, args.markdown):
        if path:
            print(f"wrote {path}", file=sys.stderr)
    if args.html and not plots_available():
        print(f"kvscope report: {args.html} has no plots: {PLOTS_NEED}", file=sys.stderr)
    return 0


def _report(args: argparse.Namespace, steps: Stages) -> tuple[str, str | None]:
    """The report as Markdown, and as HTML when --html asks: read, computed, rendered, each a
    progress stage. Raises what reading raises, ValueError when the source holds none of the
    report's signals."""
    from kvscope.core.scalars import iso_utc
    from kvscope.report.render import render_html, render_markdown
    from kvscope.report.weekly import WEEK_S, build_report, columns

    steps.stage("reading")
    frame, end, source, diagnoses, changes = _load(args)
    if columns(frame).first_ts() is None:  # none of the report's signals in the two weeks: a message, not a crash
        raise ValueError(
            f"{source} has no kvscope samples between {iso_utc(end - 2 * WEEK_S)} and {iso_utc(end)} "
            "(does it hold the agent's series? is --end right?)"
        )
    steps.done()
    steps.stage("computing")
    report = build_report(
        frame, end, args.gpu_hour_cost, source, diagnoses=diagnoses, changes=changes, objectives=args.objectives_set
    )
    report.source += coverage_note(report.this.coverage)
    steps.done()
    steps.stage("rendering")
    markdown = render_markdown(report)
    page = render_html(report) if args.html else None
    steps.done()
    return markdown, page


def _write(args: argparse.Namespace, markdown: str, page: str | None) -> None:
    """The --html and --markdown files. Raises OSError."""
    if page is not None:
        args.html.write_text(page)
    if args.markdown:
        args.markdown.write_text(markdown)
