"""The evidence a rule's candidates need: which raw series, of which instances, over which span.

A rule reads its signals through leaf series (`gauge`, `rate`, `quantile`, ...), each grouped by
its own labels. For a candidate group, a leaf grouped by `instance` needs only that instance's
series; a leaf grouped by `model` (peers: replicas of the model, its queue share) needs every
instance serving the candidates' models, and only that leaf's signal; a leaf grouped by nothing
(the fleet) needs every instance's. So evidence is planned per leaf (`rule_needs`), and only
what some candidate needs is fetched (`fetch_needs`): every-instance needs in one fetch,
instance needs batched by instances that need the same names over the same span.

The span: from the first grid point judged minus the rule's reach (ranges, offsets, baselines)
to the last grid point judged (`judge_span`): the stretches where the rule's runs can lie
(candidates.py) widened by SAFETY_S on both sides; to the window's end for cascades (later stages
may start after the root's stretch) and rules with `resolved_when` (read from the onset on).

The rule is then evaluated on a frame of its own rows (`rule_frame`), and its findings are kept
only for candidate groups (`keep_findings`): a peer fetched for a model-level leaf is not judged
on data fetched for someone else.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from kvscope.agent.signals import Catalog
from kvscope.diagnoser.evaluate.frame import Block, Frame
from kvscope.diagnoser.findings import Finding
from kvscope.diagnoser.promql.alerts import NotExpressible
from kvscope.diagnoser.promql.signals import InlineSignals, _escape_re
from kvscope.diagnoser.pushdown.candidates import Hits
from kvscope.diagnoser.pushdown.prefilter import Prefilter
from kvscope.diagnoser.rulebook.grammar import SIGNAL_FORMS, node_form, node_signal
from kvscope.diagnoser.rulebook.rule import Rule
from kvscope.diagnoser.sources.promapi import PromClient, PromError
from kvscope.diagnoser.sources.prometheus import fetch_frame

SAFETY_S = 300.0
"""Conditions are judged from this long before the first stretch where a rule can fire, and this
long after the last one."""
RESOLVE_STEP_S = 300.0
"""Step of the subquery that lists the instances of a model (at most the 5-minute lookback, so
no series present in the span is missed)."""


@dataclass(frozen=True)
class Need:
    """Raw series one rule needs: sample names, of which instances (None: every one), from grid
    index `first` to `last`."""

    names: frozenset[str]
    instances: frozenset[str] | None
    first: int
    last: int


def judge_span(rule: Rule, hits: Hits, n: int, step: float) -> tuple[int, int]:
    """(first, last) grid index at which the rule's conditions are judged."""
    if hits.everywhere or not hits.groups:
        return 0, n - 1
    margin = _steps(SAFETY_S, step)
    first = max(0, hits.first - margin)
    open_end = "cascade" in rule.doc or bool(rule.doc.get("resolved_when"))
    last = n - 1 if open_end else min(n - 1, hits.last + margin)
    return first, last


def leaf_names(node: dict[str, Any]) -> set[str]:
    """Sample names one leaf series reads (a histogram's buckets, a mean's sum and count)."""
    form, sig = node_form(node), node_signal(node)
    if form == "quantile":
        return {f"{sig}_bucket"}
    if form == "mean":
        return {f"{sig}_sum", f"{sig}_count"}
    return {str(sig)}


def rule_needs(client: PromClient, rule: Rule, pre: Prefilter, hits: Hits, grid: np.ndarray, step: float,
               catalog: Catalog, reader: InlineSignals) -> tuple[list[Need], tuple[int, int]]:
    """What the rule's candidates need, and the span judged."""
    first, last = judge_span(rule, hits, len(grid), step)
    fetch_first = max(0, first - _steps(pre.reach_s, step) - 1)
    needs = []
    for node in rule.series.values():
        if node_form(node) not in SIGNAL_FORMS:
            continue
        names = frozenset(leaf_names(node))
        by = tuple(node.get("by", rule.by))
        instances = None if hits.everywhere else _instances_for(client, rule, node, by, hits, grid, fetch_first,
                                                                 last, reader)
        needs.append(Need(names, instances, fetch_first, last))
    return needs, (first, last)


def _instances_for(client: PromClient, rule: Rule, node: dict[str, Any], by: tuple[str, ...], hits: Hits,
                   grid: np.ndarray, first: int, last: int, reader: InlineSignals) -> frozenset[str] | None:
    """Instances whose series of this leaf a candidate group reads: the candidates' own when the
    leaf is grouped by instance, those serving the candidates' values of the leaf's other labels
    (a model's replicas) when the candidates pin them, else every instance (None)."""
    pinned = [label for label in by if label in rule.by and all(label in g.labels for g in hits.groups)]
    if "instance" in pinned:
        return frozenset(g.labels["instance"] for g in hits.groups)
    if not pinned:
        return None
    values = {label: sorted({g.labels[label] for g in hits.groups}) for label in pinned}
    return resolve_instances(client, sorted(leaf_names(node))[0], values, grid, first, last, reader)


def resolve_instances(client: PromClient, series: str, values: dict[str, list[str]], grid: np.ndarray,
                      first: int, last: int, reader: InlineSignals) -> frozenset[str] | None:
    """Instances with a series of the canonical `series` whose labels take one of `values` in
    the span (one instant query over a subquery of the span); None when PromQL cannot say."""
    matchers = [(label, "=~", "|".join(_escape_re(v) for v in vs)) for label, vs in sorted(values.items())]
    if series.endswith("_bucket"):
        series = series[: -len("_bucket")] + "_count"       # one series per histogram is enough
    try:
        sel = reader.read(series, matchers, by=("instance",), outer="count_series")
    except (NotExpressible, KeyError, ValueError):
        return None
    step = float(grid[1] - grid[0]) if len(grid) > 1 else RESOLVE_STEP_S
    span = float(grid[last] - grid[first]) + step
    sub = max(step, min(RESOLVE_STEP_S, span))
    expr = f"group by (instance) (count_over_time(({sel})[{int(np.ceil(span))}s:{int(sub)}s]))"
    try:
        answer = client.query(expr, float(grid[last]))
    except PromError:
        return None
    return frozenset(str((s.get("metric") or {}).get("instance", "")) for s in answer)


# ------------------------------------------------------------------------------ fetching
@dataclass
class Fetched:
    """Evidence fetched for all rules: one block per sample name, rows unique by labels."""

    frame: Frame
    series: int = 0
    points: int = 0
    fetches: int = 0


def fetch_needs(client: PromClient, needs: list[Need], grid: np.ndarray, step: float,
                catalog: Catalog) -> Fetched:
    """Every need fetched once: the every-instance needs together, the others batched by
    instances needing the same names over the same span."""
    every = [nd for nd in needs if nd.instances is None]
    plans: list[tuple[frozenset[str], list[str] | None, int, int]] = []
    covered: dict[str, tuple[int, int]] = {}
    if every:
        names = frozenset().union(*(nd.names for nd in every))
        span = (min(nd.first for nd in every), max(nd.last for nd in every))
        plans.append((names, None, *span))
        covered = {name: span for name in names}
    per_instance: dict[str, dict[str, list[int]]] = {}
    for nd in needs:
        if nd.instances is None:
            continue
        for name in nd.names:
            have = covered.get(name)
            if have is not None and have[0] <= nd.first and have[1] >= nd.last:
                continue
            for inst in nd.instances:
                have_span = per_instance.setdefault(inst, {}).setdefault(name, [nd.first, nd.last])
                have_span[0], have_span[1] = min(have_span[0], nd.first), max(have_span[1], nd.last)
    batches: dict[tuple[frozenset[str], int, int], list[str]] = {}
    for inst, spans in per_instance.items():
        lo, hi = min(s[0] for s in spans.values()), max(s[1] for s in spans.values())
        batches.setdefault((frozenset(spans), lo, hi), []).append(inst)
    plans += [(names, sorted(insts), lo, hi) for (names, lo, hi), insts in sorted(batches.items(), key=str)]
    out = Fetched(Frame(ts=grid))
    for names, instances, lo, hi in plans:
        who = "every instance" if instances is None else f"{len(instances)} instance(s)"
        client.say(f"pushdown: evidence, {len(names)} series names for {who}, "
                   f"{time.strftime('%H:%M', time.gmtime(float(grid[lo])))}-"
                   f"{time.strftime('%H:%M', time.gmtime(float(grid[hi])))}")
        frame = fetch_frame(client, set(names), float(grid[0]), float(grid[-1]), step, instances=instances,
                            fetch_from=float(grid[lo]), fetch_to=float(grid[hi]), catalog=catalog)
        _absorb(out, frame)
        out.fetches += 1
    for block in out.frame.blocks.values():
        out.series += len(block.labels)
        out.points += int(np.count_nonzero(~np.isnan(block.values)))
    return out


def _absorb(out: Fetched, frame: Frame) -> None:
    """Add a fetched frame's rows; a row fetched twice (other spans) keeps every point either had."""
    for name, block in frame.blocks.items():
        have = out.frame.blocks.get(name)
        if have is None:
            out.frame.blocks[name] = block
            continue
        index = {lab: i for i, lab in enumerate(have.labels)}
        new_rows = []
        for i, lab in enumerate(block.labels):
            j = index.get(lab)
            if j is None:
                new_rows.append(i)
                continue
            row = have.values[j]
            np.copyto(row, block.values[i], where=np.isnan(row))
        if new_rows:
            out.frame.blocks[name] = Block(have.labels + [block.labels[i] for i in new_rows],
                                           np.vstack([have.values, block.values[new_rows]]))
    for inst, facts in frame.facts.items():
        out.frame.facts.setdefault(inst, {}).update(facts)


def rule_frame(fetched: Fetched, rule_needs_: list[Need], grid: np.ndarray, span: tuple[int, int]) -> Frame:
    """The rule's own frame: the rows of its needs, its judged span."""
    wanted: dict[str, set[str] | None] = {}
    for nd in rule_needs_:
        for name in nd.names:
            if name in wanted and wanted[name] is None:
                continue
            wanted[name] = None if nd.instances is None else (wanted.get(name) or set()) | set(nd.instances)
    blocks = {}
    instances: set[str] | None = set()
    for name, keep in wanted.items():
        block = fetched.frame.blocks.get(name)
        if keep is None:
            instances = None
        elif instances is not None:
            instances |= keep
        if block is None:
            continue
        if keep is None:
            blocks[name] = block
            continue
        rows = [i for i, lab in enumerate(block.labels) if dict(lab).get("instance", "") in keep]
        if rows:
            blocks[name] = Block([block.labels[i] for i in rows], block.values[rows])
    facts = {k: v for k, v in fetched.frame.facts.items() if instances is None or k in instances}
    return Frame(ts=grid, blocks=blocks, facts=facts, judged_from=span[0],
                 judged_to=None if span[1] >= len(grid) - 1 else span[1])


def keep_findings(findings: list[Finding], rule: Rule, hits: Hits) -> list[Finding]:
    """Findings at candidate groups only (compared on the labels the rule groups by)."""
    if hits.everywhere:
        return findings
    wanted = [{k: v for k, v in g.labels.items() if k in rule.by} for g in hits.groups]
    return [f for f in findings if any(all(f.where.get(k, "") == v for k, v in w.items()) for w in wanted)]


def _steps(seconds: float, step: float) -> int:
    return int(np.ceil(seconds / step - 1e-9))
