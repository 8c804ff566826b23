"""`kvscope ui`: the Streamlit triage UI for a recording, a Prometheus, or a running agent."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from kvscope.commands._checks import check_http_url, check_port_free, check_recording, parse_seconds, parse_time
from kvscope.commands._common import add_command, fail
from kvscope.commands._objectives import add_objective_flags, flags_of, objectives_from_args

if TYPE_CHECKING:
    from kvscope.ui.data import SourceSpec

HELP = """\
Start the triage UI (Streamlit) on 127.0.0.1. Its first screen answers "what is wrong and what
do I change": the likely cause and the top lever's exact config change per engine; below, the
evidence with its charts, every lever ranked, competing hypotheses, and the rules that could not
be evaluated. Other pages: tenants & fairness, cascades, efficiency, sizing, the rule catalog
(docs/ui.md). The Operating point and Sizing pages' C_max and the Efficiency page's goodput are
judged against the latency objectives of --objectives FILE and --slo-* (docs/goodput.md). A
recording is read once; Prometheus and an agent are queried again on the first page view after
60 s, over the last --since. Runs in the foreground; Ctrl-C stops it.

  kvscope ui --recording tests/recordings/kv-pressure-cascade.om.gz
  kvscope ui --prometheus http://127.0.0.1:9090 --since 1h
  kvscope ui --agent http://127.0.0.1:9464
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "ui", "start the triage UI (Streamlit, 127.0.0.1)", HELP)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--recording", type=Path, metavar="FILE", help="an OpenMetrics recording (.om, .om.gz)")
    src.add_argument("--prometheus", metavar="URL", help="a Prometheus holding the agent's kvscope_* series")
    src.add_argument("--agent", metavar="URL", help="a running kvscope agent")
    since_help = "window to diagnose for --prometheus/--agent: seconds or a duration"
    p.add_argument("--since", default="30m", metavar="DURATION", help=since_help)
    end_help = "window end for --prometheus/--agent: unix seconds or ISO 8601 UTC (default: now)"
    p.add_argument("--end", metavar="TIME", help=end_help)
    p.add_argument(
        "--serve-url",
        metavar="URL",
        help="the kvscope serve webhook: the triage page an alert's runbook_url opens shows the diagnosis it stored",
    )
    p.add_argument("--port", type=int, default=8501, help="port to serve on")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (think before exposing)")
    add_objective_flags(p)
    p.set_defaults(func=run)


def source_of(args: argparse.Namespace) -> SourceSpec | None:
    from kvscope.ui.data import SourceSpec

    since = parse_seconds("--since", str(args.since))
    end = None if args.end is None else parse_time("--end", str(args.end))
    if args.recording:
        return SourceSpec("recording", str(args.recording.resolve()), since)
    if args.prometheus:
        return SourceSpec("prometheus", check_http_url("--prometheus", args.prometheus), since, end)
    if args.agent:
        return SourceSpec("agent", check_http_url("--agent", args.agent, "http://127.0.0.1:9464"), since, end)
    return None


def run(args: argparse.Namespace) -> int:
    """Validate the flags, then the source, then the port: a bad recording is reported as such
    (exit 4) even while another UI holds the port."""
    try:
        source = source_of(args)
        serve = check_http_url("--serve-url", args.serve_url, "http://127.0.0.1:9095") if args.serve_url else None
        if not 0 < args.port < 65536:
            raise ValueError(f"--port: expected 1-65535, got {args.port}")
        objectives_from_args(args)  # read here to fail now; the pages read the same file and flags again
    except ValueError as exc:
        return fail("ui", exc, 3)
    try:
        if args.recording:
            check_recording(args.recording)
    except (ValueError, OSError) as exc:
        return fail("ui", exc, 4)
    try:
        check_port_free("--port", args.host, args.port)
    except ValueError as exc:
        return fail("ui", exc, 3)
    return serve_ui("ui", source, args.port, args.host, serve, objectives_spec(args))


def objectives_spec(args: argparse.Namespace) -> str | None:
    """The objective flags as the UI process reads them (ui/data.py ENV_OBJECTIVES); None: none given."""
    flags = flags_of(args)
    if not args.objectives and all(v is None for v in flags.values()):
        return None
    path = str(Path(args.objectives).resolve()) if args.objectives else None
    return json.dumps({"file": path, "flags": flags})


def serve_ui(
    command: str,
    source: SourceSpec | None,
    port: int,
    host: str = "127.0.0.1",
    serve_url: str | None = None,
    objectives: str | None = None,
) -> int:
    """Run the UI in the foreground until Ctrl-C or SIGTERM (`kvscope ui`, `kvscope demo`);
    `objectives`: `objectives_spec`'s JSON."""
    from kvscope.ui.server import TerminateRequested, UiServer, stop_on_sigterm

    stop_on_sigterm()
    server = UiServer(source, port, host, serve_url=serve_url, objectives=objectives)
    try:
        server.start()
        server.wait_healthy()
        print(f"kvscope UI: {server.url}  (Ctrl-C to stop)", flush=True)
        return server.wait()
    except RuntimeError as exc:
        return fail(command, exc, 1)
    except (KeyboardInterrupt, TerminateRequested):
        print(f"\nkvscope {command}: stopped", flush=True)
        return 0
    finally:
        server.stop()
