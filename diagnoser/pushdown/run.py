"""Diagnose a fleet in a Prometheus-compatible TSDB without pulling the fleet into the client.

1. **Inventory** (index only, no samples): which upstream and `kvscope_*` names exist in the
   window (rules whose signals are all absent are skipped exactly as the evaluator skips them),
   which `kvscope:<series>` recording rules the TSDB has (read instead of the inline union), and
   which labels the upstream series carry (a relabel of a label none carries is left out of the
   PromQL: promql/signals.py InlineSignals).
2. **Prefilter** (prefilter.py): the rule's loosened condition at a step its `for` allows, its
   conjuncts run cheapest first, each only where the earlier ones held, the `and` done by the
   client; the answer holds only the groups and steps where the condition held. The client keeps
   the groups with a stretch long enough for the rule's `for` (candidates.py).
3. **Evidence** (evidence.py): for the rules with candidates, the raw series their leaves read,
   per leaf: the candidates' own instances, their models' replicas for model-level leaves, every
   instance only for fleet-level leaves; over the stretches where they can fire, widened by a
   margin and by the rule's reach. Fetched through the full-fetch code (sources/prometheus.py),
   batched and split by the client (promapi.py).
4. **Evaluate**: the numpy evaluator runs each such rule over its own rows, judging conditions only
   inside those stretches; the grid is the whole window's, so `since`, `active`, evidence and
   scores are the full path's. Findings are kept at candidate groups; moderate-confidence findings
   then fold into or yield to the direct rules they defer to (evaluate/confidence.py), as in
   `diagnose()`.

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
from kvscope.diagnoser.evaluate.frame import DEFAULT_LOOKBACK_S, Block, Frame, JudgedSpans, make_grid
from kvscope.diagnoser.findings import Diagnosis, Finding, Skipped
from kvscope.diagnoser.promql.signals import QUANTILE_BY, InlineSignals
from kvscope.diagnoser.pushdown.candidates import Group, Hits, part_cost, query_prefilter
from kvscope.diagnoser.pushdown.evidence import Need, fetch_needs, rule_frame, rule_needs
from kvscope.diagnoser.pushdown.prefilter import SLACK, Prefilter, compile_prefilter, rule_reach
from kvscope.diagnoser.rulebook.levers import Lever, load_levers
from kvscope.diagnoser.rulebook.rule import Rule, read_rules
from kvscope.diagnoser.sources.promapi import PromClient, PromError
from kvscope.diagnoser.sources.prometheus import KVSCOPE_PREFIX, fetch_frame, native_names

NO_GROUPS = "no series for any group"


@dataclass
class RuleTrace:
    """What the pushdown did for one rule (printed with -v, counted in the summary)."""

    rule_id: str
    prefilter: Prefilter | None = None
    matched: int = 0  # groups in the prefilter's answer
    groups: int = 0  # candidates: groups with a stretch long enough to fire
    instances: int | None = None  # instances whose evidence the rule read (None: every one)
    judged_from: float | None = None  # first grid time judged
    judged_to: float | None = None  # last grid time judged
    judged_points: int = 0  # grid points judged, summed over candidates
    error: str = ""  # a prefilter the server refused (evaluated in full)
    moved: bool = False  # the server answered at other times (candidates widened)
    coarse: int | None = None  # candidates at the query step, when re-read at the grid step
    narrowed: int = 0  # conjunct queries narrowed to the instances earlier ones held for


@dataclass
class PushdownReport:
    """The phases' cost and what was split."""

    rules: list[RuleTrace] = field(default_factory=list)
    recorded: int = 0  # canonical series read from kvscope:* recording rules
    quantiles: int = 0  # recorded quantiles the TSDB has (promql/quantiles.py)
    young: int = 0  # instances whose data starts within the rules' reach
    frame: Frame | None = None  # the evidence fetched (every rule's series where it matched)
    evidence_series: int = 0
    evidence_points: int = 0
    evidence_fetches: int = 0
    prefilter_queries: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def summary(self, client: PromClient) -> list[str]:
        """Lines for stderr: what was pushed down, fetched and split."""
        candidates = [t for t in self.rules if t.groups or (t.prefilter and t.prefilter.expr is None)]
        everywhere = [t.rule_id for t in self.rules if t.prefilter is not None and t.prefilter.expr is None]
        refused = [t.rule_id for t in self.rules if t.error]
        matched = sum(1 for t in self.rules if t.matched)
        reread = [t for t in self.rules if t.coarse is not None]
        narrowed = (
            f" (re-read at the grid step: {sum(t.coarse or 0 for t in reread)} coarse candidate groups of "
            f"{len(reread)} rule(s) -> {sum(t.groups for t in reread)})"
            if reread
            else ""
        )
        fewer = sum(t.narrowed for t in self.rules)
        narrowed += f"; {fewer} conjunct queries narrowed to the instances earlier ones held for" if fewer else ""
        out = [
            f"pushdown: {sum(1 for t in self.rules if t.prefilter and t.prefilter.expr)} rule conditions "
            f"evaluated in the TSDB ({self.recorded} series from kvscope:* recording rules, "
            f"{self.quantiles} recorded quantiles, the rest from the engines' own series); {matched} matched, "
            f"{len(candidates)} with a stretch long enough to fire{narrowed}; evidence: "
            f"{self.evidence_series} series, {self.evidence_points:,} points in "
            f"{self.evidence_fetches} fetch(es); {int(client.stats['queries'])} queries, "
            f"{client.stats['bytes'] / 1e6:.1f} MB; " + ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())
        ]
        if self.young:
            out.append(
                f"pushdown: {self.young} instance(s) have no data from before the window's start minus "
                "the rules' reach; they are judged in full (windows at a series' first samples are "
                "clipped by the evaluator and extrapolated by PromQL, so no prefilter can stand in)"
            )
        if everywhere:
            out.append(f"pushdown: no server-side form, evidence fetched for every engine: {', '.join(everywhere)}")
        moved = [t.rule_id for t in self.rules if t.moved]
        if moved:
            out.append(
                f"pushdown: the TSDB answered prefilters at other times than asked (a cache or query "
                f"frontend that aligns steps), their candidates were widened by one query step: "
                f"{', '.join(moved)}"
            )
        if refused:
            out.append(
                f"pushdown: prefilter refused or timed out on the server, judged on every engine's evidence: "
                f"{', '.join(refused)}"
            )
        out += [f"split: {n}" for n in client.notes]
        return out


def diagnose_pushdown(
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
    slack: float = SLACK,
) -> tuple[Diagnosis, PushdownReport]:
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
    present, recorded, wire = inventory(client, prepared, start, end, catalog)
    report.recorded = len(recorded)
    reader = lean_reader(client, prepared, start, end, catalog, recorded, wire)
    report.quantiles = len(reader.quantiles)
    report.seconds["inventory"] = time.perf_counter() - t0
    shell = Frame(ts=grid, blocks={n: Block([], np.zeros((0, len(grid)))) for n in present})
    results: dict[str, list[Finding] | Skipped] = {}
    todo: list[tuple[Rule, RuleTrace]] = []
    for rule in prepared:
        skipped = _skip(rule, shell)
        if skipped is not None:
            results[rule.id] = skipped
            continue
        trace = RuleTrace(rule.id, compile_prefilter(rule, reader, catalog, step, slack))
        report.rules.append(trace)
        todo.append((rule, trace))
    t0 = time.perf_counter()
    client.say(f"pushdown: {len(todo)} rule conditions on the TSDB")
    q0 = client.stats["queries"]
    hits = _longest_first(client, todo, lambda item: _hits(client, item[1], grid, step))
    young, every = _young_instances(client, prepared, [t for _, t in todo], start, end, catalog)
    report.prefilter_queries = int(client.stats["queries"] - q0)
    if young:
        report.young = len(young)
        hits = [_with_young(h, young, len(grid), set(young) >= every) for h in hits]
    report.seconds["prefilter"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    plans = [(rule, trace, h) for (rule, trace), h in zip(todo, hits, strict=True) if h.everywhere or h.groups]
    needs = client.map(lambda item: _needs(client, item, grid, step, reader), plans)
    fetched = fetch_needs(client, [nd for rule_needs_, _ in needs for nd in rule_needs_], grid, step, catalog)
    report.frame = fetched.frame
    report.evidence_series, report.evidence_points = fetched.series, fetched.points
    report.evidence_fetches = fetched.fetches
    report.seconds["evidence"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for (rule, _trace, h), (rule_needs_, judged) in zip(plans, needs, strict=True):
        res = evaluate_rule(rule, rule_frame(fetched, rule_needs_, grid, judged), levers)
        if isinstance(res, Skipped) and res.reason == NO_GROUPS and not h.everywhere:
            # the candidates' rows were empty: whether other instances have groups decides
            state = _has_groups(client, rule, reader, grid, present)
            res = [] if state else res if state is False else _judged_in_full(client, rule, grid, step, catalog, levers)
        results[rule.id] = res
    quiet = [(rule, trace) for rule, trace in todo if rule.id not in results]
    states = client.map(lambda item: _has_groups(client, item[0], reader, grid, present), quiet)
    for (rule, _trace), state in zip(quiet, states, strict=True):
        results[rule.id] = (
            []
            if state
            else Skipped(rule.id, NO_GROUPS)
            if state is False
            else _judged_in_full(client, rule, grid, step, catalog, levers)
        )
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
def inventory(
    client: PromClient, rules: list[Rule], start: float, end: float, catalog: Catalog
) -> tuple[set[str], set[str], set[str]]:
    """(canonical sample names with any series in the window, canonical series with a kvscope:*
    recording rule, the wire names present from the window's start minus the rules' reach), from
    the TSDB's index."""
    names = set().union(*(sample_names(r) for r in rules))
    pattern = wire_pattern(names, catalog)
    reach = max((rule_reach(r) for r in rules), default=0.0)
    raw = set(client.label_values("__name__", [f'{{__name__=~"{pattern}"}}'], start - reach - DEFAULT_LOOKBACK_S, end))
    window = set(client.label_values("__name__", [f'{{__name__=~"{pattern}"}}'], start - DEFAULT_LOOKBACK_S, end))
    present = {n for n in names if any(re.fullmatch(wire_pattern({n}, catalog), r) for r in window)}
    rec = client.label_values("__name__", ['{__name__=~"kvscope:.+"}'], start - DEFAULT_LOOKBACK_S, end)
    recorded = {r[len("kvscope:") :] for r in rec} & names
    return present, recorded, raw


def lean_reader(
    client: PromClient,
    rules: list[Rule],
    start: float,
    end: float,
    catalog: Catalog,
    recorded: set[str],
    wire: set[str],
) -> InlineSignals:
    """How the prefilters read each signal: the `kvscope:*` recordings the TSDB has, the sources
    whose wire names it has (`wire`), relabelling only the labels those series carry, a histogram's
    quantile per raw histogram where each group has one (the +Inf buckets' label sets)."""
    reach = max((rule_reach(r) for r in rules), default=0.0)
    first = start - reach - DEFAULT_LOOKBACK_S
    carried, integer_le = wire_labels(client, wire, first, end)
    return InlineSignals(
        catalog,
        recorded,
        present=wire,
        carried=carried,
        integer_le=integer_le,
        histograms=histogram_series(client, wire, first, end),
        quantiles=recorded_quantiles(client, rules, wire, start, end),
    )


def recorded_quantiles(
    client: PromClient, rules: list[Rule], wire: set[str], start: float, end: float
) -> frozenset[tuple[str, str, str]]:
    """The recorded quantiles (promql/quantiles.py: name, `quantile`, `kvscope_by`) that cover the
    window and the reach of the rules that read quantiles: present at the window's end and at its
    start minus that reach (at its start, where the engines' buckets begin after that). Records
    installed later than the data they stand for are not read. Empty when the server cannot say."""
    reach = max((rule_reach(r) for r in rules if any("quantile" in n for n in r.series.values())), default=0.0)
    buckets = sorted(n for n in wire if n.endswith("_bucket"))
    try:
        at_end = _quantile_keys(client, end)
        if not at_end:  # no records: nothing more to ask
            return frozenset()
        early = start - reach
        if not buckets or not client.query(f"count({_names(buckets)})", early):
            early = start  # the engines' buckets begin later: so may the records
        return frozenset(at_end & _quantile_keys(client, early))
    except PromError:
        return frozenset()


def _quantile_keys(client: PromClient, at: float) -> set[tuple[str, str, str]]:
    expr = f'count by (__name__, quantile, {QUANTILE_BY}) ({{__name__=~"kvscope:.+:quantile_.+"}})'
    return {
        (str(m.get("__name__", "")), str(m.get("quantile", "")), str(m.get(QUANTILE_BY, "")))
        for m in ((r.get("metric") or {}) for r in client.query(expr, at))
    }


def histogram_series(client: PromClient, wire: set[str], start: float, end: float) -> list[dict[str, str]] | None:
    """The label sets of the histograms in [start, end], one per histogram: the index's
    `le="+Inf"` bucket series (None when the server cannot say)."""
    buckets = sorted(n for n in wire if n.endswith("_bucket"))
    if not buckets:
        return []
    try:
        return client.series([_names(buckets, 'le="+Inf"')], start, end)
    except PromError:
        return None


def wire_labels(client: PromClient, wire: set[str], start: float, end: float) -> tuple[set[str] | None, bool]:
    """(the label names the upstream series `wire` carry in [start, end], whether any bucket
    bound is spelled as an integer), from the index; (None, True), which leaves every relabel
    in, when the server cannot say."""
    native = sorted(n for n in wire if not n.startswith(KVSCOPE_PREFIX))
    if not native:
        return set(), False
    buckets = [n for n in native if n.endswith("_bucket")]
    try:
        carried = set(client.label_names([_names(native)], start, end))
        bounds = client.label_values("le", [_names(buckets)], start, end) if buckets else []
    except PromError:
        return None, True
    return carried, any(re.fullmatch(r"[0-9]+", b) for b in bounds)


def _names(names: Iterable[str], *matchers: str) -> str:
    """A selector of the series named `names` (and `matchers`)."""
    return "{" + ",".join([f'__name__=~"{"|".join(re.escape(n) for n in names)}"', *matchers]) + "}"


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
def _longest_first(client: PromClient, todo: list[tuple[Rule, RuleTrace]], fn: Any) -> list[Hits]:
    """fn over the rules' prefilters, the costliest started first (part_cost per query step), so
    that the last to finish is not a long one started last; the answers in `todo`'s order."""

    def cost(i: int) -> float:
        pre = todo[i][1].prefilter
        return 0.0 if pre is None or pre.expr is None else part_cost(pre.expr) / max(pre.step, 1e-9)

    order = sorted(range(len(todo)), key=cost, reverse=True)
    answers = client.map(fn, [todo[i] for i in order])
    out: list[Hits] = [Hits()] * len(todo)
    for i, answer in zip(order, answers, strict=True):
        out[i] = answer
    return out


def _hits(client: PromClient, trace: RuleTrace, grid: np.ndarray, step: float) -> Hits:
    assert trace.prefilter is not None
    hits = query_prefilter(client, trace.prefilter, grid, step)
    trace.error = hits.error
    trace.moved = hits.moved
    trace.coarse = hits.coarse
    trace.narrowed = hits.narrowed
    trace.matched = hits.matched
    trace.groups = len(hits.groups)
    return hits


def _has_groups(
    client: PromClient, rule: Rule, reader: InlineSignals, grid: np.ndarray, present: set[str]
) -> bool | None:
    """Whether any of the rule's own-grouping signal series has a series in the window (else the
    evaluator skips the rule as "no series for any group"): one coarse range query. None when
    PromQL cannot tell (a leaf it cannot read whose samples the index has, and the others have
    none). A leaf whose samples are not in the window at all (`present`, from the index) has no
    group whether PromQL can read it or not."""
    from kvscope.diagnoser.promql.series import SeriesCompiler
    from kvscope.diagnoser.rulebook.grammar import SIGNAL_FORMS, node_form

    step = float(grid[1] - grid[0]) if len(grid) > 1 else None
    comp = SeriesCompiler(rule, reader, step=step)
    by = ", ".join(rule.by)
    parts = []
    unreadable = False
    for node in rule.series.values():
        if node_form(node) not in SIGNAL_FORMS or tuple(node.get("by", rule.by)) != rule.by:
            continue
        series = (
            str(node.get("histogram", "")) + "_bucket"
            if node_form(node) == "quantile"
            else str(node["mean"]) + "_count"
            if node_form(node) == "mean"
            else str(node[node_form(node)])
        )
        if series not in present:
            continue
        try:
            parts.append(f"count({comp._read(node, series, by)})")
        except Exception:  # noqa: BLE001 - a leaf PromQL cannot read
            unreadable = True
    if not parts:
        return None
    expr = " or ".join(dict.fromkeys(parts))
    coarse = max(float(grid[1] - grid[0]) if len(grid) > 1 else 1.0, min(DEFAULT_LOOKBACK_S, (grid[-1] - grid[0]) / 20))
    try:
        # a live fleet has series at the window's last point: one instant query reads minutes of
        # samples where the range query reads the whole window's
        if any(s.get("value") for s in client.query(expr, float(grid[-1]))):
            return True
        result = client.range_parts(expr, float(grid[0]), float(grid[-1]), coarse, what="groups")
    except PromError:
        return None
    if any(s.get("values") for s in result):
        return True
    return None if unreadable else False


def _judged_in_full(
    client: PromClient, rule: Rule, grid: np.ndarray, step: float, catalog: Catalog, levers: dict[str, Lever]
) -> list[Finding] | Skipped:
    """The rule on every instance's series over the whole window (what the full path does)."""
    client.say(f"pushdown: {rule.id}: judged on every instance's series (PromQL cannot tell whether it has groups)")
    frame = fetch_frame(client, sample_names(rule), float(grid[0]), float(grid[-1]), step, catalog=catalog)
    return evaluate_rule(rule, frame, levers)


def _young_instances(
    client: PromClient, rules: list[Rule], traces: list[RuleTrace], start: float, end: float, catalog: Catalog
) -> tuple[list[str], set[str]]:
    """(instances in the window without data at its start minus the longest reach of the rules,
    every instance in the window): near a series' first samples the evaluator clips its windows
    to what exists while PromQL extrapolates, so their prefilters cannot be trusted; they are
    candidates for every rule."""
    reach = max((t.prefilter.reach_s for t in traces if t.prefilter is not None), default=0.0)
    if not traces:
        return [], set()
    names = set().union(*(sample_names(r) for r in rules))
    sel = f'{{__name__=~"{wire_pattern(names, catalog)}"}}'
    every = set(client.label_values("instance", [sel], start - DEFAULT_LOOKBACK_S, end))
    if not every:
        return [], every
    old = {
        str((s.get("metric") or {}).get("instance", ""))
        for s in client.query(f"group by (instance) ({sel} offset {int(max(reach, 1))}s)", start)
    }
    return sorted(every - old), every


def _with_young(h: Hits, young: list[str], n: int, all_young: bool) -> Hits:
    """Young instances are candidates of every rule over the whole window (when every instance
    is young, the rule is judged everywhere, as the full path does)."""
    if h.everywhere or all_young:
        return replace(h, groups=[], everywhere=True)
    return replace(h, groups=list(h.groups) + [Group({"instance": i}, 0, n - 1) for i in young])


# ------------------------------------------------------------------------------ phase 2
def _needs(
    client: PromClient, item: tuple[Rule, RuleTrace, Hits], grid: np.ndarray, step: float, reader: InlineSignals
) -> tuple[list[Need], JudgedSpans | None]:
    rule, trace, hits = item
    assert trace.prefilter is not None
    needs, judged = rule_needs(client, rule, trace.prefilter, hits, grid, step, reader)
    spans = [(0, len(grid) - 1)] if judged is None else [(lo, hi) for _, lo, hi in judged.spans]
    trace.judged_from, trace.judged_to = float(grid[min(s[0] for s in spans)]), float(grid[max(s[1] for s in spans)])
    trace.judged_points = sum(hi - lo + 1 for lo, hi in spans)
    sets = [nd.instances for nd in needs]
    trace.instances = None if any(s is None for s in sets) else len(set().union(*(s or () for s in sets)))
    return needs, judged
