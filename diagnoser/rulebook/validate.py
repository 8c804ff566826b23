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

from kvscope.agent.signals import Catalog, load_catalog
from kvscope.diagnoser.findings import CONFIDENCES, SEVERITIES
from kvscope.diagnoser.rulebook.grammar import (
    BASELINE_AGGS,
    FORMS,
    OPS,
    RIGHT_SIDES,
    SIGNAL_FORMS,
    ExprError,
    node_form,
    node_refs,
)
from kvscope.diagnoser.rulebook.levers import DIRECTIONS, Lever, load_levers
from kvscope.diagnoser.rulebook.rule import LineDict, Rule, RuleError, parse_duration, read_rule, rule_paths

LEVERS_MD_ROWS = tuple(
    [f"P{i}" for i in range(1, 10)]
    + [f"K{i}" for i in range(1, 9)]
    + [f"L{i}" for i in range(1, 15)]
    + [f"U{i}" for i in range(1, 12)]
)
"""The 42 symptom rows of LEVERS.md; every one needs at least one rule."""
BEYOND_ROWS = tuple(f"R{i}" for i in range(1, 8))
"""LEVERS.md "Beyond the documents" rows (issue 27): a rule may name one; none is required yet."""

AGGS = ("sum", "max", "min", "avg")
GROUP_AGGS = ("sum", "max", "min", "avg", "median", "count")
OVER_TIME = ("avg", "max", "min", "median")
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
    line = 1
    if isinstance(node, LineDict):
        line = node.line_of(key) if key else node.line
    return RuleIssue(rule.path, line, message)


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
    if doc.get("levers_md") and doc["levers_md"] not in LEVERS_MD_ROWS + BEYOND_ROWS:
        yield _issue(rule, doc, f"levers_md {doc['levers_md']!r} is not a LEVERS.md row", "levers_md")
    if not ("when" in doc) ^ ("cascade" in doc):
        yield _issue(rule, doc, "a rule needs exactly one of 'when' or 'cascade'")
    spec = doc.get("specificity", 2)
    if spec not in (1, 2, 3):
        yield _issue(rule, doc, f"specificity must be 1, 2 or 3, not {spec!r}", "specificity")


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
    elif isinstance(obj, str):
        m = _PARAM.match(obj)
        if m:
            yield parent, key, m.group(1)


def _read_at_rule_level(rule: Rule) -> set[str]:
    """Series that conditions, evidence or a `mechanism` read at the rule's grouping (a series
    grouped finer than the rule, e.g. per replica in a per-model rule, may only feed aggregates)."""
    doc = rule.doc
    names = {str(c.get("series")) for c in _conditions(rule) if isinstance(c, dict)}
    names |= {str(c.get("than")) for c in _conditions(rule) if isinstance(c, dict) and "than" in c}
    names |= {str(e.get("series")) for e in doc.get("evidence") or [] if isinstance(e, dict)}
    return names | ({str(doc["mechanism"].get("series"))} if isinstance(doc.get("mechanism"), dict) else set())


def check_series(rule: Rule, ctx: Context) -> Iterable[RuleIssue]:
    """Every series has one known form, reads known signals, refers to existing series, no cycles."""
    series = rule.doc.get("series") or {}
    known = ctx.known_series()
    by = set(rule.by)
    for name, node in series.items():
        if not isinstance(node, dict):
            yield _issue(rule, series, f"series {name!r} must be a mapping", name)
            continue
        try:
            form = node_form(node)
        except ExprError:
            yield _issue(rule, node, f"series {name!r}: needs exactly one of {', '.join(FORMS)}")
            continue
        yield from _check_node(rule, name, node, form, known, series)
        if not set(node.get("by", rule.by)) <= by and name in _read_at_rule_level(rule):
            yield _issue(
                rule,
                node,
                f"series {name!r}: by {node['by']} is finer than the rule's by {rule.by}; "
                "only an aggregate may read it",
                "by",
            )
    yield from _check_cycles(rule, series)


def _check_node(rule: Rule, name: str, node: dict, form: str, known: set[str], series: dict) -> Iterable[RuleIssue]:
    if form in SIGNAL_FORMS:
        sig = str(node.get("histogram") if form == "quantile" else node[form])
        if form in ("quantile", "mean"):
            if sig + "_bucket" not in known and form == "quantile" or sig + "_sum" not in known and form == "mean":
                yield _issue(rule, node, f"series {name!r}: {sig!r} is not a histogram in the catalog")
        elif sig not in known:
            yield _issue(rule, node, f"series {name!r}: unknown signal {sig!r} (not in agent/normalize/catalog.yaml)")
    for ref in node_refs(node):
        if ref not in series:
            yield _issue(rule, node, f"series {name!r}: refers to unknown series {ref!r}")
    checks = {"gauge": ("agg", AGGS), "aggregate": ("aggregate", GROUP_AGGS), "over_time": ("over_time", OVER_TIME)}
    if form in checks:
        key, allowed = checks[form]
        value = node.get(key, "sum")
        if value not in allowed:
            yield _issue(rule, node, f"series {name!r}: {key} {value!r} is not one of {list(allowed)}", key)
    for key in ("range", "settle", "ahead"):
        if key in node and not _PARAM.match(str(node[key])):
            try:
                parse_duration(node[key])
            except ValueError as exc:
                yield _issue(rule, node, f"series {name!r}: {exc}", key)


def _check_cycles(rule: Rule, series: dict) -> Iterable[RuleIssue]:
    def visit(name: str, path: tuple[str, ...]) -> str | None:
        if name in path:
            return " -> ".join(path + (name,))
        node = series.get(name)
        if not isinstance(node, dict):
            return None
        try:
            refs = node_refs(node)
        except ExprError:
            return None
        for ref in refs:
            cycle = visit(ref, path + (name,))
            if cycle:
                return cycle
        return None

    for name in series:
        cycle = visit(name, ())
        if cycle:
            yield _issue(rule, series, f"series cycle: {cycle}", name)
            return


def _conditions(rule: Rule) -> Iterable[dict]:
    doc = rule.doc
    blocks = [doc.get(k) or {} for k in ("when", "warning_when", "critical_when", "resolved_when")]
    blocks += [{"all": [doc["moderate_unless"]]}] if doc.get("moderate_unless") else []
    blocks += list((doc.get("cascade") or {}).get("stages") or [])
    for block in blocks:
        for key in ("all", "any"):
            yield from block.get(key) or []


def check_conditions(rule: Rule, ctx: Context) -> Iterable[RuleIssue]:
    """Known series and operators; exactly one right side; valid baselines; for parses."""
    series = rule.doc.get("series") or {}
    for cond in _conditions(rule):
        if not isinstance(cond, dict):
            yield RuleIssue(rule.path, 1, f"condition must be a mapping, not {cond!r}")
            continue
        if cond.get("series") not in series:
            yield _issue(rule, cond, f"condition reads unknown series {cond.get('series')!r}", "series")
        sides = [k for k in RIGHT_SIDES if k in cond]
        if len(sides) != 1:
            yield _issue(rule, cond, f"condition needs exactly one of {list(RIGHT_SIDES)}, got {sides}")
        if "present" not in cond and cond.get("op") not in OPS:
            yield _issue(rule, cond, f"unknown operator {cond.get('op')!r} (use {' '.join(OPS)})", "op")
        if "than" in cond and cond["than"] not in series:
            yield _issue(rule, cond, f"condition compares with unknown series {cond['than']!r}", "than")
        if "baseline" in cond and (cond["baseline"] or {}).get("agg", "avg") not in BASELINE_AGGS:
            yield _issue(rule, cond, f"baseline agg must be one of {list(BASELINE_AGGS)}", "baseline")
        if "baseline" in cond and "of" in (cond["baseline"] or {}) and cond["baseline"]["of"] not in series:
            yield _issue(rule, cond, f"baseline of unknown series {cond['baseline']['of']!r}", "baseline")
    when = rule.doc.get("when") or {}
    if when and not (when.get("all") or when.get("any")):
        yield _issue(rule, when, "'when' needs 'all' or 'any' conditions")
    yield from _check_cascade(rule)


def _check_cascade(rule: Rule) -> Iterable[RuleIssue]:
    cas = rule.doc.get("cascade")
    if not cas:
        return
    names = [s.get("name") for s in cas.get("stages") or []]
    if len(names) < 2:
        yield _issue(rule, cas, "a cascade needs at least two stages")
    for key in ("root", "symptom", "fire_at", "critical_at"):
        if key in cas and cas[key] not in names:
            yield _issue(rule, cas, f"cascade {key} {cas[key]!r} is not a stage ({names})", key)


def check_levers(rule: Rule, ctx: Context) -> Iterable[RuleIssue]:
    """Lever ids exist in rules/levers.yaml and directions are known."""
    levers = rule.doc.get("levers") or []
    if not levers:
        yield _issue(rule, rule.doc, "a rule needs at least one lever")
    for ref in levers:
        if ref.get("id") not in ctx.levers:
            yield _issue(rule, ref, f"unknown lever {ref.get('id')!r} (not in rules/levers.yaml)", "id")
        if ref.get("direction", "review") not in DIRECTIONS:
            yield _issue(rule, ref, f"direction {ref.get('direction')!r} is not one of {list(DIRECTIONS)}", "direction")


def check_evidence(rule: Rule, ctx: Context) -> Iterable[RuleIssue]:
    """Evidence reads declared series with a known stat; the summary only names evidence series."""
    series = rule.doc.get("series") or {}
    items = rule.doc.get("evidence") or []
    if not items:
        yield _issue(rule, rule.doc, "a rule needs evidence to show")
    for item in items:
        if item.get("series") not in series:
            yield _issue(rule, item, f"evidence reads unknown series {item.get('series')!r}", "series")
        if item.get("stat", "last") not in STATS:
            yield _issue(rule, item, f"stat {item.get('stat')!r} is not one of {list(STATS)}", "stat")
    names = {str(i.get("series")) for i in items}
    summary = str(rule.doc.get("summary", ""))
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(summary) if f}
    except ValueError as exc:
        yield _issue(rule, rule.doc, f"summary: {exc}", "summary")
        return
    for f in sorted(fields - names):
        yield _issue(rule, rule.doc, f"summary names {f!r}, which is not an evidence series", "summary")


def check_facts(rule: Rule, ctx: Context) -> Iterable[RuleIssue]:
    """Facts are per engine instance, so the rule must group by instance."""
    if rule.doc.get("facts") and "instance" not in rule.by:
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
        known = ctx.known_series()
        for sig in direct:
            if sig not in known:
                yield _issue(rule, doc, f"direct_evidence: unknown signal {sig!r}", "direct_evidence")
    if level != "high":
        if direct is None:
            yield _issue(
                rule,
                doc,
                f"a {level}-confidence rule needs 'direct_evidence': the signals with which "
                "the defers_to rules read the mechanism directly",
                "confidence",
            )
        if not str(doc.get("confirm") or "").strip():
            yield _issue(
                rule, doc, f"a {level}-confidence rule needs 'confirm': what evidence would confirm it", "confidence"
            )
        if not defers:
            yield _issue(
                rule,
                doc,
                f"a {level}-confidence rule needs 'defers_to': the rules that read the "
                "same mechanism from direct evidence",
                "confidence",
            )
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


VALIDATORS: tuple[Validator, ...] = (
    check_header,
    check_params,
    check_series,
    check_conditions,
    check_levers,
    check_evidence,
    check_facts,
    check_confidence,
    check_test_file,
)


def validate_rule(rule: Rule, ctx: Context | None = None) -> list[RuleIssue]:
    """Issues of one rule."""
    ctx = ctx or Context(load_catalog(), load_levers())
    issues = [issue for v in VALIDATORS for issue in v(rule, ctx)]
    if not issues:  # what the backends read: a part the checks above let through fails here
        try:
            _ = rule.tree  # parsed once, cached on the rule
        except RuleError as exc:
            issues.append(RuleIssue(exc.path or rule.path, exc.line or 1, exc.message))
    return issues


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
    if directory is None:
        for row in LEVERS_MD_ROWS:
            if row not in rows:
                issues.append(
                    RuleIssue(
                        str(paths[0].parent if paths else "rules/diagnosis"), 0, f"no rule for LEVERS.md row {row}"
                    )
                )
    return issues
