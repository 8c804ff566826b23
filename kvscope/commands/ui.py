"""`kvscope ui`: the Streamlit triage UI for a recording, a Prometheus, or a running agent."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = """\
Start the triage UI (Streamlit) on 127.0.0.1. The triage page shows the likely cause first: what,
where, since when, evidence charts, the levers with the exact config to change and the source
section they come from; then competing hypotheses and a timeline. Other pages: tenants &
fairness, cascades, efficiency, a sizing calculator, and the rule/lever catalog.

  kvscope ui --recording tests/recordings/<incident>.om
  kvscope ui --prometheus http://127.0.0.1:9090 --since 1h
  kvscope ui --agent http://127.0.0.1:9400

Runs in the foreground; Ctrl-C stops it.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ui", help="start the triage UI (Streamlit, 127.0.0.1)", description=HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--recording", type=Path, metavar="FILE", help="an OpenMetrics recording (.om, .om.gz)")
    src.add_argument("--prometheus", metavar="URL", help="a Prometheus holding the agent's kvscope_* series")
    src.add_argument("--agent", metavar="URL", help="a running kvscope agent")
    p.add_argument("--since", type=float, default=1800.0, metavar="SECONDS",
                   help="window to diagnose for --prometheus/--agent (default 1800)")
    p.add_argument("--end", type=float, default=None, metavar="UNIX_SECONDS",
                   help="window end for --prometheus/--agent (default: now)")
    p.add_argument("--port", type=int, default=8501, help="port on 127.0.0.1 (default 8501)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; think before exposing)")
    p.set_defaults(func=run)


def source_of(args: argparse.Namespace):
    from kvscope.ui.data import Source

    if args.recording:
        return Source("recording", str(args.recording.resolve()), args.since)
    if args.prometheus:
        return Source("prometheus", args.prometheus, args.since, args.end)
    if args.agent:
        return Source("agent", args.agent, args.since, args.end)
    return None


def run(args: argparse.Namespace) -> int:
    from kvscope.ui.server import TerminateRequested, UiServer, stop_on_sigterm

    if args.recording and not args.recording.is_file():
        print(f"kvscope ui: recording {args.recording} does not exist", file=sys.stderr)
        return 4
    stop_on_sigterm()
    server = UiServer(source_of(args), args.port, args.host).start()
    try:
        server.wait_healthy()
        print(f"kvscope UI: {server.url}  (Ctrl-C to stop)", flush=True)
        return server.wait()
    except RuntimeError as exc:
        print(f"kvscope ui: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, TerminateRequested):
        return 0
    finally:
        server.stop()
