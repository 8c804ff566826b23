"""`kvscope rules build`: write the Prometheus rule files and runbooks built from the catalog
and the diagnosis rules (diagnoser/promql/rulefiles.py)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from kvscope.commands._checks import check_http_url, check_rules_dir
from kvscope.commands._common import add_command, fail
from kvscope.commands._objectives import add_objective_flags, objectives_from_args

BUILD_HELP = """\
Generate Prometheus recording and alerting rules from core/catalog.yaml and
rules/diagnosis/*.yaml (kvscope:<signal> canonical series, instance:<signal>:<op> dashboard
aggregates, the TTFT SLO burn-rate alert, engine-metrics-absent alerts, one Llm<RuleName> alert
per rule PromQL can express), and one runbook per alert. Load every file in --out with
Prometheus' rule_files (docs/alerting.md). With --check nothing is written; exit 1 when a file on
disk differs from a fresh build.

examples:
  kvscope rules build                                   # after editing catalog, rules or levers
  kvscope rules build --check                           # CI: exit 1 when the committed files are stale
  kvscope rules build --slo-ttft 1s --slo-target 0.995 --out /etc/prometheus/rules/kvscope
"""

RULES_HELP = """\
Work with kvscope's rule files: the diagnosis rules in rules/diagnosis/*.yaml (what
`kvscope diagnose`, `serve` and the UI evaluate) and the Prometheus rules generated from them.

examples:
  kvscope rules check          # validate rules/diagnosis/*.yaml; problems as file:line: message
  kvscope rules build          # write rules/prometheus/*.yml and docs/runbooks/*.md
  kvscope rules build --help   # SLO and output options
  kvscope rules coverage       # which engine versions give the signals the rules read
"""

COVERAGE_HELP = """\
For every canonical signal the diagnosis rules, the dashboards and the generated Prometheus rules
read, and every engine release listed in --names (metric names gathered from the engines' own
sources, tests/fixtures/engine_names/), say whether the catalog maps it (maps / off), the release
lacks it (-), or exports it under a name no alias reads (UNMAPPED) or dropped a name the catalog
relies on (RENAMED). Exit 1 when an UNMAPPED or RENAMED cell is not in --allow (each allowed entry
carries its reason), or an allowed entry covers nothing any more.

examples:
  kvscope rules coverage                                  # the table on stdout
  kvscope rules coverage --write docs/engine-coverage.md  # refresh the checked-in table
  kvscope rules coverage --check docs/engine-coverage.md  # CI: exit 1 when it is stale
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(subparsers, "rules", "check the diagnosis rules; build Prometheus rules from them", RULES_HELP)
    sub = parser.add_subparsers(dest="rules_command", metavar="SUBCOMMAND")
    build = add_command(sub, "build", "generate rules/prometheus/*.yml and docs/runbooks/*.md", BUILD_HELP)
    build.add_argument("--out", type=Path, default=Path("rules/prometheus"), help="directory for the *.yml rule files")
    build.add_argument("--runbooks", type=Path, default=Path("docs/runbooks"), help="directory for the runbooks")
    _rules_dir_flag(build, "diagnosis rules to compile")
    add_objective_flags(build, ttft_aliases=("--slo-ttft-seconds",))
    build.add_argument(
        "--slo-error-target",
        type=float,
        default=0.999,
        help="per-tenant error SLO: share of a tenant's requests that must not fail upstream",
    )
    build.add_argument(
        "--slo-tenant-top-n",
        type=int,
        default=20,
        help="per-tenant SLO rules keep the N busiest tenants and sum the rest as tenant=other "
        "(each recording holds at most N+1 series)",
    )
    build.add_argument(
        "--runbook-base-url",
        metavar="URL",
        help="address of the kvscope UI (kvscope ui): every alert's runbook_url opens its triage page there with "
        "the alert's labels and window filled in; unset, the alerts carry no runbook_url",
    )
    build.add_argument(
        "--canonical",
        choices=("used", "all"),
        default="used",
        help="record only the kvscope:* series the generated rules read, or every catalog signal "
        "(for dashboards written against kvscope:*)",
    )
    build.add_argument(
        "--curve-interval",
        default="1m",
        metavar="DURATION",
        help="interval of kvscope-curve.yml's rules, and the span each reads: at least two scrapes "
        "(1m for scrapes of 30 s or less, 2m for 60 s)",
    )
    build.add_argument("--check", action="store_true", help="write nothing; exit 1 if the files on disk are stale")
    build.set_defaults(func=run_build)
    check = add_command(
        sub,
        "check",
        "validate rules/diagnosis/*.yaml (signals, levers, operators, parameters)",
        "Validate the diagnosis rules: unknown signals, levers, operators, series and "
        "parameters, bad durations, missing test files and symptom rows of the project checklist without a rule. "
        "Problems print as file:line: message; exit 1 when there is any.\n\nexamples:\n"
        "  kvscope rules check\n  kvscope rules check --rules-dir my-rules/   # your own rules",
    )
    _rules_dir_flag(check, "directory of rules to check")
    check.set_defaults(func=run_check)
    cov = add_command(sub, "coverage", "which engine versions give the signals kvscope reads", COVERAGE_HELP)
    names_help = "directory of engine name lists, meanings.yaml and allow.yaml"
    cov.add_argument("--names", type=Path, default=Path("tests/fixtures/engine_names"), help=names_help)
    cov.add_argument("--allow", type=Path, help="allow-list (default: NAMES/allow.yaml)")
    out = cov.add_mutually_exclusive_group()
    out.add_argument("--write", type=Path, help="write the table (Markdown) to this file")
    out.add_argument("--check", type=Path, help="exit 1 if this file differs from a fresh table")
    cov.set_defaults(func=run_coverage)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def _rules_dir_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--rules-dir", type=Path, help=f"{what} (default: the shipped rules/diagnosis)")


def _check_build_args(args: argparse.Namespace) -> None:
    """Raise ValueError saying which flag of `rules build` is wrong and how."""
    if not 0 < args.slo_error_target < 1:
        raise ValueError("--slo-error-target must be between 0 and 1 (e.g. 0.999)")
    if args.slo_tenant_top_n < 1:
        raise ValueError("--slo-tenant-top-n must be at least 1")
    check_rules_dir("--rules-dir", args.rules_dir)
    if not re.fullmatch(r"[1-9][0-9]*[smh]", args.curve_interval):
        raise ValueError(f"--curve-interval must be a duration such as 30s, 1m or 2m, got {args.curve_interval!r}")


def run_build(args: argparse.Namespace) -> int:
    from kvscope.diagnoser.promql.build import build_all
    from kvscope.diagnoser.promql.rulefiles import SloConfig

    try:
        _check_build_args(args)
        objectives = objectives_from_args(args)
        slo = SloConfig(
            objectives=objectives,
            error_target=args.slo_error_target,
            tenant_top_n=args.slo_tenant_top_n,
        )
    except ValueError as exc:
        return fail("rules build", exc, 3)
    for unaligned in {
        u
        for obj in (objectives.default, *(o for _, o in objectives.pools + objectives.tenants))
        for u in obj.unaligned()
    }:
        print(f"warning: {unaligned.message()}", file=sys.stderr)
    from kvscope.core.signals import load_catalog
    from kvscope.diagnoser.curve.records import curve_file
    from kvscope.diagnoser.pushdown.candidates import candidate_exprs
    from kvscope.diagnoser.rulebook.rule import read_rules

    rules = read_rules(args.rules_dir) if args.rules_dir else read_rules()
    try:
        base = args.runbook_base_url and check_http_url(
            "--runbook-base-url", args.runbook_base_url, "https://kvscope-ui.example"
        )
    except ValueError as exc:
        return fail("rules build", exc, 3)
    built = build_all(
        slo,
        rules=rules,
        canonical=args.canonical,
        candidates=candidate_exprs(rules, load_catalog()),
        runbook_base_url=base,
        curve=curve_file(load_catalog(), args.curve_interval),
    )
    outputs = {args.out / name: text for name, text in built.rule_files.items()}
    outputs |= {args.runbooks / name: text for name, text in built.runbooks.items()}
    stale = [p for p, text in outputs.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    if args.check:
        for path in stale:
            print(f"stale: {path} (run: kvscope rules build)")
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(outputs[path], encoding="utf-8")
    print(f"kvscope rules build: {len(outputs)} files, {len(stale)} updated ({args.out}/, {args.runbooks}/)")
    return 0


def run_check(args: argparse.Namespace) -> int:
    """`kvscope rules check`: print every issue as file:line: message."""
    from kvscope.diagnoser.rulebook.validate import validate_rules

    try:
        check_rules_dir("--rules-dir", args.rules_dir)
    except ValueError as exc:
        return fail("rules check", exc, 3)
    issues = validate_rules(args.rules_dir)
    for issue in issues:
        print(issue)
    print(f"kvscope rules check: {len(issues)} problem(s)", file=sys.stderr)
    return 1 if issues else 0


COVERAGE_HEADER = """# Engine coverage: what each engine version gives kvscope

Generated by `kvscope rules coverage --write docs/engine-coverage.md` from the metric names of each
engine release (tests/fixtures/engine_names/, gathered from the engines' own sources; the README
there says how) and core/catalog.yaml. Rows: the canonical signals kvscope's diagnosis
rules, dashboards and Prometheus rules read. tests/unit/test_engine_coverage.py fails when this file
is stale or a cell is UNMAPPED / RENAMED without a reason in allow.yaml.
"""


def run_coverage(args: argparse.Namespace) -> int:
    """`kvscope rules coverage`: the per-engine, per-version table; exit 1 on unexplained gaps."""
    from kvscope.agent.normalize.coverage import (
        Coverage,
        load_allowed,
        load_meanings,
        load_name_lists,
        problems,
        render_markdown,
    )
    from kvscope.commands._needed import needed_signals
    from kvscope.core.signals import load_catalog

    names: Path = args.names
    if not names.is_dir():
        why = "not a directory (run from the repository root, or pass --names tests/fixtures/engine_names)"
        return fail("rules coverage", f"--names {names}: {why}", 3)
    try:
        catalog = load_catalog()
        cov = Coverage(catalog, load_name_lists(names), load_meanings(names / "meanings.yaml"))
        allowed = load_allowed(args.allow or names / "allow.yaml")
    except (OSError, ValueError) as exc:
        return fail("rules coverage", exc, 3)
    signals = sorted(s for s in needed_signals(catalog) if catalog.signals[s].aliases)
    text = render_markdown(cov, signals, allowed, COVERAGE_HEADER)
    bad, stale = problems(cov, signals, allowed)
    for line in bad:
        print(f"not allowed: {line}", file=sys.stderr)
    for entry in stale:
        print(f"stale allow entry (covers nothing): {entry.engine} {entry.signal} {entry.status}", file=sys.stderr)
    if args.check is not None:
        if not args.check.exists() or args.check.read_text(encoding="utf-8") != text:
            print(f"stale: {args.check} (run: kvscope rules coverage --write {args.check})", file=sys.stderr)
            return 1
    elif args.write is not None:
        args.write.write_text(text, encoding="utf-8")
        print(f"kvscope rules coverage: wrote {args.write} ({len(signals)} signals x {len(cov.lists)} releases)")
    else:
        sys.stdout.write(text)
    return 1 if bad or stale else 0
