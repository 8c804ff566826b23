"""Compile diagnosis rules (rules/diagnosis/*.yaml) into Prometheus alerting rules.

Thresholds, `for`, grouping and severity carry over, so the Python engine and Prometheus fire on
the same data (tests/integration/test_parity.py); signals are read from the recorded `kvscope:S`
series (rulefiles.py). A rule becomes `Llm<CamelCaseId>` with labels `severity`, `rule_id` (and
`confidence` when moderate), annotations `summary`, `description` and `levers` (titles and their
docs/levers.md sections), plus one rule per higher `warning_when`/`critical_when` severity; rules
PromQL cannot express come back as `PythonOnly` with the reason, listed in the file's header.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvscope.core.signals import KVSCOPE_PREFIX, Catalog, load_catalog
from kvscope.diagnoser.actions import direction_text
from kvscope.diagnoser.citations import cite_text
from kvscope.diagnoser.findings import SEVERITY_RANK
from kvscope.diagnoser.promql.series import NotExpressible, SeriesCompiler, prom_duration
from kvscope.diagnoser.promql.signals import PromQL, name_selector, prom_number, quote
from kvscope.diagnoser.rulebook import tree
from kvscope.diagnoser.rulebook.levers import load_levers, rule_levers
from kvscope.diagnoser.rulebook.rule import Rule


@dataclass(frozen=True)
class PythonOnly:
    """A rule the Python engine evaluates but Prometheus cannot, and why."""

    rule_id: str
    reason: str


def alert_name(rule_id: str) -> str:
    """`kv_pressure_preemption` -> `LlmKvPressurePreemption`."""
    return "Llm" + "".join(part[:1].upper() + part[1:] for part in rule_id.split("_") if part)


class ConditionCompiler:
    """PromQL for `when` conditions; every condition keeps the labels of its left series."""

    def __init__(self, rule: Rule, series: SeriesCompiler, catalog: Catalog | None = None, slack: float = 0.0) -> None:
        """`slack` > 0 loosens every comparison by that share of its right side (a prefilter
        that must hold wherever the exact condition does: diagnoser/pushdown/), and refuses
        equality tests, which no slack loosens."""
        self.rule, self.series = rule, series
        self.catalog = catalog or load_catalog()
        self.slack = slack

    def condition(self, cond: tree.Cond) -> PromQL:
        """The condition in PromQL, grouped as its left series."""
        left = self.series.expr(cond.series)
        if cond.op == "present":
            return left
        if cond.op == "absent":
            if left.by:
                raise NotExpressible("tests that a series is absent per group")
            return PromQL(f"absent({left})", left.by, left.cost)
        return self._compare(left, cond)

    def chained(self, conds: Sequence[tree.Cond]) -> PromQL:
        """Comparisons of one series, all of which must hold, as one chain
        `((left) op1 right1) op2 right2`: a comparison keeps the left side's value and labels, so
        the chain equals `cond1 and cond2` and computes the series once."""
        if len({c.series for c in conds}) != 1 or any(c.right is None for c in conds):
            raise ValueError("a chain is comparisons of one series")
        out = self.series.expr(conds[0].series)
        for cond in conds:
            out = self._compare(out, cond)
        return out

    def _compare(self, left: PromQL, cond: tree.Cond) -> PromQL:
        if self.slack and cond.op in ("==", "!="):
            raise NotExpressible(f"equality test {cond.op} has no loosened form")
        right = self._right(cond)
        return PromQL(f"({left}) {cond.op} {right}", left.by, left.cost + getattr(right, "cost", 0))

    def _loose(self, x: float, op: str | None) -> float:
        """x moved by the slack in the direction that makes `left op x` hold more often."""
        if not self.slack or op is None:
            return x
        return x - self.slack * abs(x) if op in (">", ">=") else x + self.slack * abs(x)

    def _right(self, cond: tree.Cond) -> str:
        op, r, name = cond.op if self.slack else None, cond.right, cond.series
        times, plus = prom_number(self._loose(cond.times, op)), prom_number(self._loose(cond.plus, op))
        if isinstance(r, tree.Value):
            x = cond.threshold()
            if x is None:
                raise NotExpressible(f"threshold of {name} has no value")
            if op is not None and r.x == 0 and signed(self.rule, name):
                raise NotExpressible(f"{name} can be negative; a zero threshold has no loosened form")
            return prom_number(self._loose(x, op))
        if isinstance(r, tree.Than):
            other = self.series.expr(r.series)
            join = self.series._join(name, r.series).strip()
            return PromQL(f"{join} ({times} * ({other}) + {plus})".lstrip(), other.by, other.cost)
        assert isinstance(r, tree.Baseline)
        if r.agg not in ("avg", "max", "min", "sum"):
            raise NotExpressible(f"baseline agg {r.agg!r}")
        rng = self.series.dur(r.rng)
        shift = f" offset {self.series.dur(r.offset, least=0)}" if r.offset > 0 else ""
        shift = "" if shift == " offset 0s" else shift
        source = r.of or name
        join = self.series._join(name, source).strip() if source != name else ""
        sub, cost = self.series.subquery(self.series.expr(source), rng, shift)
        return PromQL(f"{join} ({times} * {r.agg}_over_time({sub}) + {plus})".lstrip(), (), cost)

    def combine(self, block: tree.Block, facts: Sequence[tree.Fact] = ()) -> str:
        """`all` conditions joined with `and`, `any` with `or`. A condition on a coarser series
        (e.g. fleet-wide, `by: []`) is joined onto the rule's groups on its own labels, as the
        Python engine broadcasts it."""
        conds = [self.condition(c) for c in block.all]
        anys = [self.condition(c) for c in block.any]
        if not conds:
            if not anys or any(set(e.by) != set(self.rule.by) for e in anys):
                raise NotExpressible("only `any` conditions, on different groupings")
            conds, anys = [PromQL("\nor\n".join(f"({e})" for e in anys), self.rule.by)], []
        conds.sort(key=lambda c: -len(c.by))
        first, rest = conds[0], conds[1:]
        if set(first.by) != set(self.rule.by):
            raise NotExpressible(f"no `all` condition is grouped by the rule's labels {list(self.rule.by)}")
        out = f"({first})"
        for e in rest:
            out += f"\nand{on_clause(self.rule.by, e.by)}\n({e})"
        if anys:
            ref = self.series.expr(block.all[0].series) if any(set(e.by) != set(first.by) for e in anys) else ""
            terms = [
                f"({e})" if set(e.by) == set(first.by) else f"(({ref})\nand{on_clause(self.rule.by, e.by)}\n({e}))"
                for e in anys
            ]
            out += "\nand\n(\n" + "\nor\n".join(terms) + "\n)"
        for fact in facts:
            out += f"\nand on (instance)\n{self.fact(fact)}"
        return out

    def fact(self, fact: tree.Fact) -> str:
        """Instances whose info gauge (agent `kvscope_engine_info` or the engine's own, e.g.
        `vllm:cache_config_info`) carries the fact; an unknown fact fails, as in Python."""
        if "instance" not in self.rule.by:
            raise NotExpressible("tests an engine fact but is not grouped by instance")
        if fact.op not in ("==", "!="):
            raise NotExpressible(f"fact operator {fact.op!r}")
        name, value = fact.fact, quote(fact.value)
        matchers = [f'{name}="{value}"'] if fact.op == "==" else [f'{name}!="{value}"', f'{name}!=""']
        names = (KVSCOPE_PREFIX + "engine_info", *(f.name for f in self.catalog.facts if f.fact is None))
        return f"group by (instance) ({name_selector(names, matchers)})"


def on_clause(by: tuple[str, ...], other: tuple[str, ...]) -> str:
    """The `on (...)` modifier joining a result grouped by `other` onto one grouped by `by`."""
    return "" if set(other) == set(by) else f" on ({', '.join(other)})"


def signed(rule: Rule, name: str, seen: frozenset[str] = frozenset()) -> bool:
    """Whether a named series can be negative (a difference, a slope, or built from one)."""
    node = rule.tree.series.get(name)
    if node is None or name in seen or isinstance(node, tree.Deriv | tree.Predict):
        return True
    if isinstance(node, tree.Signal | tree.Changes):
        return False
    if isinstance(node, tree.Pair) and node.op == "diff" or isinstance(node, tree.Scale) and node.k < 0:
        return True
    return any(signed(rule, r, seen | {name}) for r in node.refs)


def compile_rule(rule: Rule) -> list[dict[str, Any]] | PythonOnly:
    """Alerting rules for one diagnosis rule, or PythonOnly with the reason."""
    if "cascade" in rule.doc:
        return PythonOnly(rule.id, "cascade: ordered stage onsets have no PromQL form")
    missing = rule.missing_params()
    if missing:
        return PythonOnly(rule.id, f"parameter(s) {', '.join(missing)} have no default; set them to enable")
    try:
        t = rule.tree
        conds = ConditionCompiler(rule, SeriesCompiler(rule))
        when = t.gated
        expr = conds.combine(when, t.facts)
        raised = [
            (sev, conds.combine(block))
            for sev, block in (("warning", t.warning_when), ("critical", t.critical_when))
            if block and SEVERITY_RANK[sev] > SEVERITY_RANK[rule.severity]
        ]
    except (NotExpressible, KeyError, ValueError) as exc:
        return PythonOnly(rule.id, str(exc) or type(exc).__name__)
    return [_alert(rule, expr, rule.severity, when)] + [
        _alert(rule, f"{expr}\nand\n{cond}", sev, when) for sev, cond in raised
    ]


def _alert(rule: Rule, expr: str, severity: str, when: tree.Block) -> dict[str, Any]:
    where = " ".join(f"{{{{ $labels.{label} }}}}" for label in rule.by) or "the fleet"
    alert: dict[str, Any] = {"alert": alert_name(rule.id), "expr": expr}
    if when.hold > 0:
        alert["for"] = prom_duration(when.hold)
    alert["labels"] = {"severity": severity, "rule_id": rule.id}
    meta = rule.tree.meta
    if meta.get("confidence", "high") != "high":  # inferred: Alertmanager can inhibit it with
        alert["labels"]["confidence"] = str(meta["confidence"])  # the defers_to rules' alerts
    alert["annotations"] = {
        "summary": f"{rule.title} on {where} (value {{{{ $value | humanize }}}})",
        "description": cite_text(" ".join(str(meta.get("description", "")).split())),
    }
    if levers := levers_text(meta.get("levers") or []):
        alert["annotations"]["levers"] = levers
    return alert


def levers_text(named: list[Any]) -> str:
    """The `levers` annotation: each lever a rule names by its title and direction, with its
    section of docs/levers.md (per-engine settings, costs, sources): 'Concurrency limit per engine
    (decrease): docs/levers.md#vllmmax_num_seqs; ...'. A lever id levers.yaml lacks is skipped
    (`kvscope rules validate` refuses it)."""
    advice = rule_levers(named, load_levers())
    return "; ".join(f"{lv.title}{direction_text(lv)}: docs/levers.md#{lv.id.replace('.', '')}" for lv in advice)


def compile_rules(rules: list[Rule]) -> tuple[list[dict[str, Any]], list[PythonOnly]]:
    """(alerting rules in rule-id order, rules that stay Python-only)."""
    outs = [compile_rule(rule) for rule in sorted(rules, key=lambda r: r.id)]
    alerts = [alert for out in outs if not isinstance(out, PythonOnly) for alert in out]
    return alerts, [out for out in outs if isinstance(out, PythonOnly)]
