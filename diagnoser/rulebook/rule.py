"""Diagnosis rules as data (schema: docs/rules.md): load the YAML with line numbers, resolve
parameters; `Rule.tree` is the parsed form every backend reads, validate.py the checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache, cached_property
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from kvscope.core.scalars import parse_duration as parse_duration  # rule files' durations are Prometheus'
from kvscope.diagnoser.rulebook.grammar import RuleError
from kvscope.diagnoser.rulebook.tree import Deriv, Mean, Node, Predict, Quantile, Rate, Tree, parse


class LineDict(dict):
    """A YAML mapping that remembers the line of itself and of each key (1-based)."""

    line: int = 0
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)


class _LineLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The safe loader (libyaml's when PyYAML has it: ~10x faster on the 45 rule files)."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[str(key)] = key_node.start_mark.line + 1
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, path: str = "") -> Any:
    """safe_load with line numbers on every mapping; a syntax error becomes a RuleError."""
    try:
        return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise RuleError(f"YAML error: {getattr(exc, 'problem', exc)}", path, mark.line + 1 if mark else None) from exc


@dataclass(frozen=True)
class Rule:
    """One diagnosis rule. `doc` is the YAML mapping as written (with line numbers)."""

    id: str
    path: str
    doc: LineDict
    params: dict[str, Any] = field(default_factory=dict)  # resolved parameter values
    time_scale: float = 1.0  # every duration is multiplied by this (short recordings)

    @property
    def title(self) -> str:
        return str(self.doc.get("title", self.id))

    @property
    def severity(self) -> str:
        return str(self.doc.get("severity", "warning"))

    @property
    def by(self) -> tuple[str, ...]:
        return tuple(self.doc.get("by", ["instance"]))

    @cached_property
    def tree(self) -> Tree:
        """The rule parsed once into its typed tree (parameters resolved); RuleError if malformed."""
        return parse(self.doc, self.params, self.path)

    def with_params(self, overrides: dict[str, Any]) -> Rule:
        """The same rule with some parameter values replaced (unknown names are ignored)."""
        merged = dict(self.params)
        merged.update({k: v for k, v in overrides.items() if k in merged})
        return Rule(self.id, self.path, self.doc, merged, self.time_scale)

    def scaled(self, time_scale: float) -> Rule:
        """The same rule with every duration (for, ranges, baselines) multiplied by time_scale; a rule
        whose durations are `absolute` (a hang is minutes of real time) keeps them."""
        if self.doc.get("durations") == "absolute":
            time_scale = 1.0
        out = Rule(self.id, self.path, self.doc, dict(self.params), time_scale)
        if "tree" in self.__dict__:  # durations are scaled at use: the same tree serves
            out.__dict__["tree"] = self.tree
        return out

    def nullable_params(self) -> int:
        """How many parameters default to null (values the user must supply, e.g. benchmarks)."""
        specs = (self.doc.get("params") or {}).values()
        return sum(isinstance(spec, dict) and spec.get("default") is None for spec in specs)

    def missing_params(self) -> list[str]:
        """Parameters without a value (default null): the rule cannot run until they are set."""
        return [k for k, v in self.params.items() if v is None]


def rule_from_doc(doc: Any, path: str) -> Rule:
    """Build a Rule from a parsed document; structural problems raise RuleError."""
    if not isinstance(doc, LineDict):
        raise RuleError("a rule file must hold one mapping", path, 1)
    if "id" not in doc:
        raise RuleError("missing 'id'", path, doc.line)
    params = {k: v.get("default") if isinstance(v, dict) else v for k, v in (doc.get("params") or {}).items()}
    return Rule(id=str(doc["id"]), path=path, doc=doc, params=params)


def read_rule(path: str | Path) -> Rule:
    """Read and parse one rule file."""
    p = Path(path)
    return rule_from_doc(parse_yaml(p.read_text(encoding="utf-8"), str(p)), str(p))


def rules_dir() -> Path:
    """The rules/diagnosis directory shipped with the package."""
    return Path(str(resources.files("kvscope.rules").joinpath("diagnosis")))


def rule_paths(directory: str | Path | None = None) -> list[Path]:
    """Rule files (not *.test.yaml) in a directory, sorted."""
    d = Path(directory) if directory else rules_dir()
    return sorted(p for p in d.glob("*.yaml") if not p.name.endswith(".test.yaml"))


def read_rules(directory: str | Path | None = None) -> list[Rule]:
    """Every rule in a directory (default: the shipped rules)."""
    return [read_rule(p) for p in rule_paths(directory)]


@cache
def shipped_rules() -> dict[str, Rule]:
    """The shipped rules by id, read once per process: a long-lived one (the UI, where the
    launcher's read, the renderer and each page would otherwise read all of them again) shares
    them. Nothing changes a Rule in place (`with_params` and `scaled` return new ones)."""
    return {r.id: r for r in read_rules()}


def grid_steps(seconds: float, step: float, least: int = 1) -> int:
    """`seconds` in whole grid steps (at least `least`): how the evaluator reads every range."""
    return max(least, int(round(seconds / (step or 1.0))))


RATE_MIN_STEPS = 2
"""A counter's rate needs two samples in its range. On a grid at the scrape interval a range of
one step can hold a single one (scrape times drift against the grid points), which reads as no
increase at all. So a rate range that the short-window scaling shortens keeps at least this many
steps, two scrape intervals (Grafana's `$__rate_interval` takes four for the same reason), and
never more than the rule wrote."""


def rate_steps(seconds: float, time_scale: float, step: float | None) -> int:
    """A counter-rate range (rate, increase, histogram mean or quantile) in whole grid steps:
    `seconds` x `time_scale`, but no fewer than RATE_MIN_STEPS steps unless `seconds` as written
    is shorter (at time_scale 1 this is `grid_steps`)."""
    written = grid_steps(seconds, step or 1.0)
    return max(grid_steps(seconds * time_scale, step or 1.0), min(RATE_MIN_STEPS, written))


SLOPE_MIN_STEPS = 3
"""A slope (deriv, predict_linear) needs three points: a range that the short-window scaling
shortens below this many grid steps reads this many."""


def range_steps(node: Node, time_scale: float, step: float | None) -> int:
    """The trailing range a series `node` reads (its `rng`) in whole grid steps: how the evaluator
    reads it and the PromQL writer writes it on a grid. A counter rate's is `rate_steps`, a
    slope's at least SLOPE_MIN_STEPS, any other's `grid_steps` of the time-scaled range."""
    rng = float(getattr(node, "rng", 0.0) or 0.0)
    if isinstance(node, Rate | Mean | Quantile):
        return rate_steps(rng, time_scale, step)
    least = SLOPE_MIN_STEPS if isinstance(node, Deriv | Predict) else 1
    return grid_steps(rng * time_scale, step or 1.0, least)


def grid_seconds(seconds: float, time_scale: float, step: float | None, least: int = 1) -> float:
    """A rule duration as evaluated, in seconds: `seconds` x `time_scale`, on a grid in whole
    `step`s (at least `least`); as written (time-scaled) without a step."""
    seconds *= time_scale
    return grid_steps(seconds, step, least) * step if step else seconds
