"""What every command repeats: its parser and its error line."""

from __future__ import annotations

import argparse
import sys
from typing import Any


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks; a flag's help ends with its default when it has one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, [], argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def add_command(subparsers: Any, name: str, help: str, description: str | None, epilog: str | None = None) -> Any:
    """A subcommand parser whose description and epilog keep their line breaks."""
    return subparsers.add_parser(name, help=help, description=description, epilog=epilog, formatter_class=_Formatter)


def fail(command: str, message: object, status: int) -> int:
    """Print `kvscope <command>: <message>` on stderr and return `status`. Control characters
    (escape codes a server put in its error text) are shown as `?`, never sent to the terminal."""
    from kvscope.core.net import printable

    print(f"kvscope {command}: {printable(message, lines=True)}", file=sys.stderr)
    return status
