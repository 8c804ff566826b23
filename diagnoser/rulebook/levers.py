"""Tuning levers (rules/levers.yaml): what each changes, its cost, and how to pull it per system.

Lever ids are `<system>.<knob>` named after the real config key (`vllm.max_num_seqs`,
`router.routing_policy`). Each lever says its `kind` (`mitigate`: do now, during the incident;
`fix`: fixes it for good), what pulling it costs (`restart`, `quality_risk`, `capacity`), and per
system (vllm, sglang, router, gateway, k8s, app, ops) the exact setting: a `how` entry is a plain
string (the setting), a mapping `{set, note, product}` (`product`: the product, e.g. "SGLang Model
Gateway"), or a list of such mappings when several products take the change differently.
`directions` overrides `how`, `kind` or `capacity` for one direction (replicas up is a
mitigation, replicas down a cost fix, each with its own instructions). Schema: docs/rules.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from kvscope.diagnoser.citations import cite_all, cite_text
from kvscope.diagnoser.findings import EngineChange, LeverAdvice
from kvscope.diagnoser.rulebook.rule import LineDict, RuleError, parse_yaml

DIRECTIONS = ("increase", "decrease", "enable", "disable", "set", "review")
SYSTEMS = ("vllm", "sglang", "router", "gateway", "k8s", "app", "ops")
KINDS = ("mitigate", "fix")
"""`mitigate`: acts within minutes during the incident (shed, cap, add a replica); `fix`: removes
the cause for good (a config change to roll out, a routing or architecture change)."""


@dataclass(frozen=True)
class Variant:
    """What changes with the direction a rule asks for (`directions:` in levers.yaml)."""

    how: tuple[EngineChange, ...] = ()
    kind: str = ""
    capacity: str = ""


@dataclass(frozen=True)
class Lever:
    """One knob from rules/levers.yaml."""

    id: str
    title: str
    changes: str
    cost: str
    how: tuple[EngineChange, ...]
    citations: tuple[str, ...]
    kind: str = "fix"
    restart: bool = False
    quality_risk: bool = False
    capacity: str = ""
    directions: dict[str, Variant] = field(default_factory=dict)

    def advice(self, rank: int, direction: str) -> LeverAdvice:
        """This lever as ranked advice on a finding, with the instructions of `direction`."""
        v = self.directions.get(direction, Variant())
        return LeverAdvice(
            id=self.id,
            rank=rank,
            direction=direction,
            title=self.title,
            cost=self.cost,
            changes=v.how or self.how,
            citations=self.citations,
            kind=v.kind or self.kind,
            restart=self.restart,
            quality_risk=self.quality_risk,
            capacity=v.capacity or self.capacity,
        )


def rule_levers(refs: Iterable[Any], levers: Mapping[str, Lever]) -> list[LeverAdvice]:
    """A rule's `levers:` entries (`{id, direction}`) as ranked advice: the n-th entry ranks n, its
    direction `review` where it names none; an entry that is not a mapping, or whose id `levers`
    lacks, is left out (`kvscope rules check` refuses both). The one reading of them: findings,
    alerts, runbooks."""
    out = []
    for rank, ref in enumerate(refs, 1):
        if isinstance(ref, dict) and str(ref.get("id")) in levers:
            out.append(levers[str(ref.get("id"))].advice(rank, str(ref.get("direction", "review"))))
    return out


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
    if not spec.get("how") or not spec.get("citations"):
        raise RuleError(f"lever {lid}: needs 'how' and 'citations'", path, line)
    kind = str(spec.get("kind", "fix"))
    if kind not in KINDS:
        raise RuleError(f"lever {lid}: kind {kind!r} is not one of {list(KINDS)}", path, line)
    directions = {}
    for direction, over in dict(spec.get("directions") or {}).items():
        if direction not in DIRECTIONS or not isinstance(over, dict):
            msg = f"lever {lid}: directions.{direction} must map one of {list(DIRECTIONS)} to a mapping"
            raise RuleError(msg, path, line)
        if over.get("kind", kind) not in KINDS:
            raise RuleError(f"lever {lid}: directions.{direction}.kind must be one of {list(KINDS)}", path, line)
        directions[str(direction)] = Variant(
            how=_parse_how(lid, over.get("how") or {}, line, path),
            kind=str(over.get("kind", "")),
            capacity=str(over.get("capacity", "")).strip(),
        )
    return Lever(
        id=lid,
        title=str(spec.get("title", lid)),
        changes=cite_text(str(spec.get("changes", "")).strip()),
        cost=cite_text(str(spec.get("cost", "")).strip()),
        how=_parse_how(lid, spec["how"], line, path),
        citations=tuple(c.text for c in cite_all(spec["citations"])),
        kind=kind,
        restart=bool(spec.get("restart", False)),
        quality_risk=bool(spec.get("quality_risk", False)),
        capacity=str(spec.get("capacity", "")).strip(),
        directions=directions,
    )


def _parse_how(lid: str, how: Any, line: int, path: str) -> tuple[EngineChange, ...]:
    """`how` as one EngineChange per system and product, in the file's order."""
    if not isinstance(how, dict):
        raise RuleError(f"lever {lid}: 'how' must map a system to its change", path, line)
    unknown = sorted(set(how) - set(SYSTEMS))
    if unknown:
        raise RuleError(f"lever {lid}: unknown system(s) {unknown} in 'how' (use {list(SYSTEMS)})", path, line)
    out = []
    for system, entry in how.items():
        for item in entry if isinstance(entry, list) else [entry]:
            if isinstance(item, dict):
                if not item.get("set"):
                    raise RuleError(f"lever {lid}: how.{system} entry needs 'set' (the exact setting)", path, line)
                out.append(
                    EngineChange(
                        system=str(system),
                        change=cite_text(str(item["set"]).strip()),
                        note=cite_text(str(item.get("note", "")).strip()),
                        product=str(item.get("product", "")).strip(),
                    )
                )
            else:
                out.append(EngineChange(system=str(system), change=cite_text(str(item).strip())))
    return tuple(out)


@lru_cache(maxsize=1)
def load_levers() -> dict[str, Lever]:
    """The levers shipped with the package."""
    text = resources.files("kvscope.rules").joinpath("levers.yaml").read_text(encoding="utf-8")
    return parse_levers(text)
