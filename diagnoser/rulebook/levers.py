"""Tuning levers (rules/levers.yaml): what each changes, its cost, and how to pull it per system.

Lever ids are `<system>.<knob>` named after the real config key (`vllm.max_num_seqs`,
`router.routing_policy`). `how` maps a system (vllm, sglang, router, gateway, k8s, ops) to the
exact change; rules reference levers by id with a direction.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from kvscope.diagnoser.findings import EngineChange, LeverAdvice
from kvscope.diagnoser.rulebook.rule import LineDict, RuleError, parse_yaml

DIRECTIONS = ("increase", "decrease", "enable", "disable", "set", "review")
SYSTEMS = ("vllm", "sglang", "router", "gateway", "k8s", "app", "ops")


@dataclass(frozen=True)
class Lever:
    """One knob from rules/levers.yaml."""

    id: str
    title: str
    changes: str
    cost: str
    how: dict[str, str]
    citations: tuple[str, ...]

    def advice(self, rank: int, direction: str) -> LeverAdvice:
        """This lever as ranked advice on a finding."""
        return LeverAdvice(
            id=self.id,
            rank=rank,
            direction=direction,
            title=self.title,
            cost=self.cost,
            changes=tuple(EngineChange(system=s, change=c) for s, c in self.how.items()),
            citations=self.citations,
        )


def parse_levers(text: str, path: str = "rules/levers.yaml") -> dict[str, Lever]:
    """Parse levers.yaml; structural problems raise RuleError with the line."""
    doc = parse_yaml(text, path)
    if not isinstance(doc, LineDict) or not isinstance(doc.get("levers"), dict):
        raise RuleError("levers.yaml must have a top-level 'levers' mapping", path, 1)
    table: LineDict = doc["levers"]
    return {lid: _parse_lever(lid, spec, table.line_of(lid), path) for lid, spec in table.items()}


def _parse_lever(lid: str, spec: Any, line: int, path: str) -> Lever:
    if not isinstance(spec, dict):
        raise RuleError(f"lever {lid}: expected a mapping", path, line)
    if "." not in lid:
        raise RuleError(f"lever id {lid!r} must be <system>.<knob>", path, line)
    how = dict(spec.get("how") or {})
    unknown = sorted(set(how) - set(SYSTEMS))
    if unknown:
        raise RuleError(f"lever {lid}: unknown system(s) {unknown} in 'how' (use {list(SYSTEMS)})", path, line)
    if not how or not spec.get("citations"):
        raise RuleError(f"lever {lid}: needs 'how' and 'citations'", path, line)
    return Lever(
        id=lid,
        title=str(spec.get("title", lid)),
        changes=str(spec.get("changes", "")).strip(),
        cost=str(spec.get("cost", "")).strip(),
        how={k: str(v) for k, v in how.items()},
        citations=tuple(spec["citations"]),
    )


@lru_cache(maxsize=1)
def load_levers() -> dict[str, Lever]:
    """The levers shipped with the package."""
    text = resources.files("kvscope.rules").joinpath("levers.yaml").read_text(encoding="utf-8")
    return parse_levers(text)
