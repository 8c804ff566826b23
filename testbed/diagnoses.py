"""How the tests hold the fleet path (diagnoser/pushdown) to the full fetch's Diagnosis."""

from __future__ import annotations

import json
from typing import Any

FINDINGS = ("likely_cause", "competing", "other")
"""The Diagnosis fields whose findings must be the full fetch's: each finding's rule, place,
times, severity, score, evidence values and lever ids (`_facts`), not its sentences."""
SAME = ("window", "source", "rules_evaluated", "time_scale", "schema_version", "changes")
FACTS = ("rule_id", "where", "severity", "since", "until", "active", "score")
EVIDENCE = ("name", "value", "unit", "at", "threshold", "op", "stat", "key")


def _facts(finding: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a finding says, without how it words it (title, summary, lever text)."""
    if not finding:
        return None
    return {
        **{k: finding.get(k) for k in FACTS},
        "evidence": [{k: e.get(k) for k in EVIDENCE} for e in finding.get("evidence") or ()],
        "levers": [lever.get("id") for lever in finding.get("levers") or ()],
    }


def findings_differ(fleet: dict[str, Any], full: dict[str, Any]) -> list[str]:
    """The Diagnosis fields (as JSON dicts) where the fleet path's findings or the window's facts
    differ from the full fetch's; [] when they agree. The skipped list is not compared: the fleet
    path judges quiet a rule without candidates that the full fetch may find with its mechanism
    off or no series for any group (docs/fleet.md); `scale_changes` only the full fetch works out."""
    out = [k for k in SAME if fleet.get(k) != full.get(k)]
    for k in FINDINGS:
        mine, theirs = (d.get(k) for d in (fleet, full))
        if k == "likely_cause":
            mine, theirs = [mine], [theirs]
        if [_facts(f) for f in mine or ()] != [_facts(f) for f in theirs or ()]:
            out.append(k)
    return out


def assert_same_diagnosis(fleet, full) -> None:
    """The fleet path's Diagnosis has the full fetch's findings and evidence values (`findings_differ`);
    both skipped lists are printed (pytest shows them with a failure, -s shows them always)."""
    a, b = json.loads(fleet.to_json()), json.loads(full.to_json())
    assert a.pop("scale_changes") is None
    _print_skipped(a["skipped"], b["skipped"])
    differ = findings_differ(a, b)
    assert not differ, "\n".join(_told(a, b, k) for k in differ)


def _told(fleet: dict[str, Any], full: dict[str, Any], key: str) -> str:
    """One differing Diagnosis field in short: per finding (rule, place), the fields that differ."""
    if key not in FINDINGS:
        return f"{key}: fleet {fleet.get(key)!r}, full {full.get(key)!r}"
    mine, theirs = ([f for f in ([d[key]] if key == "likely_cause" else d[key]) if f] for d in (fleet, full))
    lines = [f"{key}: fleet {len(mine)} finding(s), full {len(theirs)}"]
    for a, b in zip(map(_facts, mine), map(_facts, theirs), strict=False):
        assert a is not None and b is not None
        fields = {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}
        if fields:
            lines.append(f"  {a['rule_id']} {a['where']} / {b['rule_id']} {b['where']}: {fields}")
    return "\n".join(lines)


def _print_skipped(fleet: list[dict[str, str]], full: list[dict[str, str]]) -> None:
    """Both paths' skipped rules side by side, the ones they word differently marked."""
    mine = {s["rule_id"]: s["reason"] for s in fleet}
    theirs = {s["rule_id"]: s["reason"] for s in full}
    print(f"skipped: fleet path {len(mine)}, full fetch {len(theirs)}")
    for rid in sorted(mine.keys() | theirs.keys()):
        a, b = mine.get(rid, "(evaluated)"), theirs.get(rid, "(evaluated)")
        print(f"  {'=' if a == b else '*'} {rid}: fleet: {a}" + ("" if a == b else f" | full: {b}"))
