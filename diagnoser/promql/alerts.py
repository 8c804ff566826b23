"""Compile diagnosis rules (rules/diagnosis/*.yaml) into Prometheus alerting rules.

The rule's thresholds, `for`, grouping and severity carry over unchanged, so the Python engine
(diagnoser/evaluate/evaluator.py) and Prometheus fire on the same data (tests/integration/test_parity.py
checks it). Each canonical signal `S` is read from the recorded `kvscope:S` series
(promrules.py), which exist whether the engines are scraped directly or through the agent.

A rule becomes `Llm<CamelCaseId>` with labels `severity`, `rule_id`, `levers_md`; a rule with
`critical_when` gets a second rule of the same name with `severity: critical`. Rules that
PromQL cannot express are returned as `PythonOnly` with the reason (cascades, a parameter
without a default, absence tests, a condition on a coarser series only); the generated file
lists them in its header.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from kvscope.agent.signals import KVSCOPE_PREFIX, Catalog, load_catalog
from kvscope.diagnoser.promql.signals import RecordedSignals, _escape_re, name_selector, quote
from kvscope.diagnoser.rulebook.grammar import CHANGES_SETTLE
from kvscope.diagnoser.rulebook.rule import Rule, parse_duration

SUBQUERY_STEP = "15s"
"""Resolution of `[range:step]` subqueries: the engine's default grid step (docs/rules.md)."""

RUNBOOK_BASE = "docs/runbooks/"

_OPS = (">", ">=", "<", "<=", "==", "!=")


class NotExpressible(Exception):
    """The rule (or one of its parts) has no faithful PromQL form; str() says why."""


@dataclass(frozen=True)
class PythonOnly:
    """A rule the Python engine evaluates but Prometheus cannot, and why."""

    rule_id: str
    reason: str


def alert_name(rule_id: str) -> str:
    """`kv_pressure_preemption` -> `LlmKvPressurePreemption`."""
    return "Llm" + "".join(part[:1].upper() + part[1:] for part in rule_id.split("_") if part)


def _duration(value: Any) -> str:
    """A Prometheus duration for a rule duration (`2m`, `90s`, or seconds as a number)."""
    seconds = parse_duration(value)
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds * 1000)}ms"


def _plus(by: str, labels: str) -> str:
    """`by` extended with `labels` (comma-separated), each label once."""
    out = [b.strip() for b in by.split(",") if b.strip()]
    out += [x.strip() for x in labels.split(",") if x.strip() and x.strip() not in out]
    return ", ".join(out)


def _number(value: Any) -> str:
    x = float(value)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


class SignalReader(Protocol):
    """How a canonical series is read (promql/signals.py: RecordedSignals, InlineSignals)."""

    def read(self, series: str, matchers: list[tuple[str, str, str]], fn: str | None = None,
             rng: str | None = None, by: tuple[str, ...] | None = None, outer: str | None = None) -> str: ...


class SeriesCompiler:
    """PromQL for the named series of one rule; each result is grouped by the series' `by`."""

    def __init__(self, rule: Rule, reader: SignalReader | None = None, step: float | None = None) -> None:
        """`reader` writes how a canonical signal is read (default: the recorded `kvscope:<series>`;
        `InlineSignals` reads the engines' own series). `step`: ranges, offsets and subquery
        steps as the evaluator uses them on a grid of that step (time-scaled, whole steps); None
        writes the rule's durations as they are (the alert files)."""
        self.rule = rule
        self.nodes: dict[str, dict[str, Any]] = rule.series
        self.rule_by = rule.by
        self.reader = reader or RecordedSignals()
        self.step = step
        self.sub = _duration(step) if step else SUBQUERY_STEP
        self.sub_for: Any = None
        """Optional: range seconds -> the subquery step for a subquery over that range."""

    def sub_step(self, rng: str) -> str:
        return self.sub if self.sub_for is None else self.sub_for(parse_duration(rng))

    def by_of(self, name: str) -> tuple[str, ...]:
        node = self._node(name)
        if "by" in node:
            return tuple(node["by"])
        refs = self._refs(node)
        if refs and self._form(node) in ("ratio", "sum", "diff", "product", "coalesce"):
            return max((self.by_of(r) for r in refs), key=len)
        if refs:
            return self.by_of(refs[0])
        return self.rule_by

    def expr(self, name: str) -> str:
        node = self._node(name)
        form = self._form(node)
        return getattr(self, f"_{form}")(node, ", ".join(self.by_of(name)))

    # ---------------------------------------------------------------- helpers
    def _node(self, name: str) -> dict[str, Any]:
        if name not in self.nodes:
            raise NotExpressible(f"unknown series {name!r}")
        return self.nodes[name]

    @staticmethod
    def _form(node: dict[str, Any]) -> str:
        for form in ("gauge", "rate", "increase", "quantile", "mean", "count", "resets", "ratio", "sum", "diff",
                     "product", "coalesce", "scale", "over_time", "deriv", "changes", "aggregate"):
            if form in node:
                return form
        raise NotExpressible(f"unknown series form {sorted(node)}")

    @staticmethod
    def _refs(node: dict[str, Any]) -> list[str]:
        for key in ("ratio", "sum", "diff", "product", "coalesce"):
            if key in node:
                return [str(x) for x in node[key]]
        for key in ("scale", "deriv", "changes"):
            if key in node:
                return [str(node[key])]
        return [str(node["of"])] if "of" in node else []

    def _range(self, node: dict[str, Any], default: str) -> str:
        return self.dur(node.get("range", default))

    def dur(self, value: Any, least: int = 1) -> str:
        """A rule duration as PromQL: as written, or (with a step) scaled and in whole steps."""
        if self.step is None and self.rule.time_scale == 1.0:
            return _duration(self.rule.resolve(value))
        seconds = self.rule.duration(value)
        if self.step:
            seconds = max(least, int(round(seconds / self.step))) * self.step
        return _duration(seconds)

    def _join(self, a: str, b: str) -> str:
        """Binary-operator modifier joining series b onto series a (b coarser or equal)."""
        by_a, by_b = self.by_of(a), self.by_of(b)
        if set(by_a) == set(by_b):
            return ""
        if set(by_b) <= set(by_a):
            return f" on ({', '.join(by_b)}) group_left()"
        if set(by_a) <= set(by_b):
            return f" on ({', '.join(by_a)}) group_right()"
        raise NotExpressible(f"series {a!r} and {b!r} share no grouping")

    # ---------------------------------------------------------------- signal forms
    def _read(self, node: dict[str, Any], series: str, by: str, fn: str | None = None,
              rng: str | None = None) -> str:
        """The canonical `series` (node `match` filter, `require_labels` guards), or `fn` of its
        range `[rng]`, as the reader writes it."""
        outer = "count_series" if "count" in node else str(node.get("agg", "sum")) if "gauge" in node else "sum"
        labels = tuple(b.strip() for b in by.split(",") if b.strip())
        if "count" in node:
            labels += tuple(str(d) for d in node.get("distinct", ["instance"]))
        return self.reader.read(series, self._matchers(node, by), fn, rng, by=labels, outer=outer)

    def _matchers(self, node: dict[str, Any], by: str) -> list[tuple[str, str, str]]:
        match = node.get("match") or {}
        out = []
        for label, allowed in sorted(match.items()):
            values = allowed if isinstance(allowed, list) else [allowed]
            out.append((label, "=~", "|".join(_escape_re(str(v)) for v in values)))
        grouped = {b.strip() for b in by.split(",")}
        out += [(label, "!=", "") for label in self.rule.doc.get("require_labels") or [] if label in grouped]
        return out

    def _gauge(self, node: dict[str, Any], by: str) -> str:
        return f"{node.get('agg', 'sum')} by ({by}) ({self._read(node, node['gauge'], by)})"

    def _rate(self, node: dict[str, Any], by: str) -> str:
        return f"sum by ({by}) ({self._read(node, node['rate'], by, 'rate', self._range(node, '1m'))})"

    def _increase(self, node: dict[str, Any], by: str) -> str:
        return f"sum by ({by}) ({self._read(node, node['increase'], by, 'increase', self._range(node, '5m'))})"

    def _quantile(self, node: dict[str, Any], by: str) -> str:
        q = _number(self.rule.resolve(node["quantile"]))
        rates = self._read(node, str(node["histogram"]) + "_bucket", _plus(by, "le"), "rate", self._range(node, "5m"))
        return f"histogram_quantile({q}, sum by ({_plus(by, 'le')}) ({rates}))"

    def _mean(self, node: dict[str, Any], by: str) -> str:
        s, rng = str(node["mean"]), self._range(node, "5m")
        return (f"sum by ({by}) ({self._read(node, s + '_sum', by, 'rate', rng)})\n/\n"
                f"(sum by ({by}) ({self._read(node, s + '_count', by, 'rate', rng)}) > 0)")

    resets_bridge_s: float = 0.0
    """Added to `resets` ranges (a prefilter): the evaluator counts a reset across a scrape gap of
    any length (values carried), PromQL only when the sample before the gap is inside the range."""

    def _resets(self, node: dict[str, Any], by: str) -> str:
        rng = self._range(node, "10m")
        if self.resets_bridge_s:
            rng = _duration(parse_duration(rng) + self.resets_bridge_s)
        return f"sum by ({by}) ({self._read(node, node['resets'], by, 'resets', rng)})"

    def _count(self, node: dict[str, Any], by: str) -> str:
        distinct = ", ".join(str(d) for d in node.get("distinct", ["instance"]))
        return f"count by ({by}) (count by ({_plus(by, distinct)}) ({self._read(node, node['count'], by)}))"

    # ---------------------------------------------------------------- combinations
    def _ratio(self, node: dict[str, Any], by: str) -> str:
        a, b = (str(x) for x in node["ratio"])
        min_den = float(self.rule.resolve(node.get("min_den", 0.0)))
        guard = f"> {_number(min_den)}" if min_den <= 0 else f">= {_number(min_den)}"
        return f"({self.expr(a)})\n/{self._join(a, b)}\n(({self.expr(b)}) {guard})"

    def _coalesce(self, node: dict[str, Any], by: str) -> str:
        a, b = (str(x) for x in node["coalesce"])
        if set(self.by_of(a)) != set(self.by_of(b)):
            raise NotExpressible(f"coalesce of {a!r} and {b!r} grouped differently")
        return f"({self.expr(a)})\nor\n({self.expr(b)})"

    def _sum(self, node: dict[str, Any], by: str) -> str:
        a, b = (str(x) for x in node["sum"])
        return f"({self.expr(a)})\n+{self._join(a, b)}\n({self.expr(b)})"

    def _diff(self, node: dict[str, Any], by: str) -> str:
        a, b = (str(x) for x in node["diff"])
        return f"({self.expr(a)})\n-{self._join(a, b)}\n({self.expr(b)})"

    def _product(self, node: dict[str, Any], by: str) -> str:
        a, b = (str(x) for x in node["product"])
        return f"({self.expr(a)})\n*{self._join(a, b)}\n({self.expr(b)})"

    def _scale(self, node: dict[str, Any], by: str) -> str:
        return f"({self.expr(str(node['scale']))}) * {_number(self.rule.resolve(node.get('by_value', 1.0)))}"

    def _over_time(self, node: dict[str, Any], by: str) -> str:
        agg = str(node["over_time"])
        if agg not in ("avg", "max", "min", "sum"):
            raise NotExpressible(f"over_time {agg!r}")
        off = f" offset {self.dur(node['offset'])}" if node.get("offset") else ""
        rng = self._range(node, "5m")
        return f"{agg}_over_time(({self.expr(str(node['of']))})[{rng}:{self.sub_step(rng)}]{off})"

    def _deriv(self, node: dict[str, Any], by: str) -> str:
        rng = self._range(node, "10m")
        return f"deriv(({self.expr(str(node['deriv']))})[{rng}:{self.sub_step(rng)}])"

    def _changes(self, node: dict[str, Any], by: str) -> str:
        # the engine's leading edge (grid.changes `settle`): a value counts only once the series
        # also existed `settle` earlier
        inner = self.expr(str(node["changes"]))
        settle = self.dur(node.get("settle", CHANGES_SETTLE))
        earlier = f"last_over_time(({inner})[{self.sub}:{self.sub}] offset {settle})"
        return f"changes((({inner})\nand\n{earlier})[{self._range(node, '15m')}:{self.sub}])"

    def _aggregate(self, node: dict[str, Any], by: str) -> str:
        agg, inner = str(node["aggregate"]), self.expr(str(node["of"]))
        if agg == "median":
            return f"quantile by ({by}) (0.5, {inner})"
        if agg not in ("max", "min", "sum", "avg", "count"):
            raise NotExpressible(f"aggregate {agg!r}")
        return f"{agg} by ({by}) ({inner})"


class ConditionCompiler:
    """PromQL for `when` conditions; every condition keeps the labels of its left series."""

    def __init__(self, rule: Rule, series: SeriesCompiler, catalog: Catalog | None = None,
                 slack: float = 0.0) -> None:
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
            scaled = float(value) * float(self.rule.resolve(cond.get("times", 1))) + \
                float(self.rule.resolve(cond.get("plus", 0)))        # the engine's value x times + plus
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
            offset = parse_duration(self.series.dur(base.get("offset", "10m"), least=0)) \
                if parse_duration(self.rule.resolve(base.get("offset", "10m"))) > 0 else 0.0
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
            ref = self.series.expr(str((block.get("all") or [])[0]["series"])) if any(
                set(b) != set(first_by) for _, b in anys) else ""
            terms = [f"({e})" if set(b) == set(first_by) else f"(({ref})\nand{self._on(b)}\n({e}))"
                     for e, b in anys]
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
    form = next((f for f in (*_NONNEGATIVE, "ratio", "sum", "product", "coalesce", "scale", "over_time",
                             "aggregate", "diff", "deriv") if f in node), "diff")
    if form in _NONNEGATIVE:
        return False
    if form in ("diff", "deriv"):
        return True
    if form == "scale" and float(rule.resolve(node.get("by_value", 1.0))) < 0:
        return True
    refs = [str(x) for x in node[form]] if form in ("ratio", "sum", "product", "coalesce") else \
        [str(node["scale"])] if form == "scale" else [str(node["of"])]
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
        when = doc.get("when") or {}
        expr = conds.combine(when, doc.get("facts"))
        critical = conds.combine(doc["critical_when"]) if doc.get("critical_when") else None
    except (NotExpressible, KeyError, ValueError) as exc:
        return PythonOnly(rule.id, str(exc) or type(exc).__name__)
    base = _alert(rule, expr, rule.severity, when, runbook_base)
    if critical is None or rule.severity == "critical":
        return [base]
    return [base, _alert(rule, f"{expr}\nand\n{critical}", "critical", when, runbook_base)]


def _alert(rule: Rule, expr: str, severity: str, when: dict[str, Any], runbook_base: str) -> dict[str, Any]:
    where = " ".join(f"{{{{ $labels.{label} }}}}" for label in rule.by) or "the fleet"
    alert: dict[str, Any] = {"alert": alert_name(rule.id), "expr": expr}
    if when.get("for") and parse_duration(rule.resolve(when["for"])) > 0:
        alert["for"] = _duration(rule.resolve(when["for"]))
    alert["labels"] = {"severity": severity, "rule_id": rule.id}
    if rule.doc.get("levers_md"):
        alert["labels"]["levers_md"] = str(rule.doc["levers_md"])
    if rule.doc.get("confidence", "high") != "high":     # inferred: Alertmanager can inhibit it with
        alert["labels"]["confidence"] = str(rule.doc["confidence"])   # the defers_to rules' alerts
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
