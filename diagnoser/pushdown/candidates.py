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

`query_step` picks k so that such a run spans at least CONSECUTIVE queried points: a condition
that held at isolated steps (noise) is not a candidate, and its evidence is not fetched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
    error: str = ""                  # why the server could not answer (then everywhere)
    matched: int = 0                 # groups in the answer (candidates or not)

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
    n_coarse = int((len(grid) - 1) // k)          # coarse points at grid indices 0, k, ..., n_coarse * k
    last = float(grid[n_coarse * k])
    try:
        result = client.range_parts(pre.expr, float(grid[0]), last, qstep, series=0,
                                    what=f"prefilter {pre.rule_id}")
        if n_coarse * k < len(grid) - 1:          # the window's last points, at the grid step
            result += client.query_range(pre.expr, float(grid[n_coarse * k + 1]), float(grid[-1]), step)
    except PromError as exc:
        if exc.status not in (400, 422, 503, 504):
            raise
        return Hits(everywhere=True, error=str(exc))
    return read_answer(result, grid, k, n_coarse * k, pre.hold_steps)


def queried_mask(n: int, k: int, coarse_end: int) -> np.ndarray:
    """bool [n]: the grid points a prefilter queried (every k-th up to coarse_end, then all)."""
    known = np.zeros(n, dtype=bool)
    known[0:coarse_end + 1:k] = True
    known[coarse_end + 1:] = True
    return known


def read_answer(result: list[dict[str, Any]], grid: np.ndarray, k: int, coarse_end: int,
                hold: int) -> Hits:
    """Candidate groups of a prefilter answer (series of (time, value) where it held).

    An answer at times the query did not ask for (a server that moved the steps) says nothing
    about the steps in between: then each matched group is a candidate from a query step before
    its first point to a query step after its last."""
    n = len(grid)
    known = queried_mask(n, k, coarse_end)
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
    return Hits(groups, matched=len(rows))


def candidate_span(held: np.ndarray, known: np.ndarray, hold: int) -> tuple[int, int] | None:
    """(first, last) grid index of the stretches of at least hold + 1 points in which no queried
    point is false; None when there is none (no run of the rule can fire there)."""
    open_ = held | ~known
    if not (held & known).any():
        return None
    c = np.cumsum(open_)
    reset = np.where(~open_, c, 0)
    np.maximum.accumulate(reset, out=reset)
    runs = c - reset                               # consecutive open points ending at each index
    ends = np.flatnonzero(runs >= hold + 1)
    if not ends.size:
        return None
    starts = ends - runs[ends] + 1
    return int(starts.min()), int(ends.max())
