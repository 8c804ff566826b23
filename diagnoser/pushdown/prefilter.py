"""Each rule's prefilter: its conditions as PromQL, loosened to a superset (one expression, and
its conjuncts apart, which candidates.py runs cheapest first).

The prefilter is written by the same compiler as `kvscope rules build`'s alerts
(diagnoser/promql/alerts.py) with three differences, all of which make it hold wherever the
numpy evaluator's condition holds (a superset), so the findings stay the evaluator's own:

* no `for`: a group is a candidate from its first matching step on;
* every comparison is loosened by `SLACK` (x 0.75 of a `>` threshold, x 1.25 of a `<` one;
  the same for `than`/`baseline` factors), which covers the differences between PromQL's and
  the grid's arithmetic (rate extrapolation, subquery alignment, scrape jitter);
* parts with no loosened or no PromQL form are left out, never guessed: equality tests, zero
  thresholds on series that can be negative (differences, slopes), engine facts, absence tests,
  `any` branches on other groupings, signals some of whose sources PromQL cannot read
  (rescaled buckets); `resets` ranges reach RESETS_BRIDGE_S further back (the evaluator counts
  a reset across a scrape gap of any length). A rule left with nothing is a candidate everywhere (its
  evidence is fetched for every engine). Cascades (kv_pressure_cascade) are prefiltered by
  their root stage, which every later stage needs first.

Ranges are the evaluator's (time-scaled, whole grid steps), subqueries run at the grid step.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvscope.agent.signals import Catalog
from kvscope.diagnoser.promql.alerts import ConditionCompiler
from kvscope.diagnoser.promql.series import NotExpressible, SeriesCompiler, SignalReader
from kvscope.diagnoser.promql.signals import wire_names
from kvscope.diagnoser.rulebook.grammar import CHANGES_SETTLE, node_form, node_refs
from kvscope.diagnoser.rulebook.rule import Rule

SLACK = 0.25
"""Share by which each prefilter comparison is loosened."""
RESETS_BRIDGE_S = 3600.0
"""A counter reset is seen across a scrape gap of up to this long (a restart that took an hour)."""
_DEFAULT_RANGE = {
    "rate": "1m",
    "increase": "5m",
    "quantile": "5m",
    "mean": "5m",
    "resets": "10m",
    "over_time": "5m",
    "deriv": "10m",
    "changes": "15m",
}


@dataclass(frozen=True)
class Prefilter:
    """One rule's server-side condition, the grouping of its answer and what was left out."""

    rule_id: str
    expr: str | None  # None: no server-side form; every group is a candidate
    by: tuple[str, ...]
    dropped: tuple[str, ...] = ()  # conditions left to the evaluator, with the reason
    reach_s: float = 0.0  # how far back from a grid point the rule's series read
    step: float = 0.0  # the prefilter's query step (a multiple of the grid step)
    hold_steps: int = 0  # the rule's `for` in grid steps (a cascade: its root stage's)
    parts: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """The conjuncts of `expr` with their groupings, the first one's labels the answer's: run one
    by one (candidates.py, `staged_answer`), cheapest first, and intersected by the client."""
    facts: tuple[str, ...] = ()
    """Selectors of the info gauges that carry the rule's `fact == value` tests: only engines
    with such a series anywhere in the window can be candidates (candidates.py, `fact_instances`)."""
    narrowed: Callable[[frozenset[str]], tuple[str, ...] | None] | None = field(default=None, compare=False)
    """`parts` with every selector narrowed to the given instances (None: the reader cannot)."""


def conditions_of(rule: Rule) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(`all` conditions, `any` conditions) the prefilter is built from (a cascade's root stage)."""
    if "cascade" in rule.doc:
        stages = rule.doc["cascade"].get("stages") or [{}]
        return list(stages[0].get("all") or []), []
    when = rule.doc.get("when") or {}
    return list(when.get("all") or []), list(when.get("any") or [])


def compile_prefilter(
    rule: Rule, reader: SignalReader, catalog: Catalog, step: float, slack: float = SLACK, narrow: bool = True
) -> Prefilter:
    """The prefilter of a prepared rule (parameters applied, time-scaled) on a grid of `step`;
    `narrow`: give it `narrowed` where the reader can narrow its selectors (`only`)."""
    reach = rule_reach(rule)
    hold = hold_steps(rule, step)
    qstep = query_step(rule, step)
    series = SeriesCompiler(rule, reader, step=step)
    coarse = step * max(1, min(MAX_QUERY_STEPS, hold))
    series.sub_for = lambda rng_s: _duration(step if rng_s <= LONG_SUBQUERY_S else max(step, min(coarse, rng_s / 30)))
    series.resets_bridge_s = RESETS_BRIDGE_S
    cc = ConditionCompiler(rule, series, catalog, slack=slack)
    all_conds, any_conds = conditions_of(rule)
    kept: list[tuple[str, tuple[str, ...]]] = []
    compiled: list[dict[str, Any]] = []
    dropped: list[str] = []
    for cond in all_conds:
        try:
            kept.append(cc.condition(_without_absence(cond)))
        except (NotExpressible, KeyError, ValueError, TypeError) as exc:
            dropped.append(f"{_describe(cond)}: {exc}")
        else:
            compiled.append(cond)
    kept = _chain_same_series(cc, compiled, kept)
    anys = []
    for cond in any_conds:
        try:
            anys.append(cc.condition(_without_absence(cond)))
        except (NotExpressible, KeyError, ValueError, TypeError) as exc:
            dropped.append(f"any-branch {_describe(cond)}: {exc}")
            anys = []
            break
    facts, unread = fact_selectors(rule, catalog)
    dropped += unread
    if not kept and anys and len({frozenset(b) for _, b in anys}) == 1:
        kept, anys = [("\nor\n".join(f"({e})" for e, _ in anys), anys[0][1])], []
    if not kept:
        return Prefilter(
            rule.id,
            None,
            rule.by,
            tuple(dropped) or ("no condition has a PromQL form",),
            reach,
            qstep,
            hold,
            facts=facts,
        )
    kept.sort(key=lambda c: -len(c[1]))
    (expr, by), rest = kept[0], kept[1:]
    parts = [(expr, tuple(by))] + [(e, tuple(b)) for e, b in rest]
    same = [e for e, b in anys if set(b) == set(by)]
    if anys and len(same) == len(anys):
        parts.append(("\n" + "\nor\n".join(f"({e})" for e in same) + "\n", tuple(by)))
    elif anys:
        dropped.append("`any` branches on another grouping")
    out = f"({parts[0][0]})" + "".join(f"\nand{_on(by, b)}\n({e})" for e, b in parts[1:])
    narrowed = _narrower(rule, reader, catalog, step, slack, len(parts)) if narrow else None
    return Prefilter(rule.id, out, tuple(by), tuple(dropped), reach, qstep, hold, tuple(parts), facts, narrowed)


def _narrower(
    rule: Rule, reader: SignalReader, catalog: Catalog, step: float, slack: float, n: int
) -> Callable[[frozenset[str]], tuple[str, ...] | None] | None:
    """The rule's prefilter parts recompiled with a reader whose selectors match only the given
    instances; None where the reader cannot narrow (no `only`)."""
    only = getattr(reader, "only", None)
    if only is None:
        return None

    def narrowed(instances: frozenset[str]) -> tuple[str, ...] | None:
        again = compile_prefilter(rule, only(instances), catalog, step, slack, narrow=False)
        return tuple(e for e, _ in again.parts) if len(again.parts) == n else None

    return narrowed


def _chain_same_series(
    cc: ConditionCompiler, conds: list[dict[str, Any]], kept: list[tuple[str, tuple[str, ...]]]
) -> list[tuple[str, tuple[str, ...]]]:
    """Compiled `all` conditions with those comparing the same series (e.g. a spread above a
    floor and above its baseline) merged into one chain, so the TSDB computes the series once."""
    by_series: dict[str, list[int]] = {}
    for i, cond in enumerate(conds):
        if "op" in cond and "series" in cond:
            by_series.setdefault(str(cond["series"]), []).append(i)
    out, merged = [], set()
    for i, part in enumerate(kept):
        if i in merged:
            continue
        same = by_series.get(str(conds[i].get("series")), [i]) if "op" in conds[i] else [i]
        if len(same) > 1:
            try:
                part = cc.chained([conds[j] for j in same])
                merged.update(same)
            except (NotExpressible, KeyError, ValueError, TypeError):
                pass
        out.append(part)
    return out


def fact_selectors(rule: Rule, catalog: Catalog) -> tuple[tuple[str, ...], list[str]]:
    """(one selector per `fact == value` test whose fact only info-gauge labels carry, the tests
    left to the evaluator with the reason). The evaluator reads a fact from the labels of an
    engine's info gauges anywhere in the window (an unknown fact fails), so an engine without such
    a series carrying that label value cannot fire. Tests on facts a static gauge's value carries,
    and other operators, are left out (a superset). Only for rules grouped by instance."""
    tests = list(rule.doc.get("facts") or [])
    if not tests:
        return (), []
    if "instance" not in rule.by:
        return (), ["engine facts (checked by the evaluator)"]
    out, left = [], []
    for test in tests:
        name = str(test.get("fact"))
        static = any(f.fact == name for f in catalog.facts)
        info = sorted(
            {
                n
                for f in catalog.facts
                if f.fact is None and (not f.labels or name in f.labels)
                for n in wire_names(f.name, "gauge")
            }
        )
        if test.get("op", "==") != "==" or static or not info or not _LABEL.fullmatch(name):
            left.append(f"fact {name}: checked by the evaluator")
            continue
        value = re.escape(str(rule.resolve(test["value"]))).replace("\\", "\\\\").replace('"', '\\"')
        out.append(f'{{__name__=~"{"|".join(re.escape(n) for n in info)}",{name}=~"(?i){value}"}}')
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
    try:
        if "cascade" in rule.doc:
            cas = rule.doc["cascade"] or {}
            stages = cas.get("stages") or [{}]
            hold = rule.duration(stages[0].get("for", cas.get("for", "0s")))
        else:
            hold = rule.duration((rule.doc.get("when") or {}).get("for", "0s"))
    except (KeyError, ValueError, TypeError, AttributeError):
        return 0
    return max(0, int(round(hold / step)))


CONSECUTIVE = 3
"""A run of true points long enough to fire holds at least this many consecutive prefilter steps
(where the rule's `for` allows): isolated matches are dropped by the client (candidates.py)."""


def query_step(rule: Rule, step: float) -> float:
    """The prefilter's query step: a run of hold + 1 true grid points (what `for` asks) spans at
    least CONSECUTIVE query steps, at most MAX_QUERY_STEPS grid steps each."""
    k = (hold_steps(rule, step) + 1) // CONSECUTIVE
    return step * max(1, min(MAX_QUERY_STEPS, k))


def _duration(seconds: float) -> str:
    from kvscope.diagnoser.promql.series import _duration as fmt

    return fmt(seconds)


def _without_absence(cond: dict[str, Any]) -> dict[str, Any]:
    if cond.get("present") is False:
        raise NotExpressible("an absence test")
    return cond


def _on(by: tuple[str, ...], other: tuple[str, ...]) -> str:
    return "" if set(other) == set(by) else f" on ({', '.join(other)})"


def _describe(cond: dict[str, Any]) -> str:
    if "fact" in cond:
        return f"fact {cond['fact']}"
    return f"{cond.get('series')} {cond.get('op', 'present')} {cond.get('value', cond.get('than', 'baseline'))}"


def rule_reach(rule: Rule) -> float:
    """Seconds before a grid point that any of the rule's series or baselines read (ranges,
    offsets, settles, nested), plus one range-query lookback-free margin of nothing: the
    frame's own lookback is the TSDB's, applied when the data is fetched."""
    memo: dict[str, float] = {}

    def reach(name: str, seen: frozenset[str] = frozenset()) -> float:
        if name in memo:
            return memo[name]
        node = rule.series.get(name)
        if node is None or name in seen:
            return 0.0
        form = node_form(node)
        own = (
            rule.duration(node["range"])
            if "range" in node
            else (rule.duration(_DEFAULT_RANGE[form]) if form in _DEFAULT_RANGE else 0.0)
        )
        if node.get("offset"):
            own += rule.duration(node["offset"])
        if form == "changes":
            own += rule.duration(node.get("settle", CHANGES_SETTLE))
        memo[name] = own + max((reach(r, seen | {name}) for r in node_refs(node)), default=0.0)
        return memo[name]

    out = max((reach(n) for n in rule.series), default=0.0)
    for cond in _every_condition(rule):
        base = cond.get("baseline")
        if isinstance(base, dict):
            src = str(base.get("of", cond.get("series")))
            out = max(
                out, rule.duration(base.get("range", "30m")) + rule.duration(base.get("offset", "10m")) + reach(src)
            )
    return out


def _every_condition(rule: Rule) -> list[dict[str, Any]]:
    doc = rule.doc
    blocks = [doc.get(k) or {} for k in ("when", "warning_when", "critical_when", "resolved_when")]
    blocks += list((doc.get("cascade") or {}).get("stages") or [])
    return [c for b in blocks for key in ("all", "any") for c in (b.get(key) or []) if isinstance(c, dict)]
