"""What every command repeats: its parser and its error line."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_command(subparsers: Any, name: str, help: str, description: str | None, epilog: str | None = None) -> Any:
    """A subcommand parser whose description and epilog keep their line breaks."""
    raw = argparse.RawDescriptionHelpFormatter
    return subparsers.add_parser(name, help=help, description=description, epilog=epilog, formatter_class=raw)


def fail(command: str, message: object, status: int) -> int:
    """Print `kvscope <command>: <message>` on stderr and return `status`."""
    print(f"kvscope {command}: {message}", file=sys.stderr)
    return status
