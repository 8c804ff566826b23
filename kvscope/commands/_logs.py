"""Flags and reading for `--log FILE` (diagnose, record): engine stats lines as canonical series."""

from __future__ import annotations

import argparse
import datetime
import gzip
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvscope.agent.logs.series import LogRead

LOG_HELP = """\
Engine logs (--log FILE, - for stdin, .gz decompressed): vLLM stats lines (0.6 on), SGLang
`Prefill batch` / `Decode batch` lines and their preemption / retraction warnings, plain or
`kubectl logs` output (--timestamps gives each line's time, --prefix its pod as the instance).
Each line becomes the canonical series a scrape at its time would have given; what the log does
not print stays absent, and other lines are counted on stderr, never guessed at (docs/logs.md).
"""


def add_log_flags(parser: argparse.ArgumentParser, job: bool = True) -> None:
    """--instance, --model, --year (and --job) for a --log source."""
    group = parser.add_argument_group("engine logs (--log)")
    instance_help = "instance label of the log's engine (default: the file name; `kubectl logs --prefix` names pods)"
    group.add_argument("--instance", metavar="NAME", help=instance_help)
    group.add_argument("--model", metavar="NAME", help="model label (default: none)")
    date_help = (
        "date of lines whose time lacks it: the year of vLLM's MM-DD, the day of older SGLang's HH:MM:SS "
        "(default: today, UTC; a later line that goes back rolls on)"
    )
    group.add_argument("--date", type=_date, metavar="YYYY-MM-DD", help=date_help)
    if job:
        group.add_argument("--job", default="engine", metavar="NAME", help="job label")


def _date(text: str) -> datetime.date:
    try:
        return datetime.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date YYYY-MM-DD: {text!r}") from None


def read_log_arg(args: argparse.Namespace, command: str) -> LogRead:
    """The LogRead of args.log; OSError / ValueError with a message for the user. A log whose
    `summary.jump_error()` is not None is refused (ValueError), its `summary.warnings()` said
    first on stderr as `kvscope <command>`; otherwise the caller says them where it wants."""
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
    if (jumped := read.summary.jump_error()) is not None:  # a window of years the log never held is no all-clear
        for warning in read.summary.warnings():
            print(f"kvscope {command}: {warning}", file=sys.stderr)
        raise ValueError(jumped)
    return read
