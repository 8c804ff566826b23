"""The rule engine: evaluate diagnosis rules over a window and rank what fired.

`diagnose(frame)` runs every rule (rules/diagnosis/*.yaml) over a `Frame` from any source and
returns a `Diagnosis` (likely cause, competing hypotheses, other findings, rules not evaluable).
Pure: no I/O besides loading the shipped rules and levers when none are passed.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from kvscope.diagnoser.citations import cite_all, cite_text
from kvscope.diagnoser.evaluate.conditions import ConditionEvaluator, Evaluated, first_run, latest_run, run_lengths
from kvscope.diagnoser.evaluate.confidence import before_symptom, direct_present, settle
from kvscope.diagnoser.evaluate.expr import Grouped, SeriesEvaluator, evidence_name, promql
from kvscope.diagnoser.evaluate.frame import Frame
from kvscope.diagnoser.findings import (
    MECHANISM_OFF,
    MECHANISM_UNKNOWN,
    SEVERITY_RANK,
    CascadeInfo,
    Diagnosis,
    Evidence,
    Finding,
    ScaleChange,
    Skipped,
    same_place,
)
from kvscope.diagnoser.rulebook import tree
from kvscope.diagnoser.rulebook.grammar import ExprError
from kvscope.diagnoser.rulebook.levers import Lever, load_levers, rule_levers
from kvscope.diagnoser.rulebook.rule import Rule, parse_duration, read_rules
from kvscope.diagnoser.values import fill_summary

REFERENCE_WINDOW_S = 900.0
"""Rule durations are written for windows of at least this length (15 minutes)."""


def auto_time_scale(window_s: float) -> float:
    """1.0 for windows of 15 minutes or more; shorter windows (a two-minute recording cannot hold
    a `for: 5m`) scale every duration by window / 15 min, never below 1/50."""
    return max(0.02, min(1.0, window_s / REFERENCE_WINDOW_S))


def diagnose(
    frame: Frame,
    rules: Iterable[Rule] | None = None,
    levers: dict[str, Lever] | None = None,
    params: dict[str, dict[str, Any]] | None = None,
    source: str = "",
    time_scale: float | None = None,
    workers: int | None = None,
) -> Diagnosis:
    """Evaluate rules over the frame's window and rank the findings.

    `params` maps rule id -> parameter overrides (thresholds, durations, benchmark values).
    `time_scale` multiplies every rule duration; None picks `auto_time_scale(window)`.
    `workers` threads evaluate rules side by side (numpy releases the GIL in its array work);
    the result does not depend on it.
    """
    rules = list(rules) if rules is not None else read_rules()
    levers = levers if levers is not None else load_levers()
    start, end = frame.window
    scale = auto_time_scale(end - start) if time_scale is None else time_scale
    prepared = [r.with_params((params or {}).get(r.id, {})).scaled(scale) for r in rules]
    workers = workers if workers is not None else min(4, os.cpu_count() or 1)
    if workers > 1 and len(prepared) > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(lambda r: evaluate_rule(r, frame, levers), prepared))
    else:
        results = [evaluate_rule(r, frame, levers) for r in prepared]
    d = conclude(prepared, results, frame.names(), frame.window, source, scale)
    if scale >= 1:
        return d
    return replace(d, scale_changes=scale_changes(prepared, results, frame, levers))


def scale_changes(
    prepared: list[Rule], results: list[list[Finding] | Skipped], frame: Frame, levers: dict[str, Lever]
) -> tuple[ScaleChange, ...]:
    """The rules whose verdict on `frame` (`results`, durations shortened) differs from the same
    rule judged with its usual durations: what the short-window note must tell (render.scale_text).
    Rules whose durations are absolute were not shortened and are not judged again."""
    out = []
    for rule, res in zip(prepared, results, strict=True):
        if rule.time_scale == 1.0:
            continue
        full = evaluate_rule(rule.scaled(1.0), frame, levers)
        if _found(res) != _found(full):
            detail = ""
            if isinstance(res, list) and isinstance(full, list) and res and full:
                detail = _both_fired(res, full)
            out.append(ScaleChange(rule.id, rule.title, _verdict(res), _verdict(full), detail))
    return tuple(out)


def _both_fired(shortened: list[Finding], full: list[Finding]) -> str:
    """How two firings of one rule differ: 'as critical (at the usual length as warning)' at the
    same places, else the places: 'at instance=a, instance=b (at the usual length at instance=a)'."""
    places = [sorted({_place(f) for f in fs}) for fs in (shortened, full)]
    if places[0] == places[1]:
        worst = [max((f.severity for f in fs), key=SEVERITY_RANK.__getitem__) for fs in (shortened, full)]
        if worst[0] != worst[1]:
            return f"as {worst[0]} (at the usual length as {worst[1]})"
        return "at the same places, some with another severity than at the usual length"
    shown = [", ".join(p[:3]) + (f" and {len(p) - 3} more" if len(p) > 3 else "") for p in places]
    return f"at {shown[0]} (at the usual length at {shown[1]})"


def _place(f: Finding) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(f.where.items())) or "the fleet"


def _verdict(res: list[Finding] | Skipped) -> str:
    """Fired, did not fire, or not evaluable (`ScaleChange`): a rule that saw its mechanism off
    looked, and found nothing."""
    if isinstance(res, Skipped):
        return "did not fire" if res.reason.startswith(MECHANISM_OFF) else "not evaluable"
    return "fired" if res else "did not fire"


def _found(res: list[Finding] | Skipped) -> tuple[str, frozenset[tuple[str, str]]]:
    """A rule's verdict with the places and severities it fired at: what a changed verdict means."""
    if isinstance(res, Skipped):
        return _verdict(res), frozenset()
    return _verdict(res), frozenset((f.severity, repr(sorted(f.where.items()))) for f in res)


def conclude(
    prepared: list[Rule],
    results: list[list[Finding] | Skipped],
    present: set[str],
    window: tuple[float, float],
    source: str,
    scale: float,
) -> Diagnosis:
    """The Diagnosis of every rule's result (in `prepared`'s order): `defers_to` settled, a
    cascade's root put before its symptoms, ranked. `present`: sample names in the window."""
    skipped = [r for r in results if isinstance(r, Skipped)]
    findings = [f for r in results if not isinstance(r, Skipped) for f in r]
    evaluated = [r.id for r, res in zip(prepared, results, strict=True) if not isinstance(res, Skipped)]
    findings, skipped = settle(findings, skipped, evaluated, direct_present(prepared, present))
    return replace(rank(before_symptom(findings), window, source, skipped, len(prepared)), time_scale=scale)


def evaluated_series(rule: Rule, frame: Frame, time_scale: float) -> Callable[[str], Grouped]:
    """A rule's named series over the frame, by name, exactly as `diagnose` evaluated them (same
    durations at `time_scale`): what charts of a finding's evidence read. The series several of
    them build on (the model's sum, the peers' mean) are evaluated once for all."""
    return SeriesEvaluator(rule.scaled(time_scale), frame).get


def evaluate_rule(rule: Rule, frame: Frame, levers: dict[str, Lever]) -> list[Finding] | Skipped:
    """Findings of one rule over the frame, or why it could not be evaluated."""
    t0 = time.process_time()
    try:
        return _evaluate_rule(rule, frame, levers)
    finally:
        if frame.profile is not None:  # CPU seconds per rule (bench --profile)
            frame.profile[("rule", rule.id)] = frame.profile.get(("rule", rule.id), 0.0) + time.process_time() - t0


def _evaluate_rule(rule: Rule, frame: Frame, levers: dict[str, Lever]) -> list[Finding] | Skipped:
    ev = SeriesEvaluator(rule, frame)
    try:
        if (before := precheck(rule, frame)) is not None:
            return before
        if (off := mechanism_off(rule, ev)) is not None:
            return off
        if not (keys := _rule_keys(ev)):
            return Skipped(rule.id, "no series for any group")
        ce = ConditionEvaluator(ev, rule.by, keys, frame.facts)
        if rule.tree.cascade:
            return _cascade_findings(rule, ce, levers)
        return _findings(rule, ce, levers)
    except (ExprError, KeyError, ValueError) as exc:
        return Skipped(rule.id, f"evaluation error: {exc}")


def precheck(rule: Rule, frame: Frame) -> Skipped | None:
    """Why the rule is skipped before any value is read, from the frame's step, sample names and
    engine facts alone, or None: parameters not set, too coarse a step, a required signal absent,
    an engine fact no instance exports, every signal of its mechanism absent (unknown). The fleet
    path asks it of a frame of the TSDB's index (pushdown/run.py): the same reasons, the same words."""
    missing = rule.missing_params()
    if missing and len(missing) == rule.nullable_params():
        return Skipped(rule.id, f"parameter(s) not set: {', '.join(missing)}")
    if coarse := too_coarse(rule, frame):
        return Skipped(rule.id, coarse)
    if absent := required_absent(rule, frame):
        return Skipped(rule.id, f"signal(s) absent: {', '.join(sorted(absent))}")
    wanted = {f.fact for f in rule.tree.facts}
    if wanted and not any(wanted <= set(known) for known in frame.facts.values()):
        return facts_unknown(rule)
    mech = rule.tree.mechanism
    if mech and missing_signals(rule, mech.series, frame.names()):
        return Skipped(rule.id, f"{MECHANISM_UNKNOWN} {mech.name} ({mech.how})")
    return None


# ---------------------------------------------------------------------------- mechanism on?
def too_coarse(rule: Rule, frame: Frame) -> str:
    """Why the frame is sampled too sparsely for a rule with `max_step` (a duration or a `$param`),
    or "": a counter cannot be seen to stay flat between samples further apart than that."""
    limit = rule.doc.get("max_step")
    if limit is None or not frame.step:
        return ""
    if isinstance(limit, str) and limit.startswith("$"):
        limit = rule.params.get(limit[1:])
    seconds = parse_duration(limit)
    if frame.step <= seconds:
        return ""
    return f"data sampled every {frame.step:g} s, sparser than max_step {seconds:g} s: too coarse to judge"


def mechanism_off(rule: Rule, ev: SeriesEvaluator) -> Skipped | None:
    """Why a rule cannot judge its mechanism here, or None when it can: its `mechanism` series present
    and never above 0 = off; without a value = unknown (not evaluable). After `precheck`."""
    mech = rule.tree.mechanism
    if not mech:
        return None
    values = ev.get(mech.series).values
    if (values > 0).any():
        return None
    state = MECHANISM_OFF if (~np.isnan(values)).any() else MECHANISM_UNKNOWN
    return Skipped(rule.id, f"{state} {mech.name} ({mech.how})")


def facts_unknown(rule: Rule) -> Skipped:
    """No engine exports every fact the rule tests: not evaluable."""
    return Skipped(
        rule.id,
        f"{MECHANISM_UNKNOWN} engine fact(s) {', '.join(sorted({f.fact for f in rule.tree.facts}))} not exported",
    )


# ---------------------------------------------------------------------------- signals needed
def sample_names(rule: Rule) -> set[str]:
    """Sample names a rule reads from a source (histograms expanded to _bucket/_sum/_count)."""
    return set().union(*(tree.leaf_names(n) for n in rule.tree.series.values() if isinstance(n, tree.Signal)))


def required_absent(rule: Rule, frame: Frame) -> set[str]:
    """Signals a rule cannot do without that the frame lacks entirely: those of every `when.all`
    condition (or the cascade's root stage), and of the `when.any` branches if none is computable."""
    names = frame.names()

    def absent(cond: tree.Cond) -> set[str]:
        if cond.op == "absent":
            return set()  # a test for absence needs nothing
        out = missing_signals(rule, cond.series, names)
        if isinstance(cond.right, tree.Than):
            out |= missing_signals(rule, cond.right.series, names)
        return out

    t = rule.tree
    if t.cascade:
        return set().union(*(absent(c) for c in t.cascade.stages[0].all))
    when = t.when or tree.Block()
    out = set().union(*(absent(c) for c in when.all))
    branches = [absent(c) for c in when.any]
    if branches and all(branches):
        out |= set().union(*branches)
    return out


def missing_signals(rule: Rule, name: str, names: set[str], seen: frozenset[str] = frozenset()) -> set[str]:
    """Absent signals that leave a named series without any value (coalesce needs only one side)."""
    node = rule.tree.series.get(name)
    if node is None or name in seen:
        return set()
    if isinstance(node, tree.Signal):
        return set() if names & tree.expansions(node.signal) else {node.signal}
    parts = [missing_signals(rule, ref, names, seen | {name}) for ref in node.refs]
    if isinstance(node, tree.Pair) and node.op == "coalesce":
        return set().union(*parts) if all(parts) else set()
    return set().union(*parts)


def _rule_keys(ev: SeriesEvaluator) -> list[tuple[str, ...]]:
    """Groups of the rule: every key of its rule-level series (SeriesEvaluator.get has already
    dropped keys that lack a label the rule requires, `require_labels`)."""
    at_rule = (ev.get(name) for name in ev.nodes if ev.by_of(name) == ev.rule.by)
    return sorted({key for g in at_rule if g.by == ev.rule.by for key in g.keys})


# ---------------------------------------------------------------------------- plain rules
def _findings(rule: Rule, ce: ConditionEvaluator, levers: dict[str, Lever]) -> list[Finding]:
    t = rule.tree
    when = t.gated
    truth, done = ce.block(when, lazy=True)
    _judged(truth, ce)
    if not truth.any():
        return []  # the conditions never hold anywhere: the rest cannot make the rule fire
    truth &= ce.facts_hold(t.facts)[:, None]
    for_steps = ce.ev._k(when.hold, 0)
    truth = ce.bridge_outages(truth)
    runs = run_lengths(truth)
    crit, warn, resolved = (ce.block(b)[0] if b else None for b in (t.critical_when, t.warning_when, t.resolved_when))
    # `moderate_unless`: the branch that observes the mechanism; a finding without it is inferred
    direct = ce.all_of([t.moderate_unless])[0] if t.moderate_unless else None
    out = []
    for gi in map(int, np.flatnonzero(truth.any(axis=1))):  # a group never true cannot fire
        if (span := latest_run(runs[gi], for_steps)) is None:
            continue
        found = _finding(rule, ce, gi, span, done, crit, levers, None, warn)
        if direct is not None and not direct[gi, span[0] : span[1] + 1].any():
            found = replace(found, confidence="moderate")
        if resolved is not None and not found.active and resolved[gi, span[0] :].any():
            found = _resolved(rule, found)
        out.append(found)
    return out


def _judged(truth: np.ndarray, ce: ConditionEvaluator) -> None:
    """No condition holds outside the frame's `judged` stretches."""
    if ce.ev.frame.judged is not None:
        truth &= ce.ev.frame.judged.mask(ce.by, ce.keys, truth.shape[1])


def _resolved(rule: Rule, f: Finding) -> Finding:
    """An episode that ended after its own lever was pulled (`resolved_when` held between its onset
    and the window's end, e.g. the fleet scaled out): kept as a record at `info`, not a warning."""
    note = (rule.tree.resolved_when or tree.Block()).note or "resolved"
    drop = 100 * (SEVERITY_RANK[f.severity] - SEVERITY_RANK["info"])
    return replace(f, severity="info", score=round(f.score - drop, 3), summary=f"{f.summary} (resolved: {note})")


def _finding(
    rule: Rule,
    ce: ConditionEvaluator,
    gi: int,
    span: tuple[int, int],
    done: list[Evaluated],
    crit: np.ndarray | None,
    levers: dict[str, Lever],
    cascade: CascadeInfo | None,
    warn: np.ndarray | None = None,
) -> Finding:
    ts = ce.ev.frame.ts
    start, end = span
    severity = rule.severity
    if warn is not None and severity == "info" and warn[gi, start : end + 1].any():
        severity = "warning"
    if crit is not None and crit[gi, start : end + 1].any():
        severity = "critical"
    if cascade is not None and cascade.stage_name in _critical_stages(rule):
        severity = "critical"
    evidence = _evidence(rule, ce, gi, span, done)
    meta = rule.tree.meta
    spec = int(meta.get("specificity", 2))
    sources = cite_all(meta.get("citations") or ())
    return Finding(
        rule_id=rule.id,
        levers_md=str(meta.get("levers_md", "")),
        title=rule.title,
        severity=severity,
        where={k: v for k, v in zip(rule.by, ce.keys[gi], strict=True) if v},
        since=float(ts[start]),
        until=float(ts[end]),
        active=float(ts[end]) == ce.ev.frame.window[1],
        window=ce.ev.frame.window,
        step_s=ce.ev.frame.step,
        score=round(100 * SEVERITY_RANK[severity] + 10 * spec + _strength(done, gi, span), 3),
        summary=_summary(rule, evidence),
        evidence=tuple(evidence),
        levers=tuple(rule_levers(meta.get("levers") or [], levers)),
        citations=tuple(c.text for c in sources),
        sources=sources,
        cascade=cascade,
        false_positives=tuple(cite_text(str(fp)) for fp in meta.get("false_positives") or ()),
        params=dict(rule.params),
        specificity=spec,
        confidence=str(meta.get("confidence", "high")),
        confirm=cite_text(str(meta.get("confirm", ""))),
        defers_to=tuple(str(x) for x in meta.get("defers_to") or ()),
    )


def _critical_stages(rule: Rule) -> set[str]:
    cas = rule.tree.cascade
    names = [s.name for s in cas.stages] if cas else []
    return set(names[names.index(cas.critical_at) :]) if cas and cas.critical_at in names else set()


def _stat(values: np.ndarray, stat: str, ts: np.ndarray) -> tuple[float | None, float | None]:
    ok = ~np.isnan(values)
    if not ok.any():
        return None, None
    idx = np.flatnonzero(ok)
    if stat == "mean":
        return float(np.mean(values[ok])), None
    picks = {"max": idx[np.argmax(values[ok])], "min": idx[np.argmin(values[ok])], "first": idx[0]}
    pick = picks.get(stat, idx[-1])  # "last" and any other stat: the latest value
    return float(values[pick]), float(ts[pick])


def _evidence(
    rule: Rule, ce: ConditionEvaluator, gi: int, span: tuple[int, int], done: list[Evaluated]
) -> list[Evidence]:
    start, end = span
    ts = ce.ev.frame.ts[start : end + 1]
    held = ce.ev.frame.window[1] - ce.ev.frame.window[0]  # the longest range a window can reach
    thresholds = {e.cond.series: e.cond for e in done if isinstance(e.cond.right, tree.Value)}
    out = []
    for item in rule.tree.evidence:
        value, at = _stat(ce.ev.aligned(item.series, rule.by, ce.keys)[gi, start : end + 1], item.stat, ts)
        cond = thresholds.get(item.series)
        out.append(
            Evidence(
                name=evidence_name(rule, item, ce.ev.frame.step, held),
                value=None if value is None else round(value, 6),
                unit=item.unit,
                series=promql(rule, item.series, ce.ev.frame.step, held),
                at=at,
                threshold=cond.threshold() if cond else None,
                op=cond.op if cond else None,
                stat=item.stat,
                key=item.series,
            )
        )
    return out


def _strength(done: list[Evaluated], gi: int, span: tuple[int, int]) -> float:
    """0-5: how far the first comparison went past its right side (a constant, another series or
    a baseline), as |log2(mean left / mean right)| x 2.5 over the active period."""
    for e in done:
        if e.right is None:
            continue
        left = e.left[gi, span[0] : span[1] + 1]
        right = e.right[gi, span[0] : span[1] + 1]
        ok = ~np.isnan(left) & ~np.isnan(right)
        if not ok.any():
            continue
        num, den = float(np.mean(left[ok])), float(np.mean(right[ok]))
        if num <= 0 or den <= 0:
            return 0.0
        return float(min(5.0, abs(math.log2(num / den)) * 2.5))
    return 0.0


def _summary(rule: Rule, evidence: list[Evidence]) -> str:
    """The rule's summary with evidence values filled in as the evidence table writes them
    (`values.fill_summary`); the title when a value it names is absent."""
    template = str(rule.tree.meta.get("summary", rule.title))
    filled = fill_summary(template, [item.series for item in rule.tree.evidence], evidence)
    return rule.title if filled is None else filled


# ---------------------------------------------------------------------------- cascades
def _cascade_findings(rule: Rule, ce: ConditionEvaluator, levers: dict[str, Lever]) -> list[Finding]:
    cas = rule.tree.cascade
    assert cas is not None
    names = [s.name for s in cas.stages]
    slack = ce.ev._k(cas.slack, 0)
    evaluated = []
    for stage in cas.stages:
        truth, done = ce.block(stage)
        _judged(truth, ce)
        truth = ce.bridge_outages(truth)
        evaluated.append((truth, run_lengths(truth), ce.ev._k(stage.hold, 0), done))
    fire_at = names.index(cas.fire_at)
    done = [e for (_, _, _, d) in evaluated for e in d]
    out = []
    for gi in range(len(ce.keys)):
        onsets = _stage_onsets(evaluated, gi, slack)
        reached = [i for i, o in enumerate(onsets) if o is not None]
        if not reached or reached[-1] < fire_at:
            continue
        start = onsets[0] if onsets[0] is not None else onsets[reached[0]]
        assert start is not None  # `reached` lists the stages with an onset
        any_true = np.logical_or.reduce([evaluated[i][0][gi] for i in reached])
        end = int(np.flatnonzero(any_true)[-1]) if any_true.any() else start
        info = _cascade_info(cas, names, onsets, reached[-1], ce.ev.frame.ts)
        out.append(_finding(rule, ce, gi, (start, max(end, start)), done, None, levers, info))
    return out


def _stage_onsets(evaluated: list, gi: int, slack: int) -> list[int | None]:
    onsets: list[int | None] = []
    not_before = 0
    for _, runs, for_steps, _ in evaluated:  # a stage counts only once the one before it began
        onset = first_run(runs[gi], for_steps, not_before) if not onsets or onsets[-1] is not None else None
        onsets.append(onset)
        if onset is not None:
            not_before = max(0, onset - slack)
    return onsets


def _cascade_info(
    cas: tree.Cascade, names: list[str], onsets: list[int | None], last: int, ts: np.ndarray
) -> CascadeInfo:
    times = {n: (float(ts[o]) if o is not None else None) for n, o in zip(names, onsets, strict=True)}
    root, symptom = times.get(cas.root), times.get(cas.symptom)
    lead = symptom - root if root is not None and symptom is not None else None
    return CascadeInfo(stage=last + 1, stage_name=names[last], stages_total=len(names), onsets=times, lead_time_s=lead)


# ---------------------------------------------------------------------------- ranking
def rank(
    findings: list[Finding],
    window: tuple[float, float],
    source: str,
    skipped: list[Skipped] | None = None,
    rules_evaluated: int = 0,
) -> Diagnosis:
    """Order findings: likely cause first, then competing hypotheses, then the rest; the score
    (severity, specificity, strength, earliness) is docs/rules.md "Ranking"."""
    rest = tuple(skipped or ())
    if not findings:
        return Diagnosis(window, source, likely_cause=None, skipped=rest, rules_evaluated=rules_evaluated)
    first, last = min(f.since for f in findings), max(f.since for f in findings)
    spread = last - first

    def total(f: Finding) -> float:
        early = 5.0 * (1 - (f.since - first) / spread) if spread > 0 else 5.0
        return f.score + early

    ordered = sorted(findings, key=lambda f: (-total(f), f.since, f.rule_id, sorted(f.where.items())))
    head, *tail = [replace(f, score=round(total(f), 3)) for f in ordered]
    competing = tuple(
        f for f in tail if f.specificity >= 2 and same_place(f.where, head.where) and f.rule_id != head.rule_id
    )
    picked = {id(f) for f in competing}  # by identity: comparing findings field by field is O(n^2)
    other = tuple(f for f in tail if id(f) not in picked)
    return Diagnosis(window, source, head, competing, other, rest, rules_evaluated)
