"""How the tests hold the fleet path (diagnoser/pushdown) to the full fetch's Diagnosis."""

from __future__ import annotations

import json
from typing import Any

FINDINGS = ("likely_cause", "competing", "other")
"""The Diagnosis fields that must be the full fetch's exactly: every finding with its rule, place,
times, severity, score, evidence values and levers."""
SAME = ("window", "source", "rules_evaluated", "time_scale", "schema_version", "changes")


def findings_differ(fleet: dict[str, Any], full: dict[str, Any]) -> list[str]:
    """The Diagnosis fields (as JSON dicts) where the fleet path's findings or the window's facts
    differ from the full fetch's; [] when they agree. The skipped list is not compared: the fleet
    path words its skip reasons from the TSDB's inventory, and judges quiet a rule without
    candidates that the full fetch may find with its mechanism off or no series for any group
    (docs/fleet.md); `scale_changes` only the full fetch works out."""
    return [k for k in FINDINGS + SAME if fleet.get(k) != full.get(k)]


def assert_same_diagnosis(fleet, full) -> None:
    """The fleet path's Diagnosis has the full fetch's findings, byte for byte (`findings_differ`);
    both skipped lists are printed (pytest shows them with a failure, -s shows them always)."""
    a, b = json.loads(fleet.to_json()), json.loads(full.to_json())
    assert a.pop("scale_changes") is None
    _print_skipped(a["skipped"], b["skipped"])
    differ = findings_differ(a, b)
    assert not differ, {k: {"fleet": a.get(k), "full": b.get(k)} for k in differ}


def _print_skipped(fleet: list[dict[str, str]], full: list[dict[str, str]]) -> None:
    """Both paths' skipped rules side by side, the ones they word differently marked."""
    mine = {s["rule_id"]: s["reason"] for s in fleet}
    theirs = {s["rule_id"]: s["reason"] for s in full}
    print(f"skipped: fleet path {len(mine)}, full fetch {len(theirs)}")
    for rid in sorted(mine.keys() | theirs.keys()):
        a, b = mine.get(rid, "(evaluated)"), theirs.get(rid, "(evaluated)")
        print(f"  {'=' if a == b else '*'} {rid}: fleet: {a}" + ("" if a == b else f" | full: {b}"))
