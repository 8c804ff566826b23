"""Diagnose a fleet in a Prometheus-compatible TSDB without pulling the fleet into the client.

1. **Inventory** (index only, no samples): which upstream and `kvscope_*` names exist in the
   window (rules whose signals are all absent are skipped exactly as the evaluator skips them)
   and which `kvscope:<series>` recording rules the TSDB has (read instead of the inline union).
2. **Prefilter** (prefilter.py): one range query per rule on the evaluation grid; the answer holds
   only the groups and steps where the loosened condition held.
3. **Evidence**: for the rules that matched, the raw series they read, for the instances that
   matched (every instance when a rule compares against peers or the fleet) and from the first
   match minus the rule's reach, through the full-fetch code (sources/prometheus.py), batched and
   split by the client (promapi.py).
4. **Evaluate**: the numpy evaluator runs each such rule over that frame, judging conditions only
   from the first match (minus a safety margin) on; the grid is the whole window's, so `since`,
   `active`, evidence and scores are the full path's. Moderate-confidence findings then fold into
   or yield to the direct rules they defer to (evaluate/confidence.py), as in `diagnose()`.

Findings equal the full fetch's as long as each prefilter holds wherever the evaluator's condition
does (tests/integration/test_pushdown.py checks it on every recording of the incident library and
per rule on the rule test cases).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from kvscope.agent.signals import Catalog, load_catalog
from kvscope.diagnoser.evaluate.confidence import direct_present, settle
from kvscope.diagnoser.evaluate.evaluator import (
    auto_time_scale,
    evaluate_rule,
    rank,
    required_absent,
    sample_names,
)
from kvscope.diagnoser.evaluate.frame import DEFAULT_LOOKBACK_S, Block, Frame, make_grid
from kvscope.diagnoser.findings import Diagnosis, Finding, Skipped
from kvscope.diagnoser.promql.signals import InlineSignals
from kvscope.diagnoser.pushdown.prefilter import SLACK, Prefilter, compile_prefilter
from kvscope.diagnoser.rulebook.levers import Lever, load_levers
from kvscope.diagnoser.rulebook.rule import Rule, read_rules
from kvscope.diagnoser.sources.promapi import PromClient, PromError
from kvscope.diagnoser.sources.prometheus import KVSCOPE_PREFIX, fetch_frame, native_names

SAFETY_S = 300.0
"""Conditions are judged from this long (plus the rule's `for`) before a prefilter's first match."""


@dataclass
class RuleTrace:
    """What the pushdown did for one rule (printed with -v, counted in the summary)."""

    rule_id: str
    prefilter: Prefilter | None = None
    groups: int = 0                      # groups the prefilter matched
    instances: list[str] | None = None   # evidence fetched for these (None: every instance)
    judged_from: float | None = None     # first grid time judged
    error: str = ""                      # a prefilter the server refused (evaluated in full)


@dataclass
class PushdownReport:
    """The two phases' cost and what was split."""

    rules: list[RuleTrace] = field(default_factory=list)
    recorded: int = 0                    # canonical series read from kvscope:* recording rules
    young: int = 0                       # instances whose data starts within the rules' reach
    frame: Frame | None = None           # the evidence fetched (every rule's series where it matched)
    evidence_series: int = 0
    evidence_points: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def summary(self, client: PromClient) -> list[str]:
        """Lines for stderr: what was pushed down, fetched and split."""
        matched = [t for t in self.rules if t.groups or (t.prefilter and t.prefilter.expr is None)]
        everywhere = [t.rule_id for t in self.rules if t.prefilter is not None and t.prefilter.expr is None]
        refused = [t.rule_id for t in self.rules if t.error]
        out = [f"pushdown: {sum(1 for t in self.rules if t.prefilter and t.prefilter.expr)} rule conditions "
               f"evaluated in the TSDB ({self.recorded} series from kvscope:* recording rules, the rest from "
               f"the engines' own series); {len(matched)} matched, evidence: {self.evidence_series} series, "
               f"{self.evidence_points:,} points; {int(client.stats['queries'])} queries, "
               f"{client.stats['bytes'] / 1e6:.1f} MB; "
               + ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())]
        if self.young:
            out.append(f"pushdown: {self.young} instance(s) have no data from before the window's start minus "
                       "the rules' reach; they are judged in full (windows at a series' first samples are "
                       "clipped by the evaluator and extrapolated by PromQL, so no prefilter can stand in)")
        if everywhere:
            out.append(f"pushdown: no server-side form, evidence fetched for every engine: {', '.join(everywhere)}")
        if refused:
            out.append(f"pushdown: prefilter refused or timed out on the server, judged on every engine's evidence: "
                       f"{', '.join(refused)}")
        out += [f"split: {n}" for n in client.notes]
        return out


def diagnose_pushdown(client: PromClient, start: float, end: float, step: float,
                      rules: Iterable[Rule] | None = None, params: dict[str, dict[str, Any]] | None = None,
                      time_scale: float | None = None, levers: dict[str, Lever] | None = None,
                      source: str = "", catalog: Catalog | None = None,
                      slack: float = SLACK) -> tuple[Diagnosis, PushdownReport]:
    """The Diagnosis `diagnose()` would give on the full window, with the TSDB doing the filtering."""
    rules = list(rules) if rules is not None else read_rules()
    levers = levers if levers is not None else load_levers()
    catalog = catalog or load_catalog()
    grid = make_grid(start, end, step)
    scale = auto_time_scale(float(grid[-1] - grid[0])) if time_scale is None else time_scale
    prepared = [r.with_params((params or {}).get(r.id, {})).scaled(scale) for r in rules]
    report = PushdownReport()
    t0 = time.perf_counter()
    client.say("pushdown: inventory")
    present, recorded = inventory(client, prepared, start, end, catalog)
    report.recorded = len(recorded)
    report.seconds["inventory"] = time.perf_counter() - t0
    shell = Frame(ts=grid, blocks={n: Block([], np.zeros((0, len(grid)))) for n in present})
    results: dict[str, list[Finding] | Skipped] = {}
    todo: list[tuple[Rule, RuleTrace]] = []
    for rule in prepared:
        skipped = _skip(rule, shell)
        if skipped is not None:
            results[rule.id] = skipped
            continue
        trace = RuleTrace(rule.id, compile_prefilter(rule, InlineSignals(catalog, recorded), catalog, step, slack))
        report.rules.append(trace)
        todo.append((rule, trace))
    t0 = time.perf_counter()
    client.say(f"pushdown: {len(todo)} rule conditions on the TSDB")
    hits = client.map(lambda item: _prefilter_hits(client, item[1], grid, step), todo)
    young = _young_instances(client, prepared, [t for _, t in todo], start, end, catalog)
    if young:
        report.young = len(young)
        hits = [_with_young(h, young) for h in hits]
    report.seconds["prefilter"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    plans = [(rule, trace, h) for (rule, trace), h in zip(todo, hits, strict=True) if h is not None]
    frames = _evidence(client, plans, grid, step, catalog, report)
    report.frame = _merged(frames, grid)
    report.seconds["evidence"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for rule, trace, _ in plans:
        frame = _rule_frame(frames, rule, trace, grid)
        results[rule.id] = evaluate_rule(rule, frame, levers)
    quiet = [(rule, trace) for rule, trace in todo if rule.id not in results]
    empty = client.map(lambda item: _no_groups(client, item[0], catalog, recorded, grid), quiet)
    for (rule, _trace), none in zip(quiet, empty, strict=True):
        results[rule.id] = Skipped(rule.id, "no series for any group") if none else []
    report.seconds["evaluate"] = time.perf_counter() - t0
    findings: list[Finding] = []
    skipped_list: list[Skipped] = []
    for rule in prepared:
        res = results[rule.id]
        if isinstance(res, Skipped):
            skipped_list.append(res)
        else:
            findings.extend(res)
    evaluated = [rid for rid, res in results.items() if not isinstance(res, Skipped)]
    findings, skipped_list = settle(findings, skipped_list, evaluated, direct_present(prepared, present))
    window = (float(grid[0]), float(grid[-1]))
    return replace(rank(findings, window, source, skipped_list, len(rules)), time_scale=scale), report


# ------------------------------------------------------------------------------ phase 0
def inventory(client: PromClient, rules: list[Rule], start: float, end: float,
              catalog: Catalog) -> tuple[set[str], set[str]]:
    """(canonical sample names with any series in the window, canonical series with a kvscope:*
    recording rule), from the TSDB's index."""
    names = set().union(*(sample_names(r) for r in rules))
    pattern = wire_pattern(names, catalog)
    raw = set(client.label_values("__name__", [f'{{__name__=~"{pattern}"}}'],
                                  start - DEFAULT_LOOKBACK_S, end))
    present = {n for n in names if any(re.fullmatch(wire_pattern({n}, catalog), r) for r in raw)}
    rec = client.label_values("__name__", ['{__name__=~"kvscope:.+"}'], start - DEFAULT_LOOKBACK_S, end)
    recorded = {r[len("kvscope:"):] for r in rec} & names
    return present, recorded


def wire_pattern(names: set[str], catalog: Catalog) -> str:
    """A regex of every name on the wire that produces the canonical sample names."""
    alternatives = set()
    for declared in native_names(names, catalog) - {f.name for f in catalog.facts}:
        alternatives.add(re.escape(declared))
        if ":" in declared:
            alternatives.add(re.escape(declared.replace(":", "_", 1)))
    native = "|".join(sorted(alternatives)) or "$^"
    kv = "|".join(sorted(re.escape(KVSCOPE_PREFIX + n) for n in names))
    return f"(({native})(_total|_bucket|_sum|_count)?)|({kv})"


def _skip(rule: Rule, shell: Frame) -> Skipped | None:
    """The evaluator's own reasons to skip a rule before reading any value."""
    missing = rule.missing_params()
    if missing and len(missing) == rule.nullable_params():
        return Skipped(rule.id, f"parameter(s) not set: {', '.join(missing)}")
    absent = required_absent(rule, shell)
    if absent:
        return Skipped(rule.id, f"signal(s) absent: {', '.join(sorted(absent))}")
    return None


# ------------------------------------------------------------------------------ phase 1
@dataclass
class Hits:
    """Where a prefilter matched: its groups, and the first grid index it matched at."""

    groups: list[dict[str, str]]
    first: int
    everywhere: bool = False


def _prefilter_hits(client: PromClient, trace: RuleTrace, grid: np.ndarray, step: float) -> Hits | None:
    pre = trace.prefilter
    assert pre is not None
    if pre.expr is None:
        return Hits([], 0, everywhere=True)
    try:
        qstep = pre.step or step
        last = float(grid[0]) + qstep * int((grid[-1] - grid[0]) // qstep)
        result = client.range_parts(pre.expr, float(grid[0]), last, qstep, series=0,
                                    what=f"prefilter {pre.rule_id}")
        if last < grid[-1]:                       # the window's last grid points, at the grid step
            result += client.query_range(pre.expr, last + step, float(grid[-1]), step)
    except PromError as exc:
        # a prefilter the server cannot run (an unsupported function, its own timeout or size
        # limit) costs speed, not answers: the rule is judged on every engine's evidence
        if exc.status not in (400, 422, 503, 504):
            raise
        trace.error = str(exc)
        return Hits([], 0, everywhere=True)
    first = len(grid)
    groups = []
    for series in result:
        values = series.get("values") or []
        if not values:
            continue
        groups.append(dict(series.get("metric") or {}))
        t = min(float(v[0]) for v in values)
        first = min(first, int(np.searchsorted(grid, t - 1e-6)))
    trace.groups = len(groups)
    return Hits(groups, first) if groups else None


def _no_groups(client: PromClient, rule: Rule, catalog: Catalog, recorded: set[str], grid: np.ndarray) -> bool:
    """Whether none of the rule's own-grouping signal series has any series in the window (the
    evaluator skips such a rule as "no series for any group"): one coarse range query."""
    from kvscope.diagnoser.promql.alerts import SeriesCompiler
    from kvscope.diagnoser.rulebook.grammar import SIGNAL_FORMS, node_form

    step = float(grid[1] - grid[0]) if len(grid) > 1 else None
    comp = SeriesCompiler(rule, InlineSignals(catalog, recorded), step=step)
    by = ", ".join(rule.by)
    parts = []
    for node in rule.series.values():
        if node_form(node) not in SIGNAL_FORMS or tuple(node.get("by", rule.by)) != rule.by:
            continue
        series = str(node.get("histogram", "")) + "_bucket" if node_form(node) == "quantile" else \
            str(node["mean"]) + "_count" if node_form(node) == "mean" else str(node[node_form(node)])
        try:
            parts.append(f"count({comp._read(node, series, by)})")
        except Exception:  # noqa: BLE001 - a leaf PromQL cannot read: assume it has groups
            return False
    if not parts:
        return False
    coarse = max(float(grid[1] - grid[0]) if len(grid) > 1 else 1.0, min(DEFAULT_LOOKBACK_S, (grid[-1] - grid[0]) / 20))
    try:
        result = client.range_parts(" or ".join(parts), float(grid[0]), float(grid[-1]), coarse, what="groups")
    except PromError:
        return False
    return not any(s.get("values") for s in result)


def _young_instances(client: PromClient, rules: list[Rule], traces: list[RuleTrace], start: float, end: float,
                     catalog: Catalog) -> list[str]:
    """Instances in the window without data at its start minus the longest reach of the rules:
    near a series' first samples the evaluator clips its windows to what exists while PromQL
    extrapolates, so their prefilters cannot be trusted; they are candidates for every rule."""
    reach = max((t.prefilter.reach_s for t in traces if t.prefilter is not None), default=0.0)
    if not traces:
        return []
    names = set().union(*(sample_names(r) for r in rules))
    sel = f'{{__name__=~"{wire_pattern(names, catalog)}"}}'
    every = set(client.label_values("instance", [sel], start - DEFAULT_LOOKBACK_S, end))
    if not every:
        return []
    old = {str((s.get("metric") or {}).get("instance", ""))
           for s in client.query(f"group by (instance) ({sel} offset {int(max(reach, 1))}s)", start)}
    return sorted(every - old)


def _with_young(h: Hits | None, young: list[str]) -> Hits:
    if h is not None and h.everywhere:
        return h
    groups = list(h.groups) if h is not None else []
    return Hits(groups + [{"instance": i} for i in young], 0)


# ------------------------------------------------------------------------------ phase 2
def _per_instance(rule: Rule, pre: Prefilter) -> bool:
    """Whether a group's findings depend only on its own instance's series (else peers, the
    model or the fleet are read too, and every instance's evidence is fetched)."""
    if "instance" not in pre.by or "instance" not in rule.by:
        return False
    for node in rule.series.values():
        by = node.get("by", rule.by)
        if "instance" not in by:
            return False
    return True


def _evidence(client: PromClient, plans: list[tuple[Rule, RuleTrace, Hits]], grid: np.ndarray, step: float,
              catalog: Catalog, report: PushdownReport) -> dict[str, Frame]:
    """One fetch for the rules that read only matched instances, one for those that read every
    instance: each from the earliest point any of its rules needs."""
    some: dict[str, Any] = {"instances": set(), "names": set(), "from": float(grid[-1])}
    every: dict[str, Any] = {"names": set(), "from": float(grid[-1])}
    for rule, trace, hits in plans:
        pre = trace.prefilter
        assert pre is not None
        judged = 0 if hits.everywhere else max(0, hits.first - _steps(rule.duration(_for(rule)) + SAFETY_S, step))
        trace.judged_from = float(grid[judged])
        fetch_from = float(grid[max(0, judged - _steps(pre.reach_s, step) - 1)])
        if not hits.everywhere and _per_instance(rule, pre):
            trace.instances = sorted({g.get("instance", "") for g in hits.groups})
            target = some
            some["instances"] |= set(trace.instances)
        else:
            target = every
        target["names"] |= sample_names(rule)
        target["from"] = min(target["from"], fetch_from)
    frames: dict[str, Frame] = {}
    for key, spec in (("some", some), ("every", every)):
        if not spec["names"] or (key == "some" and not spec["instances"]):
            continue
        instances = sorted(spec["instances"]) if key == "some" else None
        client.say(f"pushdown: evidence for {len(instances) if instances is not None else 'every'} instance(s) "
                   f"from {time.strftime('%H:%M:%S', time.gmtime(spec['from']))}")
        frame = fetch_frame(client, spec["names"], float(grid[0]), float(grid[-1]), step, instances=instances,
                            fetch_from=spec["from"], catalog=catalog)
        frames[key] = frame
        for block in frame.blocks.values():
            report.evidence_series += len(block.labels)
            report.evidence_points += int(np.count_nonzero(~np.isnan(block.values)))
    return frames


def _merged(frames: dict[str, Frame], grid: np.ndarray) -> Frame:
    """One frame of all evidence fetched (for charts): every-instance blocks win over partial ones."""
    out = Frame(ts=grid)
    for key in ("some", "every"):
        frame = frames.get(key)
        if frame is not None:
            out.blocks.update(frame.blocks)
            out.facts.update(frame.facts)
    return out


def _for(rule: Rule) -> Any:
    if "cascade" in rule.doc:
        return (rule.doc["cascade"] or {}).get("for", "0s")
    return (rule.doc.get("when") or {}).get("for", "0s")


def _steps(seconds: float, step: float) -> int:
    return int(np.ceil(seconds / step - 1e-9))


def _rule_frame(frames: dict[str, Frame], rule: Rule, trace: RuleTrace, grid: np.ndarray) -> Frame:
    """The rule's own frame: its sample names, its instances, its first judged point."""
    src = frames.get("some" if trace.instances is not None else "every")
    names = sample_names(rule)
    keep = set(trace.instances) if trace.instances is not None else None
    blocks = {}
    for name in names:
        block = None if src is None else src.blocks.get(name)
        if block is None:
            continue
        if keep is None:
            blocks[name] = block
            continue
        rows = [i for i, lab in enumerate(block.labels) if dict(lab).get("instance", "") in keep]
        if rows:
            blocks[name] = Block([block.labels[i] for i in rows], block.values[rows])
    facts = {} if src is None else {k: v for k, v in src.facts.items() if keep is None or k in keep}
    judged = int(np.searchsorted(grid, (trace.judged_from or grid[0]) - 1e-6))
    return Frame(ts=grid, blocks=blocks, facts=facts, judged_from=judged)
