"""Compile diagnosis rules (rules/diagnosis/*.yaml) into Prometheus alerting rules.

The rule's thresholds, `for`, grouping and severity carry over unchanged, so the Python engine
(diagnoser/evaluate/evaluator.py) and Prometheus fire on the same data (tests/integration/test_parity.py
checks it). Each canonical signal `S` is read from the recorded `kvscope:S` series
(promrules.py), which exist whether the engines are scraped directly or through the agent.

A rule becomes `Llm<CamelCaseId>` with labels `severity`, `rule_id`, `levers_md`; a rule with
`warning_when` / `critical_when` gets a further rule of the same name with that severity. Rules that
PromQL cannot express are returned as `PythonOnly` with the reason (cascades, a parameter
without a default, absence tests, a condition on a coarser series only); the generated file
lists them in its header.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvscope.agent.signals import KVSCOPE_PREFIX, Catalog, load_catalog
from kvscope.diagnoser.findings import SEVERITY_RANK
from kvscope.diagnoser.promql.series import NotExpressible, SeriesCompiler, _duration, _number
from kvscope.diagnoser.promql.signals import name_selector, quote
from kvscope.diagnoser.rulebook.rule import Rule, parse_duration

RUNBOOK_BASE = "docs/runbooks/"

_OPS = (">", ">=", "<", "<=", "==", "!=")


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

    def condition(self, cond: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
        """(expression, its grouping)."""
        if "fact" in cond:
            raise NotExpressible("tests an engine fact from an info gauge")
        name = str(cond["series"])
        left, by = self.series.expr(name), self.series.by_of(name)
        if "present" in cond:
            if cond["present"]:
                return left, by
            if by:
                raise NotExpressible("tests that a series is absent per group")
            return f"absent({left})", by
        op = str(cond.get("op"))
        if op not in _OPS:
            raise NotExpressible(f"operator {op!r}")
        if self.slack and op in ("==", "!="):
            raise NotExpressible(f"equality test {op} has no loosened form")
        return f"({left}) {op} {self._right(cond, name)}", by

    def chained(self, conds: list[dict[str, Any]]) -> tuple[str, tuple[str, ...]]:
        """Comparisons of one series, all of which must hold, as one chain
        `((left) op1 right1) op2 right2`: a comparison keeps the left side's value and labels, so
        the chain equals `cond1 and cond2` and computes the series once."""
        names = {str(c.get("series")) for c in conds}
        if len(names) != 1 or any("op" not in c or "present" in c or "fact" in c for c in conds):
            raise ValueError("a chain is comparisons of one series")
        out, by = self.condition(conds[0])
        for cond in conds[1:]:
            op = str(cond.get("op"))
            if op not in _OPS:
                raise NotExpressible(f"operator {op!r}")
            if self.slack and op in ("==", "!="):
                raise NotExpressible(f"equality test {op} has no loosened form")
            out = f"({out}) {op} {self._right(cond, str(cond['series']))}"
        return out, by

    def _loose(self, x: float, op: str | None) -> float:
        """x moved by the slack in the direction that makes `left op x` hold more often."""
        if not self.slack or op is None:
            return x
        return x - self.slack * abs(x) if op in (">", ">=") else x + self.slack * abs(x)

    def _right(self, cond: dict[str, Any], name: str) -> str:
        op = str(cond.get("op")) if self.slack else None
        times = _number(self._loose(float(self.rule.resolve(cond.get("times", 1))), op))
        plus = _number(self._loose(float(self.rule.resolve(cond.get("plus", 0))), op))
        if "value" in cond:
            value = self.rule.resolve(cond["value"])
            if value is None:
                raise NotExpressible(f"threshold {cond['value']} has no value")
            if op is not None and float(value) == 0 and signed(self.rule, name):
                raise NotExpressible(f"{name} can be negative; a zero threshold has no loosened form")
            scaled = float(value) * float(self.rule.resolve(cond.get("times", 1))) + float(
                self.rule.resolve(cond.get("plus", 0))
            )  # the engine's value x times + plus
            return _number(self._loose(scaled, op))
        if "than" in cond:
            other = str(cond["than"])
            join = self.series._join(name, other)
            return f"{join.strip()} ({times} * ({self.series.expr(other)}) + {plus})".lstrip()
        if "baseline" in cond:
            base = cond["baseline"]
            agg = str(base.get("agg", "avg"))
            if agg not in ("avg", "max", "min", "sum"):
                raise NotExpressible(f"baseline agg {agg!r}")
            rng = self.series.dur(base.get("range", "30m"))
            offset = (
                parse_duration(self.series.dur(base.get("offset", "10m"), least=0))
                if parse_duration(self.rule.resolve(base.get("offset", "10m"))) > 0
                else 0.0
            )
            shift = f" offset {_duration(offset)}" if offset > 0 else ""
            source = str(base.get("of", name))
            join = self.series._join(name, source) if source != name else ""
            shifted = f"{agg}_over_time(({self.series.expr(source)})[{rng}:{self.series.sub_step(rng)}]{shift})"
            return f"{join.strip()} ({times} * {shifted} + {plus})".lstrip()
        raise NotExpressible("condition has no right side")

    def combine(self, block: dict[str, Any], facts: list[dict[str, Any]] | None = None) -> str:
        """`all` conditions joined with `and`, `any` with `or`. A condition on a coarser series
        (e.g. fleet-wide, `by: []`) is joined onto the rule's groups on its own labels, as the
        Python engine broadcasts it."""
        conds = [self.condition(c) for c in block.get("all") or []]
        anys = [self.condition(c) for c in block.get("any") or []]
        if not conds:
            if not anys or any(set(b) != set(self.rule.by) for _, b in anys):
                raise NotExpressible("only `any` conditions, on different groupings")
            conds, anys = [("\nor\n".join(f"({e})" for e, _ in anys), self.rule.by)], []
        conds.sort(key=lambda c: -len(c[1]))
        (first, first_by), rest = conds[0], conds[1:]
        if set(first_by) != set(self.rule.by):
            raise NotExpressible(f"no `all` condition is grouped by the rule's labels {list(self.rule.by)}")
        out = f"({first})"
        for expr, by in rest:
            out += f"\nand{self._on(by)}\n({expr})"
        if anys:
            ref = (
                self.series.expr(str((block.get("all") or [])[0]["series"]))
                if any(set(b) != set(first_by) for _, b in anys)
                else ""
            )
            terms = [f"({e})" if set(b) == set(first_by) else f"(({ref})\nand{self._on(b)}\n({e}))" for e, b in anys]
            out += "\nand\n(\n" + "\nor\n".join(terms) + "\n)"
        for fact in facts or []:
            out += f"\nand on (instance)\n{self.fact(fact)}"
        return out

    def _on(self, by: tuple[str, ...]) -> str:
        return "" if set(by) == set(self.rule.by) else f" on ({', '.join(by)})"

    def fact(self, fact: dict[str, Any]) -> str:
        """Instances whose info gauge (agent `kvscope_engine_info` or the engine's own, e.g.
        `vllm:cache_config_info`) carries the fact; an unknown fact fails, as in Python."""
        if "instance" not in self.rule.by:
            raise NotExpressible("tests an engine fact but is not grouped by instance")
        op = str(fact.get("op", "=="))
        if op not in ("==", "!="):
            raise NotExpressible(f"fact operator {op!r}")
        name, value = str(fact["fact"]), quote(str(self.rule.resolve(fact["value"])))
        matchers = [f'{name}="{value}"'] if op == "==" else [f'{name}!="{value}"', f'{name}!=""']
        names = (KVSCOPE_PREFIX + "engine_info", *info_gauges(self.catalog))
        return f"group by (instance) ({name_selector(names, matchers)})"


_NONNEGATIVE = ("gauge", "rate", "increase", "quantile", "mean", "resets", "count", "changes")


def signed(rule: Rule, name: str, seen: frozenset[str] = frozenset()) -> bool:
    """Whether a named series can be negative (a difference, a slope, or built from one)."""
    node = rule.series.get(name)
    if node is None or name in seen:
        return True
    form = next(
        (
            f
            for f in (
                *_NONNEGATIVE,
                "ratio",
                "sum",
                "product",
                "coalesce",
                "scale",
                "over_time",
                "aggregate",
                "diff",
                "deriv",
            )
            if f in node
        ),
        "diff",
    )
    if form in _NONNEGATIVE:
        return False
    if form in ("diff", "deriv"):
        return True
    if form == "scale" and float(rule.resolve(node.get("by_value", 1.0))) < 0:
        return True
    refs = (
        [str(x) for x in node[form]]
        if form in ("ratio", "sum", "product", "coalesce")
        else [str(node["scale"])]
        if form == "scale"
        else [str(node["of"])]
    )
    return any(signed(rule, r, seen | {name}) for r in refs)


def info_gauges(catalog: Catalog) -> tuple[str, ...]:
    """Engine info-style gauges whose labels are facts (from the catalog's `facts`)."""
    return tuple(f.name for f in catalog.facts if f.fact is None)


def compile_rule(rule: Rule, runbook_base: str = RUNBOOK_BASE) -> list[dict[str, Any]] | PythonOnly:
    """Alerting rules for one diagnosis rule, or PythonOnly with the reason."""
    doc = rule.doc
    if "cascade" in doc:
        return PythonOnly(rule.id, "cascade: ordered stage onsets have no PromQL form")
    missing = rule.missing_params()
    if missing:
        return PythonOnly(rule.id, f"parameter(s) {', '.join(missing)} have no default; set them to enable")
    try:
        series = SeriesCompiler(rule)
        conds = ConditionCompiler(rule, series)
        when = rule.when
        expr = conds.combine(when, doc.get("facts"))
        raised = [
            (sev, conds.combine(doc[f"{sev}_when"]))
            for sev in ("warning", "critical")
            if doc.get(f"{sev}_when") and SEVERITY_RANK[sev] > SEVERITY_RANK[rule.severity]
        ]
    except (NotExpressible, KeyError, ValueError) as exc:
        return PythonOnly(rule.id, str(exc) or type(exc).__name__)
    return [_alert(rule, expr, rule.severity, when, runbook_base)] + [
        _alert(rule, f"{expr}\nand\n{cond}", sev, when, runbook_base) for sev, cond in raised
    ]


def _alert(rule: Rule, expr: str, severity: str, when: dict[str, Any], runbook_base: str) -> dict[str, Any]:
    where = " ".join(f"{{{{ $labels.{label} }}}}" for label in rule.by) or "the fleet"
    alert: dict[str, Any] = {"alert": alert_name(rule.id), "expr": expr}
    if when.get("for") and parse_duration(rule.resolve(when["for"])) > 0:
        alert["for"] = _duration(rule.resolve(when["for"]))
    alert["labels"] = {"severity": severity, "rule_id": rule.id}
    if rule.doc.get("levers_md"):
        alert["labels"]["levers_md"] = str(rule.doc["levers_md"])
    if rule.doc.get("confidence", "high") != "high":  # inferred: Alertmanager can inhibit it with
        alert["labels"]["confidence"] = str(rule.doc["confidence"])  # the defers_to rules' alerts
    levers = ", ".join(str(lv.get("id")) for lv in rule.doc.get("levers") or [] if isinstance(lv, dict))
    alert["annotations"] = {
        "summary": f"{rule.title} on {where} (value {{{{ $value | humanize }}}})",
        "description": " ".join(str(rule.doc.get("description", "")).split())
        + (f" Levers: {levers}." if levers else ""),
        "runbook_url": f"{runbook_base}{rule.id}.md",
    }
    return alert


def compile_rules(rules: list[Rule], runbook_base: str = RUNBOOK_BASE) -> tuple[list[dict[str, Any]], list[PythonOnly]]:
    """(alerting rules in rule-id order, rules that stay Python-only)."""
    alerts: list[dict[str, Any]] = []
    python_only: list[PythonOnly] = []
    for rule in sorted(rules, key=lambda r: r.id):
        out = compile_rule(rule, runbook_base)
        if isinstance(out, PythonOnly):
            python_only.append(out)
        else:
            alerts.extend(out)
    return alerts, python_only
