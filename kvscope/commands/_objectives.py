"""The latency-objective flags every command that judges requests shares (`--objectives FILE`,
`--slo-ttft`, `--slo-tpot`, `--slo-e2e`, `--slo-target`), read through core/objectives.py's one
parser: the file's `objectives:` section with the flags set over it (docs/goodput.md)."""

from __future__ import annotations

import argparse
from typing import Any

from kvscope.agent.config import read_objectives
from kvscope.core.objectives import ObjectiveSet


def add_objective_flags(parser: argparse.ArgumentParser, ttft_aliases: tuple[str, ...] = ()) -> None:
    """Add the objective flags; `ttft_aliases`: older spellings of --slo-ttft a command keeps."""
    group = parser.add_argument_group("latency objectives (docs/goodput.md)")
    group.add_argument(
        "--objectives",
        metavar="FILE",
        help="YAML whose `objectives:` section declares ttft, tpot, e2e, target, pools and tenants "
        "(the agent's config file works); the flags below override its top level",
    )
    group.add_argument(
        "--slo-ttft",
        *ttft_aliases,
        dest="slo_ttft",
        metavar="DURATION",
        help="time to first token bound, e.g. 1s or 500ms (default 1s); must be a histogram bucket bound",
    )
    for kind, what in (("tpot", "time per output token of a request, e.g. 100ms"), ("e2e", "end-to-end, e.g. 30s")):
        group.add_argument(
            f"--slo-{kind}",
            dest=f"slo_{kind}",
            metavar="DURATION",
            help=f"{what} bound (default: none; off removes one the file sets); must be a histogram bucket bound",
        )
    group.add_argument(
        "--slo-target", dest="slo_target", metavar="SHARE", help="share of requests that must meet them all (0.99)"
    )


def objectives_from_args(args: argparse.Namespace) -> ObjectiveSet:
    """The objectives the flags and --objectives declare. ValueError (or the config reader's
    ConfigError, a ValueError) saying which flag or key is wrong."""
    return read_objectives(getattr(args, "objectives", None), flags_of(args))


def flags_of(args: argparse.Namespace) -> dict[str, Any]:
    """{kind or "target": the --slo-* flag's text, None where not given}."""
    return {k: getattr(args, f"slo_{k}", None) for k in ("ttft", "tpot", "e2e", "target")}
