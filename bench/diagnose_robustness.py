"""Does the diagnosis survive recordings made differently? A metamorphic sweep.

For every recording of the incident library (tests/recordings/*.yaml) and every variant of
testbed/recording_variants.py that applies to it (slower scrape intervals, the other accepted
metric spelling, Ray names, extra labels, clock offsets, staggered targets, late start, early
end, a target down for a while, a counter reset on another replica), the variant is written
as a recording, diagnosed exactly as `kvscope diagnose --recording` would, and judged against
the scenario's `expected` rows (the same judgement as tests/unit/test_diagnose_recordings.py).
The original recording is the baseline column: a variant fails only where the original passes.

Prints one row per variant: passed / applicable, and the failures with what was found.
`--baseline-rules DIR` judges every case with a second rule set too (e.g. the rules of an earlier
commit, `git archive <commit> rules | tar -x -C /tmp/base`): same variant files, same frames, both
columns in one run, so a rule change is measured against its baseline on the same box.

    .venv/bin/python bench/diagnose_robustness.py
    .venv/bin/python bench/diagnose_robustness.py --only kv-pressure-cascade --variants resample_5s,gap
    .venv/bin/python bench/diagnose_robustness.py --baseline-rules /tmp/base/rules/diagnosis
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # for testbed; kvscope comes from the install (or an overlay)

from kvscope.diagnoser.evaluate.evaluator import diagnose, sample_names  # noqa: E402
from kvscope.diagnoser.rulebook.rule import read_rules  # noqa: E402
from kvscope.diagnoser.sources.recording import RecordingSource  # noqa: E402
from testbed.recording_variants import (  # noqa: E402
    VARIANTS,
    applicable,
    check_diagnosis,
    read_variant_source,
    write_variant,
)

LIBRARY = ROOT / "tests" / "recordings"


def diagnose_path(path: Path, rule_sets: list[list]) -> list:
    """Diagnose a recording the way `kvscope diagnose --recording` does (its own scrape step), once
    per rule set, from one frame holding what any of them reads."""
    source = RecordingSource(path)
    names = set().union(*(sample_names(r) for rules in rule_sets for r in rules))
    frame = source.read_frame(names, None, None, source.natural_step())
    return [diagnose(frame, rules, source=source.description) for rules in rule_sets]


def run_case(meta_path: Path, variant: str, rule_sets: list[list], work: Path) -> list[tuple[str, str]]:
    """('pass' | 'FAIL' | 'n/a', detail) per rule set for one recording and variant ('original' =
    as recorded)."""
    meta = yaml.safe_load(meta_path.read_text())
    src = LIBRARY / meta["recording"]
    if variant != "original":
        why_not = applicable(variant, meta, read_variant_source(src))
        if why_not:
            return [("n/a", why_not)] * len(rule_sets)
        spans = LIBRARY / meta["spans"] if meta.get("spans") else None
        src = write_variant(src, VARIANTS[variant], meta, work / f"{meta_path.stem}-{variant}", spans)
    out = []
    for rules, diagnosis in zip(rule_sets, diagnose_path(src, rule_sets), strict=True):
        problem = check_diagnosis(meta, diagnosis, rules)
        out.append(("FAIL", problem) if problem else ("pass", ""))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated scenario names (default: all)")
    ap.add_argument("--variants", help=f"comma-separated variants, or none (default: all: {', '.join(VARIANTS)})")
    ap.add_argument("--baseline-rules", type=Path, help="a second rules directory judged on the same cases")
    args = ap.parse_args()
    scenarios = sorted(LIBRARY.glob("*.yaml"))
    if args.only:
        keep = set(args.only.split(","))
        scenarios = [p for p in scenarios if p.stem in keep]
    chosen = [] if args.variants == "none" else args.variants.split(",") if args.variants else list(VARIANTS)
    variants = ["original"] + chosen
    unknown = [v for v in variants[1:] if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; known: {list(VARIANTS)}")
    rule_sets = [read_rules()] + ([read_rules(args.baseline_rules)] if args.baseline_rules else [])
    labels = ["rules"] + (["baseline"] if args.baseline_rules else [])
    t0 = time.perf_counter()
    tables: list[dict[str, list[tuple[str, str, str]]]] = [{v: [] for v in variants} for _ in rule_sets]
    with tempfile.TemporaryDirectory(prefix="kvscope-variants-") as tmp:
        for meta_path in scenarios:
            for variant in variants:
                got = run_case(meta_path, variant, rule_sets, Path(tmp))
                for table, (verdict, detail) in zip(tables, got, strict=True):
                    table[variant].append((meta_path.stem, verdict, detail))
                shown = " ".join(f"{label}={verdict}" for label, (verdict, _) in zip(labels, got, strict=True))
                print(f"  {meta_path.stem:38s} {variant:14s} {shown}", file=sys.stderr, flush=True)
    failures = 0
    for label, table in zip(labels, tables, strict=True):
        print(f"\n{label}:\n| variant | passed / applicable | failing recordings |\n|---|---|---|")
        for variant, rows in table.items():
            done = [r for r in rows if r[1] != "n/a"]
            bad = [r for r in done if r[1] == "FAIL"]
            failures += len(bad) if label == "rules" else 0
            print(f"| {variant} | {len(done) - len(bad)} / {len(done)} | {', '.join(r[0] for r in bad) or '-'} |")
        print()
        for variant, rows in table.items():
            for name, verdict, detail in rows:
                if verdict == "FAIL":
                    print(f"FAIL ({label}) {variant} {name}: {detail}")
    import kvscope.diagnoser.evaluate.evaluator as engine_module

    print(
        f"\n{sum(len(r) for r in tables[0].values())} cases, {failures} failing, "
        f"{time.perf_counter() - t0:.0f} s (diagnoser from {Path(engine_module.__file__).parent})"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
