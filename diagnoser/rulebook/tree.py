"""A diagnosis rule parsed once into a typed tree: what every backend (the numpy evaluator, the
PromQL compiler, the evidence text) converts, instead of each re-reading the YAML mapping.

`parse(doc, params)` resolves `$param`s (null stays None: its test is false) and durations into
seconds (time-scaled at use); a malformed part raises RuleError at its file:line. A new series
form (docs/rules.md "Series expressions") is one dataclass here and one case per backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvscope.core.scalars import parse_duration
from kvscope.diagnoser.rulebook.grammar import (
    BASELINE_AGGS,
    FORMS,
    OPS,
    PAIR_FORMS,
    RIGHT_SIDES,
    RuleError,
)

Match = tuple[tuple[str, tuple[str, ...]], ...]
"""`match: {label: value | [values]}` as sorted (label, allowed values) pairs."""


@dataclass(frozen=True, kw_only=True)
class Node:
    """One named series expression; `by` is its own grouping when the YAML overrides the rule's."""

    by: tuple[str, ...] | None = None

    @property
    def refs(self) -> tuple[str, ...]:
        """Named series this one reads."""
        return ()


@dataclass(frozen=True, kw_only=True)
class Signal(Node):
    """A form that reads one canonical signal (`match` keeps only series with those labels)."""

    signal: str
    match: Match = ()
    rng: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Gauge(Signal):
    agg: str = "sum"


@dataclass(frozen=True, kw_only=True)
class Rate(Signal):
    """Per-second rate (`rate`) or, with `increase`, the increase over the range."""

    increase: bool = False


@dataclass(frozen=True, kw_only=True)
class Quantile(Signal):
    """`signal` is the histogram's base name."""

    q: float


@dataclass(frozen=True, kw_only=True)
class Mean(Signal):
    """Histogram mean: rate of `_sum` over rate of `_count`."""


@dataclass(frozen=True, kw_only=True)
class Resets(Signal):
    pass


@dataclass(frozen=True, kw_only=True)
class Count(Signal):
    distinct: tuple[str, ...] = ("instance",)


def leaf_names(node: Signal) -> set[str]:
    """Sample names one leaf series reads (a histogram's buckets, a mean's sum and count)."""
    if isinstance(node, Quantile):
        return {f"{node.signal}_bucket"}
    if isinstance(node, Mean):
        return {f"{node.signal}_sum", f"{node.signal}_count"}
    return {node.signal}


def expansions(signal: str) -> set[str]:
    """Every sample name a signal may appear as: itself or a histogram's series."""
    return {signal, f"{signal}_bucket", f"{signal}_sum", f"{signal}_count"}


@dataclass(frozen=True, kw_only=True)
class Pair(Node):
    """Two named series combined point by point: ratio, sum, diff, product or coalesce."""

    op: str
    a: str
    b: str
    min_den: float = 0.0

    @property
    def refs(self) -> tuple[str, ...]:
        return (self.a, self.b)


@dataclass(frozen=True, kw_only=True)
class Of(Node):
    """A form over one other named series."""

    of: str

    @property
    def refs(self) -> tuple[str, ...]:
        return (self.of,)


@dataclass(frozen=True, kw_only=True)
class Scale(Of):
    k: float = 1.0


@dataclass(frozen=True, kw_only=True)
class OverTime(Of):
    agg: str
    rng: float = 300.0
    offset: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Deriv(Of):
    rng: float = 600.0


@dataclass(frozen=True, kw_only=True)
class Predict(Of):
    """The value `ahead` seconds from now on the least-squares line over the range
    (PromQL `predict_linear`): a level the trend reaches before it is reached."""

    rng: float = 600.0
    ahead: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Changes(Of):
    """`settle`: how long after a series appears its value is not compared yet (targets are first
    scraped at different phases of their interval: that rise is no change). Time-scaled."""

    rng: float = 900.0
    settle: float = 60.0


@dataclass(frozen=True, kw_only=True)
class Aggregate(Of):
    agg: str


@dataclass(frozen=True)
class Value:
    x: float | None  # None: a parameter left null (the test is false)


@dataclass(frozen=True)
class Than:
    series: str


@dataclass(frozen=True)
class Baseline:
    agg: str = "avg"
    rng: float = 1800.0
    offset: float = 600.0
    of: str | None = None


@dataclass(frozen=True)
class Cond:
    """`series op right * times + plus`; `op` "present"/"absent" test whether a value exists."""

    series: str
    op: str
    right: Value | Than | Baseline | None = None
    times: float = 1.0
    plus: float = 0.0
    line: int = field(default=0, compare=False)  # in the rule file, for validation messages

    def threshold(self) -> float | None:
        """The constant right side (× times + plus), None for another series or a null param."""
        if not isinstance(self.right, Value) or self.right.x is None:
            return None
        return self.right.x * self.times + self.plus


@dataclass(frozen=True)
class Block:
    """`all` conditions, `any` conditions (at least one, when given) and how long they hold."""

    all: tuple[Cond, ...] = ()
    any: tuple[Cond, ...] = ()
    hold: float = 0.0
    note: str = ""
    name: str = ""

    @property
    def conds(self) -> tuple[Cond, ...]:
        return self.all + self.any


@dataclass(frozen=True)
class Cascade:
    stages: tuple[Block, ...]
    root: str
    symptom: str
    fire_at: str
    critical_at: str
    slack: float


@dataclass(frozen=True)
class Fact:
    fact: str
    op: str
    value: str


@dataclass(frozen=True)
class Mechanism:
    name: str
    series: str
    how: str


@dataclass(frozen=True)
class Evidence:
    series: str
    name: str
    unit: str
    stat: str


@dataclass(frozen=True)
class Tree:
    """A whole rule; `when` as written (`gated` adds the mechanism)."""

    by: tuple[str, ...]
    series: dict[str, Node]
    when: Block | None
    cascade: Cascade | None = None
    warning_when: Block | None = None
    critical_when: Block | None = None
    resolved_when: Block | None = None
    moderate_unless: Cond | None = None
    facts: tuple[Fact, ...] = ()
    mechanism: Mechanism | None = None
    evidence: tuple[Evidence, ...] = ()
    require_labels: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)
    """Text the evaluator copies onto a finding as written (title, levers_md, citations ...)."""

    @property
    def gated(self) -> Block:
        """`when` with the mechanism's series above 0 added to `all`: a rule judges only where the
        feature it reads runs (docs/rules.md "Is the mechanism on?"), in Python and in PromQL."""
        when = self.when or Block()
        if not self.mechanism:
            return when
        return Block((*when.all, Cond(self.mechanism.series, ">", Value(0.0))), when.any, when.hold)

    def blocks(self) -> list[Block]:
        """Every condition block: when, raised severities, resolved_when, cascade stages."""
        out = [self.when, self.warning_when, self.critical_when, self.resolved_when]
        return [b for b in out if b] + list(self.cascade.stages if self.cascade else ())


class _Parser:
    def __init__(self, doc: Any, params: dict[str, Any], path: str) -> None:
        self.doc, self.params, self.path = doc, params, path

    def fail(self, message: str, where: Any) -> Exception:
        return RuleError(message, self.path, getattr(where, "line", None) or None)

    def value(self, v: Any) -> Any:
        if isinstance(v, str) and v.startswith("$"):
            if v[1:] not in self.params:
                raise self.fail(f"unknown parameter {v}", self.doc)
            return self.params[v[1:]]
        return v

    def need(self, m: Any, key: str) -> str:
        """A required key's value as text; RuleError at the mapping's line when it is missing."""
        if not isinstance(m, dict) or key not in m:
            raise self.fail(f"missing {key!r} in {m!r}", m if isinstance(m, dict) else self.doc)
        return str(m[key])

    def num(self, m: dict[str, Any], key: str, default: float) -> float:
        v = self.value(m.get(key, default))
        try:
            return float(v)
        except (TypeError, ValueError) as exc:
            raise self.fail(f"{key}: not a number: {v!r}", m) from exc

    def dur(self, m: dict[str, Any], key: str, default: float) -> float:
        try:
            return parse_duration(self.value(m.get(key, default)))
        except (TypeError, ValueError) as exc:
            raise self.fail(f"{key}: {exc}", m) from exc

    def node(self, m: Any) -> Node:
        if not isinstance(m, dict):
            raise self.fail(f"a series must be a mapping, got {m!r}", self.doc)
        kw: dict[str, Any] = {"by": tuple(str(b) for b in m["by"])} if "by" in m else {}
        forms = [f for f in FORMS if f in m]
        if len(forms) != 1:
            raise self.fail(f"expression must have exactly one of {', '.join(FORMS)}; got {sorted(m)}", m)
        form = forms[0]
        if form in _SIGNALS:
            return self.signal_node(form, m, kw)
        if form in PAIR_FORMS:
            refs = m[form]
            if not isinstance(refs, list) or len(refs) != 2:
                raise self.fail(f"{form} takes two named series", m)
            return Pair(op=form, a=str(refs[0]), b=str(refs[1]), min_den=self.num(m, "min_den", 0.0), **kw)
        return self.derived_node(form, m, kw)

    def derived_node(self, form: str, m: dict[str, Any], kw: dict[str, Any]) -> Node:
        """A series computed from one named series (scale, over_time, deriv, predict, changes, aggregate)."""
        if form == "scale":
            return Scale(of=str(m["scale"]), k=self.num(m, "by_value", 1.0), **kw)
        if form == "over_time":
            return OverTime(
                of=self.need(m, "of"),
                agg=str(m["over_time"]),
                rng=self.dur(m, "range", 300),
                offset=self.dur(m, "offset", 0) if m.get("offset") else 0.0,
                **kw,
            )
        if form == "deriv":
            return Deriv(of=str(m["deriv"]), rng=self.dur(m, "range", 600), **kw)
        if form == "predict":
            return Predict(of=str(m["predict"]), rng=self.dur(m, "range", 600), ahead=self.dur(m, "ahead", 0), **kw)
        if form == "changes":
            return Changes(of=str(m["changes"]), rng=self.dur(m, "range", 900), settle=self.dur(m, "settle", 60), **kw)
        return Aggregate(of=self.need(m, "of"), agg=str(m["aggregate"]), **kw)

    def signal_node(self, form: str, m: dict[str, Any], kw: dict[str, Any]) -> Node:
        """A series that reads a canonical signal (gauge, rate, increase, quantile, mean, count, resets)."""
        cls, rng = _SIGNALS[form]
        kw["signal"] = self.need(m, "histogram" if form == "quantile" else form)
        match = m.get("match", {}).items()
        kw["match"] = tuple(sorted((str(k), tuple(map(str, v if isinstance(v, list) else [v]))) for k, v in match))
        kw["rng"] = self.dur(m, "range", rng)
        if form == "gauge":
            kw["agg"] = str(m.get("agg", "sum"))
        elif form == "increase":
            kw["increase"] = True
        elif form == "quantile":
            kw["q"] = self.num(m, "quantile", 0.5)
        elif form == "count":
            kw["distinct"] = tuple(str(d) for d in m.get("distinct", ["instance"]))
        return cls(**kw)

    def cond(self, m: Any) -> Cond:
        if not isinstance(m, dict) or "series" not in m:
            raise self.fail(f"a condition needs `series`: {m!r}", m if isinstance(m, dict) else self.doc)
        series, line = str(m["series"]), getattr(m, "line", 0)
        sides = [k for k in RIGHT_SIDES if k in m]
        if len(sides) != 1:
            raise self.fail(f"condition needs exactly one of {list(RIGHT_SIDES)}, got {sides}", m)
        if "present" in m:
            return Cond(series, "present" if m["present"] else "absent", line=line)
        op = str(m.get("op"))
        if op not in OPS:
            raise self.fail(f"unknown operator {op!r} (use {' '.join(OPS)})", m)
        times, plus = self.num(m, "times", 1.0), self.num(m, "plus", 0.0)
        right: Value | Than | Baseline
        if "value" in m:
            right = Value(None if self.value(m["value"]) is None else self.num(m, "value", 0.0))
        elif "than" in m:
            right = Than(str(m["than"]))
        elif isinstance(m["baseline"], dict):
            b = m["baseline"]
            agg = str(b.get("agg", "avg"))
            if agg not in BASELINE_AGGS:
                raise self.fail(f"baseline agg must be one of {list(BASELINE_AGGS)}, not {agg!r}", b)
            of = str(b["of"]) if "of" in b else None
            right = Baseline(agg, self.dur(b, "range", 1800), self.dur(b, "offset", 600), of)
        else:
            raise self.fail("baseline must be a mapping", m)
        return Cond(series, op, right, times, plus, line)

    def block(self, m: Any, hold: float = 0.0) -> Block | None:
        if not m:
            return None
        if not isinstance(m, dict):
            raise self.fail("a condition block must be a mapping", self.doc)
        return Block(
            all=tuple(self.cond(c) for c in m.get("all") or ()),
            any=tuple(self.cond(c) for c in m.get("any") or ()),
            hold=self.dur(m, "for", hold) if "for" in m else hold,
            note=str(m.get("note") or ""),
            name=str(m.get("name") or ""),
        )

    def cascade(self, m: dict[str, Any]) -> Cascade:
        hold = self.dur(m, "for", 0)
        stages = tuple(self.block(s, hold) or Block(hold=hold) for s in m.get("stages") or ())
        names = [s.name for s in stages] or [""]
        pick = lambda key, i: str(m.get(key, names[i]))  # noqa: E731
        return Cascade(
            stages, pick("root", 0), pick("symptom", -1), pick("fire_at", min(1, len(names) - 1)),
            str(m.get("critical_at", "")), self.dur(m, "slack", 0),
        )  # fmt: skip

    def tree(self) -> Tree:
        d = self.doc
        mech = d.get("mechanism")
        mechanism = (
            Mechanism(str(mech.get("name", "")), self.need(mech, "series"), str(mech.get("how", ""))) if mech else None
        )
        return Tree(
            by=tuple(str(b) for b in d.get("by", ["instance"])),
            series={str(k): self.node(v) for k, v in (d.get("series") or {}).items()},
            when=None if "cascade" in d else self.block(d.get("when")),
            cascade=self.cascade(d["cascade"]) if isinstance(d.get("cascade"), dict) else None,
            warning_when=self.block(d.get("warning_when")),
            critical_when=self.block(d.get("critical_when")),
            resolved_when=self.block(d.get("resolved_when")),
            moderate_unless=self.cond(d["moderate_unless"]) if d.get("moderate_unless") else None,
            facts=tuple(
                Fact(self.need(f, "fact"), str(f.get("op", "==")), str(self.value(f.get("value"))))
                for f in d.get("facts") or ()
            ),
            mechanism=mechanism,
            evidence=tuple(
                Evidence(
                    self.need(e, "series"),
                    str(e.get("name", e.get("series"))),
                    str(e.get("unit", "")),
                    str(e.get("stat", "last")),
                )
                for e in d.get("evidence") or ()
            ),
            require_labels=tuple(str(x) for x in d.get("require_labels") or ()),
            meta={k: d[k] for k in _META if k in d},
        )


_SIGNALS: dict[str, tuple[type[Signal], float]] = {
    "gauge": (Gauge, 0.0),
    "rate": (Rate, 60.0),
    "increase": (Rate, 300.0),
    "quantile": (Quantile, 300.0),
    "mean": (Mean, 300.0),
    "resets": (Resets, 600.0),
    "count": (Count, 0.0),
}
_META = (
    "title", "severity", "specificity", "levers_md", "description", "summary", "citations", "false_positives",
    "confidence", "confirm", "defers_to", "direct_evidence", "levers",
)  # fmt: skip


def parse(doc: Any, params: dict[str, Any], path: str = "") -> Tree:
    """The typed tree of one rule document with `params` resolved; RuleError (file:line) when a
    part is malformed."""
    try:
        return _Parser(doc, params, path).tree()
    except (KeyError, TypeError, AttributeError) as exc:  # a part missing or of the wrong shape
        raise RuleError(f"malformed rule: {type(exc).__name__}: {exc}", path, getattr(doc, "line", 1)) from exc
