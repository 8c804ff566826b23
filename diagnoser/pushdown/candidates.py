"""Which groups a rule can fire for, and when: a prefilter's answer read against the rule's `for`.

The prefilter (prefilter.py) runs on the TSDB at its query step, a multiple k of the grid step,
and at the grid step over the window's last points that the coarse steps do not reach. Its
answer holds the groups and steps where the loosened condition held. Where the evaluator's
condition holds, the prefilter's does too (a superset), so a run of hold + 1 true grid points
(what a rule with `for` needs to fire) is true at every queried point inside it. The client
checks that per group: the grid points not queried are unknown (wildcards), the queried ones
are what the answer says, and only stretches of hold + 1 points with no queried point false can
hold a run that fires. A group without such a stretch cannot fire; for the others the stretches
bound where the evaluator's runs can lie (`Group.first`, `Group.last`).

A prefilter of several conjuncts is run one conjunct at a time, cheapest first, each only over
the span where the earlier ones held (`staged_answer`) and, where none of its aggregations
reaches across instances, for the instances they held for (`Narrowing`); the client does the
`and`. Candidates of
a coarse answer grouped by model or by nothing are then re-read at the grid step over the span
where they can fire (`refined`): a group whose answer has no run of hold + 1 grid points there
is dropped before its evidence, every replica's series, is fetched.

`query_step` picks k so that such a run spans at least CONSECUTIVE queried points: a condition
that held at isolated steps (noise) is not a candidate, and its evidence is not fetched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kvscope.diagnoser.evaluate.frame import DEFAULT_LOOKBACK_S
from kvscope.diagnoser.pushdown.prefilter import Prefilter
from kvscope.diagnoser.sources.promapi import PromClient, PromError


@dataclass(frozen=True)
class Group:
    """One candidate group: its labels (the prefilter's grouping, empty labels absent) and the
    first and last grid index of the stretches where a run of the rule can lie."""

    labels: dict[str, str]
    first: int
    last: int


@dataclass
class Hits:
    """A rule's candidates; `everywhere`: no server-side answer, every group is a candidate over
    the whole window."""

    groups: list[Group] = field(default_factory=list)
    everywhere: bool = False
    error: str = ""  # why the server could not answer (then everywhere)
    matched: int = 0  # groups in the answer (candidates or not)
    moved: bool = False  # answered at times not asked for: candidates widened
    coarse: int | None = None  # candidates at the query step, before re-reading at the grid step
    narrowed: int = 0  # conjunct queries narrowed to the instances earlier ones held for

    @property
    def first(self) -> int:
        return min(g.first for g in self.groups)

    @property
    def last(self) -> int:
        return max(g.last for g in self.groups)


def query_prefilter(client: PromClient, pre: Prefilter, grid: np.ndarray, step: float) -> Hits:
    """Run one prefilter over the grid and read its answer (see the module docstring). A
    prefilter the server refuses (an unsupported function, its own timeout or size limit)
    costs speed, not answers: the rule is judged everywhere."""
    if pre.expr is None:
        return Hits(everywhere=True)
    qstep = pre.step or step
    k = max(1, int(round(qstep / step)))
    head = lattice_head(grid, qstep, k)  # coarse points at grid indices head, head + k, ..., coarse_end
    coarse_end = head + int((len(grid) - 1 - head) // k) * k
    what = f"prefilter {pre.rule_id}"
    try:
        allowed = fact_instances(client, pre, grid)
        if allowed is not None and not allowed:
            return Hits()
        narrowing = Narrowing(pre)
        result = staged_answer(client, pre, grid, step, k, coarse_end, head, narrowing) if len(pre.parts) > 1 else None
        if result is None:
            result = lattice_query(client, pre.expr, grid, step, k, coarse_end, 0, len(grid) - 1, what, head)
    except PromError as exc:
        if exc.status not in (400, 422, 503, 504):
            raise
        return Hits(everywhere=True, error=str(exc))
    if allowed is not None:
        result = [r for r in result if str((r.get("metric") or {}).get("instance", "")) in allowed]
    hits = read_answer(result, grid, k, coarse_end, pre.hold_steps, head)
    hits.narrowed = narrowing.count
    peers = any("instance" not in g.labels for g in hits.groups)
    return refined(client, pre, grid, step, hits) if k > 1 and peers and not hits.moved else hits


def refined(client: PromClient, pre: Prefilter, grid: np.ndarray, step: float, hits: Hits) -> Hits:
    """Coarse candidates re-read at the grid step, over the span where they can fire only: a
    group is kept where its answer holds at hold + 1 consecutive grid points (the coarse answer
    leaves the points between its steps open, so noise that held at a few query steps makes a
    candidate). Asked for groups of models or of the fleet, whose evidence is every replica's
    series, as large as this fleet-wide query; an instance's group fetches its own series only,
    less than the query would cost (measured: bench/diagnose_fleet.py). The same expression at
    the same times gives the same values, so this only narrows; a refused or moved answer keeps
    the coarse candidates."""
    lo, hi = hits.first, hits.last
    sub = grid[lo : hi + 1]
    n = len(sub)
    try:
        result = staged_answer(client, pre, sub, step, 1, n - 1) if len(pre.parts) > 1 else None
        if result is None:
            result = lattice_query(
                client, pre.expr or "", sub, step, 1, n - 1, 0, n - 1, f"prefilter {pre.rule_id} at the grid step"
            )
    except PromError:
        return hits
    fine = read_answer(result, sub, 1, n - 1, pre.hold_steps)
    if fine.moved:
        return hits
    spans = {_key(g.labels, None): g for g in fine.groups}
    out = []
    for g in hits.groups:
        f = spans.get(_key(g.labels, None))
        if f is None:
            continue  # no stretch of hold + 1 grid points: it cannot fire
        first, last = max(g.first, f.first + lo), min(g.last, f.last + lo)
        out.append(Group(g.labels, first, last) if first <= last else g)
    return Hits(out, matched=hits.matched, coarse=len(hits.groups), narrowed=hits.narrowed)


def lattice_head(grid: np.ndarray, qstep: float, k: int) -> int:
    """The first of the grid's first k points at a multiple of the query step (0 if none): coarse
    queries whose start is a multiple of their step are answered at the times asked by servers
    that align steps for their caches (VictoriaMetrics' rollup cache, query frontends), and
    their parts are cached across queries."""
    for i in range(min(k, len(grid))):
        t = float(grid[i]) / qstep
        if abs(t - round(t)) < 1e-9:
            return i
    return 0


def fact_instances(client: PromClient, pre: Prefilter, grid: np.ndarray) -> set[str] | None:
    """The instances with an info series for each of the rule's fact tests anywhere in the
    window (one instant query at its end over the whole window and the lookback); None: no
    fact test, or the server refused the query (then facts are left to the evaluator)."""
    if not pre.facts:
        return None
    span = f"{int(float(grid[-1] - grid[0]) + DEFAULT_LOOKBACK_S) + 1}s"
    expr = "\nand on (instance)\n".join(f"group by (instance) (last_over_time({sel}[{span}]))" for sel in pre.facts)
    try:
        answer = client.query(expr, float(grid[-1]))
    except PromError as exc:
        if exc.status not in (400, 422, 503, 504):
            raise
        return None
    return {str((r.get("metric") or {}).get("instance", "")) for r in answer}


def lattice_query(
    client: PromClient,
    expr: str,
    grid: np.ndarray,
    step: float,
    k: int,
    coarse_end: int,
    lo: int,
    hi: int,
    what: str,
    head: int = 0,
) -> list[dict[str, Any]]:
    """`expr` at the queried grid points between indices lo and hi: the window's first `head`
    points at the grid step, then every k-th up to coarse_end (one range query at k steps,
    split by the client where it must), then the window's last points at the grid step."""
    result: list[dict[str, Any]] = []
    if lo < head:
        result += client.query_range(expr, float(grid[lo]), float(grid[min(hi, head - 1)]), step)
    first = head + -(-(max(lo, head) - head) // k) * k
    last = head + (min(hi, coarse_end) - head) // k * k
    if first <= last and hi >= head:
        result += client.range_parts(expr, float(grid[first]), float(grid[last]), step * k, series=0, what=what)
    if hi > coarse_end:
        result += client.query_range(expr, float(grid[max(lo, coarse_end + 1)]), float(grid[hi]), step)
    return result


def part_cost(expr: str) -> int:
    """A rough price of one conjunct on the TSDB, to run the cheap ones first: raw selectors, a
    histogram's (all its buckets) nine times more, each subquery (the inner expression again at
    its own step) ten."""
    selectors = expr.count("{__name__") + len(re.findall(r"\bkvscope:\w+", expr))
    return selectors + 9 * expr.count("_bucket") + 10 * len(re.findall(r"\[\d+[a-z]*(?:\d+[a-z]*)*:\d", expr))


def staged_answer(
    client: PromClient,
    pre: Prefilter,
    grid: np.ndarray,
    step: float,
    k: int,
    coarse_end: int,
    head: int = 0,
    narrow: Narrowing | None = None,
) -> list[dict[str, Any]] | None:
    """The answer of `pre.expr`, a conjunction `p0 and [on (...)] p1 and ...`, computed as the
    server would, from its conjuncts run one at a time, cheapest first: a grid point where one
    conjunct has no series has none in the conjunction, so each next conjunct is queried only
    between the first and last points every earlier one held at, and none once that is empty
    (a rule whose cheap condition never held costs one cheap query), and for the instances
    every earlier one held for where it can be (`Narrowing`). The client then does the
    `and`: the first conjunct's series at the points where each other one has a series with the
    same labels (its `on` labels where it has a grouping of its own). None when an answer came
    back at times that were not asked for (a server that moves steps): then the one joined
    query runs instead."""
    n = len(grid)
    known = queried_mask(n, k, coarse_end, head)
    alive = known.copy()
    answers: dict[int, list[dict[str, Any]]] = {}
    narrow = narrow or Narrowing(pre)
    for i in sorted(range(len(pre.parts)), key=lambda j: part_cost(pre.parts[j][0])):
        at = np.flatnonzero(alive)
        if not at.size:
            return []
        answers[i] = lattice_query(
            client, narrow.expr(i), grid, step, k, coarse_end, int(at[0]), int(at[-1]), f"prefilter {pre.rule_id}", head
        )
        rows = _rows(answers[i], grid, known, None)
        if rows is None:
            return None
        alive &= np.logical_or.reduce(list(rows.values())) if rows else np.zeros(n, dtype=bool)
        narrow.held(i, rows)
    by = set(pre.parts[0][1])
    masks = [_rows(answers[j], grid, known, None if set(b) == by else b) for j, (_, b) in enumerate(pre.parts) if j]
    out = []
    for key, held in (_rows(answers[0], grid, known, None) or {}).items():
        mask = held & alive
        for j, other in enumerate(masks, start=1):
            on = None if set(pre.parts[j][1]) == by else pre.parts[j][1]
            mask &= (other or {}).get(_key(dict(key), on), np.zeros(n, dtype=bool))
        if mask.any():
            out.append({"metric": dict(key), "values": [[float(grid[i]), "1"] for i in np.flatnonzero(mask)]})
    return out


NARROW_SHARE = 0.5
"""A later conjunct is narrowed to the instances left when they are at most this share of the
most instances one earlier answer held."""


class Narrowing:
    """The instances a staged prefilter can still match, and its next conjuncts' queries narrowed
    to them: a conjunct grouped by instance that has no series for an instance has none in the
    `and` either, so a later conjunct whose every aggregation keeps `instance` (`per_instance`)
    is asked for the instances every earlier such conjunct held for only (the same series for
    those, none for the rest). Asked only when that is at most NARROW_SHARE of the instances
    some answer held: a fleet where the cheap conjuncts held nearly everywhere pays nothing for
    it (a regex of every instance in every selector)."""

    def __init__(self, pre: Prefilter) -> None:
        self.pre = pre
        self.instances: frozenset[str] | None = None
        self.seen = 0  # the most instances one answer held
        self.parts: tuple[str, ...] | None = None
        self.asked: frozenset[str] | None = None
        self.count = 0  # queries narrowed

    def expr(self, i: int) -> str:
        """Conjunct i's query: narrowed to the instances left, where it can be and that is fewer."""
        own = self.pre.parts[i][0]
        left = self.instances
        if left is None or self.pre.narrowed is None or len(left) > NARROW_SHARE * self.seen or not self._narrowable(i):
            return own
        if self.asked != left:
            self.parts, self.asked = self.pre.narrowed(left), left
        if self.parts is None:
            return own
        self.count += 1
        return self.parts[i]

    def held(self, i: int, rows: dict[tuple[tuple[str, str], ...], np.ndarray]) -> None:
        """Take conjunct i's answer (`_rows` keyed by all labels): the instances it held for."""
        if "instance" not in self.pre.parts[i][1]:
            return
        got = {dict(key).get("instance") for key in rows}
        if None in got or "" in got:
            self.pre, self.instances = replace(self.pre, narrowed=None), None  # labels not as grouped: stop
            return
        held = frozenset(str(g) for g in got)
        self.seen = max(self.seen, len(held))
        self.instances = held if self.instances is None else self.instances & held

    def _narrowable(self, i: int) -> bool:
        return "instance" in self.pre.parts[i][1] and per_instance(self.pre.parts[i][0])


_AGGREGATION = re.compile(
    r"\b(sum|min|max|avg|group|stddev|stdvar|count|count_values|bottomk|topk|quantile|limitk)"
    r"\s*(?:(by|without)\s*\(([^)]*)\))?\s*\("
)


def per_instance(expr: str) -> bool:
    """Whether each of `expr`'s series depends on one instance's series only, so narrowing its
    selectors to some instances gives the same series for them: every aggregation keeps
    `instance` (`by` it, or `without` not it), and no function writes or reads that label or
    leaves vector land (label_replace/label_join of it, scalar, vector, absent)."""
    if '"instance"' in expr or re.search(r"\b(scalar|vector|absent|absent_over_time)\s*\(", expr):
        return False
    for m in _AGGREGATION.finditer(expr):
        labels = {x.strip() for x in (m.group(3) or "").split(",")}
        if m.group(2) is None or (m.group(2) == "by") != ("instance" in labels):
            return False
    return True


def _key(labels: dict[str, Any], on: tuple[str, ...] | None) -> tuple[tuple[str, str], ...]:
    """What `and` matches series on: every label but the name, or the `on` labels ("" if absent)."""
    if on is None:
        return tuple(sorted((str(a), str(b)) for a, b in labels.items() if a != "__name__"))
    return tuple((a, str(labels.get(a, ""))) for a in on)


def _rows(
    result: list[dict[str, Any]], grid: np.ndarray, known: np.ndarray, on: tuple[str, ...] | None
) -> dict[tuple[tuple[str, str], ...], np.ndarray] | None:
    """bool [n] per matching key: the grid points where a series of the answer has a value; None
    when a value is at a time that was not queried."""
    out: dict[tuple[tuple[str, str], ...], np.ndarray] = {}
    for series in result:
        values = series.get("values") or []
        if not values:
            continue
        ts = np.array([float(v[0]) for v in values])
        idx = np.clip(np.searchsorted(grid, ts - 1e-6), 0, len(grid) - 1)
        if not (np.all(np.abs(grid[idx] - ts) < 1e-3) and known[idx].all()):
            return None
        row = out.setdefault(_key(series.get("metric") or {}, on), np.zeros(len(grid), dtype=bool))
        row[idx] = True
    return out


def queried_mask(n: int, k: int, coarse_end: int, head: int = 0) -> np.ndarray:
    """bool [n]: the grid points a prefilter queried (the first `head`, every k-th from there up
    to coarse_end, then all)."""
    known = np.zeros(n, dtype=bool)
    known[:head] = True
    known[head : coarse_end + 1 : k] = True
    known[coarse_end + 1 :] = True
    return known


def read_answer(
    result: list[dict[str, Any]], grid: np.ndarray, k: int, coarse_end: int, hold: int, head: int = 0
) -> Hits:
    """Candidate groups of a prefilter answer (series of (time, value) where it held).

    An answer at times the query did not ask for (a server that moved the steps) says nothing
    about the steps in between: then each matched group is a candidate from a query step before
    its first point to a query step after its last."""
    n = len(grid)
    known = queried_mask(n, k, coarse_end, head)
    rows: dict[tuple[tuple[str, str], ...], np.ndarray] = {}
    aligned = True
    for series in result:
        values = series.get("values") or []
        if not values:
            continue
        key = tuple(sorted((str(a), str(b)) for a, b in (series.get("metric") or {}).items()))
        held = rows.setdefault(key, np.zeros(n, dtype=bool))
        ts = np.array([float(v[0]) for v in values])
        idx = np.clip(np.searchsorted(grid, ts - 1e-6), 0, n - 1)
        aligned = aligned and bool(np.all(np.abs(grid[idx] - ts) < 1e-3) and known[idx].all())
        held[idx] = True
    groups = []
    for key, held in rows.items():
        if aligned:
            span = candidate_span(held, known, hold)
        else:
            at = np.flatnonzero(held)
            span = (max(0, int(at[0]) - k), min(n - 1, int(at[-1]) + k)) if at.size else None
        if span is not None:
            groups.append(Group(dict(key), *span))
    return Hits(groups, matched=len(rows), moved=not aligned)


def candidate_span(held: np.ndarray, known: np.ndarray, hold: int) -> tuple[int, int] | None:
    """(first, last) grid index of the stretches of at least hold + 1 points in which no queried
    point is false; None when there is none (no run of the rule can fire there)."""
    open_ = held | ~known
    if not (held & known).any():
        return None
    c = np.cumsum(open_)
    reset = np.where(~open_, c, 0)
    np.maximum.accumulate(reset, out=reset)
    runs = c - reset  # consecutive open points ending at each index
    ends = np.flatnonzero(runs >= hold + 1)
    if not ends.size:
        return None
    starts = ends - runs[ends] + 1
    return int(starts.min()), int(ends.max())
