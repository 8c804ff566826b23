"""The fleet path: diagnose a fleet in a Prometheus-compatible TSDB from the candidates it keeps.

`diagnose --prometheus`, the UI, the weekly report and the webhook come here (docs/fleet.md):
inventory (rules whose signals are all absent skipped), candidates (candidates.py; rules without
trustworthy records judged on every engine's series), evidence (evidence.py), then the numpy
evaluator on each rule's own rows, settled and ranked as `diagnose()`.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kvscope.core.scalars import iso_utc
from kvscope.core.signals import Catalog, load_catalog
from kvscope.diagnoser.evaluate.confidence import direct_present
from kvscope.diagnoser.evaluate.evaluator import auto_time_scale, conclude, evaluate_rule, precheck, sample_names
from kvscope.diagnoser.evaluate.frame import DEFAULT_LOOKBACK_S, Block, Frame, make_grid
from kvscope.diagnoser.findings import MECHANISM_OFF, MECHANISM_UNKNOWN, Diagnosis, Finding, Skipped
from kvscope.diagnoser.promql.signals import InlineSignals, ray_spelling
from kvscope.diagnoser.pushdown.candidates import (
    RECORD_LAG_S,
    Group,
    Hits,
    candidate_exprs,
    describe,
    read_candidates,
    records_end,
)
from kvscope.diagnoser.pushdown.evidence import Fetched, fetch_needs, rule_frame, rule_needs
from kvscope.diagnoser.pushdown.prefilter import hold_steps, rule_reach
from kvscope.diagnoser.rulebook.levers import Lever, load_levers
from kvscope.diagnoser.rulebook.rule import Rule, read_rules
from kvscope.diagnoser.sources.promapi import PromClient, PromError, as_points
from kvscope.diagnoser.sources.prometheus import fetch_frame, wire_pattern

NO_GROUPS = "no series for any group"


@dataclass
class FleetReport:
    """What the fleet path read and judged (the summary on stderr)."""

    hits: dict[str, Hits] = field(default_factory=dict)
    young: int = 0  # the most instances whose data starts within one rule's reach
    asked_end: float | None = None  # the window's end asked for
    end: float = math.inf  # the window's end judged (the records' newest evaluation, when it cut the window)
    fetched: Fetched | None = None  # the evidence fetched (every rule's series where it matched)
    evidence_series: int = 0
    evidence_points: int = 0
    evidence_fetches: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def summary(self, client: PromClient) -> list[str]:
        """Lines for stderr: what was read from the records, fetched and split."""
        read = [h for h in self.hits.values() if not h.everywhere]
        everywhere = sorted(rid for rid, h in self.hits.items() if h.everywhere and not h.uncovered)
        out = [
            f"fleet: {len(read)} rules read from kvscope:candidate, {sum(1 for h in read if h.groups)} with "
            f"candidates ({sum(len(h.groups) for h in read)} groups); evidence: {self.evidence_series} series, "
            f"{self.evidence_points:,} points in {self.evidence_fetches} fetch(es); "
            f"{int(client.stats['queries'])} queries, {client.stats['bytes'] / 1e6:.1f} MB; "
            + ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())
        ]
        if self.asked_end is not None and self.end < self.asked_end:
            out.append(
                f"fleet: the window ends at the candidate records' newest evaluation, {iso_utc(self.end)}, "
                f"{self.asked_end - self.end:.0f} s before the end asked for (a live rule group writes a record "
                "after its interval, evaluation and write; docs/fleet.md)"
            )
        if self.young:
            out.append(
                f"fleet: up to {self.young} instance(s) have no data from before the window's start minus a rule's "
                "reach; they are judged in full for it (windows at a series' first samples are clipped by the "
                "evaluator and extrapolated by PromQL, so no candidate record can stand in)"
            )
        for why in sorted({self.hits[r].why for r in everywhere}):
            rules = [r for r in everywhere if self.hits[r].why == why]
            out.append(f"fleet: judged on every engine's series ({why}): {', '.join(rules)}")
        out += describe(self.hits)
        out += [f"split: {n}" for n in client.notes]
        return out


def diagnose_fleet(
    client: PromClient,
    start: float,
    end: float,
    step: float,
    rules: Iterable[Rule] | None = None,
    params: dict[str, dict[str, Any]] | None = None,
    time_scale: float | None = None,
    levers: dict[str, Lever] | None = None,
    source: str = "",
    catalog: Catalog | None = None,
    place: Mapping[str, str] | None = None,
) -> tuple[Diagnosis, FleetReport]:
    """The Diagnosis `diagnose()` would give on the full window, from the TSDB's candidates.
    `place` (label -> value, the webhook's alert's): the findings at that place only, the same
    as the whole fleet's there: only the candidate groups at the place are read
    (candidates.py `place_matchers`), and their evidence fetched; groups of other places are
    left out, so findings elsewhere are missing, not quiet. Rules judged on every engine's
    series are judged on every engine's as without it."""
    rules = list(rules) if rules is not None else read_rules()
    levers = levers if levers is not None else load_levers()
    catalog = catalog or load_catalog()
    params = params or {}
    grid = make_grid(start, end, step)
    scale = auto_time_scale(float(grid[-1] - grid[0])) if time_scale is None else time_scale
    prepared = [r.with_params(params.get(r.id, {})).scaled(scale) for r in rules]
    report = FleetReport()
    t0 = time.perf_counter()
    if scale == 1.0:
        report.asked_end = end
        report.end = end = _records_end(client, rules, start, end)
        grid = make_grid(start, end, step)
    client.say("fleet: inventory")
    present, facts = inventory(client, prepared, start, end, catalog)
    # the index as a frame: its sample names, and the facts some series carries (not whose)
    shell = Frame(
        ts=grid, blocks={n: Block([], np.zeros((0, len(grid)))) for n in present}, facts={"": dict.fromkeys(facts, "")}
    )
    results: dict[str, list[Finding] | Skipped] = {r.id: s for r in prepared if (s := precheck(r, shell)) is not None}
    todo = [rule for rule in prepared if rule.id not in results]
    report.seconds["inventory"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    client.say(f"fleet: candidates of {len(todo)} rules")
    report.hits = hits = _candidates(client, rules, todo, params, scale, grid, catalog, place)
    young = _young_instances(client, todo, start, end, catalog, (place or {}).get("instance"))
    report.young = max((len(v) for v in young.values() if v is not None), default=0)
    for rule in todo:
        if rule.id in young and young[rule.id] != []:
            hits[rule.id] = _with_young(hits[rule.id], young[rule.id], len(grid))
    report.seconds["candidates"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    reader = InlineSignals(catalog)
    plans = [(rule, hits[rule.id]) for rule in todo if hits[rule.id].everywhere or hits[rule.id].groups]
    needs = client.map(
        lambda item: rule_needs(client, item[0], rule_reach(item[0], step), item[1], grid, step, reader), plans
    )
    fetched = fetch_needs(client, [nd for rule_needs_, _ in needs for nd in rule_needs_], grid, step, catalog)
    report.fetched = fetched
    report.evidence_series, report.evidence_points = fetched.series, fetched.points
    report.evidence_fetches = fetched.fetches
    report.seconds["evidence"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    judged_here = {rule.id for rule, _ in plans}
    guessed = {rule.id for rule in todo if rule.id not in judged_here}
    # no candidate: quiet, as the full fetch finds it (or with its mechanism off, or no series for
    # any group: no finding either way; `precheck` above said what the index can say)
    results.update({rid: [] for rid in guessed})
    for (rule, h), (rule_needs_, judged) in zip(plans, needs, strict=True):
        res = evaluate_rule(rule, rule_frame(fetched, rule_needs_, grid, judged), levers)
        if isinstance(res, Skipped) and not h.everywhere and res.reason.startswith(_FLEET_WIDE):
            res = []  # the candidates' rows do not speak for the fleet's mechanism
            guessed.add(rule.id)
        results[rule.id] = res
    deciding = guessed & _deciding(prepared, results, present)
    for rule in prepared:
        if rule.id in deciding and results[rule.id] == []:
            results[rule.id] = _judged_in_full(client, rule, grid, step, catalog, levers)
    report.seconds["evaluate"] = time.perf_counter() - t0
    ordered = [results[rule.id] for rule in prepared]
    return conclude(prepared, ordered, present, (float(grid[0]), float(grid[-1])), source, scale), report


def _candidates(
    client: PromClient,
    rules: list[Rule],
    todo: list[Rule],
    params: dict[str, dict[str, Any]],
    scale: float,
    grid: np.ndarray,
    catalog: Catalog,
    place: Mapping[str, str] | None = None,
) -> dict[str, Hits]:
    """Per rule to judge, its candidates from the records (those at `place` only, when given),
    or why every engine is judged."""
    ids = {r.id for r in todo}
    own = [r for r in rules if r.id in ids]
    out: dict[str, Hits] = {}
    if scale != 1.0:
        why = f"time scale {scale:g}: the records are the rules' at scale 1 (windows of 15 min or more)"
        return {r.id: Hits(everywhere=True, why=why) for r in own}
    versions = {}
    for rid, (expr, version) in candidate_exprs(own, catalog).items():
        if params.get(rid):
            out[rid] = Hits(everywhere=True, why="parameters other than the records' defaults")
        elif expr is None:
            out[rid] = Hits(everywhere=True, why="no PromQL form, no candidate record")
        else:
            versions[rid] = version
    if versions:
        holds = {r.id: float(hold_steps(r, 1.0)) for r in own}
        try:
            out.update(read_candidates(client, versions, holds, grid, place))
        except PromError as exc:
            if exc.status not in (400, 422, 503, 504):
                raise
            out.update({rid: Hits(everywhere=True, why=f"candidate query refused: {exc}") for rid in versions})
    return out


def _present() -> float:
    """The time now: a function of its own, so a test over backfilled data can say when now is."""
    return time.time()


def _records_end(client: PromClient, rules: list[Rule], start: float, end: float) -> float:
    """`end`, or the candidate records' newest evaluation when they lag it by less than
    RECORD_LAG_S (candidates.py `records_end`); `end` where the TSDB refuses the query. Only a
    window ending within RECORD_LAG_S of the present can be ahead of a live rule group: records
    missing at the end of an older window are missing, and those rules are judged in full there."""
    if _present() - end > RECORD_LAG_S:
        return end
    try:
        return records_end(client, [r.id for r in rules], start, end)
    except PromError as exc:
        if exc.status not in (400, 422, 503, 504):
            raise
        return end


# ------------------------------------------------------------------------------ inventory
def inventory(
    client: PromClient, rules: list[Rule], start: float, end: float, catalog: Catalog
) -> tuple[set[str], set[str]]:
    """(the canonical sample names with any series in the window, the engine facts some series
    in it may carry: an info gauge's labels or a static gauge's value), from the TSDB's index."""
    names = set().union(*(sample_names(r) for r in rules))
    pattern = wire_pattern(names, catalog, facts=True)
    window = set(client.label_values("__name__", [f'{{__name__=~"{pattern}"}}'], start - DEFAULT_LOOKBACK_S, end))
    present = {n for n in names if any(map(re.compile(wire_pattern({n}, catalog)).fullmatch, window))}
    wanted = {f.fact for r in rules for f in r.tree.facts}
    carried = set()
    for src in catalog.facts:
        spelled = re.compile("|".join(re.escape(n) for n in {src.name, ray_spelling(src.name)}))
        if any(map(spelled.fullmatch, window)):
            carried |= {src.fact} if src.fact else {w for w in wanted if not src.labels or w in src.labels}
    return present, carried


def _young_instances(
    client: PromClient, rules: list[Rule], start: float, end: float, catalog: Catalog, instance: str | None = None
) -> dict[str, list[str] | None]:
    """Per rule, the instances in the window without data at its start minus the rule's reach
    (None: every instance is): one range query with a point at each reach (instant queries for
    the others), over every series but the histograms' buckets (a histogram's `_count` ages with
    them, at a tenth of the series). With `instance` (the webhook's alert's), a young instance
    other than it is left out: it is no candidate at the alert's place."""
    if not rules:
        return {}
    names = {re.sub("_bucket$", "_count", n) for r in rules for n in sample_names(r)}
    sel = f'{{__name__=~"{wire_pattern(names, catalog)}",__name__!~".+_bucket"}}'
    every = set(client.label_values("instance", [sel], start - DEFAULT_LOOKBACK_S, end))
    reaches = {r.id: int(max(rule_reach(r), 1)) for r in rules}
    if not every:
        return {}

    distinct = sorted(set(reaches.values()))
    olds: dict[int, set[str]] = {}
    ranged = [r for r in distinct if r % 15 == 0]
    if len(ranged) > 2 and (ranged[-1] - ranged[0]) // math.gcd(*ranged) <= 1000:
        # one range query whose points fall at start minus each reach (a point the answer lacks,
        # e.g. a grid the TSDB moved, is asked alone below)
        answer = client.query_range(
            f"group by (instance) ({sel})", start - ranged[-1], start - ranged[0], math.gcd(*ranged)
        )
        held = {
            str((s.get("metric") or {}).get("instance", "")): {
                round(float(t)) for t in as_points(s.get("values"))[:, 0]
            }
            for s in answer
        }
        for r in ranged:
            if any(round(start - r) in at for at in held.values()):
                olds[r] = {inst for inst, at in held.items() if round(start - r) in at}

    def old(reach: int) -> set[str]:
        answer = client.query(f"group by (instance) ({sel} offset {reach}s)", start)
        return {str((s.get("metric") or {}).get("instance", "")) for s in answer}

    rest = [r for r in distinct if r not in olds]
    olds.update(zip(rest, client.map(old, rest), strict=True))
    young = {rid: every - olds[reach] for rid, reach in reaches.items()}
    return {
        rid: None if ids >= every else sorted(i for i in ids if instance in (None, i)) for rid, ids in young.items()
    }


def _with_young(h: Hits, young: list[str] | None, n: int) -> Hits:
    """Young instances are candidates of the rule over the whole window (every instance young:
    the rule is judged everywhere, as the full path does)."""
    if h.everywhere:
        return h
    if young is None:
        return replace(h, groups=[], everywhere=True, why="every instance is younger than the rule's reach")
    return replace(h, groups=list(h.groups) + [Group({"instance": i}, 0, n - 1) for i in young])


# ------------------------------------------------------------------------------ no candidates
_FLEET_WIDE = (NO_GROUPS, MECHANISM_OFF, MECHANISM_UNKNOWN)


def _deciding(prepared: list[Rule], results: dict[str, list[Finding] | Skipped], present: set[str]) -> set[str]:
    """The rules a finding defers to where its direct evidence is in the window: whether they
    could look decides whether the finding stands (evaluate/confidence.py `settle`), so a rule
    among them that the inventory judged quiet is judged on its series."""
    direct = direct_present(prepared, present)
    return {
        rid
        for res in results.values()
        if not isinstance(res, Skipped)
        for f in res
        if direct.get(f.rule_id)
        for rid in f.defers_to
    }


def _judged_in_full(
    client: PromClient, rule: Rule, grid: np.ndarray, step: float, catalog: Catalog, levers: dict[str, Lever]
) -> list[Finding] | Skipped:
    """The rule on every instance's series over the whole window (what the full path does)."""
    client.say(f"fleet: {rule.id}: judged on every instance's series (a finding that defers to it stands or not)")
    frame = fetch_frame(client, sample_names(rule), float(grid[0]), float(grid[-1]), step, catalog=catalog)
    return evaluate_rule(rule, frame, levers)
