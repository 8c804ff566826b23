"""`kvscope curve`: each pool's latency-throughput curve from its own history, and what changed."""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from typing import TYPE_CHECKING

from kvscope.commands._checks import check_recording, parse_seconds
from kvscope.commands._common import add_command, fail
from kvscope.commands._logs import LOG_HELP, add_log_flags, read_log_arg
from kvscope.commands._objectives import add_objective_flags, objectives_from_args
from kvscope.commands._source import add_source_flags, open_source, read_source_flags, unread, window

if TYPE_CHECKING:
    from kvscope.diagnoser.sources.promapi import PromClient

HELP = """\
Read each pool's (model x engine) operating curve passively from the traffic it served: the
window cut into scrape intervals per instance, bucketed by concurrency (engine_requests_running,
the requests in one engine's running batch), and per bucket TTFT and ITL p50/p99 from the
engines' histograms merged over the bucket's intervals, requests/s, output tokens/s, KV usage and
how many intervals stand behind each number. Buckets with too little data are marked sparse and
not used. From the curve: the knee (TTFT p99 leaving p50 while throughput flattens or requests
start to wait), C_max (where TTFT p99 crosses --slo-ttft, or the p99 of TPOT or e2e crosses
--slo-tpot / --slo-e2e where the engines export per-request histograms of them; the recorded path
judges TTFT alone) and the usable RPS there, the Little's
Law gap, and the headroom of the window's peak. Method: docs/curve.md ("Sizing LLM Inference for
Production", §8.1-8.5).

What changed: config changes (the engines' info series: vLLM cache_config_info's KV capacity),
restarts (counter resets, or a new process start time) and replica-count changes split the window;
each change's curve before is compared with the curve after over the concurrency buckets both sides
measured, else over the arrival rates both sides saw (requests that finished plus the change of
those in the engine): regression, improvement, no_change (the data excludes a move beyond the
thresholds), or not_comparable where the load does not overlap or the data cannot decide, with how
much more traffic at which load would decide it.

Sources (pick one), as for `kvscope diagnose`:
  --recording FILE.om[.gz]   --log FILE   --prometheus URL --since 1h   --agent URL --since 30m

Examples:
  kvscope curve --recording tests/recordings/curve-vllm-staircase.om.gz
  kvscope curve --prometheus http://127.0.0.1:9090 --since 6h --slo-ttft 2s --json | jq '.pools[].c_max'
  kvscope curve --prometheus http://127.0.0.1:9090 --since 7d --recorded   # from kvscope-curve.yml's records

A week of a large fleet read in full is minutes and gigabytes; with kvscope-curve.yml (kvscope
rules build) loaded into the TSDB, --recorded reads each pool's points from its records in seconds,
at the rules' interval, and judges the changes from the same rows (docs/curve.md, "From recording
rules").

{log_help}
Exit status: 0 printed, 3 bad usage, 4 the source could not be read or holds no concurrency signal.
"""
HELP = HELP.format(log_help=LOG_HELP)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "curve", "each pool's latency-throughput curve, knee, C_max and what changed", HELP)
    add_source_flags(p, since="1h")
    p.add_argument(
        "--step",
        help="interval length, e.g. 15s (default: the source's scrape interval: a recording's, or the median gap "
        "between a TSDB's raw samples; else 15s)",
    )
    add_objective_flags(p, ttft_aliases=("--slo-ttft-p99",))
    p.add_argument("--json", action="store_true", help="print JSON (shape: docs/curve.md)")
    p.add_argument(
        "--recorded",
        action="store_true",
        help="--prometheus: read the curve from kvscope's curve records (kvscope-curve.yml from kvscope rules build, "
        "loaded into the TSDB) instead of every engine's histograms: a week of a large fleet in seconds; "
        "the records keep no ITL, so a change of no setting (a restart, a replica count) takes no regression "
        "or improvement on this path",
    )
    add_log_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        since = read_source_flags(args)
        if args.recorded and not args.prometheus:
            raise ValueError("--recorded reads a TSDB's curve records: use it with --prometheus URL")
        step = None if args.step is None else parse_seconds("--step", args.step)
        args.objectives_set = objectives_from_args(args)
        if args.objectives_set.default.ttft is None:
            raise ValueError("--slo-ttft: C_max needs a TTFT bound, e.g. 1s or 2.5s")
        args.slo_ttft_p99 = args.objectives_set.default.ttft
    except ValueError as exc:
        return fail("curve", exc, 3)
    try:
        if args.recording:
            check_recording(args.recording)
        if args.log:
            args.log_read = read_log_arg(args, "curve")
    except (ValueError, OSError, EOFError, zlib.error) as exc:
        return fail("curve", exc, 4)
    return _curve(args, since, step)


LONG_WINDOW_S = 6 * 3600
"""From this window on, reading every engine's histograms takes minutes at fleet size (docs/curve.md)."""


def _long_window_hint(client: PromClient, start: float, end: float) -> str:
    """What to run instead of reading every engine's histograms over a long window."""
    from kvscope.diagnoser.curve.recorded import recorded_interval

    hours = (end - start) / 3600
    if recorded_interval(client, start, end) is not None:
        return (
            f"kvscope curve: reading every engine's histograms over {hours:g} h; this TSDB keeps kvscope's curve "
            "records: --recorded reads the points and judges the changes in seconds"
        )
    return (
        f"kvscope curve: reading every engine's histograms over {hours:g} h (minutes at fleet size); "
        "load kvscope-curve.yml (kvscope rules build) into the TSDB to read long windows with --recorded"
    )


def _curve(args: argparse.Namespace, since: float, step: float | None) -> int:
    from kvscope.diagnoser.curve.recorded import recorded_curves, settings_reader
    from kvscope.diagnoser.curve.report import pool_curves, render_text, to_json
    from kvscope.diagnoser.curve.window import curve_step, read_window
    from kvscope.diagnoser.sources import SourceError
    from kvscope.diagnoser.sources.prometheus import PrometheusSource
    from kvscope.diagnoser.sources.window import DEFAULT_STEP_S

    args.quiet = True
    source = open_source(args)
    try:
        start, end = window(args, since, step or DEFAULT_STEP_S)
        if isinstance(source, PrometheusSource) and args.recorded:  # run() let --recorded through with it only
            curves = recorded_curves(source.client, start, end, args.slo_ttft_p99, settings_reader(source))
        else:
            if isinstance(source, PrometheusSource) and end - start >= LONG_WINDOW_S:
                print(_long_window_hint(source.client, start, end), file=sys.stderr)
            frame = read_window(source, start, end, step or curve_step(source, start, end, DEFAULT_STEP_S))
            curves = pool_curves(frame, slo_s=args.slo_ttft_p99, objectives=args.objectives_set)
    except SourceError as exc:
        return fail("curve", unread(args, exc), 4)
    except ValueError as exc:
        return fail("curve", exc, 3)
    if args.json:
        print(json.dumps(to_json(curves, args.slo_ttft_p99), indent=2, sort_keys=True))
    else:
        print(render_text(curves, args.slo_ttft_p99))
    if not curves:
        return fail("curve", f"{source.description} has no engine_requests_running in this window: no curve", 4)
    return 0
