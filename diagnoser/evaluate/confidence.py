"""Findings from indirect evidence yield to rules that read the same mechanism directly
(`confidence: moderate`, `defers_to`, `direct_evidence`; docs/rules.md "Confidence" has the
table): folded in as supporting evidence where a direct rule fired at the same place, overruled
where one looked with its direct evidence present and did not fire, else kept at moderate
confidence saying what would confirm it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from kvscope.diagnoser.findings import (
    OVERRULED,
    SEVERITY_RANK,
    Finding,
    Skipped,
    same_mechanism,
    same_place,
)
from kvscope.diagnoser.rulebook import tree
from kvscope.diagnoser.rulebook.rule import Rule

BELOW = 10.0
"""A deferring finding's score stays this far below the direct finding it folds into: more than
the earliness bonus (0-5) ranking adds, so the direct reading always leads."""


def direct_present(rules: Iterable[Rule], names: set[str]) -> dict[str, bool]:
    """Per rule with `defers_to`: whether any of its `direct_evidence` signals (or the signal's
    histogram series) has samples in the window, `names` being the sample names present."""
    return {
        r.id: any(names & tree.expansions(str(sig)) for sig in r.tree.meta.get("direct_evidence") or ())
        for r in rules
        if r.tree.meta.get("defers_to")
    }


def settle(
    findings: list[Finding], skipped: list[Skipped], evaluated: Iterable[str], direct_present: Mapping[str, bool]
) -> tuple[list[Finding], list[Skipped]]:
    """Apply `defers_to` to one run's findings. `evaluated`: ids of the rules that could look
    (not skipped); `direct_present`: per deferring rule, whether any of its `direct_evidence`
    signals is in the window. Returns the findings kept and the skipped list with overruled
    rules added."""
    could_look = set(evaluated)
    findings = lift(findings)
    kept: list[Finding] = []
    overruled: dict[str, list[str]] = {}
    for f in findings:
        direct = [rid for rid in f.defers_to if rid in could_look]
        fired = [g for g in findings if g.rule_id in direct and same_place(g.where, f.where)]
        if fired:
            ceiling = min(g.score for g in fired) - BELOW
            kept.append(replace(f, score=min(f.score, round(ceiling, 3))))
        elif direct and direct_present.get(f.rule_id, False):
            overruled.setdefault(f.rule_id, direct)
        else:
            kept.append(f)
    notes = [
        Skipped(
            rid, f"{OVERRULED} {', '.join(direct)} read the same mechanism from direct evidence and did not fire there"
        )
        for rid, direct in overruled.items()
        if not any(f.rule_id == rid for f in kept)
    ]
    return kept, list(skipped) + notes


def lift(findings: list[Finding]) -> list[Finding]:
    """A direct finding takes the worst severity of the findings that fold into it (they defer to
    it and sit at its place), its score raised by the same 100 per level as ranking gives: the
    direct reading confirms the mechanism, the inferred one says how much it hurts now."""
    out = []
    for g in findings:
        folded = [f.severity for f in findings if g.rule_id in f.defers_to and same_place(g.where, f.where)]
        worst = max([g.severity, *folded], key=SEVERITY_RANK.__getitem__)
        up = 100 * (SEVERITY_RANK[worst] - SEVERITY_RANK[g.severity])
        out.append(replace(g, severity=worst, score=round(g.score + up, 3)) if up else g)
    return out


def before_symptom(findings: list[Finding]) -> list[Finding]:
    """A cascade that has not reached its symptom stage (K2 before TTFT moved) ranks below a
    finding of the same mechanism at the same place (K1, K3): that finding already names the
    stage reached, and 002 §7.4 acts there, before the latency the cascade is named for. Once the
    symptom stage is reached the cascade is the fuller account (and critical), and leads."""
    out = []
    for f in findings:
        before = f.cascade is not None and f.cascade.lead_time_s is None  # asked once, not per peer
        peers = [
            g
            for g in findings
            if before and g.cascade is None and same_place(g.where, f.where) and same_mechanism(f, g)
        ]
        if peers:
            f = replace(f, score=min(f.score, round(min(g.score for g in peers) - BELOW, 3)))
        out.append(f)
    return out
