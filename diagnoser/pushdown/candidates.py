"""Which groups a rule can fire for, and when: the TSDB's `kvscope:candidate` records read against
the rule's `for` (docs/fleet.md).

`read_candidates` reads every rule's records and `{version}` series in one range query, each point
the evaluations of the last RECORD_LOOKBACK_S, never the 5-minute lookback: backfilled records
(promtool, vmalert -replay) carry no staleness markers, so a bare selector would stretch every held
evaluation over five minutes. A run of the rule's `for` holds the candidate at >= hold_s // interval
consecutive points; groups without one cannot fire, and for the others the runs (widened by two
intervals before and one after) bound the evaluator's (`Group.first/last`). Records not covering the
window make it `uncovered`, except the last RECORD_LAG_S before the present, which a live rule
group has not evaluated yet: there the window ends at the records' newest evaluation (`records_end`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from kvscope.core.scalars import iso_utc, parse_duration
from kvscope.core.signals import Catalog
from kvscope.diagnoser.promql.rulefiles import CANDIDATE, CANDIDATE_INTERVAL
from kvscope.diagnoser.promql.signals import InlineSignals, escape_re, quote
from kvscope.diagnoser.pushdown.prefilter import compile_prefilter
from kvscope.diagnoser.rulebook.rule import Rule
from kvscope.diagnoser.sources.promapi import PromClient, matrix_on_grid

INTERVAL_S = parse_duration(CANDIDATE_INTERVAL)
RECORD_LOOKBACK_S = INTERVAL_S + 5.0
"""One evaluation interval and a margin for the evaluations' jitter."""
RECORD_LAG_S = 120.0
"""How far the records' newest evaluation may lag the window's end for the window to end there
instead of judging every rule on every engine's series: a live rule group's record of time t is
written after its interval (15 s), its evaluation (about 13 s for the slowest group at 1000
engines, below) and the write (vmalert's remote-write flush, VictoriaMetrics' default
`-search.latencyOffset` of 30 s). Records that stop earlier are missing, not late."""


def candidate_exprs(rules: list[Rule], catalog: Catalog) -> dict[str, tuple[str | None, str]]:
    """{rule id: (its loosened condition as PromQL over the engines' own series, or None, and
    the version label: a hash of that text, or why there is none)}, at the rules' defaults
    and time scale 1. The fleet path compiles the same to know which records it can trust."""
    out: dict[str, tuple[str | None, str]] = {}
    for rule in rules:
        if rule.missing_params():
            out[rule.id] = (None, f"parameter(s) without a default: {', '.join(rule.missing_params())}")
            continue
        pre = compile_prefilter(rule, InlineSignals(catalog), catalog, INTERVAL_S)
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


def records_end(client: PromClient, rule_ids: list[str], start: float, end: float) -> float:
    """The end of [start, end] the records can judge: `end`, or, when some rule's records of any
    version cover the window but for its last evaluations, less than RECORD_LAG_S, the newest time
    start + k x INTERVAL_S at which every such rule's had evaluated (a window ending at the
    present, as the webhook's does, would otherwise judge every rule in full for its last
    seconds). Rules whose records miss more, or elsewhere, are judged in full whatever the end
    (`read_candidates`), so they do not move it. One range query of the records' own series."""
    times = np.arange(start, end + INTERVAL_S / 2, INTERVAL_S)
    if not rule_ids or float(times[-1]) - start < RECORD_LAG_S:
        return end
    ids = "|".join(sorted(rule_ids))
    expr = f'max by (rule_id) (last_over_time({CANDIDATE}{{rule_id=~"{ids}",version!=""}}[{RECORD_LOOKBACK_S:g}s]))'
    result = client.range_parts(expr, start, float(times[-1]), INTERVAL_S, what="candidate records' evaluations")
    _, values = matrix_on_grid(result, start, INTERVAL_S, len(times))
    lasts = []
    for row in values:
        gaps = _runs(np.isnan(row))
        if len(gaps) == 1 and gaps[0][1] == len(times) - 1 and gaps[0][0] > 0:
            lasts.append(float(times[gaps[0][0] - 1]))
        elif not gaps:
            lasts.append(float(times[-1]))
    late = [t for t in lasts if times[-1] - t <= RECORD_LAG_S]
    return end if not late or min(late) >= times[-1] else min(late)


def read_candidates(
    client: PromClient,
    versions: dict[str, str],
    holds: dict[str, float],
    grid: np.ndarray,
    place: Mapping[str, str] | None = None,
) -> dict[str, Hits]:
    """Every rule's candidates from one range query of the records over the grid's window.
    `versions`: rule id -> the version its record must carry; `holds`: rule id -> its `for` in
    seconds. A rule not in `versions` is not asked for. `place` (label -> value): only the
    groups at that place (`place_matchers`), as the webhook asks for an alert's."""
    start, end = float(grid[0]), float(grid[-1])
    times = np.arange(start, end + INTERVAL_S / 2, INTERVAL_S)
    ids = "|".join(sorted(versions))
    expr = f'last_over_time({CANDIDATE}{{rule_id=~"{ids}"{place_matchers(place)}}}[{RECORD_LOOKBACK_S:g}s])'
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
        gaps = [(float(times[a]), float(times[b])) for a, b in _runs(~up[rid])]
        if gaps:
            out[rid] = Hits(everywhere=True, why="no kvscope:candidate records (or of another version)", uncovered=gaps)
            continue
        need = max(1, int(holds.get(rid, 0.0) // INTERVAL_S))
        out[rid] = Hits([g for labels, held in rows[rid] if (g := _group(labels, held, need, times, grid))])
    return out


def place_matchers(place: Mapping[str, str] | None) -> str:
    """`,label=~"value|"` per label of `place`: the series that carry the place's value or do not
    carry the label at all (a record grouped by fewer labels, e.g. per model, and the records' own
    `{version}` series), the groups at the place (`findings.same_place`) the webhook keeps. Label
    names must be identifiers (the webhook's place labels are)."""
    return "".join(f',{k}=~"{quote(escape_re(v))}|"' for k, v in sorted((place or {}).items()))


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


def describe(hits: dict[str, Hits]) -> list[str]:
    """Lines naming the rules judged by the full fetch because their records do not cover the
    window, with the spans, and how to backfill them."""
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
        more = f" (+{len(spans) - 3} more)" if len(spans) > 3 else ""
        out.append(f"  {', '.join(rids)}: " + ", ".join(f"{iso_utc(a)} - {iso_utc(b)}" for a, b in spans[:3]) + more)
    lo, hi = min(h.uncovered[0][0] for h in bad.values()), max(h.uncovered[-1][1] for h in bad.values())
    out.append(
        "  backfill them (docs/fleet.md): promtool tsdb create-blocks-from rules "
        f"--start {int(lo)} --end {int(hi)} --url <prometheus> rules/prometheus/kvscope-candidates.yml, "
        "or vmalert -rule=rules/prometheus/kvscope-candidates.yml -replay.timeFrom="
        f"{iso_utc(lo)} -replay.timeTo={iso_utc(hi)} -datasource.url=<vm> -remoteWrite.url=<vm>"
    )
    return out
