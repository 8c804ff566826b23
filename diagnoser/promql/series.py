"""PromQL for a rule's named series: the one writer of a rule series in PromQL.

`SeriesCompiler(rule, reader, step).expr(name)` writes the series `name` of a rule grouped by its
`by`; the reader (promql/signals.py) says how a canonical signal is read: `NamedSignals` the
`kvscope:<series>` records (alert files) or canonical names (a finding's evidence text),
`InlineSignals` the engines' own series (the candidate records). With a grid `step`, ranges are
the evaluator's on that grid (time-scaled, whole steps); with `held`, no longer than the data.
"""

from __future__ import annotations

from typing import Any

from kvscope.diagnoser.promql.ranges import prom_duration, range_text
from kvscope.diagnoser.promql.signals import (
    NamedSignals,
    NotExpressible,
    PromQL,
    SignalReader,
    escape_re,
    prom_number,
)
from kvscope.diagnoser.rulebook import tree
from kvscope.diagnoser.rulebook.rule import Rule, grid_seconds, parse_duration, range_steps

SUBQUERY_STEP = "15s"
"""Resolution of `[range:step]` subqueries: the engine's default grid step (docs/rules.md)."""


Part = tuple[str, int]
"""PromQL text and its price (PromQL.cost)."""
SUBQUERY_COST = 10
"""A subquery's price beyond its inner expression's: the inner expression again at every step."""


def _plus(by: str, labels: str) -> str:
    """`by` extended with `labels` (comma-separated), each label once."""
    out = [b.strip() for b in by.split(",") if b.strip()]
    out += [x.strip() for x in labels.split(",") if x.strip() and x.strip() not in out]
    return ", ".join(out)


IDENTITY_AGGS = frozenset({"sum", "max", "min", "avg"})
"""Aggregations that return a vector of one series per label set unchanged when grouped by
exactly its labels."""


def _aggregate(agg: str, by: str, inner: str) -> str:
    """`agg by (by) (inner)`, or `inner` itself where the reader already aggregated it by exactly
    those labels (promql/signals.py `Aggregated`)."""
    labels = frozenset(b.strip() for b in by.split(",") if b.strip())
    if agg in IDENTITY_AGGS and getattr(inner, "labels", None) == labels:
        return str(inner)
    return f"{agg} by ({by}) ({inner})"


class SeriesCompiler:
    """PromQL for the named series of one rule; each result is grouped by the series' `by`."""

    def __init__(
        self,
        rule: Rule,
        reader: SignalReader | None = None,
        step: float | None = None,
        held: float | None = None,
        edge: bool = True,
    ) -> None:
        """`reader`: default the recorded `kvscope:<series>`. `step`: durations as the evaluator's
        on that grid (None: as written, the alert files). `held`: seconds of data the window
        holds; a range is clipped to the data it can reach, as the evaluator's windows are.
        `edge`: ranges written for a server to run (`range_text`: the same samples on Prometheus
        2.x and 3.x); False writes them as the rule says, for a reader (a finding's evidence)."""
        self.rule = rule
        self.edge = edge
        self.held = held
        self.nodes: dict[str, tree.Node] = rule.tree.series
        self.rule_by = rule.by
        self.reader = reader or NamedSignals()
        self.step = step
        self.sub = prom_duration(step) if step else SUBQUERY_STEP
        self.sub_for: Any = None
        """Optional: range seconds -> the subquery step for a subquery over that range."""

    def bracket(self, rng: str) -> str:
        """A range as written inside `[...]` (`edge`: `range_text`)."""
        return range_text(rng) if self.edge else rng

    def sub_step(self, rng: str) -> str:
        return self.sub if self.sub_for is None else self.sub_for(parse_duration(rng))

    def by_of(self, name: str) -> tuple[str, ...]:
        node = self._node(name)
        if node.by is not None:
            return node.by
        if isinstance(node, tree.Pair):
            return max((self.by_of(r) for r in node.refs), key=len)
        return self.by_of(node.refs[0]) if node.refs else self.rule_by

    def expr(self, name: str) -> PromQL:
        """The series `name` in PromQL, with its grouping and its price (`PromQL.cost`)."""
        node = self._node(name)
        by = self.by_of(name)
        text, cost = getattr(self, f"_{type(node).__name__.lower()}")(node, ", ".join(by))
        return PromQL(text, by, cost)

    def _node(self, name: str) -> tree.Node:
        if name not in self.nodes:
            raise NotExpressible(f"unknown series {name!r}")
        return self.nodes[name]

    def range_seconds(self, name_or_node: str | tree.Node) -> float | None:
        """Seconds of the trailing range a series reads over, as evaluated and as written here:
        time-scaled, in whole grid steps (`range_steps`: a counter rate at least two, a slope at
        least three) with a step, as written without one; no longer than the data `held` (a
        range ending `offset` earlier, than the data held before it). None without a range."""
        node = self._node(name_or_node) if isinstance(name_or_node, str) else name_or_node
        rng = float(getattr(node, "rng", 0.0) or 0.0)
        if not rng:
            return None
        scale = self.rule.time_scale
        seconds = range_steps(node, scale, self.step) * self.step if self.step else rng * scale
        reach = self.held
        if reach is not None and isinstance(node, tree.OverTime) and node.offset:
            reach -= parse_duration(self.dur(node.offset))
        if reach is not None and seconds > reach:
            return max(self.step or 1.0, reach)
        return seconds

    def _range(self, node: tree.Node) -> str:
        """The node's range (`range_seconds`) as PromQL writes a duration."""
        return prom_duration(self.range_seconds(node))

    def dur(self, seconds: float, least: int = 1) -> str:
        """A rule duration as PromQL: as written, or (with a step) scaled and in whole steps."""
        return prom_duration(grid_seconds(seconds, self.rule.time_scale, self.step, least))

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

    def subquery(self, inner: PromQL | str, rng: str, offset: str = "") -> tuple[str, int]:
        """`(inner)[rng:step]` (with ` offset ...`) and its price: the inner expression again at
        every step, ten times a selector."""
        return f"({inner})[{self.bracket(rng)}:{self.sub_step(rng)}]{offset}", getattr(inner, "cost", 1) + SUBQUERY_COST

    # ---------------------------------------------------------------- signal forms
    def _read(self, node: tree.Signal, series: str, by: str, fn: str | None = None, rng: str | None = None) -> PromQL:
        """The canonical `series` (node `match` filter, `require_labels` guards), or `fn` of its
        range `[rng]`, as the reader writes it, with its price (a histogram's buckets ten times)."""
        outer = "count_series" if isinstance(node, tree.Count) else node.agg if isinstance(node, tree.Gauge) else "sum"
        labels = tuple(b.strip() for b in by.split(",") if b.strip())
        if isinstance(node, tree.Count):
            labels += node.distinct
        rng = self.bracket(rng) if rng else rng
        text = self.reader.read(series, self._matchers(node, by), fn, rng, by=labels, outer=outer)
        cost = getattr(text, "cost", 1) * (10 if series.endswith("_bucket") else 1)
        if not isinstance(text, PromQL):
            return PromQL(text, (), cost)
        text.cost = cost  # the reader's own new node (an `Aggregated` keeps its labels)
        return text

    def _matchers(self, node: tree.Signal, by: str) -> list[tuple[str, str, str]]:
        out = [(label, "=~", "|".join(escape_re(v) for v in values)) for label, values in node.match]
        grouped = {b.strip() for b in by.split(",")}
        return out + [(label, "!=", "") for label in self.rule.tree.require_labels if label in grouped]

    def _gauge(self, node: tree.Gauge, by: str) -> Part:
        text = self._read(node, node.signal, by)
        return _aggregate(node.agg, by, text), text.cost

    def _rate(self, node: tree.Rate, by: str) -> Part:
        fn = "increase" if node.increase else "rate"
        text = self._read(node, node.signal, by, fn, self._range(node))
        return _aggregate("sum", by, text), text.cost

    def _quantile(self, node: tree.Quantile, by: str) -> Part:
        q, rng = prom_number(node.q), self._range(node)
        rates = self._read(node, node.signal + "_bucket", _plus(by, "le"), "rate", rng)
        return f"histogram_quantile({q}, {_aggregate('sum', _plus(by, 'le'), rates)})", rates.cost

    def _mean(self, node: tree.Mean, by: str) -> Part:
        rng = self._range(node)
        s, c = (self._read(node, node.signal + x, by, "rate", rng) for x in ("_sum", "_count"))
        return f"{_aggregate('sum', by, s)}\n/\n({_aggregate('sum', by, c)} > 0)", s.cost + c.cost

    resets_bridge_s: float = 0.0
    """Added to `resets` ranges (a prefilter): the evaluator counts a reset across a scrape gap of
    any length (values carried), PromQL only when the sample before the gap is inside the range."""

    def _resets(self, node: tree.Resets, by: str) -> Part:
        rng = self._range(node)
        if self.resets_bridge_s:
            rng = prom_duration(parse_duration(rng) + self.resets_bridge_s)
        text = self._read(node, node.signal, by, "resets", rng)
        return _aggregate("sum", by, text), text.cost

    def _count(self, node: tree.Count, by: str) -> Part:
        text = self._read(node, node.signal, by)
        return f"count by ({by}) (count by ({_plus(by, ', '.join(node.distinct))}) ({text}))", text.cost

    # ---------------------------------------------------------------- combinations
    def _pair(self, node: tree.Pair, by: str) -> Part:
        a, b = self.expr(node.a), self.expr(node.b)
        cost = a.cost + b.cost
        if node.op == "ratio":
            guard = f"> {prom_number(node.min_den)}" if node.min_den <= 0 else f">= {prom_number(node.min_den)}"
            return f"({a})\n/{self._join(node.a, node.b)}\n(({b}) {guard})", cost
        if node.op == "coalesce":
            if set(a.by) != set(b.by):
                raise NotExpressible(f"coalesce of {node.a!r} and {node.b!r} grouped differently")
            return f"({a})\nor\n({b})", cost
        op = {"sum": "+", "diff": "-", "product": "*"}[node.op]
        return f"({a})\n{op}{self._join(node.a, node.b)}\n({b})", cost

    def _scale(self, node: tree.Scale, by: str) -> Part:
        a = self.expr(node.of)
        return f"({a}) * {prom_number(node.k)}", a.cost

    def _overtime(self, node: tree.OverTime, by: str) -> Part:
        if node.agg not in ("avg", "max", "min", "sum"):
            raise NotExpressible(f"over_time {node.agg!r}")
        off = f" offset {self.dur(node.offset)}" if node.offset else ""
        sub, cost = self.subquery(self.expr(node.of), self._range(node), off)
        return f"{node.agg}_over_time({sub})", cost

    def _deriv(self, node: tree.Deriv, by: str) -> Part:
        sub, cost = self.subquery(self.expr(node.of), self._range(node))
        return f"deriv({sub})", cost

    def _predict(self, node: tree.Predict, by: str) -> Part:
        sub, cost = self.subquery(self.expr(node.of), self._range(node))
        return f"predict_linear({sub}, {prom_number(node.ahead * self.rule.time_scale)})", cost

    def _changes(self, node: tree.Changes, by: str) -> Part:
        # the engine's leading edge (grid.changes `settle`): a value counts only once the series
        # also existed `settle` earlier
        inner = self.expr(node.of)
        earlier = f"last_over_time(({inner})[{self.bracket(self.sub)}:{self.sub}] offset {self.dur(node.settle)})"
        rng = self._range(node)
        return (
            f"changes((({inner})\nand\n{earlier})[{self.bracket(rng)}:{self.sub}])",
            2 * inner.cost + 2 * SUBQUERY_COST,
        )

    def _aggregate(self, node: tree.Aggregate, by: str) -> Part:
        inner = self.expr(node.of)
        if node.agg == "median":
            return f"quantile by ({by}) (0.5, {inner})", inner.cost
        if node.agg not in ("max", "min", "sum", "avg", "count"):
            raise NotExpressible(f"aggregate {node.agg!r}")
        return f"{node.agg} by ({by}) ({inner})", inner.cost
