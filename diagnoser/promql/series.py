"""PromQL for a rule's named series: the one writer of a rule series in PromQL.

`SeriesCompiler(rule, reader, step).expr(name)` writes the series `name` of a rule
(rules/diagnosis/*.yaml `series:`) grouped by its `by`. How each canonical signal is read is the
reader's (promql/signals.py): `RecordedSignals` reads the `kvscope:<series>` recording rules (the
alert files), `InlineSignals` the engines' own series (the pushdown prefilter),
`CanonicalSignals` the canonical names as they are (the evidence text of a finding,
diagnoser/evaluate/expr.py `promql`). With a grid `step`, ranges are the ones the numpy
evaluator uses on that grid (time-scaled, whole steps); with `held`, no longer than the data.
"""

from __future__ import annotations

from typing import Any, Protocol

from kvscope.diagnoser.promql.signals import RecordedSignals, _escape_re
from kvscope.diagnoser.rulebook.grammar import CHANGES_SETTLE
from kvscope.diagnoser.rulebook.rule import Rule, parse_duration

SUBQUERY_STEP = "15s"
"""Resolution of `[range:step]` subqueries: the engine's default grid step (docs/rules.md)."""


class NotExpressible(Exception):
    """The rule (or one of its parts) has no faithful PromQL form; str() says why."""


def _duration(value: Any) -> str:
    """A Prometheus duration for a rule duration (`2m`, `90s`, or seconds as a number), compound
    and exact: `2m`, `1m30s`, `39m19s800ms`."""
    left, parts = int(round(parse_duration(value) * 1000)), []
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        n, left = divmod(left, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts) or "0s"


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


def _number(value: Any) -> str:
    x = float(value)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


class SignalReader(Protocol):
    """How a canonical series is read (promql/signals.py: RecordedSignals, InlineSignals)."""

    def read(
        self,
        series: str,
        matchers: list[tuple[str, str, str]],
        fn: str | None = None,
        rng: str | None = None,
        by: tuple[str, ...] | None = None,
        outer: str | None = None,
    ) -> str: ...


class SeriesCompiler:
    """PromQL for the named series of one rule; each result is grouped by the series' `by`."""

    def __init__(
        self, rule: Rule, reader: SignalReader | None = None, step: float | None = None, held: float | None = None
    ) -> None:
        """`reader` writes how a canonical signal is read (default: the recorded `kvscope:<series>`;
        `InlineSignals` reads the engines' own series). `step`: ranges, offsets and subquery
        steps as the evaluator uses them on a grid of that step (time-scaled, whole steps); None
        writes the rule's durations as they are (the alert files). `held`: the seconds of data
        the window holds; a range is clipped to the data it can reach, as the evaluator's
        trailing windows are (for an `offset` window, `held` minus the offset)."""
        self.rule = rule
        self.held = held
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
        for form in (
            "gauge",
            "rate",
            "increase",
            "quantile",
            "mean",
            "count",
            "resets",
            "ratio",
            "sum",
            "diff",
            "product",
            "coalesce",
            "scale",
            "over_time",
            "deriv",
            "changes",
            "aggregate",
        ):
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

    def _range(self, node: dict[str, Any], default: str, reach: float | None = None) -> str:
        """The node's range (or `default`), no longer than `reach` (default: `held`) seconds."""
        text = self.dur(node.get("range", default))
        limit = self.held if reach is None else reach
        if limit is not None and parse_duration(text) > limit:
            return _duration(max(self.step or 1.0, limit))
        return text

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
    def _read(self, node: dict[str, Any], series: str, by: str, fn: str | None = None, rng: str | None = None) -> str:
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
        return _aggregate(str(node.get("agg", "sum")), by, self._read(node, node["gauge"], by))

    def _rate(self, node: dict[str, Any], by: str) -> str:
        return _aggregate("sum", by, self._read(node, node["rate"], by, "rate", self._range(node, "1m")))

    def _increase(self, node: dict[str, Any], by: str) -> str:
        return _aggregate("sum", by, self._read(node, node["increase"], by, "increase", self._range(node, "5m")))

    def _quantile(self, node: dict[str, Any], by: str) -> str:
        q = _number(self.rule.resolve(node["quantile"]))
        recorded = getattr(self.reader, "recorded_quantile", None)  # InlineSignals: its recording rule
        if recorded is not None and not self._matchers(node, by):  # `match` is among the matchers
            expr = recorded(
                str(node["histogram"]), q, self._range(node, "5m"), tuple(b.strip() for b in by.split(",") if b.strip())
            )
            if expr is not None:
                return str(expr)
        own = getattr(self.reader, "quantile", None)  # InlineSignals: each raw histogram's own, where one per group
        if own is not None:
            labels = tuple(b.strip() for b in by.split(",") if b.strip())
            expr = own(
                str(node["histogram"]) + "_bucket",
                self._matchers(node, _plus(by, "le")),
                q,
                self._range(node, "5m"),
                labels,
            )
            if expr is not None:
                return str(expr)
        rates = self._read(node, str(node["histogram"]) + "_bucket", _plus(by, "le"), "rate", self._range(node, "5m"))
        return f"histogram_quantile({q}, {_aggregate('sum', _plus(by, 'le'), rates)})"

    def _mean(self, node: dict[str, Any], by: str) -> str:
        s, rng = str(node["mean"]), self._range(node, "5m")
        return (
            f"{_aggregate('sum', by, self._read(node, s + '_sum', by, 'rate', rng))}\n/\n"
            f"({_aggregate('sum', by, self._read(node, s + '_count', by, 'rate', rng))} > 0)"
        )

    resets_bridge_s: float = 0.0
    """Added to `resets` ranges (a prefilter): the evaluator counts a reset across a scrape gap of
    any length (values carried), PromQL only when the sample before the gap is inside the range."""

    def _resets(self, node: dict[str, Any], by: str) -> str:
        rng = self._range(node, "10m")
        if self.resets_bridge_s:
            rng = _duration(parse_duration(rng) + self.resets_bridge_s)
        return _aggregate("sum", by, self._read(node, node["resets"], by, "resets", rng))

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
        reach = None if self.held is None or not off else self.held - parse_duration(self.dur(node["offset"]))
        rng = self._range(node, "5m", reach)
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
