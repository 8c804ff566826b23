"""Flags and reading for `--log FILE` (diagnose, record): engine stats lines as canonical series."""

from __future__ import annotations

import argparse
import datetime
import gzip
import os
import sys
from typing import Any

LOG_HELP = """\
Engine logs (--log FILE, or - for stdin; .gz is decompressed): vLLM V0 and V1 stats lines
(`Avg prompt throughput: .. Running: N reqs, Waiting: M reqs, GPU KV cache usage: X%, ..`, from
0.6 on), SGLang `Prefill batch` / `Decode batch` lines, vLLM V0 preemption and SGLang retraction
warnings; plain or `kubectl logs` output (with --timestamps the RFC 3339 time of each line is
used, with --prefix the pod becomes the instance). Each line becomes the canonical series a
scrape at its time would have given: running, waiting, KV usage, prefix hit rate, prompt and
generation tokens (vLLM's logged tokens/s integrated over the time between stats lines) and
preemptions / retractions as counters; what the log does not print stays absent. Lines that are
not engine stats are counted and summarised on stderr, never guessed at. Formats per release:
docs/logs.md.
"""


def add_log_flags(parser: argparse.ArgumentParser, job: bool = True) -> None:
    """--instance, --model, --year (and --job) for a --log source."""
    group = parser.add_argument_group("engine logs (--log)")
    group.add_argument(
        "--instance",
        metavar="NAME",
        help="instance label of the log's engine (default: the file name; `kubectl logs "
        "--prefix` lines name their pod)",
    )
    group.add_argument("--model", metavar="NAME", help="model label (default: none)")
    group.add_argument(
        "--date",
        type=_date,
        metavar="YYYY-MM-DD",
        help="date of lines whose time lacks it: the year of vLLM's MM-DD, the day of older "
        "SGLang's HH:MM:SS (default: today, UTC; a later line that goes back rolls on)",
    )
    if job:
        group.add_argument("--job", default="engine", metavar="NAME", help="job label (default engine)")


def _date(text: str) -> datetime.date:
    try:
        return datetime.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date YYYY-MM-DD: {text!r}") from None


def read_log_arg(args: argparse.Namespace) -> Any:
    """The LogRead of args.log; OSError / ValueError with a message for the user."""
    from kvscope.agent.logs.series import read_log

    name = "stdin" if args.log == "-" else os.path.basename(args.log)
    instance = args.instance or name.removesuffix(".gz").removesuffix(".log").removesuffix(".txt") or "log"
    if args.log == "-":
        read = read_log(sys.stdin.buffer, instance, args.job, args.model, args.date)
    else:
        if os.path.isdir(args.log):
            raise ValueError(f"log {args.log} is a directory")
        with open(args.log, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw) if gz else raw
            read = read_log(stream, instance, args.job, args.model, args.date)  # type: ignore[arg-type]
    if not read.scrapes:
        raise ValueError(f"log {args.log} holds no vLLM or SGLang stats lines ({read.summary.text()})")
    return read
