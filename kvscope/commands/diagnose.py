"""`kvscope diagnose`: evaluate the diagnosis rules over a window and print the likely cause first."""

from __future__ import annotations

import argparse
import sys
import zlib
from typing import TYPE_CHECKING

from kvscope.commands._checks import check_recording, check_rules_dir, parse_seconds
from kvscope.commands._common import add_command, fail
from kvscope.commands._logs import LOG_HELP, add_log_flags, read_log_arg
from kvscope.commands._params import add_param_flag, parse_params
from kvscope.commands._source import add_source_flags, open_source, read_source_flags, unread, window

if TYPE_CHECKING:
    from kvscope.diagnoser.findings import Diagnosis
    from kvscope.diagnoser.sources.prometheus import PrometheusSource
    from kvscope.diagnoser.sources.window import Source

HELP = """\
Evaluate every rule in rules/diagnosis/ over one window of engine, GPU and request signals and
rank what fired: the likely cause first (what, where, since when, the evidence numbers with the
series they came from, the levers ranked with the exact config change for vLLM / SGLang / the
router, and the source-document citation), then competing hypotheses and other findings.

Sources (pick one):
  --recording FILE.om[.gz]   an OpenMetrics recording (postmortem, tests, demo); its whole span
  --log FILE                 an engine log (vLLM / SGLang stats lines, - for stdin); its whole span
  --prometheus URL --since 30m   range queries against Prometheus / Thanos / Mimir / VictoriaMetrics
  --agent URL --since 30m        a kvscope agent's /api/v1/samples

Windows shorter than 15 minutes (short recordings) are evaluated with every rule duration
scaled by window / 15 min; --time-scale 1 turns that off.

--prometheus reads the candidate records of `kvscope rules build` and fetches evidence only where
one fired; rules whose records miss part of the window are judged on every engine's series, and
stderr says which ("fleet: ..."), and what was split to stay within the server's query limits
("split: ..."). How, and how to backfill the records: docs/fleet.md.

Examples:
  kvscope diagnose --recording tests/recordings/kv-pressure-cascade.om.gz
  kvscope diagnose --prometheus http://127.0.0.1:9090 --since 1h
  kvscope diagnose --prometheus http://127.0.0.1:9090 --start 2026-11-22T07:00:00Z --end 2026-11-22T08:00:00Z
  kvscope diagnose --agent http://127.0.0.1:9464 --since 30m --json | jq .likely_cause
  kubectl logs deploy/vllm --timestamps | kvscope diagnose --log - --instance vllm-0
  kvscope diagnose --recording rec.om.gz --param kv_pressure_preemption.kv_full=0.85 -v

Rules whose signals the source lacks are "not evaluable" (never healthy); -v lists them.

"What changed in this window": config changes, restarts and replica-count changes found in the
window, each judged by the curve before against after at matched load; a regression is the finding
regression_after_change (docs/curve.md; `kvscope curve` shows the curves). With --prometheus
only with --changes (the likely cause's pool: the engines of its model, from the TSDB's index; every
pool when nothing fired) or --full-fetch (every pool): it reads those engines' TTFT and ITL buckets
in full, about 2 s per 250 engines and hour of 15 s scrapes.

{log_help}
Exit status: 0 nothing at warning or critical fired (info findings may be printed),
1 the worst finding is a warning, 2 the worst is critical, 3 bad usage, 4 the source could not
be read or holds none of the signals any rule reads (not an all-clear). A source that could not be
read says "not diagnosed: <reason>" on stderr; with --json stdout holds
{{"status": "not_diagnosed", "reason": ...}}.
"""

HELP = HELP.format(log_help=LOG_HELP)
EXIT_USAGE = 3
EXIT_SOURCE = 4
MAX_POINTS_PER_SERIES = 10_000


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "diagnose", "find why latency moved and which lever fixes it", HELP)
    end_help = (
        "window end, unix seconds or ISO 8601 UTC (default: now / end of recording; with --prometheus, "
        "now rounded down to a multiple of --step, as Grafana asks, so that caching TSDBs answer at the times asked)"
    )
    add_source_flags(p, since="30m", end_help=end_help)
    p.add_argument("--step", help="grid step, e.g. 15s (default: the recording's scrape interval, else 15s)")
    add_param_flag(p)
    p.add_argument("--time-scale", type=float, help="multiply every rule duration by this (default: auto under 15 min)")
    p.add_argument("--rules-dir", help="rules directory (default: the shipped rules/diagnosis)")
    p.add_argument("--full-fetch", action="store_true", help="--prometheus: judge every rule on every engine's series")
    p.add_argument(
        "--changes", action="store_true", help="--prometheus: also read what changed in the likely cause's pool"
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress or fleet summary on stderr")
    p.add_argument("--json", action="store_true", help="print the Diagnosis as JSON (schema: docs/rules.md)")
    p.add_argument("--verbose", "-v", action="store_true", help="also list the rules that were skipped and why")
    add_log_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvscope.diagnoser.rulebook.rule import RuleError, read_rules

    try:
        since = read_source_flags(args)
        args.step = None if args.step is None else parse_seconds("--step", args.step)
        check_rules_dir("--rules-dir", args.rules_dir)
        rules = read_rules(args.rules_dir)
        params = parse_params(args.param, {r.id: r.params for r in rules})
    except (ValueError, RuleError, OSError) as exc:
        return fail("diagnose", exc, EXIT_USAGE)
    try:
        if args.recording:
            check_recording(args.recording)
        if args.log:
            args.log_read = read_log_arg(args, "diagnose")
            for warning in args.log_read.summary.warnings():  # said even with -q: the window is not the log's
                print(f"kvscope diagnose: {warning}", file=sys.stderr)
    except (ValueError, OSError, EOFError, zlib.error) as exc:
        return fail("diagnose", f"cannot read log {args.log}: {exc}" if args.log else exc, EXIT_SOURCE)
    return _diagnose(args, rules, params, since)


def _diagnose(args: argparse.Namespace, rules: list, params: dict, since: float) -> int:
    from kvscope.diagnoser.evaluate.evaluator import diagnose, sample_names
    from kvscope.diagnoser.sources import SourceError
    from kvscope.diagnoser.sources.prometheus import PrometheusSource
    from kvscope.diagnoser.sources.window import DEFAULT_STEP_S, Span, read_window

    source = open_source(args)
    if args.recording or args.log:  # not for a TSDB: the recording replay (and aiohttp with it) stays unimported
        from kvscope.diagnoser.sources.recording import RecordingSource

        if isinstance(source, RecordingSource):  # logs too: a grid too large for the --step asked for is refused
            source.step_given = args.step is not None
    try:
        step = args.step or source.natural_step() or DEFAULT_STEP_S
        start, end = window(args, since, step if args.prometheus else None)  # --prometheus: now on the step's lattice
        if start is not None and end is not None and not args.prometheus:
            step = max(step, (end - start) / MAX_POINTS_PER_SERIES)  # Prometheus refuses > 11,000 points per series
        if isinstance(source, PrometheusSource) and not args.full_fetch:
            result = _fleet(args, source, rules, params, start, end, step)
            return _finish(args, source, _pool_changes(args, source, result, start, end, step))
        frame = read_window(source, set().union(*(sample_names(r) for r in rules)), Span(start, end), step)
        _print_notes(args, source)
    except SourceError as exc:
        return _not_diagnosed(args, unread(args, exc))
    except ValueError as exc:
        return fail("diagnose", exc, EXIT_USAGE)
    result = diagnose(frame, rules, params=params, source=source.description, time_scale=args.time_scale)
    return _finish(args, source, _with_changes(source, result, start, end, step))


def _not_diagnosed(args: argparse.Namespace, why: str) -> int:
    """The source could not be read: "not diagnosed: <why>" on stderr, with --json also
    `{"status": "not_diagnosed", "reason": ...}` on stdout (never an empty all-clear); exit 4."""
    if args.json:
        import json

        print(json.dumps({"status": "not_diagnosed", "reason": why.splitlines()[0] if why else why}))
    return fail("diagnose", f"not diagnosed: {why}", EXIT_SOURCE)


def _with_changes(source: Source, result: Diagnosis, start: float | None, end: float | None, step: float) -> Diagnosis:
    """The diagnosis with what changed in the window (`curve.report.with_changes`); as it is, said
    on stderr, when the curve cannot be read: the findings stand (as `serve` keeps them)."""
    from kvscope.diagnoser.curve.report import with_changes
    from kvscope.diagnoser.sources import SourceError

    try:
        return with_changes(source, result, start, end, step)
    except SourceError as exc:
        return _changes_unread(result, exc)


def _changes_unread(result: Diagnosis, exc: Exception) -> Diagnosis:
    """The diagnosis as it is, with why what changed could not be read said on stderr."""
    print(f"kvscope diagnose: what changed in the window could not be read: {exc}", file=sys.stderr)
    return result


def _pool_changes(
    args: argparse.Namespace, source: PrometheusSource, result: Diagnosis, start: float, end: float, step: float
) -> Diagnosis:
    """The fleet path's diagnosis, with what changed in the likely cause's pool when --changes asks
    (the pool the webhook reads for an alert at that place: `scope_to_pool`)."""
    from kvscope.diagnoser.sources import SourceError
    from kvscope.diagnoser.sources.prometheus import scope_to_pool

    if not args.changes:
        if not args.quiet:
            print("what changed: not read on the fleet path (--changes reads the likely cause's pool)", file=sys.stderr)
        return result
    where = result.likely_cause.where if result.likely_cause else {}
    try:
        scope = scope_to_pool(source, where.get("model"), where.get("instance"), start, end)
    except SourceError as exc:
        return _changes_unread(result, exc)
    if not args.quiet:
        print(f"what changed: read for {scope}", file=sys.stderr)
    return _with_changes(source, result, start, end, step)


def _fleet(
    args: argparse.Namespace, source: PrometheusSource, rules: list, params: dict, start: float, end: float, step: float
) -> Diagnosis:
    from kvscope.diagnoser.pushdown.run import diagnose_fleet

    result, report = diagnose_fleet(
        source.client,
        start,
        end,
        step,
        rules,
        params=params,
        time_scale=args.time_scale,
        source=source.description,
        catalog=source.catalog,
    )
    from kvscope.diagnoser.pushdown.candidates import describe

    # which rules were judged by the full fetch because the records miss part of the window: always said
    for line in report.summary(source.client) if not args.quiet else describe(report.hits):
        print(line, file=sys.stderr)
    return result


def _print_notes(args: argparse.Namespace, source: Source) -> None:
    from kvscope.diagnoser.sources.logs import LogSource
    from kvscope.diagnoser.sources.prometheus import PrometheusSource

    if isinstance(source, LogSource) and not args.quiet:
        print(source.summary.text(), file=sys.stderr)
    if isinstance(source, PrometheusSource) and not args.quiet:
        for note in source.client.notes:
            print(f"split: {note}", file=sys.stderr)
    for note in source.notes:  # what a recording's reader left out: always said
        print(f"kvscope diagnose: {note}", file=sys.stderr)


def _finish(args: argparse.Namespace, source: Source, result: Diagnosis) -> int:
    from kvscope.diagnoser.findings import nothing_evaluable
    from kvscope.diagnoser.render import render_diagnosis

    if args.json:
        print(result.to_json())
    else:
        render_diagnosis(result, verbose=args.verbose)
    if nothing_evaluable(result):
        why = (
            "is it a recording of vLLM / SGLang / dcgm-exporter /metrics?"
            if args.recording
            else "which engine signals the log lines carry: docs/logs.md"
            if args.log
            else "wrong URL or window? is anything scraping the engines?"
        )
        return fail(
            "diagnose",
            f"none of the {result.rules_evaluated} rules could be evaluated: {source.description} holds none of "
            f"the signals they read in this window ({why}); exit 4, not an all-clear. -v lists what is missing.",
            EXIT_SOURCE,
        )
    return result.exit_status()
