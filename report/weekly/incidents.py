"""The week's top findings, grouped the way `kvscope diagnose` groups them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvscope.diagnoser.findings import SEVERITY_RANK, Diagnosis, Finding


@dataclass(frozen=True)
class Incident:
    """One line of the week's top findings: a finding with the findings that belong to it, grouped
    the way `kvscope diagnose` groups them. `supporting`: findings at the likely cause's place that
    share its mechanism (`Diagnosis.supporting`); `repeats`: the same rule on other instances
    (`render.group_repeats`)."""

    head: Finding
    supporting: tuple[Finding, ...] = ()
    repeats: tuple[Finding, ...] = ()

    @property
    def members(self) -> tuple[Finding, ...]:
        return (self.head,) + self.supporting + self.repeats

    @property
    def severity(self) -> str:
        """The worst severity among its findings."""
        return max((f.severity for f in self.members), key=SEVERITY_RANK.__getitem__)


def group_incidents(diagnoses: Iterable[Diagnosis]) -> list[Incident]:
    """Each diagnosis' likely cause with its supporting findings, each competing hypothesis, and
    the other findings with repeats across instances collapsed: the order `kvscope diagnose` prints."""
    from kvscope.diagnoser.render import group_repeats

    out: list[Incident] = []
    for d in diagnoses:
        supporting = d.supporting
        if d.likely_cause is not None:
            out.append(Incident(d.likely_cause, supporting))
        out += [Incident(f) for f in d.hypotheses]
        support = {id(f) for f in supporting}
        other = tuple(f for f in d.other if id(f) not in support)
        out += [
            Incident(worst, repeats=tuple(m for m in members if m is not worst))
            for worst, members in group_repeats(other)
        ]
    return out
