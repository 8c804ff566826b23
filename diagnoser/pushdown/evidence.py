"""The evidence a rule's candidates need: which raw series, of which instances, over which span.

`rule_needs` plans per leaf and candidate: a leaf by `instance` needs that instance's series, by
`model` every instance serving the candidates' models (a quantile's buckets summed by the TSDB
when that is exact: `summed_buckets`), by nothing every instance's. `fetch_needs`
fetches the every-instance needs at once, the rest batched by names and rounded span: the
candidate's stretch widened by SAFETY_S (to the window's end for cascades and `resolved_when`
leaves) minus the rule's reach. `rule_frame` gives the rule a frame of its own rows.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from kvscope.core.signals import Catalog, make_labels
from kvscope.diagnoser.evaluate.frame import DEFAULT_LOOKBACK_S, Block, Frame, JudgedSpans
from kvscope.diagnoser.findings import same_place
from kvscope.diagnoser.promql.series import NotExpressible
from kvscope.diagnoser.promql.signals import InlineSignals, Matcher, escape_re
from kvscope.diagnoser.pushdown.candidates import Group, Hits
from kvscope.diagnoser.rulebook import tree
from kvscope.diagnoser.rulebook.rule import Rule
from kvscope.diagnoser.sources.promapi import PromClient, PromError, matrix_on_grid
from kvscope.diagnoser.sources.prometheus import fetch_frame

SAFETY_S = 300.0
"""Conditions are judged from this long before a candidate's stretch to this long after it."""
SPAN_QUANTUM_S = 1200.0
"""Fetch spans are rounded out to multiples of this, so that instances with nearly the same
stretches are fetched together."""


@dataclass(frozen=True)
class Need:
    """Raw series one rule needs: sample names, of which instances (None: every one), from grid
    index `first` to `last`."""

    names: frozenset[str]
    instances: frozenset[str] | None
    first: int
    last: int
    summed: Block | None = field(default=None, compare=False)  # buckets the TSDB summed (summed_buckets)


def judged_spans(rule: Rule, hits: Hits, n: int, step: float) -> list[tuple[Group, int, int]]:
    """Per candidate group, the (first, last) grid index at which it is judged."""
    if hits.everywhere:
        return [(Group({}, 0, n - 1), 0, n - 1)]
    margin = _steps(SAFETY_S, step)
    open_end = rule.tree.cascade is not None
    return [(g, max(0, g.first - margin), n - 1 if open_end else min(n - 1, g.last + margin)) for g in hits.groups]


def below(rule: Rule, names: list[str]) -> set[str]:
    """The named series `names` read, directly or through others (themselves included)."""
    nodes, todo, seen = rule.tree.series, list(names), set()
    while todo:
        name = todo.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        todo += nodes[name].refs
    return seen


def resolved_leaves(rule: Rule) -> set[str]:
    """Named series `resolved_when` reads (directly or through others): read to the window's end."""
    block = rule.tree.resolved_when
    todo = []
    for cond in block.conds if block else ():
        r = cond.right
        todo += [cond.series] + ([r.series] if isinstance(r, tree.Than) else [])
        if isinstance(r, tree.Baseline) and r.of:
            todo.append(r.of)
    return below(rule, todo)


def leaf_groupings(rule: Rule) -> dict[str, tuple[str, ...]]:
    """Per leaf series, the labels every read of it keeps: its own grouping, less those an
    `aggregate` above it (through any chain of series) sums over (a model's replicas, the fleet)."""
    nodes = rule.tree.series
    out = {n: rule.by if node.by is None else node.by for n, node in nodes.items() if isinstance(node, tree.Signal)}
    for node in nodes.values():
        if isinstance(node, tree.Aggregate):
            keep = set(node.by or ())
            for name in below(rule, list(node.refs)) & out.keys():
                out[name] = tuple(label for label in out[name] if label in keep)
    return out


def place_frame(rule: Rule, frame: Frame, where: Mapping[str, str]) -> Frame:
    """The rows of `frame` that the rule's group at `where` reads: per sample name, the rows that
    agree with `where` on the labels every leaf reading it keeps (`leaf_groupings`; a row without
    such a label is kept), every row where a leaf sums over all of them. The rule's series at
    `where` are the same over it as over the whole frame, on fewer rows: a finding at one instance
    of a 1000-engine fleet reads its model's engines, as the fleet path fetched them for it."""
    nodes = rule.tree.series
    keeps: dict[str, set[str]] = {}
    for name, labels in leaf_groupings(rule).items():
        node = nodes[name]
        assert isinstance(node, tree.Signal)  # leaf_groupings names leaves only
        for sample in tree.leaf_names(node):
            keeps[sample] = keeps.get(sample, set(labels)) & set(labels)
    blocks = {}
    for sample, block in frame.blocks.items():
        pinned = {k: v for k, v in where.items() if k in keeps.get(sample, ())}
        if not pinned:
            blocks[sample] = block
            continue
        rows = [i for i, labels in enumerate(block.labels) if same_place(dict(labels), pinned)]
        seen = None if block.seen is None else block.seen[rows]
        blocks[sample] = Block([block.labels[i] for i in rows], block.values[rows], seen)
    return replace(frame, blocks=blocks, cache={} if frame.cache is not None else None)


def rule_needs(
    client: PromClient, rule: Rule, reach_s: float, hits: Hits, grid: np.ndarray, step: float, reader: InlineSignals
) -> tuple[list[Need], JudgedSpans | None]:
    """What the rule's candidates need, and where each is judged (None: everywhere)."""
    n = len(grid)
    spans = judged_spans(rule, hits, n, step)
    reach = _steps(reach_s, step) + 1
    to_end = resolved_leaves(rule)
    reads = leaf_groupings(rule)
    leaves = {name: node for name, node in rule.tree.series.items() if isinstance(node, tree.Signal)}
    one_span = len(grid) > 1 and "instance" not in rule.by and len({name in to_end for name in leaves}) == 1
    reads_of = _reads_of(leaves, reads)
    summed: dict[
        tuple, Block | None
    ] = {}  # p50 and p99 of one histogram share one sum (leaves of one histogram: one task)

    def of_leaf(name: str, node: tree.Signal) -> list[Need]:
        names = frozenset(tree.leaf_names(node))
        by = reads[name]
        first = max(0, min(lo for _, lo, _ in spans) - reach)
        last = n - 1 if name in to_end else max(hi for _, _, hi in spans)
        if hits.everywhere:
            return [Need(names, None, first, last)]
        pinned = [label for label in by if label in rule.by and all(label in g.labels for g in hits.groups)]
        if "instance" in pinned:  # each candidate's own series, around its own stretch
            return [
                Need(names, frozenset({g.labels["instance"]}), max(0, lo - reach), n - 1 if name in to_end else hi)
                for g, lo, hi in spans
            ]
        values = {label: sorted({g.labels[label] for g in hits.groups}) for label in pinned}
        matchers = [(label, "=~", "|".join(escape_re(v) for v in vs)) for label, vs in sorted(values.items())]
        if one_span and isinstance(node, tree.Quantile) and "instance" not in by and len(reads_of[min(names)]) == 1:
            key = (node.signal, node.match, tuple(matchers), by)
            if key not in summed:
                summed[key] = summed_buckets(client, node, matchers, by, grid, first, last, reader)
            if summed[key] is not None:
                return [Need(names, None, first, last, summed[key])]
        instances = resolve_instances(client, sorted(names)[0], matchers, grid, first, last, reader) if pinned else None
        return [Need(names, instances, first, last)]

    tasks: dict[object, list[str]] = {}  # the leaves' queries run at once
    for name, node in leaves.items():
        tasks.setdefault((node.signal, node.match) if isinstance(node, tree.Quantile) else name, []).append(name)
    done = client.map(lambda names: {name: of_leaf(name, leaves[name]) for name in names}, list(tasks.values()))
    found = {name: part for group in done for name, part in group.items()}
    needs = [nd for name in leaves for nd in found[name]]
    if hits.everywhere:
        return needs, None
    return needs, JudgedSpans(
        tuple((tuple(sorted((k, v) for k, v in g.labels.items() if k in rule.by)), lo, hi) for g, lo, hi in spans)
    )


def _reads_of(leaves: dict[str, tree.Signal], reads: dict[str, tuple[str, ...]]) -> dict[str, set]:
    """sample name -> how the leaves read it (grouping, quantile or not, matchers): a histogram's
    buckets are summed by the TSDB only where every leaf reads them alike."""
    reads_of: dict[str, set] = {}
    for name, leaf in leaves.items():
        for sample in tree.leaf_names(leaf):
            reads_of.setdefault(sample, set()).add((reads[name], isinstance(leaf, tree.Quantile), leaf.match))
    return reads_of


def resolve_instances(
    client: PromClient,
    series: str,
    matchers: list[Matcher],
    grid: np.ndarray,
    first: int,
    last: int,
    reader: InlineSignals,
) -> frozenset[str] | None:
    """Instances with a series of the canonical `series` that `matchers` match in the span or its
    lookback (one instant query, `last_over_time` over raw samples); None when PromQL cannot say."""
    if series.endswith("_bucket"):
        series = series[: -len("_bucket")] + "_count"  # one series per histogram is enough
    step = float(grid[1] - grid[0]) if len(grid) > 1 else 0.0
    rng = f"{int(np.ceil(float(grid[last] - grid[first]) + step + DEFAULT_LOOKBACK_S))}s"
    try:
        sel = reader.read(series, matchers, "last_over_time", rng, by=("instance",), outer="count_series")
    except (NotExpressible, KeyError, ValueError):
        return None
    try:
        answer = client.query(f"group by (instance) ({sel})", float(grid[last]))
    except PromError:
        return None
    return frozenset(str((s.get("metric") or {}).get("instance", "")) for s in answer)


def summed_buckets(
    client: PromClient,
    node: tree.Quantile,
    pinned: list[Matcher],
    by: tuple[str, ...],
    grid: np.ndarray,
    first: int,
    last: int,
    reader: InlineSignals,
) -> Block | None:
    """The leaf's buckets summed by the TSDB over `by` and `le`, on grid[first:last+1], when that
    is exactly the sum the evaluator takes (of integer counts): every upstream series seen in the
    span or its lookback present at every grid point and none reset, so every canonical series is
    too (counted on the wire, which the TSDB aggregates as it reads). None otherwise (the raw
    series are read)."""
    name, t0, t1, step = node.signal + "_bucket", float(grid[first]), float(grid[last]), float(grid[1] - grid[0])
    match = [(label, "=~", "|".join(escape_re(v) for v in vs)) for label, vs in node.match] + pinned
    rng, n = f"{int(np.ceil(t1 - t0 + DEFAULT_LOOKBACK_S))}s", last - first + 1
    try:
        wire = reader.raw_reads(name, match)
        seen = [f"count({e})" for e in reader.raw_reads(name, match, "last_over_time", rng)]
        resets = [f"sum({e})" for e in reader.raw_reads(name, match, "resets", rng)]
        summed = f"sum by ({', '.join((*by, 'le'))}) ({reader.read(name, match, by=by, outer='sum')})"
        calls = [partial(client.query, e, t1) for e in seen + resets] + [
            partial(client.range_parts, e, t0, t1, step) for e in [summed, *(f"count({e})" for e in wire)]
        ]
        answers = client.map(lambda call: call(), calls)
    except (NotExpressible, KeyError, ValueError, PromError):
        return None
    k = len(wire)
    series = [float(a[0]["value"][1]) if a else 0.0 for a in answers[: 2 * k]]
    metrics, values = matrix_on_grid(answers[2 * k], t0, step, n)
    counts = [matrix_on_grid(a, t0, step, n)[1] for a in answers[2 * k + 1 :]]
    held = all(len(c) == (want > 0) and (c == want).all() for c, want in zip(counts, series[:k], strict=True))
    exact = held and not any(series[k:]) and bool(metrics) and np.isfinite(values).all()
    return Block([make_labels(m) for m in metrics], values) if exact else None


# ------------------------------------------------------------------------------ fetching
@dataclass
class Fetched:
    """Evidence fetched for all rules: per fetch, its first grid index and its frame (on the grid
    from there; a row fetched in two spans is in both)."""

    grid: np.ndarray
    parts: list[tuple[int, Frame]] = field(default_factory=list)
    facts: dict[str, dict[str, str]] = field(default_factory=dict)  # instance -> facts, later fetches win
    series: int = 0
    points: int = 0
    fetches: int = 0

    def whole(self) -> Frame:
        """Every row on the whole grid (the UI plots the evidence)."""
        names = {name for _, part in self.parts for name in part.blocks}
        return rows_frame(self, dict.fromkeys(names), 0, len(self.grid) - 1)


def fetch_needs(client: PromClient, needs: list[Need], grid: np.ndarray, step: float, catalog: Catalog) -> Fetched:
    """Every need fetched once: the every-instance needs together, the others batched by
    instances needing the same names over the same span (summed buckets are fetched already)."""
    summed = [nd.summed for nd in needs if nd.summed is not None]
    needs = [nd for nd in needs if nd.summed is None]
    every = [nd for nd in needs if nd.instances is None]
    plans: list[tuple[frozenset[str], list[str] | None, int, int]] = []
    covered: dict[str, tuple[int, int]] = {}
    if every:
        names = frozenset().union(*(nd.names for nd in every))
        span = (min(nd.first for nd in every), max(nd.last for nd in every))
        plans.append((names, None, *span))
        covered = {name: span for name in names}
    batches = _instance_batches(_instance_spans(needs, covered), max(1, int(round(SPAN_QUANTUM_S / step))), len(grid))
    plans += [(names, sorted(insts), lo, hi) for (names, lo, hi), insts in sorted(batches.items(), key=str)]
    out = Fetched(grid, fetches=len(plans))
    fetch = partial(fetch_frame, step=step, catalog=catalog)
    calls = [
        partial(fetch, names=set(nms), start=float(grid[lo]), end=float(grid[hi]), instances=insts)
        for nms, insts, lo, hi in plans
    ]
    for k, frame in enumerate(call(client) for call in calls):
        names, instances, lo, hi = plans[k]
        who = "every instance" if instances is None else f"{len(instances)} instance(s)"
        hours = "-".join(time.strftime("%H:%M", time.gmtime(float(grid[i]))) for i in (lo, hi))
        client.say(f"pushdown: evidence {k + 1}/{len(plans)}, {len(names)} series names for {who}, {hours}")
        out.parts.append((lo, frame))
        for inst, facts in frame.facts.items():
            out.facts.setdefault(inst, {}).update(facts)
    rows = {(name, lab) for _, part in out.parts for name, block in part.blocks.items() for lab in block.labels}
    blocks = [b for _, part in out.parts for b in part.blocks.values()] + summed
    out.series = len(rows) + sum(len(b.labels) for b in summed)
    out.points = sum(int(np.count_nonzero(~np.isnan(b.values))) for b in blocks)
    return out


def _instance_spans(needs: list[Need], covered: dict[str, tuple[int, int]]) -> dict[str, dict[str, list[int]]]:
    """instance -> name -> [first, last] grid index it is needed over, for the needs of some
    instances, less what the every-instance fetch `covered` already reads."""
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
    return per_instance


def _instance_batches(
    per_instance: dict[str, dict[str, list[int]]], quantum: int, n: int
) -> dict[tuple[frozenset[str], int, int], list[str]]:
    """(names, first, last) -> the instances needing those names over that span, spans rounded
    out to `quantum` grid steps so instances alike share one query."""
    batches: dict[tuple[frozenset[str], int, int], list[str]] = {}
    for inst, spans in per_instance.items():
        by_span: dict[tuple[int, int], set[str]] = {}
        for name, (lo, hi) in spans.items():
            rounded = (lo // quantum * quantum, min(n - 1, (hi // quantum + 1) * quantum - 1))
            by_span.setdefault(rounded, set()).add(name)
        for (lo, hi), span_names in by_span.items():
            batches.setdefault((frozenset(span_names), lo, hi), []).append(inst)
    return batches


def rule_frame(fetched: Fetched, rule_needs_: list[Need], grid: np.ndarray, judged: JudgedSpans | None) -> Frame:
    """The rule's own frame: the rows of its needs over the stretch they span (the grid outside
    it holds nothing the rule reads), judged where its candidates can fire."""
    wanted: dict[str, set[str] | None] = {}
    for nd in rule_needs_:
        for name in nd.names if nd.summed is None else ():
            if name in wanted and wanted[name] is None:
                continue
            wanted[name] = None if nd.instances is None else (wanted.get(name) or set()) | set(nd.instances)
    lo = min((nd.first for nd in rule_needs_), default=0)
    hi = max((nd.last for nd in rule_needs_), default=len(grid) - 1)
    frame = rows_frame(fetched, wanted, lo, hi)
    for nd in rule_needs_:
        if nd.summed is not None:  # on the frame's own stretch: the rule's needs share one span
            frame.blocks.update(dict.fromkeys(nd.names, nd.summed))
    if judged is not None:
        frame.judged = JudgedSpans(tuple((labels, a - lo, b - lo) for labels, a, b in judged.spans))
    return frame


def rows_frame(fetched: Fetched, wanted: dict[str, set[str] | None], lo: int, hi: int) -> Frame:
    """The fetched rows of `wanted` names (of those instances; None: every one) on grid[lo:hi+1],
    each row with every point any fetch gave it."""
    n = hi - lo + 1
    rows: dict[str, dict] = {}
    for first, part in fetched.parts:
        a, b = max(lo, first), min(hi, first + len(part.ts) - 1)
        for name, block in part.blocks.items():
            if name not in wanted:
                continue
            keep, have = wanted[name], rows.setdefault(name, {})
            for i, lab in enumerate(block.labels):
                if keep is not None and dict(lab).get("instance", "") not in keep:
                    continue
                row = have.setdefault(lab, np.full(n, np.nan))
                if a <= b:
                    seg = row[a - lo : b - lo + 1]
                    np.copyto(seg, block.values[i, a - first : b - first + 1], where=np.isnan(seg))
    blocks = {
        name: Block(list(have), np.array(list(have.values())).reshape(len(have), n))
        for name, have in rows.items()
        if have or wanted[name] is None
    }
    every = any(keep is None for keep in wanted.values())
    instances = set().union(*(keep for keep in wanted.values() if keep is not None))
    facts = {k: v for k, v in fetched.facts.items() if every or k in instances}
    grid = fetched.grid
    return Frame(ts=grid[lo : hi + 1], blocks=blocks, facts=facts, outer=(float(grid[0]), float(grid[-1])))


def _steps(seconds: float, step: float) -> int:
    return int(np.ceil(seconds / step - 1e-9))
