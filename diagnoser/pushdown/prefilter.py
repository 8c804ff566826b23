"""Each rule's prefilter: its conditions as PromQL loosened to a superset (docs/fleet.md), written
by the alerts' compiler with no `for` and every comparison loosened by `SLACK`; parts without a
loosened form are left out, never guessed (equality tests, zero thresholds on signed series, facts,
absence, `any` on other groupings, unreadable signals). `resets` ranges reach RESETS_BRIDGE_S
further back; cascades are prefiltered by their root stage; a rule left with nothing is a
candidate everywhere. Ranges are the evaluator's (time-scaled, whole grid steps).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvscope.core.signals import Catalog
from kvscope.diagnoser.promql.alerts import ConditionCompiler, on_clause
from kvscope.diagnoser.promql.series import NotExpressible, SeriesCompiler, prom_duration
from kvscope.diagnoser.promql.signals import PromQL, SignalReader, quote, wire_names
from kvscope.diagnoser.rulebook import tree
from kvscope.diagnoser.rulebook.rule import Rule, grid_steps, rate_steps

SLACK = 0.25
"""Share by which each prefilter comparison is loosened."""
RESETS_BRIDGE_S = 3600.0
"""A counter reset is seen across a scrape gap of up to this long (a restart that took an hour)."""


@dataclass(frozen=True)
class Prefilter:
    """One rule's server-side condition and what was left out."""

    expr: str | None  # None: no server-side form; every group is a candidate
    dropped: tuple[str, ...] = ()  # conditions left to the evaluator, with the reason
    facts: tuple[str, ...] = ()
    """Selectors of the info gauges that carry the rule's `fact == value` tests: only engines
    with such a series anywhere in the window can be candidates (candidates.py `candidate_exprs` joins them on)."""


def conditions_of(rule: Rule) -> tuple[tuple[tree.Cond, ...], tuple[tree.Cond, ...]]:
    """(`all` conditions, `any` conditions) the prefilter is built from: a cascade's root stage,
    else `when` with the mechanism's gate (`Tree.gated`: the evaluator judges only there)."""
    t = rule.tree
    if t.cascade:
        return (t.cascade.stages[0].all if t.cascade.stages else ()), ()
    return (t.gated.all, t.gated.any) if t.when else ((), ())


def compile_prefilter(rule: Rule, reader: SignalReader, catalog: Catalog, step: float) -> Prefilter:
    """The prefilter of a prepared rule (parameters applied, time-scaled) on a grid of `step`."""
    hold = hold_steps(rule, step)
    series = SeriesCompiler(rule, reader, step=step)
    coarse = step * max(1, min(MAX_QUERY_STEPS, hold))
    series.sub_for = lambda rng_s: prom_duration(
        step if rng_s <= LONG_SUBQUERY_S else max(step, min(coarse, rng_s / 30))
    )
    series.resets_bridge_s = RESETS_BRIDGE_S
    cc = ConditionCompiler(rule, series, catalog, slack=SLACK)
    all_conds, any_conds = conditions_of(rule)
    kept: list[PromQL] = []
    compiled: list[tree.Cond] = []
    dropped: list[str] = []
    for cond in all_conds:
        try:
            kept.append(cc.condition(_without_absence(cond)))
        except (NotExpressible, KeyError, ValueError, TypeError) as exc:
            dropped.append(f"{_describe(cond)}: {exc}")
        else:
            compiled.append(cond)
    kept = _chain_same_series(cc, compiled, kept)
    anys: list[PromQL] = []
    for cond in any_conds:
        try:
            anys.append(cc.condition(_without_absence(cond)))
        except (NotExpressible, KeyError, ValueError, TypeError) as exc:
            dropped.append(f"any-branch {_describe(cond)}: {exc}")
            anys = []
            break
    facts, unread = fact_selectors(rule, catalog)
    dropped += unread
    if not kept and anys and len({frozenset(e.by) for e in anys}) == 1:
        kept, anys = [PromQL("\nor\n".join(f"({e})" for e in anys), anys[0].by, sum(e.cost for e in anys))], []
    if not kept:
        return Prefilter(None, tuple(dropped) or ("no condition has a PromQL form",), facts)
    kept.sort(key=lambda c: -len(c.by))
    by = kept[0].by
    parts = [(e, e.by) for e in kept]
    same = [e for e in anys if set(e.by) == set(by)]
    if anys and len(same) == len(anys):
        ored = PromQL("\n" + "\nor\n".join(f"({e})" for e in same) + "\n", by, sum(e.cost for e in same))
        parts.append((ored, by))
    elif anys:
        dropped.append("`any` branches on another grouping")
    out = f"({parts[0][0]})" + "".join(f"\nand{on_clause(by, b)}\n({e})" for e, b in parts[1:])
    return Prefilter(out, tuple(dropped), facts)


def _chain_same_series(cc: ConditionCompiler, conds: list[tree.Cond], kept: list[PromQL]) -> list[PromQL]:
    """Compiled `all` conditions with those comparing the same series (e.g. a spread above a
    floor and above its baseline) merged into one chain, so the TSDB computes the series once."""
    by_series: dict[str, list[int]] = {}
    for i, cond in enumerate(conds):
        if cond.right is not None:
            by_series.setdefault(cond.series, []).append(i)
    out, merged = [], set()
    for i, part in enumerate(kept):
        if i in merged:
            continue
        same = by_series.get(conds[i].series, [i]) if conds[i].right is not None else [i]
        if len(same) > 1:
            try:
                part = cc.chained([conds[j] for j in same])
                merged.update(same)
            except (NotExpressible, KeyError, ValueError, TypeError):
                pass
        out.append(part)
    return out


def fact_selectors(rule: Rule, catalog: Catalog) -> tuple[tuple[str, ...], list[str]]:
    """(one selector per `fact == value` test whose fact only info-gauge labels carry: an engine
    without such a series cannot fire; the tests left to the evaluator, with the reason). Only
    for rules grouped by instance."""
    tests = rule.tree.facts
    if not tests:
        return (), []
    if "instance" not in rule.by:
        return (), ["engine facts (checked by the evaluator)"]
    out, left = [], []
    gauges = [f for f in catalog.facts if f.fact is None]  # info gauges: their labels are facts
    for test in tests:
        name = test.fact
        static = any(f.fact == name for f in catalog.facts)
        info = sorted({n for f in gauges if not f.labels or name in f.labels for n in wire_names(f.name, "gauge")})
        if test.op != "==" or static or not info or not _LABEL.fullmatch(name):
            left.append(f"fact {name}: checked by the evaluator")
            continue
        cond = f'=~"(?i){quote(re.escape(test.value))}"'
        out.append(f'{{__name__=~"{"|".join(re.escape(n) for n in info)}",{name}{cond}}}')
    return tuple(out), left


_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

MAX_QUERY_STEPS = 8
LONG_SUBQUERY_S = 600.0
"""Subqueries over ranges longer than this (baselines) are read at up to 1/30 of their range or the
rule's `for` (at most MAX_QUERY_STEPS grid steps), whichever is finer: an average over 30 points of a 30-minute baseline
instead of 120 (the slack covers the difference); shorter ones (max over a minute) at the grid step."""


def hold_steps(rule: Rule, step: float) -> int:
    """The rule's `for` in grid steps, as the evaluator rounds it (a cascade: its root stage's own
    `for`, else the cascade's); 0 when it cannot be read."""
    t = rule.tree
    block = (t.cascade.stages[0] if t.cascade.stages else None) if t.cascade else t.when
    return grid_steps((block.hold if block else 0.0) * rule.time_scale, step, 0)


def _without_absence(cond: tree.Cond) -> tree.Cond:
    if cond.op == "absent":
        raise NotExpressible("an absence test")
    return cond


def _describe(cond: tree.Cond) -> str:
    r = cond.right
    right = r.series if isinstance(r, tree.Than) else "baseline" if isinstance(r, tree.Baseline) else ""
    if isinstance(r, tree.Value):
        right = "null" if r.x is None else f"{r.x:g}"
    return f"{cond.series} {cond.op} {right}".rstrip()


def rule_reach(rule: Rule, step: float | None = None) -> float:
    """Seconds before a grid point that any of the rule's series or baselines read (ranges,
    offsets, settles, nested), plus one range-query lookback-free margin of nothing: the
    frame's own lookback is the TSDB's, applied when the data is fetched. With the grid's `step`,
    a range the short-window scaling shortens reaches as far as the evaluator reads a counter
    rate over it (`rate_steps`: at least two steps), read for every range (reaching further
    only fetches more)."""
    memo: dict[str, float] = {}
    nodes, scale = rule.tree.series, rule.time_scale

    def span(rng: float) -> float:
        return max(rng * scale, rate_steps(rng, scale, step) * step) if step and rng else rng * scale

    def reach(name: str, seen: frozenset[str] = frozenset()) -> float:
        if name in memo:
            return memo[name]
        node = nodes.get(name)
        if node is None or name in seen:
            return 0.0
        own = span(getattr(node, "rng", 0.0)) + sum(getattr(node, f, 0.0) for f in ("offset", "settle")) * scale
        memo[name] = own + max((reach(r, seen | {name}) for r in node.refs), default=0.0)
        return memo[name]

    out = max((reach(n) for n in nodes), default=0.0)
    for cond in (c for b in rule.tree.blocks() for c in b.conds):
        if isinstance(cond.right, tree.Baseline):
            base = cond.right
            out = max(out, (base.rng + base.offset) * scale + reach(base.of or cond.series))
    return out
