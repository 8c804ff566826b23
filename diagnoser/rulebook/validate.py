"""Rule validators: every problem in a rule file becomes an issue that points at file:line.

`validate_rules()` runs each validator over each rule (plus the set-wide checks) and returns the
issues; `kvscope rules check` prints them as `rules/diagnosis/x.yaml:14: unknown operator '=>'`.
A rule that fails validation is a rule that would silently never fire, so CI runs this.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscope.core.signals import Catalog, load_catalog
from kvscope.diagnoser.findings import CONFIDENCES, SEVERITIES
from kvscope.diagnoser.rulebook import tree
from kvscope.diagnoser.rulebook.grammar import BASELINE_AGGS
from kvscope.diagnoser.rulebook.levers import DIRECTIONS, Lever, load_levers
from kvscope.diagnoser.rulebook.rule import LineDict, Rule, RuleError, parse_duration, read_rule, rule_paths

LEVERS_MD_ROWS = tuple(f"{row}{i}" for row, n in (("P", 9), ("K", 8), ("L", 14), ("U", 11)) for i in range(1, n + 1))
"""The 42 symptom rows of LEVERS.md; every one needs at least one rule."""
BEYOND_ROWS = tuple(f"R{i}" for i in range(1, 10))
"""LEVERS.md "Beyond the documents" rows (issue 27): a rule may name one; none is required yet.
R8 (engine_hung) and R9 (pd_kv_transfer_failing, issue 59) continue the table past the shared copy's R7."""

STATS = ("max", "min", "mean", "first", "last")
_PARAM = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)$")


@dataclass(frozen=True)
class RuleIssue:
    """One problem, located in a file."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass
class Context:
    """What validators check against."""

    catalog: Catalog
    levers: dict[str, Lever]

    def known_series(self) -> set[str]:
        return set(self.catalog.signals) | self.catalog.series_names()


Validator = Callable[[Rule, Context], Iterable[RuleIssue]]


def _issue(rule: Rule, node: Any, message: str, key: str | None = None) -> RuleIssue:
    if isinstance(node, LineDict):
        return RuleIssue(rule.path, node.line_of(key) if key else node.line, message)
    return RuleIssue(rule.path, 1, message)


def check_header(rule: Rule, ctx: Context) -> Iterable[RuleIssue]:
    """id equals the file name; title, severity, LEVERS.md row, citations are present and valid."""
    doc = rule.doc
    if Path(rule.path).stem != rule.id:
        yield _issue(rule, doc, f"id {rule.id!r} must equal the file name {Path(rule.path).stem!r}", "id")
    for key in ("title", "description", "severity", "levers_md", "citations", "series"):
        if not doc.get(key):
            yield _issue(rule, doc, f"missing {key!r}")
    if doc.get("severity") and doc["severity"] not in SEVERITIES:
        yield _issue(rule, doc, f"severity {doc['severity']!r} is not one of {list(SEVERITIES)}", "severity")
    if "max_step" in doc:
        yield from _check_max_step(rule)
    if doc.get("durations", "scaled") not in ("scaled", "absolute"):
        yield _issue(rule, doc, f"durations {doc['durations']!r} is not scaled or absolute", "durations")
    if doc.get("levers_md") and doc["levers_md"] not in LEVERS_MD_ROWS + BEYOND_ROWS:
        yield _issue(rule, doc, f"levers_md {doc['levers_md']!r} is not a LEVERS.md row", "levers_md")
    if not ("when" in doc) ^ ("cascade" in doc):
        yield _issue(rule, doc, "a rule needs exactly one of 'when' or 'cascade'")
    spec = doc.get("specificity", 2)
    if spec not in (1, 2, 3):
        yield _issue(rule, doc, f"specificity must be 1, 2 or 3, not {spec!r}", "specificity")


def _check_max_step(rule: Rule) -> Iterable[RuleIssue]:
    """`max_step` is a duration or a `$parameter` whose value is one."""
    limit = rule.doc["max_step"]
    ref = limit[1:] if isinstance(limit, str) and limit.startswith("$") else None
    try:
        parse_duration(rule.params.get(ref) if ref else limit)
    except (RuleError, ValueError, TypeError):
        yield _issue(rule, rule.doc, f"max_step {limit!r} is not a duration or a duration parameter", "max_step")


def check_params(rule: Rule, ctx: Context) -> Iterable[RuleIssue]:
    """Parameters have defaults and units; every $reference is declared; durations parse."""
    params = rule.doc.get("params") or {}
    for name, spec in params.items():
        if not isinstance(spec, dict) or "default" not in spec:
            yield _issue(rule, params, f"parameter {name!r} needs {{default: ..., unit: ...}}", name)
            continue
        if "unit" not in spec:
            yield _issue(rule, params, f"parameter {name!r} has no unit", name)
        default = spec["default"]
        if spec.get("unit") == "duration" and default is not None:
            try:
                parse_duration(default)
            except ValueError as exc:
                yield _issue(rule, params, f"parameter {name!r}: {exc}", name)
        elif default is not None and not isinstance(default, int | float):
            yield _issue(rule, params, f"parameter {name!r}: default {default!r} is not a number", name)
    for node, key, ref in _param_refs(rule.doc):
        if ref not in params:
            yield _issue(rule, node, f"unknown parameter ${ref}", key)


def _param_refs(obj: Any, parent: Any = None, key: str | None = None) -> Iterable[tuple[Any, str | None, str]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _param_refs(v, obj, k)
    elif isinstance(obj, list):
        for v in obj:
            yield from _param_refs(v, parent, key)
    elif isinstance(obj, str) and (m := _PARAM.match(obj)):
        yield parent, key, m.group(1)


def _conds(t: tree.Tree) -> list[tree.Cond]:
    """Every condition of a rule: its blocks, cascade stages and `moderate_unless`."""
    return [c for b in t.blocks() for c in b.conds] + ([t.moderate_unless] if t.moderate_unless else [])


_AGG_KEYS = {
    tree.Gauge: ("agg", ("sum", "max", "min", "avg")),
    tree.Aggregate: ("aggregate", ("sum", "max", "min", "avg", "median", "count")),
    tree.OverTime: ("over_time", BASELINE_AGGS),  # avg, max, min, median: the baseline's aggregations
}


def check_series(rule: Rule, ctx: Context) -> Iterable[RuleIssue]:
    """Every series reads known signals, refers to existing series, aggregates with a known
    function, is no finer than the rule where conditions read it, and has no cycles."""
    t, lines = rule.tree, rule.doc.get("series") or {}
    known = ctx.known_series()
    # series that conditions, evidence or the mechanism read at the rule's grouping (a series
    # grouped finer than the rule, e.g. per replica in a per-model rule, may only feed aggregates)
    at_rule = {c.series for c in _conds(t)} | {c.right.series for c in _conds(t) if isinstance(c.right, tree.Than)}
    at_rule |= {e.series for e in t.evidence} | ({t.mechanism.series} if t.mechanism else set())
    for name, node in t.series.items():
        at = lines.get(name)
        if isinstance(node, tree.Signal):
            suffix = {tree.Quantile: "_bucket", tree.Mean: "_sum"}.get(type(node), "")
            if node.signal + suffix not in known and suffix:
                yield _issue(rule, at, f"series {name!r}: {node.signal!r} is not a histogram in the catalog")
            elif node.signal not in known and not suffix:
                yield _issue(rule, at, f"series {name!r}: unknown signal {node.signal!r} (not in core/catalog.yaml)")
        for ref in node.refs:
            if ref not in t.series:
                yield _issue(rule, at, f"series {name!r}: refers to unknown series {ref!r}")
        if isinstance(node, tree.Gauge | tree.Aggregate | tree.OverTime) and node.agg not in _AGG_KEYS[type(node)][1]:
            key, allowed = _AGG_KEYS[type(node)]
            yield _issue(rule, at, f"series {name!r}: {key} {node.agg!r} is not one of {list(allowed)}", key)
        if node.by is not None and not set(node.by) <= set(rule.by) and name in at_rule:
            yield _issue(
                rule,
                at,
                f"series {name!r}: by {list(node.by)} is finer than the rule's by {rule.by}; "
                "only an aggregate may read it",
                "by",
            )
    yield from _check_cycles(rule, t.series)


def _check_cycles(rule: Rule, series: dict[str, tree.Node]) -> Iterable[RuleIssue]:
    def visit(name: str, path: tuple[str, ...]) -> str | None:
        if name in path:
            return " -> ".join((*path, name))
        refs = series[name].refs if name in series else ()
        return next((cycle for ref in refs if (cycle := visit(ref, (*path, name)))), None)

    found = next(((name, cycle) for name in series if (cycle := visit(name, ()))), None)
    if found:
        yield _issue(rule, rule.doc.get("series"), f"series cycle: {found[1]}", found[0])


def check_conditions(rule: Rule, ctx: Context) -> Iterable[RuleIssue]:
    """Conditions read known series (left, `than` and baseline `of`); `when` has conditions; a
    cascade's stages are named and its root, symptom, fire_at and critical_at name stages."""
    t = rule.tree
    for cond in _conds(t):
        if cond.series not in t.series:
            yield RuleIssue(rule.path, cond.line or 1, f"condition reads unknown series {cond.series!r}")
        if isinstance(cond.right, tree.Than) and cond.right.series not in t.series:
            yield RuleIssue(rule.path, cond.line or 1, f"condition compares with unknown series {cond.right.series!r}")
        if isinstance(cond.right, tree.Baseline) and cond.right.of is not None and cond.right.of not in t.series:
            yield RuleIssue(rule.path, cond.line or 1, f"baseline of unknown series {cond.right.of!r}")
    if t.when and not t.when.conds:
        yield _issue(rule, rule.doc.get("when"), "'when' needs 'all' or 'any' conditions")
    cas, at = t.cascade, rule.doc.get("cascade")
    if cas is None:
        return
    names = [s.name for s in cas.stages]
    if len(names) < 2:
        yield _issue(rule, at, "a cascade needs at least two stages")
    for key in ("root", "symptom", "fire_at", "critical_at"):
        value = getattr(cas, key)
        if (value or key != "critical_at") and value not in names:
            yield _issue(rule, at, f"cascade {key} {value!r} is not a stage ({names})", key)


def check_levers(rule: Rule, ctx: Context) -> Iterable[RuleIssue]:
    """Lever ids exist in rules/levers.yaml and directions are known."""
    levers = rule.doc.get("levers") or []
    if not levers:
        yield _issue(rule, rule.doc, "a rule needs at least one lever")
    for ref in levers if isinstance(levers, list) else [levers]:
        if not isinstance(ref, dict):
            yield _issue(rule, rule.doc, f"a lever entry is {{id: ..., direction: ...}}, got {ref!r}", "levers")
            continue
        if ref.get("id") not in ctx.levers:
            yield _issue(rule, ref, f"unknown lever {ref.get('id')!r} (not in rules/levers.yaml)", "id")
        if ref.get("direction", "review") not in DIRECTIONS:
            yield _issue(rule, ref, f"direction {ref.get('direction')!r} is not one of {list(DIRECTIONS)}", "direction")


def check_evidence(rule: Rule, ctx: Context) -> Iterable[RuleIssue]:
    """Evidence reads declared series with a known stat; the summary only names evidence series."""
    t = rule.tree
    if not t.evidence:
        yield _issue(rule, rule.doc, "a rule needs evidence to show")
    for item, at in zip(t.evidence, rule.doc.get("evidence") or [], strict=False):
        if item.series not in t.series:
            yield _issue(rule, at, f"evidence reads unknown series {item.series!r}", "series")
        if item.stat not in STATS:
            yield _issue(rule, at, f"stat {item.stat!r} is not one of {list(STATS)}", "stat")
        if "{range}" in item.name and not getattr(t.series.get(item.series), "rng", 0.0):
            yield _issue(rule, at, f"name says {{range}} but series {item.series!r} has no range", "name")
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(str(t.meta.get("summary", ""))) if f}
    except ValueError as exc:
        yield _issue(rule, rule.doc, f"summary: {exc}", "summary")
        return
    for f in sorted(fields - {e.series for e in t.evidence}):
        yield _issue(rule, rule.doc, f"summary names {f!r}, which is not an evidence series", "summary")
    if t.facts and "instance" not in t.by:  # facts are per engine instance
        yield _issue(rule, rule.doc, "facts need 'instance' in by", "facts")


def check_confidence(rule: Rule, ctx: Context) -> Iterable[RuleIssue]:
    """`confidence` is a known level; a moderate one says what would confirm it (`confirm`), names
    the rules that read the same mechanism directly (`defers_to`, checked set-wide) and the
    signals that are that direct evidence (`direct_evidence`)."""
    doc = rule.doc
    level = doc.get("confidence", "high")
    if level not in CONFIDENCES:
        yield _issue(rule, doc, f"confidence {level!r} is not one of {list(CONFIDENCES)}", "confidence")
    defers = doc.get("defers_to")
    if defers is not None and not (isinstance(defers, list) and all(isinstance(x, str) for x in defers)):
        yield _issue(rule, doc, "defers_to must be a list of rule ids", "defers_to")
    direct = doc.get("direct_evidence")
    if direct is not None and not (isinstance(direct, list) and direct and all(isinstance(x, str) for x in direct)):
        yield _issue(rule, doc, "direct_evidence must be a non-empty list of signals", "direct_evidence")
    elif direct:
        for sig in (s for s in direct if s not in ctx.known_series()):
            yield _issue(rule, doc, f"direct_evidence: unknown signal {sig!r}", "direct_evidence")
    if level != "high":
        needs = {
            "direct_evidence": (
                direct is None,
                "the signals with which the defers_to rules read the mechanism directly",
            ),
            "confirm": (not str(doc.get("confirm") or "").strip(), "what evidence would confirm it"),
            "defers_to": (not defers, "the rules that read the same mechanism from direct evidence"),
        }
        for key, (missing, what) in needs.items():
            if missing:
                yield _issue(rule, doc, f"a {level}-confidence rule needs {key!r}: {what}", "confidence")
    elif defers or direct or (doc.get("confirm") and not doc.get("moderate_unless")):
        yield _issue(
            rule,
            doc,
            "'confirm', 'defers_to' and 'direct_evidence' belong to a rule with confidence "
            "below high ('confirm' also to one with moderate_unless)",
            "confirm" if doc.get("confirm") else "defers_to",
        )


def _check_deferrals(rules: dict[str, Rule]) -> Iterable[RuleIssue]:
    """Every `defers_to` names another rule of the set, at high confidence."""
    for rule in rules.values():
        defers = rule.doc.get("defers_to")
        for rid in defers if isinstance(defers, list) else []:
            target = rules.get(str(rid))
            if target is None or target.id == rule.id:
                yield _issue(rule, rule.doc, f"defers_to names {rid!r}, which is not another rule", "defers_to")
            elif target.doc.get("confidence", "high") != "high":
                yield _issue(
                    rule, rule.doc, f"defers_to names {rid!r}, which is not a high-confidence rule", "defers_to"
                )


def check_test_file(rule: Rule, ctx: Context) -> Iterable[RuleIssue]:
    """Every rule ships <rule_id>.test.yaml next to it."""
    if not Path(rule.path).with_name(f"{rule.id}.test.yaml").exists():
        yield _issue(rule, rule.doc, f"missing test file {rule.id}.test.yaml")


VALIDATORS: tuple[Validator, ...] = (check_header, check_params, check_levers, check_confidence, check_test_file)
TREE_VALIDATORS: tuple[Validator, ...] = (check_series, check_conditions, check_evidence)
"""Validators that read the rule's typed tree: they run when it parses."""


def validate_rule(rule: Rule, ctx: Context | None = None) -> list[RuleIssue]:
    """Issues of one rule: the mapping's own checks, then the tree every backend reads (a part
    it cannot parse is one issue at its line), then the checks on that tree."""
    ctx = ctx or Context(load_catalog(), load_levers())
    issues = [issue for v in VALIDATORS for issue in v(rule, ctx)]
    try:
        _ = rule.tree  # parsed once, cached on the rule
    except RuleError as exc:
        if all(i.message != exc.message for i in issues):
            issues.append(RuleIssue(exc.path or rule.path, exc.line or 1, exc.message))
        return issues
    return issues + [issue for v in TREE_VALIDATORS for issue in v(rule, ctx)]


def validate_rules(directory: str | Path | None = None, ctx: Context | None = None) -> list[RuleIssue]:
    """Issues of every rule in a directory, plus LEVERS.md coverage."""
    ctx = ctx or Context(load_catalog(), load_levers())
    issues: list[RuleIssue] = []
    rows: set[str] = set()
    paths = rule_paths(directory)
    rules: dict[str, Rule] = {}
    for path in paths:
        try:
            rule = read_rule(path)
        except RuleError as exc:
            issues.append(RuleIssue(exc.path or str(path), exc.line or 1, exc.message))
            continue
        rows.add(str(rule.doc.get("levers_md")))
        rules[rule.id] = rule
        issues.extend(validate_rule(rule, ctx))
    issues.extend(_check_deferrals(rules))
    where = str(paths[0].parent if paths else "rules/diagnosis")
    uncovered = [r for r in LEVERS_MD_ROWS if r not in rows] if directory is None else []
    return issues + [RuleIssue(where, 0, f"no rule for LEVERS.md row {row}") for row in uncovered]
