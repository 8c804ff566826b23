"""`kvscope` command line. Each subcommand lives in its own module in kvscope/commands/.

A command module exposes `register(subparsers)` which adds its parser and sets
`func=<callable(args) -> int>` as the default. Modules are discovered, so adding a command
never touches this file.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from kvscope import __version__, commands

DESCRIPTION = """\
kvscope watches LLM inference engines (vLLM, SGLang, llama.cpp, TGI, routers, KV tiers) and their GPUs, finds why
latency moved, and names the tuning lever that fixes it, with evidence and a citation.
"""


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """Every command's parser; with `argv` naming a command, only that command's module is
    imported (the others get a bare parser that nothing shows), so a command starts quickly."""
    parser = argparse.ArgumentParser(
        prog="kvscope", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"kvscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    names = sorted(m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_"))
    asked = next((a for a in argv or () if not a.startswith("-")), None)
    for name in names:
        if asked in names and name != asked:
            sub.add_parser(name)
            continue
        importlib.import_module(f"kvscope.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
