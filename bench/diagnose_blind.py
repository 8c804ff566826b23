"""Judge the diagnoser on the blind set: scenarios whose expected diagnosis was written from the
source documents before the diagnoser ever saw them (testbed/fleetgen/blind*.py).

For every `tests/recordings/blind-*.yaml` (or the YAMLs given) it diagnoses the recording and
compares with the YAML:

* `likely` — the likely cause is a row of an `expected` entry marked `likely: true`;
* `found`  — otherwise, an expected row is at least among the findings (wrong ranking);
* `false+` — a row of `must_not` fired at warning or above, or a healthy control warned;
* `miss`   — none of the expected rows fired.

    .venv/bin/python bench/diagnose_blind.py                 # the blind set in tests/recordings/
    .venv/bin/python bench/diagnose_blind.py --dir /tmp/b    # freshly generated copies
    .venv/bin/python bench/diagnose_blind.py --json out.json # the verdicts, for a before/after diff

Exit status: 0 every scenario `ok`, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from kvscope.diagnoser.evaluate.evaluator import diagnose, sample_names
from kvscope.diagnoser.rulebook.rule import read_rules
from kvscope.diagnoser.sources.recording import RecordingSource

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "tests" / "recordings"
SEVERE = ("warning", "critical")


def judge(meta: dict, diagnosis) -> dict:
    """One scenario's verdict: status, the likely cause, and the rows that fired wrongly."""
    fired = [(f.levers_md, f.rule_id, f.severity) for f in diagnosis.findings]
    severe = {row for row, _, sev in fired if sev in SEVERE}
    wrong = sorted(severe & set(meta.get("must_not") or []))
    top = diagnosis.likely_cause
    top_s = f"{top.levers_md} {top.rule_id} ({top.severity})" if top else "-"
    expected = meta.get("expected")
    if expected in (None, [], "no warning"):
        status = "ok" if not severe else "false+"
        return {"status": status, "likely_cause": top_s, "wrong": sorted(severe), "fired": fired}
    likely = {row for e in expected if e.get("likely") for row in e["levers"]}
    allowed = {row for e in expected for row in e["levers"]}
    if wrong:
        status = "false+"
    elif top is not None and top.levers_md in likely:
        status = "ok"
    elif any(row in allowed for row, _, _ in fired):
        status = "found" if top is None or top.levers_md not in allowed else "ok (supporting row first)"
    else:
        status = "miss"
    return {"status": status, "likely_cause": top_s, "wrong": wrong, "fired": fired}


def run(paths: list[Path]) -> dict[str, dict]:
    """Diagnose each scenario YAML's recording with the working tree's rules."""
    rules = read_rules()
    names = set().union(*(sample_names(r) for r in rules))
    out = {}
    for path in paths:
        meta = yaml.safe_load(path.read_text())
        source = RecordingSource(path.parent / meta["recording"])
        frame = source.read_frame(names, None, None, source.natural_step())
        out[meta["scenario"]] = judge(meta, diagnose(frame, rules, source=source.description))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("yamls", nargs="*", type=Path, help="scenario YAMLs (default: blind-*.yaml of --dir)")
    ap.add_argument("--dir", type=Path, default=LIBRARY, help="where the blind-*.yaml live (default tests/recordings)")
    ap.add_argument("--json", type=Path, help="also write the verdicts here")
    a = ap.parse_args(argv)
    paths = a.yamls or sorted(a.dir.glob("blind-*.yaml"))
    if not paths:
        print(f"no blind-*.yaml in {a.dir}", file=sys.stderr)
        return 2
    verdicts = run(paths)
    width = max(map(len, verdicts))
    for name, v in verdicts.items():
        extra = f"  wrong: {', '.join(v['wrong'])}" if v["wrong"] else ""
        print(f"{name:<{width}}  {v['status']:<8} likely cause: {v['likely_cause']}{extra}")
        print(f"{'':<{width}}  fired: {', '.join(f'{r}/{rid}/{s}' for r, rid, s in v['fired']) or '-'}")
    ok = sum(v["status"].startswith("ok") for v in verdicts.values())
    print(f"{ok}/{len(verdicts)} scenarios ok")
    if a.json:
        a.json.write_text(json.dumps(verdicts, indent=1))
    return 0 if ok == len(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
