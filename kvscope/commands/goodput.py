"""`kvscope goodput`: each pool's share of requests that met every latency objective, beside its raw
throughput (diagnoser/goodput.py; docs/goodput.md)."""

from __future__ import annotations

import argparse
import json

from kvscope.commands._checks import check_recording
from kvscope.commands._common import add_command, fail
from kvscope.commands._objectives import add_objective_flags, objectives_from_args
from kvscope.commands._source import add_source_flags, open_source, read_source_flags, unread, window

HELP = """\
Goodput per pool (model): the share of requests that met every latency objective at once (time to
first token, time per output token, end to end; --slo-* or an `objectives:` section), good
requests/s and good output tokens/s beside the raw rates, and good tokens per GPU-hour where the
engine-GPU join counts the pool's GPUs.

From the engines' histograms the share is known only as bounds: each objective's share is read
from its histogram's buckets, and no engine exports which requests failed which objective, so the
combined share lies between max(0, 1 - sum of the misses) and the smallest share. An objective
whose histogram the pool does not export is not evaluable (named; the lower bound is then
unknown). Where the request tap counted each request against the objectives, the exact share of
the requests it saw is printed too. Method: docs/goodput.md.

Sources (pick one):
  --recording FILE.om[.gz]   --prometheus URL --since 1h   --agent URL --since 30m

Examples:
  kvscope goodput --recording tests/recordings/kv-pressure-cascade.om.gz --slo-tpot 100ms --slo-e2e 30s
  kvscope goodput --prometheus http://127.0.0.1:9090 --since 6h --objectives /etc/kvscope/agent.yaml --json

Exit status: 0 printed, 3 bad usage, 4 the source could not be read or counted no request.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "goodput", "each pool's share of requests meeting every latency objective", HELP)
    add_source_flags(p, since="1h", log=False)
    add_objective_flags(p)
    p.add_argument("--json", action="store_true", help="print JSON: one object per pool")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        since = read_source_flags(args)
        objectives = objectives_from_args(args)
    except ValueError as exc:
        return fail("goodput", exc, 3)
    except OSError as exc:
        return fail("goodput", exc, 4)
    try:
        if args.recording:
            check_recording(args.recording)
    except (ValueError, OSError) as exc:
        return fail("goodput", exc, 4)
    from kvscope.diagnoser.goodput import SIGNALS, pool_goodput, render_text
    from kvscope.diagnoser.sources import SourceError
    from kvscope.diagnoser.sources.window import DEFAULT_STEP_S, Span, read_window

    args.quiet, args.log_read = True, None
    source = open_source(args)
    try:
        rows = pool_goodput(read_window(source, SIGNALS, Span(*window(args, since, DEFAULT_STEP_S))), objectives)
    except SourceError as exc:
        return fail("goodput", unread(args, exc), 4)
    except ValueError as exc:
        return fail("goodput", exc, 3)
    print(json.dumps([r.to_dict() for r in rows], indent=2, sort_keys=True) if args.json else render_text(rows))
    if not rows:
        return fail("goodput", f"{source.description} counted no request on any objective's histogram", 4)
    return 0
