"""Findings from indirect evidence yield to rules that read the same mechanism directly
(`confidence: moderate`, `defers_to`, `direct_evidence`; docs/rules.md "Confidence" has the
table): folded in as supporting evidence where a direct rule fired at the same place, overruled
where one looked with its direct evidence present and did not fire, else kept at moderate
confidence saying what would confirm it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from kvscope.diagnoser.findings import (
    OVERRULED,
    SEVERITY_RANK,
    Finding,
    Skipped,
    same_mechanism,
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
    by_rule = _ByPlace.per_key(findings, lambda g: (g.rule_id,))
    for f in findings:
        direct = [rid for rid in f.defers_to if rid in could_look]
        fired = [g for rid in dict.fromkeys(direct) if rid in by_rule for g in by_rule[rid].at(f.where)]
        if fired:
            ceiling = min(g.score for g in fired) - BELOW
            kept.append(replace(f, score=min(f.score, round(ceiling, 3))))
        elif direct and direct_present.get(f.rule_id, False):
            overruled.setdefault(f.rule_id, direct)
        else:
            kept.append(f)
    kept_ids = {f.rule_id for f in kept}
    notes = [
        Skipped(
            rid, f"{OVERRULED} {', '.join(direct)} read the same mechanism from direct evidence and did not fire there"
        )
        for rid, direct in overruled.items()
        if rid not in kept_ids
    ]
    return kept, list(skipped) + notes


def lift(findings: list[Finding]) -> list[Finding]:
    """A direct finding takes the worst severity of the findings that fold into it (they defer to
    it and sit at its place), its score raised by the same 100 per level as ranking gives: the
    direct reading confirms the mechanism, the inferred one says how much it hurts now."""
    deferring = _ByPlace.per_key(findings, lambda f: f.defers_to)
    out = []
    for g in findings:
        folded = [f.severity for f in deferring[g.rule_id].at(g.where)] if g.rule_id in deferring else []
        worst = max([g.severity, *folded], key=SEVERITY_RANK.__getitem__)
        up = 100 * (SEVERITY_RANK[worst] - SEVERITY_RANK[g.severity])
        out.append(replace(g, severity=worst, score=round(g.score + up, 3)) if up else g)
    return out


def before_symptom(findings: list[Finding]) -> list[Finding]:
    """A cascade that has not reached its symptom stage (K2 before TTFT moved) ranks below a
    finding of the same mechanism at the same place (K1, K3): that finding already names the
    stage reached, and 002 §7.4 acts there, before the latency the cascade is named for. Once the
    symptom stage is reached the cascade is the fuller account (and critical), and leads."""
    plain = _ByPlace([g for g in findings if g.cascade is None])
    out = []
    for f in findings:
        before = f.cascade is not None and f.cascade.lead_time_s is None
        peers = [g for g in plain.at(f.where) if same_mechanism(f, g)] if before else []
        if peers:
            f = replace(f, score=min(f.score, round(min(g.score for g in peers) - BELOW, 3)))
        out.append(f)
    return out


class _ByPlace:
    """Findings looked up by place: `at(where)` is every one whose own place agrees with `where`
    on the labels both carry (`same_place`, a fleet-wide place matching any), found through a
    dict per set of label names rather than by comparing every pair: linear in the findings
    for the few label sets a run has, where the pairwise scan was quadratic (5000 pods)."""

    def __init__(self, findings: Iterable[Finding]) -> None:
        self._groups: dict[frozenset[str], list[Finding]] = defaultdict(list)
        for f in findings:
            self._groups[frozenset(f.where)].append(f)
        self._index: dict[tuple[frozenset[str], tuple[str, ...]], dict[tuple[str, ...], list[Finding]]] = {}

    @classmethod
    def per_key(cls, findings: list[Finding], keys: Callable[[Finding], Iterable[str]]) -> dict[str, _ByPlace]:
        """One index per key (a rule id), of the findings whose `keys` include it."""
        members: dict[str, list[Finding]] = defaultdict(list)
        for f in findings:
            for key in dict.fromkeys(keys(f)):
                members[key].append(f)
        return {key: cls(group) for key, group in members.items()}

    def at(self, where: Mapping[str, str]) -> list[Finding]:
        out: list[Finding] = []
        for names, group in self._groups.items():
            shared = tuple(sorted(names & where.keys()))
            index = self._index.get((names, shared))
            if index is None:
                index = self._index[names, shared] = defaultdict(list)
                for f in group:
                    index[tuple(f.where[k] for k in shared)].append(f)
            out += index.get(tuple(where[k] for k in shared), ())
        return out
