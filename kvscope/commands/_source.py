"""The diagnose source and window a command's flags name (`--prometheus`, `--recording`, `--log`,
`--agent`; `--since`, `--start`, `--end`, `--timeout`), shared by `kvscope diagnose`, `kvscope curve`
and `kvscope goodput`."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from kvscope.commands._checks import check_http_url, parse_seconds, parse_time, source_hint

if TYPE_CHECKING:
    from kvscope.agent.recording.omfile import RecordingLimits
    from kvscope.diagnoser.sources.window import Source


EXAMPLE_URL = {"prometheus": "http://127.0.0.1:9090", "agent": "http://127.0.0.1:9464"}
END_HELP = "window end, unix seconds or ISO 8601 UTC (default: now / end of recording)"


def add_source_flags(
    parser: argparse.ArgumentParser,
    since: str,
    log: bool = True,
    end_help: str = END_HELP,
) -> None:
    """One source (--recording, --prometheus, --agent and, with `log`, --log), the window (--since,
    default `since`; --start, --end), --timeout and the recording caps; read by `read_source_flags`."""
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--recording", metavar="FILE", help="OpenMetrics recording (.om or .om.gz)")
    src.add_argument(
        "--prometheus", metavar="URL", help=f"Prometheus-compatible base URL, e.g. {EXAMPLE_URL['prometheus']}"
    )
    src.add_argument("--agent", metavar="URL", help=f"kvscope agent base URL, e.g. {EXAMPLE_URL['agent']}")
    if log:
        src.add_argument("--log", metavar="FILE", help="engine log: vLLM / SGLang stats lines (- for stdin; see below)")
    parser.add_argument("--since", default=since, metavar="DURATION", help="live sources: window length, e.g. 30m, 6h")
    parser.add_argument(
        "--start", metavar="TIME", help="window start, unix seconds or ISO 8601 UTC (overrides --since)"
    )
    parser.add_argument("--end", metavar="TIME", help=end_help)
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="--prometheus/--agent: seconds one HTTP query may take, connect to last byte",
    )
    add_recording_cap_flags(parser)


def read_source_flags(args: argparse.Namespace) -> float:
    """Check the flags of `add_source_flags`: one source picked, URLs, --timeout; --start and --end
    made unix seconds in `args`. Returns --since in seconds; ValueError (bad usage) naming the flag."""
    flags = (
        ("recording", "log", "prometheus", "agent") if hasattr(args, "log") else ("recording", "prometheus", "agent")
    )
    if not any(getattr(args, f) for f in flags):
        named = ", ".join(f"--{f}" for f in flags[:-1])
        raise ValueError(f"pick a source: {named} or --{flags[-1]} (see --help)")
    since = parse_seconds("--since", args.since)
    parse_seconds("--timeout", str(args.timeout))
    args.end = None if args.end is None else parse_time("--end", args.end)
    args.start = None if args.start is None else parse_time("--start", args.start)
    for flag in ("prometheus", "agent"):
        if getattr(args, flag):
            check_http_url(f"--{flag}", getattr(args, flag), EXAMPLE_URL[flag])
    return since


def window(args: argparse.Namespace, since: float, lattice: float | None) -> tuple[Any, Any]:
    """(start, end) of the window the flags name (`read_source_flags` made them unix seconds):
    --start and --end as given; for a live source without --start, the `since` seconds ending at
    --end or now, now rounded down to a multiple of `lattice` where one is given (`lattice_end`).
    A recording or a log without them: None (its whole span); typed as argparse's
    values are, the live paths reading them as floats."""
    from kvscope.diagnoser.sources.window import lattice_end

    start, end = args.start, args.end
    if start is None and not (args.recording or getattr(args, "log", None)):
        if end is None:
            end = lattice_end(lattice) if lattice else time.time()
        start = end - since
    return start, end


def unread(args: argparse.Namespace, exc: Exception) -> str:
    """Why the source could not be read (a SourceError); for --prometheus or --agent with the hint
    `source_hint` gives."""
    url = args.prometheus or args.agent
    return source_hint("prometheus" if args.prometheus else "agent", url, str(exc)) if url else str(exc)


def add_recording_cap_flags(parser: argparse.ArgumentParser) -> None:
    """--max-series, --max-targets, --max-recording-mib: the RecordingLimits a recording is read
    within (agent/recording/omfile.py), each named in the error past it."""
    caps = "--recording: refuse a recording past this many "
    parser.add_argument("--max-series", type=_positive, metavar="N", help=caps + "series (default 100000)")
    parser.add_argument(
        "--max-targets", type=_positive, metavar="N", help=caps + "targets (job, instance; default 1000)"
    )
    parser.add_argument("--max-recording-mib", type=_positive, metavar="MIB", help=caps + "MiB of text (default 1024)")


def _positive(text: str) -> int:
    """A whole number from 1 (a cap's flag)."""
    if not (text.isascii() and text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"not a whole number from 1: {text[:40]!r}")
    return int(text)


def recording_limits(args: argparse.Namespace) -> RecordingLimits:
    """The RecordingLimits the cap flags give (`add_recording_cap_flags`; defaults where absent)."""
    from kvscope.agent.recording.omfile import RecordingLimits

    default = RecordingLimits()
    mib = getattr(args, "max_recording_mib", None)
    return RecordingLimits(
        max_bytes=default.max_bytes if mib is None else mib << 20,
        max_series=getattr(args, "max_series", None) or default.max_series,
        max_targets=getattr(args, "max_targets", None) or default.max_targets,
    )


def open_source(args: argparse.Namespace) -> Source:
    """The Source the flags name; `args.log_read` must hold the log already read (`read_log_arg`).
    With --prometheus, progress goes to stderr unless `args.quiet`; --prometheus and --agent
    reads each end within `args.timeout` seconds."""
    if args.prometheus:
        from kvscope.diagnoser.sources.promapi import PromClient
        from kvscope.diagnoser.sources.prometheus import PrometheusSource

        progress = None if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
        client = PromClient(args.prometheus, timeout_s=args.timeout, progress=progress)
        return PrometheusSource(args.prometheus, client=client)
    if args.recording:
        from kvscope.diagnoser.sources.recording import RecordingSource

        return RecordingSource(args.recording, limits=recording_limits(args))
    if getattr(args, "log", None):  # goodput has no --log
        from kvscope.diagnoser.sources.logs import LogSource

        return LogSource(args.log_read, "stdin" if args.log == "-" else args.log)
    from kvscope.diagnoser.sources.agent import AgentSource

    return AgentSource(args.agent, timeout_s=args.timeout)
