"""`kvscope record`: scrape targets for a while and write an OpenMetrics recording."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Any

from kvscope.agent.collectors.engine import EngineCollector
from kvscope.agent.config import AgentConfig, ConfigError
from kvscope.agent.recording.omfile import RecordingWriter
from kvscope.commands._checks import check_output_file, parse_seconds
from kvscope.commands._common import add_command, fail
from kvscope.commands._flags import ENV_HELP, add_scrape_flags, config_from_args
from kvscope.commands._logs import LOG_HELP, add_log_flags, read_log_arg
from kvscope.commands._progress import progress_bar

DESCRIPTION = """\
Record what engine (vLLM, SGLang) and dcgm-exporter /metrics endpoints expose, for a
postmortem, a test fixture or the demo: every --interval all targets are scraped and written as
Prometheus would store them (native names, target labels, `up` and `scrape_duration_seconds`;
a failed scrape is `up 0`). The output is OpenMetrics text with timestamps (gzip for .gz), for
kvscope diagnose / report / ui, or `promtool tsdb create-blocks-from openmetrics FILE DIR`.
Ctrl-C (or SIGTERM) stops early and still writes a complete file.

With --log FILE, no scraping: the engine log's stats lines are written as the recording a scrape
at each line's time would have given (kvscope_<signal> series, `up` per line time).

{log_help}"""

DESCRIPTION = DESCRIPTION.format(log_help=LOG_HELP)
EXAMPLES = """\
examples:
  kvscope record --target http://127.0.0.1:8000/metrics --duration 10m --out incident.om.gz
  kvscope record --config kvscope.yaml --duration 2m --interval 1s --out load-test.om
  kubectl logs pod/vllm-0 --timestamps | kvscope record --log - --instance vllm-0 -o incident.om.gz
"""


def register(subparsers: Any) -> None:
    help = "record engine /metrics to an OpenMetrics file (promtool-compatible)"
    parser = add_command(subparsers, "record", help, DESCRIPTION, EXAMPLES + "\n" + ENV_HELP)
    add_scrape_flags(parser)
    duration_help = "how long to record: seconds or a duration (30s, 10m, 1h); required unless --log"
    parser.add_argument("--duration", metavar="DURATION", help=duration_help)
    interval_help = "time between scrapes (default: the config's scrape interval, 15s); same as --scrape.interval"
    parser.add_argument("--interval", metavar="DURATION", help=interval_help)
    out_help = "recording to write (.om, or .om.gz for gzip)"
    parser.add_argument("--out", "-o", required=True, metavar="FILE", help=out_help)
    parser.add_argument("--no-progress", action="store_true", help="do not draw a progress bar")
    log_help = "write the recording of an engine log instead of scraping (- for stdin; see above)"
    parser.add_argument("--log", metavar="FILE", help=log_help)
    add_log_flags(parser, job=False)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        out = check_output_file("--out", args.out)
    except ValueError as exc:
        return fail("record", exc, 2)
    if args.log:
        return _record_log(args, out)
    if args.duration is None:
        return fail("record", "--duration is required (or give --log FILE)", 2)
    if args.interval is not None:
        args.scrape_interval = args.interval
    try:
        duration_s = parse_seconds("--duration", args.duration)
    except ValueError as exc:
        return fail("record", exc, 2)
    try:
        config = config_from_args(args, None)
    except ConfigError as e:
        return fail("record", f"config error: {e}", 2)
    if not config.targets:
        return fail("record", "no targets: give --target URL or a --config with targets", 2)
    summary, failed, scrapes = asyncio.run(record(config, duration_s, out, progress=not args.no_progress))
    print(summary, file=sys.stderr)
    if scrapes and failed == scrapes:  # a recording of nothing but `up 0` is no recording of the engines
        said = f"all {scrapes} scrape(s) failed: the recording holds only `up 0`; check the targets"
        return fail("record", said, 1)
    return 0


def _record_log(args: argparse.Namespace, out: Path) -> int:
    import zlib

    from kvscope.agent.recording.fromlog import write_log_recording

    try:
        read = read_log_arg(args, "record")
    except (ValueError, OSError, EOFError, zlib.error) as exc:
        return fail("record", f"cannot read log {args.log}: {exc}", 2)
    path = write_log_recording(read, out)
    samples = sum(len(s) for _, _, s in read.scrapes)
    print(f"{read.summary.text()}\nwrote {path} ({len(read.scrapes)} scrapes, {samples} samples)", file=sys.stderr)
    for warning in read.summary.warnings():
        print(f"kvscope record: {warning}", file=sys.stderr)
    return 0


async def record(config: AgentConfig, duration_s: float, out: Path, progress: bool = True) -> tuple[str, int, int]:
    """Scrape every interval for `duration_s` (or until SIGINT/SIGTERM) and write `out`. Returns
    (what was written, in words; scrapes that failed; scrapes in all)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    collector = EngineCollector(config)
    writer = RecordingWriter(out)
    failed = 0
    bar = progress_bar(
        progress,
        total=round(duration_s),
        unit="s",
        desc=f"recording {len(config.targets)} target(s)",
        bar_format="{l_bar}{bar}| {n:.0f}/{total}s{postfix}",
    )
    start = time.monotonic()
    next_tick = start
    try:
        while not stop.is_set() and time.monotonic() - start < duration_s:
            for scrape in await collector.scrape_all():
                writer.add_scrape(
                    scrape.target.job,
                    scrape.target.instance,
                    scrape.timestamp,
                    scrape.exposition(),
                    scrape.duration_s,
                    scrape.target.target_labels(),
                )
                failed += scrape.text is None
            bar.n = min(duration_s, time.monotonic() - start)
            bar.set_postfix_str(f"{writer.scrapes} scrapes, {failed} failed, {writer.samples} samples")
            next_tick += config.interval_s
            remaining = min(next_tick, start + duration_s) - time.monotonic()
            if remaining > 0:
                try:
                    await asyncio.wait_for(stop.wait(), timeout=remaining)
                except TimeoutError:
                    pass
    except BaseException:
        writer.abort()
        raise
    finally:
        if not stop.is_set():
            bar.n = bar.total
        bar.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await collector.close()
    path = writer.close()
    how = "stopped early" if stop.is_set() else "done"
    said = (
        f"{how}: wrote {path} ({writer.scrapes} scrapes of {len(config.targets)} target(s), "
        f"{failed} failed, {writer.samples} samples)"
    )
    return said, failed, writer.scrapes
