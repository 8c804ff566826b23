"""`kvscope diagnose`: evaluate the diagnosis rules over a window and print the likely cause first."""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from typing import Any

from kvscope.commands._checks import (
    check_http_url,
    check_recording,
    check_rules_dir,
    parse_seconds,
    parse_time,
    source_hint,
)
from kvscope.commands._params import add_param_flag, parse_params

HELP = """\
Evaluate every rule in rules/diagnosis/ over one window of engine, GPU and request signals and
rank what fired: the likely cause first (what, where, since when, the evidence numbers with the
series they came from, the levers ranked with the exact config change for vLLM / SGLang / the
router, and the source-document citation), then competing hypotheses and other findings.

Sources (pick one):
  --recording FILE.om[.gz]   an OpenMetrics recording (postmortem, tests, demo); its whole span
  --prometheus URL --since 30m   range queries against Prometheus / Thanos / Mimir / VictoriaMetrics
  --agent URL --since 30m        a kvscope agent's /api/v1/samples

Windows shorter than 15 minutes (short recordings) are evaluated with every rule duration
scaled by window / 15 min; --time-scale 1 turns that off.

Examples:
  kvscope diagnose --recording tests/recordings/kv-pressure-cascade.om.gz
  kvscope diagnose --prometheus http://127.0.0.1:9090 --since 1h
  kvscope diagnose --prometheus http://127.0.0.1:9090 --start 2026-11-22T07:00:00Z --end 2026-11-22T08:00:00Z
  kvscope diagnose --agent http://127.0.0.1:9464 --since 30m --json | jq .likely_cause
  kvscope diagnose --recording rec.om.gz --param kv_pressure_preemption.kv_full=0.85 -v

Rules whose signals the source lacks are "not evaluable" (never healthy); -v lists them.

Exit status: 0 nothing at warning or critical fired (info findings may be printed),
1 the worst finding is a warning, 2 the worst is critical, 3 bad usage, 4 the source could not
be read or holds none of the signals any rule reads (not an all-clear).
"""

EXIT_USAGE = 3
EXIT_SOURCE = 4
MAX_POINTS_PER_SERIES = 10_000
EXAMPLE_URL = {"prometheus": "http://127.0.0.1:9090", "agent": "http://127.0.0.1:9464"}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("diagnose", help="find why latency moved and which lever fixes it",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--recording", metavar="FILE", help="OpenMetrics recording (.om or .om.gz)")
    src.add_argument("--prometheus", metavar="URL", help="Prometheus-compatible base URL, e.g. http://127.0.0.1:9090")
    src.add_argument("--agent", metavar="URL", help="kvscope agent base URL, e.g. http://127.0.0.1:9464")
    p.add_argument("--since", default="30m", metavar="DURATION",
                   help="live sources: window length ending now or at --end, e.g. 30m, 2h, 1800 (default 30m)")
    p.add_argument("--end", default=None, metavar="TIME",
                   help="window end, unix seconds or ISO 8601 UTC (default: now / end of recording)")
    p.add_argument("--start", default=None, metavar="TIME",
                   help="window start, unix seconds or ISO 8601 UTC (overrides --since)")
    p.add_argument("--step", default=None,
                   help="grid step, e.g. 15s (default: the recording's scrape interval, else 15s)")
    add_param_flag(p)
    p.add_argument("--time-scale", type=float, default=None,
                   help="multiply every rule duration by this (default: auto for windows under 15 min)")
    p.add_argument("--rules-dir", default=None, help="rules directory (default: the shipped rules/diagnosis)")
    p.add_argument("--json", action="store_true", help="print the Diagnosis as JSON (schema: docs/rules.md)")
    p.add_argument("--verbose", "-v", action="store_true", help="also list the rules that were skipped and why")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvscope.diagnoser.rulebook.rule import RuleError, parse_duration, read_rules

    if not (args.recording or args.prometheus or args.agent):
        print("kvscope diagnose: pick a source: --recording, --prometheus or --agent (see --help)", file=sys.stderr)
        return EXIT_USAGE
    try:
        since = parse_seconds("--since", args.since)
        args.end = None if args.end is None else parse_time("--end", args.end)
        args.start = None if args.start is None else parse_time("--start", args.start)
        if args.step is not None:
            parse_duration(args.step)
        for flag in ("prometheus", "agent"):
            if getattr(args, flag):
                check_http_url(f"--{flag}", getattr(args, flag), EXAMPLE_URL[flag])
        check_rules_dir("--rules-dir", args.rules_dir)
        rules = read_rules(args.rules_dir)
        params = parse_params(args.param, {r.id: r.params for r in rules})
    except (ValueError, RuleError, OSError) as exc:
        print(f"kvscope diagnose: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.recording:
        try:
            check_recording(args.recording)
        except (ValueError, OSError) as exc:
            print(f"kvscope diagnose: {exc}", file=sys.stderr)
            return EXIT_SOURCE
    return _diagnose(args, rules, params, since)


def _diagnose(args: argparse.Namespace, rules: list, params: dict, since: float) -> int:
    from kvscope.diagnoser.evaluate.evaluator import diagnose, sample_names
    from kvscope.diagnoser.render import render_diagnosis
    from kvscope.diagnoser.rulebook.rule import parse_duration
    from kvscope.diagnoser.sources import SourceError

    source = _source(args)
    try:
        step = parse_duration(args.step) if args.step else _default_step(source)
        end = args.end
        start = args.start
        if start is None and not args.recording:
            end = time.time() if end is None else end
            start = end - since
        if start is not None and end is not None and (end - start) / step > MAX_POINTS_PER_SERIES:
            step = (end - start) / MAX_POINTS_PER_SERIES     # Prometheus refuses > 11,000 points per series
        names = set().union(*(sample_names(r) for r in rules))
        frame = source.read_frame(names, start, end, step)
    except SourceError as exc:
        kind = "prometheus" if args.prometheus else "agent" if args.agent else ""
        url = args.prometheus or args.agent
        print(f"kvscope diagnose: {source_hint(kind, url, str(exc)) if url else exc}", file=sys.stderr)
        return EXIT_SOURCE
    except (EOFError, zlib.error) as exc:
        print(f"kvscope diagnose: recording {args.recording} is truncated or corrupt: {exc}", file=sys.stderr)
        return EXIT_SOURCE
    except ValueError as exc:
        print(f"kvscope diagnose: {exc}", file=sys.stderr)
        return EXIT_USAGE
    result = diagnose(frame, rules, params=params, source=source.description, time_scale=args.time_scale)
    if args.json:
        print(result.to_json())
    else:
        render_diagnosis(result, verbose=args.verbose)
    if result.rules_evaluated and len(result.skipped) == result.rules_evaluated:
        why = "is it a recording of vLLM / SGLang / dcgm-exporter /metrics?" if args.recording else \
            "wrong URL or window? is anything scraping the engines?"
        print(f"kvscope diagnose: none of the {result.rules_evaluated} rules could be evaluated: "
              f"{source.description} holds none of the signals they read in this window ({why}); "
              "exit 4, not an all-clear. -v lists what is missing.", file=sys.stderr)
        return EXIT_SOURCE
    return result.exit_status()


def _source(args: argparse.Namespace) -> Any:
    if args.recording:
        from kvscope.diagnoser.sources.recording import RecordingSource
        return RecordingSource(args.recording)
    if args.prometheus:
        from kvscope.diagnoser.sources.prometheus import PrometheusSource
        return PrometheusSource(args.prometheus)
    from kvscope.diagnoser.sources.agent import AgentSource
    return AgentSource(args.agent)


def _default_step(source: Any) -> float:
    natural = getattr(source, "natural_step", None)
    return natural() if natural else 15.0
