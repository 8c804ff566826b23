"""The diagnose source a command's flags name (`--prometheus`, `--recording`, `--log`, `--agent`),
shared by `kvscope diagnose` and `kvscope curve`."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvscope.agent.recording.omfile import RecordingLimits
    from kvscope.diagnoser.sources.window import Source


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
    if args.log:
        from kvscope.diagnoser.sources.logs import LogSource

        return LogSource(args.log_read, "stdin" if args.log == "-" else args.log)
    from kvscope.diagnoser.sources.agent import AgentSource

    return AgentSource(args.agent, timeout_s=args.timeout)
