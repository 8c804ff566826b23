"""Which groups a rule can fire for, and when: the TSDB's `kvscope:candidate` records read against
the rule's `for`.

`kvscope rules build` writes each rule's loosened condition (prefilter.py) as a recording rule
(`kvscope-candidates.yml`), evaluated every CANDIDATE_INTERVAL; the same expression adds a series
`{version=...}` at every evaluation that succeeded, which says when the records cover the window
and for which version of the rule. One range query at that interval reads them for every rule
(`read_candidates`).

Where the evaluator's condition holds, the candidate's does too (a superset), so a run of the
rule's `for` (hold + 1 grid points, `hold_s` seconds) holds the candidate at every evaluation
inside it: at least hold_s // interval consecutive query points. A query point reads the
evaluations of the last RECORD_LOOKBACK_S (the last one, or two), never the 5-minute lookback:
backfilled records (promtool, vmalert -replay) carry no staleness markers, so a bare selector
would stretch every evaluation that held over the next five minutes. Groups without such a run
cannot fire; for the others the runs, widened by two intervals before and one after (the
evaluations' phase), bound where the evaluator's runs can lie (`Group.first`, `Group.last`).

A rule whose records do not cover the window (installed later, another version of the rule,
gaps) is `uncovered`: it is judged on every engine's series (the exact full fetch), and the
spans are said.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvscope.agent.signals import Catalog
from kvscope.diagnoser.promql.rulefiles import CANDIDATE, CANDIDATE_INTERVAL, _seconds
from kvscope.diagnoser.promql.signals import InlineSignals
from kvscope.diagnoser.pushdown.prefilter import compile_prefilter
from kvscope.diagnoser.rulebook.rule import Rule
from kvscope.diagnoser.sources.promapi import PromClient, matrix_on_grid

INTERVAL_S = float(_seconds(CANDIDATE_INTERVAL))
RECORD_LOOKBACK_S = INTERVAL_S + 5.0
"""One evaluation interval and a margin for the evaluations' jitter."""


def candidate_exprs(rules: list[Rule], catalog: Catalog) -> dict[str, tuple[str | None, str]]:
    """{rule id: (its loosened condition as PromQL over the engines' own series, or None, and
    the version label: a hash of that text, or why there is none)}, at the rules' defaults
    and time scale 1. The fleet path compiles the same to know which records it can trust."""
    out: dict[str, tuple[str | None, str]] = {}
    step = INTERVAL_S
    for rule in rules:
        if rule.missing_params():
            out[rule.id] = (None, f"parameter(s) without a default: {', '.join(rule.missing_params())}")
            continue
        pre = compile_prefilter(rule, InlineSignals(catalog), catalog, step)
        if pre.expr is None:
            out[rule.id] = (None, "; ".join(pre.dropped))
            continue
        expr = pre.expr + "".join(
            f"\nand on (instance)\ngroup by (instance) (last_over_time({sel}[{FACT_REACH}]))" for sel in pre.facts
        )
        out[rule.id] = (expr, hashlib.sha256(expr.encode()).hexdigest()[:12])
    return out


FACT_REACH = "1h"
"""A rule's `fact == value` tests (prefilter.py `fact_selectors`: the info gauges that carry the
fact) hold for an engine with such a series in the last hour: the evaluator reads a fact from an
engine's info series anywhere in the window, and engines export them from start to exit."""


@dataclass(frozen=True)
class Group:
    """One candidate group: its labels (the record's grouping, empty labels absent) and the
    first and last grid index of the stretches where a run of the rule can lie."""

    labels: dict[str, str]
    first: int
    last: int


@dataclass
class Hits:
    """A rule's candidates; `everywhere`: no record to trust, every group is a candidate over
    the whole window (`why`, and the uncovered spans as (from, to) times)."""

    groups: list[Group] = field(default_factory=list)
    everywhere: bool = False
    why: str = ""
    uncovered: list[tuple[float, float]] = field(default_factory=list)

    @property
    def first(self) -> int:
        return min(g.first for g in self.groups)

    @property
    def last(self) -> int:
        return max(g.last for g in self.groups)


def read_candidates(
    client: PromClient, versions: dict[str, str], holds: dict[str, float], grid: np.ndarray
) -> dict[str, Hits]:
    """Every rule's candidates from one range query of the records over the grid's window.
    `versions`: rule id -> the version its record must carry; `holds`: rule id -> its `for` in
    seconds. A rule not in `versions` is not asked for."""
    start, end = float(grid[0]), float(grid[-1])
    times = np.arange(start, end + INTERVAL_S / 2, INTERVAL_S)
    ids = "|".join(sorted(versions))
    expr = f'last_over_time({CANDIDATE}{{rule_id=~"{ids}"}}[{RECORD_LOOKBACK_S:g}s])'
    result = client.range_parts(expr, start, float(times[-1]), INTERVAL_S, what="candidate records")
    metrics, values = matrix_on_grid(result, start, INTERVAL_S, len(times))
    up: dict[str, np.ndarray] = {rid: np.zeros(len(times), dtype=bool) for rid in versions}
    rows: dict[str, list[tuple[dict[str, str], np.ndarray]]] = {rid: [] for rid in versions}
    for metric, row in zip(metrics, values, strict=True):
        rid = metric.get("rule_id", "")
        if rid not in versions:
            continue
        if "version" in metric:  # the record's own series: it evaluated, for this version of the rule
            if metric.get("version") == versions[rid]:
                up[rid] |= ~np.isnan(row)
            continue
        labels = {k: v for k, v in metric.items() if k not in ("__name__", "rule_id") and v}
        rows[rid].append((labels, ~np.isnan(row)))
    out = {}
    for rid in versions:
        gaps = _spans(~up[rid], times)
        if gaps:
            out[rid] = Hits(everywhere=True, why="no kvscope:candidate records (or of another version)", uncovered=gaps)
            continue
        need = max(1, int(holds.get(rid, 0.0) // INTERVAL_S))
        out[rid] = Hits([g for labels, held in rows[rid] if (g := _group(labels, held, need, times, grid))])
    return out


def _group(labels: dict[str, str], held: np.ndarray, need: int, times: np.ndarray, grid: np.ndarray) -> Group | None:
    """The group's stretches where the rule can fire, as grid indices; None when none."""
    runs = [(lo, hi) for lo, hi in _runs(held) if hi - lo + 1 >= need]
    if not runs:
        return None
    first = float(times[runs[0][0]]) - 2 * INTERVAL_S
    last = float(times[runs[-1][1]]) + INTERVAL_S
    lo = int(np.searchsorted(grid, first - 1e-6))
    hi = int(np.searchsorted(grid, last + 1e-6)) - 1
    return Group(labels, max(0, lo), min(len(grid) - 1, max(hi, lo)))


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) index of each run of True."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _spans(mask: np.ndarray, times: np.ndarray) -> list[tuple[float, float]]:
    return [(float(times[a]), float(times[b])) for a, b in _runs(mask)]


def describe(hits: dict[str, Hits]) -> list[str]:
    """Lines naming the rules judged by the full fetch because their records do not cover the
    window, with the spans, and how to backfill them."""
    import time

    def at(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))

    bad = {rid: h for rid, h in hits.items() if h.uncovered}
    if not bad:
        return []
    out = [
        f"fleet: {len(bad)} rule(s) judged on every engine's series (exact full fetch): "
        "no kvscope:candidate records of this rule version for part of the window:"
    ]
    by_spans: dict[tuple, list[str]] = {}
    for rid, h in sorted(bad.items()):
        by_spans.setdefault(tuple(h.uncovered), []).append(rid)
    for spans, rids in by_spans.items():
        out.append(f"  {', '.join(rids)}: " + ", ".join(f"{at(a)} - {at(b)}" for a, b in spans[:3]) + _more(spans))
    lo, hi = min(h.uncovered[0][0] for h in bad.values()), max(h.uncovered[-1][1] for h in bad.values())
    out.append(
        "  backfill them (docs/fleet.md): promtool tsdb create-blocks-from rules "
        f"--start {int(lo)} --end {int(hi)} --url <prometheus> rules/prometheus/kvscope-candidates.yml, "
        "or vmalert -rule=rules/prometheus/kvscope-candidates.yml -replay.timeFrom="
        f"{at(lo)} -replay.timeTo={at(hi)} -datasource.url=<vm> -remoteWrite.url=<vm>"
    )
    return out


def _more(spans: Any) -> str:
    return f" (+{len(spans) - 3} more)" if len(spans) > 3 else ""
