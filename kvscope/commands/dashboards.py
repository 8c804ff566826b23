"""`kvscope dashboards build|lint`: generate the Grafana dashboards and lint their PromQL."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvscope.commands._common import add_command

HELP = """\
Build the kvscope Grafana dashboards from their Python sources (dashboards/*.py) and lint every
panel query (guarded division, rate() only on counters, histogram_quantile over sum by (le),
every series known to the catalog or the recording rules).

  kvscope dashboards build                 # fail if dashboards/build/*.json is stale
  kvscope dashboards build --update-golden # rewrite dashboards/build/*.json
  kvscope dashboards build --out DIR       # write the JSON to DIR (for Grafana provisioning)
  kvscope dashboards lint                  # lint only
"""

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "dashboards" / "build"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "dashboards", "build and lint the Grafana dashboards", HELP)
    action_help = "build: generate JSON (checks staleness); lint: check the queries only"
    p.add_argument("action", choices=("build", "lint"), help=action_help)
    p.add_argument("--out", type=Path, help="write the JSON here instead of checking dashboards/build/")
    golden_help = "rewrite dashboards/build/*.json instead of failing when they are stale"
    p.add_argument("--update-golden", action="store_true", help=golden_help)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvscope.dashboards.build import build_dashboards, check_golden
    from kvscope.dashboards.lint import lint_boards
    from kvscope.dashboards.registry import BOARDS

    issues = lint_boards(BOARDS)
    for issue in issues:
        print(f"lint: {issue}", file=sys.stderr)
    if issues:
        return 1
    if args.action == "lint":
        print(f"{sum(len(b.panels()) for b in BOARDS)} panels in {len(BOARDS)} dashboards: lint clean")
        return 0
    if args.out is not None or args.update_golden:
        out = args.out or DEFAULT_OUT
        for path in build_dashboards(out):
            print(f"wrote {path}")
        return 0
    stale = check_golden(DEFAULT_OUT)
    for name in stale:
        print(f"stale: {DEFAULT_OUT / name} (run: kvscope dashboards build --update-golden)", file=sys.stderr)
    if not stale:
        print(f"{len(BOARDS)} dashboards in {DEFAULT_OUT} are up to date")
    return 1 if stale else 0
