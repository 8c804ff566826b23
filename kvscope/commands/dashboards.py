"""`kvscope dashboards build|lint`: generate the Grafana dashboards and lint their PromQL."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvscope.commands._common import add_command, fail

HELP = """\
Build the kvscope Grafana dashboards from their Python sources (dashboards/*.py) and lint every
panel query (guarded division, rate() only on counters, histogram_quantile over sum by (le),
every series known to the catalog or the recording rules).

  kvscope dashboards build                 # write the JSON to ./kvscope-dashboards/
  kvscope dashboards build --out DIR       # write the JSON to DIR (a Grafana provisioning folder)
  kvscope dashboards build --check         # fail if the repository's dashboards/build/*.json is stale
  kvscope dashboards build --update-golden # rewrite the repository's dashboards/build/*.json
  kvscope dashboards lint                  # lint only

--out DIR is kvscope's own folder: JSON files in it that no dashboard produces are removed.
"""

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "dashboards" / "build"
"""The repository's generated dashboards (--check, --update-golden)."""

WRITE_TO = Path("kvscope-dashboards")
"""Where `build` writes without --out: a folder in the working directory."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "dashboards", "build and lint the Grafana dashboards", HELP)
    action_help = "build: write the dashboards' JSON; lint: check the queries only"
    p.add_argument("action", choices=("build", "lint"), help=action_help)
    p.add_argument("--out", type=Path, help=f"write the JSON here (default ./{WRITE_TO}/)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="write nothing; fail if dashboards/build/*.json is stale")
    golden_help = "rewrite the repository's dashboards/build/*.json"
    mode.add_argument("--update-golden", action="store_true", help=golden_help)
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
    if (args.check or args.update_golden) and args.out is not None:
        both = (
            "--out writes a folder of your own; --check and --update-golden work on the repository's dashboards/build/"
        )
        return fail("dashboards", both, 3)
    if not args.check:
        out = DEFAULT_OUT if args.update_golden else args.out or WRITE_TO
        paths = build_dashboards(out)
        print(f"wrote {len(paths)} dashboards to {out}/: {', '.join(p.name for p in paths)}")
        if not args.update_golden:
            print(
                "Grafana: import them (Dashboards > New > Import), or point a dashboard file provider at "
                f"{out.resolve()} (docs/dashboards.md)"
            )
        return 0
    stale = check_golden(DEFAULT_OUT)
    for name in stale:
        print(f"stale: {DEFAULT_OUT / name} (run: kvscope dashboards build --update-golden)", file=sys.stderr)
    if not stale:
        print(f"{len(BOARDS)} dashboards in {DEFAULT_OUT} are up to date")
    return 1 if stale else 0
