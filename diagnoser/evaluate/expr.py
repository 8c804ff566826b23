"""Evaluate a rule's named `series` expressions over a Frame, per group, on the grid.

Each expression (docs/rules.md, "Series expressions") becomes a `Grouped`: one row per group
(label values of its `by`), one column per grid point, NaN where absent. `promql()` writes it in
PromQL for evidence.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvscope.diagnoser.evaluate import grid
from kvscope.diagnoser.evaluate.buckets import bucket_layout, group_buckets
from kvscope.diagnoser.evaluate.frame import Frame
from kvscope.diagnoser.promql.series import NotExpressible, SeriesCompiler
from kvscope.diagnoser.promql.signals import NamedSignals
from kvscope.diagnoser.rulebook import tree
from kvscope.diagnoser.rulebook.grammar import ExprError
from kvscope.diagnoser.rulebook.rule import Rule, grid_steps, range_steps


@dataclass
class Grouped:
    """A named series evaluated per group: keys are label values of `by`, values [G, T]."""

    by: tuple[str, ...]
    keys: list[tuple[str, ...]]
    values: np.ndarray


class SeriesEvaluator:
    """Evaluates and caches the named series of one rule over one frame."""

    def __init__(self, rule: Rule, frame: Frame) -> None:
        self.rule, self.frame = rule, frame
        self.nodes: dict[str, tree.Node] = rule.tree.series
        self._cache: dict[str, Grouped] = {}
        self._aligned: dict[tuple, tuple[list, np.ndarray]] = {}
        self._active: set[str] = set()

    def by_of(self, name: str) -> tuple[str, ...]:
        by = self.nodes[name].by
        return self.rule.by if by is None else by

    def get(self, name: str) -> Grouped:
        """The named series at its own grouping."""
        if name not in self._cache:
            if name not in self.nodes:
                raise ExprError(f"unknown series {name!r}")
            if name in self._active:
                raise ExprError(f"series {name!r} refers to itself")
            self._active.add(name)
            t0 = time.process_time() if self.frame.profile is not None else 0.0
            try:
                self._cache[name] = self._required(self._evaluate(self.nodes[name], self.by_of(name)))
            finally:
                self._active.discard(name)
            if self.frame.profile is not None:
                node = self.nodes[name]
                key = ("node", self.rule.id, name, type(node).__name__.lower(), getattr(node, "signal", ""))
                self.frame.profile[key] = self.frame.profile.get(key, 0.0) + time.process_time() - t0
        return self._cache[name]

    def _required(self, g: Grouped) -> Grouped:
        """Drop groups with an empty value for a label the rule requires (`require_labels`)."""
        idx = [g.by.index(label) for label in self.rule.tree.require_labels if label in g.by]
        if not idx or not g.keys:
            return g
        keep = [i for i, k in enumerate(g.keys) if all(k[j] for j in idx)]
        if len(keep) == len(g.keys):
            return g
        return Grouped(g.by, [g.keys[i] for i in keep], g.values[keep])

    def aligned(self, name: str, by: tuple[str, ...], keys: list[tuple[str, ...]]) -> np.ndarray:
        """The named series broadcast onto groups `keys` of grouping `by` (its `by` ⊆ `by`).

        Remembered per (name, by, keys list): conditions, critical tests and evidence of a rule
        ask for the same alignments. Treat the result as read-only (it may be shared)."""
        mkey = (name, by, id(keys))
        hit = self._aligned.get(mkey)
        if hit is not None and hit[0] is keys:
            return hit[1]
        out = align(self.get(name), by, keys)
        self._aligned[mkey] = (keys, out)
        return out

    # ------------------------------------------------------------------ forms
    def _evaluate(self, node: tree.Node, by: tuple[str, ...]) -> Grouped:
        form = getattr(self, f"_form_{type(node).__name__.lower()}")
        if not isinstance(node, tree.Signal):
            return form(node, by)
        hit = self._memo((replace(node, by=None), by, self.rule.time_scale), lambda: form(node, by))
        return Grouped(hit.by, hit.keys, hit.values)

    def _memo(self, key: tuple, make: Any) -> Any:
        """`make()` computed once per frame under `key` (shared by the frame's rules), or on every
        call when the frame keeps no cache."""
        cache = self.frame.cache
        if cache is None:
            return make()
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def _k(self, seconds: float, least: int = 1) -> int:
        """A rule duration (time-scaled) in whole grid steps, at least `least`."""
        return grid_steps(seconds * self.rule.time_scale, self.frame.step, least)

    def _range_k(self, node: tree.Node) -> int:
        """The trailing range the series `node` reads, in whole grid steps (`range_steps`: as the
        PromQL writer writes it)."""
        return range_steps(node, self.rule.time_scale, self.frame.step)

    def _rows(
        self, name: str, by: tuple[str, ...], extra: tuple[str, ...] = (), match: tree.Match = (), seen: bool = False
    ) -> tuple[list, np.ndarray, np.ndarray]:
        """Group keys, row -> group index and the values of a block's matching rows (with `seen`,
        the values as they were before failed scrapes made some stale)."""
        key = ("rows", name, by, extra, match) + (("seen",) if seen else ())
        return self._memo(key, lambda: self._group_rows(name, by, extra, match, seen))

    def _adjusted(self, name: str, match: tree.Match, values: np.ndarray) -> np.ndarray | None:
        """Reset-adjusted counters of a block (cached), None when series have gaps."""
        return self._memo(("adjusted", name, match), lambda: grid.reset_adjusted(values))

    def _counter_rates(
        self, name: str, match: tree.Match, values: np.ndarray, k: int, per_second: bool = True
    ) -> np.ndarray:
        step = self.frame.step or 1.0
        adj = self._adjusted(name, match, values)
        if adj is None:
            rates = grid.counter_rate(values, k, step)
            return rates if per_second else rates * grid.window_spans(values.shape[1], k) * step
        inc = grid.window_increase(adj, k)
        if per_second:
            with np.errstate(invalid="ignore", divide="ignore"):
                inc /= grid.window_spans(values.shape[1], k) * step
        return inc

    def _group_rows(
        self, name: str, by: tuple[str, ...], extra: tuple[str, ...], match: tree.Match, seen: bool = False
    ) -> tuple[list, np.ndarray, np.ndarray]:
        block = self.frame.block(name)
        empty: tuple[list, np.ndarray, np.ndarray] = [], np.zeros(0, dtype=np.int64), np.zeros((0, len(self.frame.ts)))
        if block is None:
            return empty
        values = block.seen if seen and block.seen is not None else block.values
        keep = None
        if match:
            tests = [(self._label_column(name, k), set(ok)) for k, ok in match]
            keep = [i for i in range(len(block.labels)) if all(col[i] in ok for col, ok in tests)]
            if not keep:
                return empty
            values = values[keep]
        cols = [self._label_column(name, k) for k in by + extra]
        rows: list[tuple[str, ...]] = list(zip(*cols, strict=True)) if cols else [()] * len(block.labels)
        if keep is not None:
            rows = [rows[i] for i in keep]
        keys, inv = grid.group_index(rows)
        return keys, inv, values

    def _label_column(self, name: str, label: str) -> list[str]:
        """One label's value for each row of a block ("" where a series lacks it), cached per
        frame: rules group the same blocks by the same few labels."""
        cache = self.frame.cache if self.frame.cache is not None else {}
        labels = self.frame.blocks[name].labels
        key = ("label_column", name, label, id(labels), len(labels))
        if key not in cache:
            dkey = ("label_dicts", name, id(labels), len(labels))
            if dkey not in cache:
                cache[dkey] = [dict(lbl) for lbl in labels]
            cache[key] = [d.get(label, "") for d in cache[dkey]]
        return cache[key]

    def _empty(self, by: tuple[str, ...]) -> Grouped:
        return Grouped(by, [], np.zeros((0, len(self.frame.ts))))

    def _form_gauge(self, node: tree.Gauge, by: tuple[str, ...]) -> Grouped:
        keys, inv, values = self._rows(node.signal, by, match=node.match)
        if not keys:
            return self._empty(by)
        return Grouped(by, keys, grid.reduce_groups(values, inv, len(keys), node.agg))

    def _sum_rates(self, name: str, match: tree.Match, k: int, by: tuple[str, ...]) -> Grouped:
        keys, inv, values = self._rows(name, by, match=match)
        if not keys:
            return self._empty(by)
        rates = self._counter_rates(name, match, values, k)
        return Grouped(by, keys, grid.reduce_groups(rates, inv, len(keys), "sum"))

    def _form_rate(self, node: tree.Rate, by: tuple[str, ...]) -> Grouped:
        k = self._range_k(node)
        g = self._sum_rates(node.signal, node.match, k, by)
        if node.increase:
            g.values = g.values * k * (self.frame.step or 1.0)
        return g

    def _form_mean(self, node: tree.Mean, by: tuple[str, ...]) -> Grouped:
        s = self._sum_rates(node.signal + "_sum", node.match, self._range_k(node), by)
        c = self._sum_rates(node.signal + "_count", node.match, self._range_k(node), by)
        if not s.keys or not c.keys:
            return self._empty(by)
        return Grouped(by, s.keys, _guarded_ratio(s.values, align(c, by, s.keys), 0.0))

    def _form_count(self, node: tree.Count, by: tuple[str, ...]) -> Grouped:
        # a replica whose scrape failed is still a replica: counted as the lookback sees it
        keys, inv, values = self._rows(node.signal, by, node.distinct, match=node.match, seen=True)
        if not keys:
            return self._empty(by)
        present = grid.reduce_groups(values, inv, len(keys), "count") > 0
        outer, inv2 = grid.group_index([k[: len(by)] for k in keys])
        counts = grid.reduce_groups(np.where(present, 1.0, np.nan), inv2, len(outer), "sum")
        return Grouped(by, outer, counts)

    def _form_resets(self, node: tree.Resets, by: tuple[str, ...]) -> Grouped:
        """Counter resets (process restarts) in the trailing range, summed over the group."""
        keys, inv, values = self._rows(node.signal, by, match=node.match)
        if not keys:
            return self._empty(by)
        counts = grid.resets(values, self._range_k(node))
        return Grouped(by, keys, grid.reduce_groups(counts, inv, len(keys), "sum"))

    def _form_quantile(self, node: tree.Quantile, by: tuple[str, ...]) -> Grouped:
        name, match = node.signal + "_bucket", node.match
        keys, inv, values = self._rows(name, by, ("le",), match=match)
        if not keys:
            return self._empty(by)
        k, q = self._range_k(node), node.q
        adj = self._adjusted(name, match, values)
        if adj is not None and adj.shape[1] >= 2:
            return Grouped(by, *self._dense_quantiles(q, name, match, by, keys, inv, adj, k))

        def increases() -> tuple[np.ndarray, np.ndarray | None]:
            # quantiles are scale-free: increases serve as well as rates, without a division pass
            inc = self._counter_rates(name, match, values, k, per_second=False)
            if len(keys) != inc.shape[0]:
                return grid.reduce_groups(inc, inv, len(keys), "sum"), None
            key_rows = np.empty(len(keys), dtype=np.int64)  # one series per (group, le): no summing
            key_rows[inv] = np.arange(len(keys))
            return inc, key_rows

        summed, key_rows = self._memo(("bucket_increase", name, by, match, k), increases)
        return Grouped(by, *_quantiles(q, keys, summed, len(by), key_rows))

    def _dense_quantiles(
        self,
        q: float,
        name: str,
        match: tree.Match,
        by: tuple[str, ...],
        keys: list,
        inv: np.ndarray,
        adj: np.ndarray,
        k: int,
    ) -> tuple[list, np.ndarray]:
        """Quantiles of gap-free bucket counters (grid.window_quantile) over counters summed once
        per grouping."""
        cache = self.frame.cache if self.frame.cache is not None else {}
        lkey = ("bucket_layout", name, by, match)
        if lkey not in cache:
            cache[lkey] = bucket_layout(keys, inv, adj, len(by))
        groups, source, sets = cache[lkey]
        if len(sets) == 1 and len(sets[0][1]) == len(groups):  # one bound set: no assembly
            les, gis, rows = sets[0]
            pkey: tuple[Any, ...] = (name, match, k, rows.shape, rows.tobytes(), gis.tobytes(), id(source))
            if ("bucket_quantile_all", q, pkey) not in cache:
                cache[("bucket_quantile_all", q, pkey)] = grid.window_quantile(q, les, source, rows, k, gis)
            return groups, cache[("bucket_quantile_all", q, pkey)]
        out = np.full((len(groups), adj.shape[1]), np.nan)
        for les, gis, rows in sets:
            pkey = (name, match, k, rows.shape, rows.tobytes(), id(source))
            if ("bucket_quantile", q, pkey) not in cache:
                cache[("bucket_quantile", q, pkey)] = grid.window_quantile(q, les, source, rows, k)
            out[gis] = cache[("bucket_quantile", q, pkey)]
        return groups, out

    def _form_pair(self, node: tree.Pair, by: tuple[str, ...]) -> Grouped:
        a, b = self.get(node.a), self.get(node.b)
        if node.op == "coalesce":  # the first series where it has a value, else the second (`A or B`)
            if not a.keys or not b.keys:
                return a if a.keys else b
        fine = a if len(a.by) >= len(b.by) else b
        keys = sorted(set(a.keys) | set(b.keys)) if node.op == "coalesce" and a.by == b.by else fine.keys
        av, bv = align(a, fine.by, keys), align(b, fine.by, keys)
        if node.op == "ratio":
            return Grouped(fine.by, keys, _guarded_ratio(av, bv, node.min_den))
        if node.op == "coalesce":
            return Grouped(fine.by, keys, np.where(np.isnan(av), bv, av))
        return Grouped(fine.by, keys, {"sum": np.add, "diff": np.subtract, "product": np.multiply}[node.op](av, bv))

    def _form_scale(self, node: tree.Scale, by: tuple[str, ...]) -> Grouped:
        a = self.get(node.of)
        return Grouped(a.by, a.keys, a.values * node.k)

    def _form_overtime(self, node: tree.OverTime, by: tuple[str, ...]) -> Grouped:
        a = self.get(node.of)
        values = grid.over_time(a.values, self._range_k(node), node.agg)
        if node.offset:  # the window ending `offset` earlier (an earlier level)
            values = grid.shift(values, self._k(node.offset))
        return Grouped(a.by, a.keys, values)

    def _form_deriv(self, node: tree.Deriv | tree.Predict, by: tuple[str, ...]) -> Grouped:
        a = self.get(node.of)
        k = self._range_k(node)  # at least three steps (a short log or recording)
        ahead = node.ahead * self.rule.time_scale if isinstance(node, tree.Predict) else None
        return Grouped(a.by, a.keys, grid.deriv(a.values, k, self.frame.step or 1.0, ahead=ahead))

    _form_predict = _form_deriv

    def _form_changes(self, node: tree.Changes, by: tuple[str, ...]) -> Grouped:
        a = self.get(node.of)
        return Grouped(a.by, a.keys, grid.changes(a.values, self._range_k(node), self._k(node.settle)))

    def _form_aggregate(self, node: tree.Aggregate, by: tuple[str, ...]) -> Grouped:
        a = self.get(node.of)
        if not set(by) <= set(a.by):
            raise ExprError(f"aggregate by {list(by)} is not a subset of {list(a.by)}")
        if not a.keys:
            return self._empty(by)
        pos = [a.by.index(k) for k in by]
        keys, inv = grid.group_index([tuple(k[i] for i in pos) for k in a.keys])
        return Grouped(by, keys, grid.reduce_groups(a.values, inv, len(keys), node.agg))


def align(g: Grouped, by: tuple[str, ...], keys: list[tuple[str, ...]]) -> np.ndarray:
    """Rows of `g` for each key of a grouping `by` that contains g.by (missing -> NaN)."""
    n_t = g.values.shape[1] if g.values.ndim == 2 else 0
    if not set(g.by) <= set(by):
        raise ExprError(f"cannot join series grouped by {list(g.by)} onto {list(by)}")
    if g.by == by and (g.keys is keys or g.keys == keys) and g.values.shape[0] == len(keys):
        return g.values  # already these rows in this order (shared: read-only)
    pos = [by.index(k) for k in g.by]
    index = {k: i for i, k in enumerate(g.keys)}
    rows = np.array([index.get(tuple(k[i] for i in pos), -1) for k in keys], dtype=np.int64)
    out = np.full((len(keys), n_t), np.nan)
    ok = rows >= 0
    if ok.any():
        out[ok] = g.values[rows[ok]]
    return out


def _guarded_ratio(num: np.ndarray, den: np.ndarray, min_den: float) -> np.ndarray:
    """num / den, absent where den is absent, zero or below min_den (never a division by zero)."""
    ok = ~np.isnan(den) & (den > 0) & (den >= min_den)
    out = np.full(num.shape, np.nan)
    np.divide(num, den, out=out, where=ok)
    return out


def _quantiles(
    q: float, keys: list[tuple[str, ...]], summed: np.ndarray, n_by: int, key_rows: np.ndarray | None = None
) -> tuple[list, np.ndarray]:
    """Per group: bucket rates keyed (group..., le) -> quantile rows, one le-set at a time.

    `key_rows` maps a key's index to its row in `summed` (identity when None)."""
    groups, sets = group_buckets(keys, n_by)
    out = np.full((len(groups), summed.shape[1]), np.nan)
    for les, gis, rows in sets:
        if key_rows is not None:
            rows = key_rows[rows]
        out[gis] = grid.bucket_quantile(q, les, summed, rows)
    return groups, out


RANGE_FIELD = "{range}"
"""In an evidence name, the range its series was read over, in words ("mean over {range}")."""


def range_used(rule: Rule, name: str, step: float | None = None, held: float | None = None) -> float | None:
    """Seconds of the trailing range the series `name` is read over, as evaluated and as
    `promql` prints it (`SeriesCompiler.range_seconds`): time-scaled, in whole grid `step`s and no
    longer than the `held` seconds of data; as written without a step. None for a series without
    a range."""
    node = rule.tree.series.get(name)
    return None if node is None else SeriesCompiler(rule, step=step, held=held).range_seconds(node)


def duration_words(seconds: float) -> str:
    """A range for a reader: "5 s", "2.5 s", "1 min", "1 min 30 s", "2 h 5 min" (to the whole
    second from 10 s up: a 10.001 s grid step reads "10 s")."""
    if seconds < 10:
        return f"{round(seconds, 1):g} s"
    m, s = divmod(int(round(seconds)), 60)
    if not m:
        return f"{s} s"
    h, m = divmod(m, 60)
    if not h:
        return f"{m} min" + (f" {s} s" if s else "")
    return f"{h} h" + (f" {m} min" if m else "")


def evidence_name(rule: Rule, item: tree.Evidence, step: float | None = None, held: float | None = None) -> str:
    """An evidence item's label, its `{range}` written from the range its series was read over
    (`range_used`): "waiting requests (mean over 9 s)" where a scaled window read 9 s, never the
    words of the rule as written."""
    if RANGE_FIELD not in item.name:
        return item.name
    seconds = range_used(rule, item.series, step, held)
    return item.name.replace(RANGE_FIELD, "its range" if seconds is None else duration_words(seconds))


def promql(rule: Rule, name: str, step: float | None = None, held: float | None = None) -> str:
    """The named series in PromQL on one line, as evidence shows it (the rule compiler's text,
    diagnoser/promql/series.py). Ranges are printed as evaluated: time-scaled, rounded to whole
    grid `step`s, and clipped to the `held` seconds of data (minus any offset), without the
    generated rules' extra millisecond (promql/ranges.py `range_text`). A series PromQL cannot
    write says so instead."""
    try:
        text = SeriesCompiler(rule, NamedSignals(""), step=step, held=held, edge=False).expr(name)
    except NotExpressible as exc:
        return f"{name} (no PromQL form: {exc})"
    return re.sub(r"\s*\n\s*", " ", text)
