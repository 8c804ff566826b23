"""Conditions, `for` durations, facts and cascade stages, evaluated on grouped grid series.

A condition gives a boolean per group and grid point, never true on an absent value; `latest_run`
finds the latest run of true points that lasted `for`: a finding's `since`/`until`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvscope.diagnoser.evaluate import grid
from kvscope.diagnoser.evaluate.expr import SeriesEvaluator
from kvscope.diagnoser.rulebook import tree
from kvscope.diagnoser.rulebook.grammar import OPS


@dataclass
class Evaluated:
    """One condition over all groups: the truth, the left values and the right side."""

    cond: tree.Cond
    truth: np.ndarray  # bool [G, T]
    left: np.ndarray  # float [G, T]
    right: np.ndarray | None  # float [G, T] (None for `present`)


class ConditionEvaluator:
    """Evaluates conditions of one rule at the rule's grouping."""

    def __init__(
        self, ev: SeriesEvaluator, by: tuple[str, ...], keys: list[tuple[str, ...]], facts: dict[str, dict[str, str]]
    ) -> None:
        self.ev, self.by, self.keys, self.facts = ev, by, keys, facts
        self.shape = (len(keys), len(ev.frame.ts))

    def bridge_outages(self, truth: np.ndarray) -> np.ndarray:
        """`truth` with the points where a group's instance was down (frame.mark_stale), and the
        scrape after, taking the value from before the outage: stale is unknown, not false, so an
        outage neither cuts a `for` run nor makes a condition true. Groups without `instance` as is."""
        down = self.ev.frame.down
        if not down or "instance" not in self.by:
            return truth
        col = self.by.index("instance")
        rows = [(gi, down[k[col]]) for gi, k in enumerate(self.keys) if k[col] in down]
        if not rows:
            return truth
        out = truth.copy()
        steps = np.arange(truth.shape[1])
        for gi, down_mask in rows:
            mask = down_mask.copy()
            mask[1:] |= down_mask[:-1]  # the first scrape back has no rate over a window yet
            last_up = np.maximum.accumulate(np.where(mask, 0, steps))
            out[gi, mask] = truth[gi, last_up[mask]] & ~mask[last_up[mask]]
        return out

    def evaluate(self, cond: tree.Cond) -> Evaluated:
        left = self.ev.aligned(cond.series, self.by, self.keys)
        if cond.right is None:  # `present: true|false`
            return Evaluated(cond, np.isnan(left) ^ (cond.op == "present"), left, None)
        right = self._right(cond, left)
        with np.errstate(invalid="ignore"):
            truth = OPS[cond.op](left, right)
        if cond.op == "!=":  # the only comparison that is true against NaN
            truth &= ~np.isnan(left) & ~np.isnan(right)
        return Evaluated(cond, truth, left, right)

    def _right(self, cond: tree.Cond, left: np.ndarray) -> np.ndarray:
        r = cond.right
        if isinstance(r, tree.Value):  # a parameter left unset (null) makes the test false
            # one value for every group and point: a read-only broadcast, not a [G, T] array
            x = cond.threshold()
            return np.broadcast_to(np.float64(np.nan if x is None else x), self.shape)
        if isinstance(r, tree.Than):
            return self.ev.aligned(r.series, self.by, self.keys) * cond.times + cond.plus
        assert isinstance(r, tree.Baseline)
        k, off = self.ev._k(r.rng), self.ev._k(r.offset, 0)
        source = left if r.of is None else self.ev.aligned(r.of, self.by, self.keys)
        return grid.shift(grid.over_time(source, k, r.agg), off) * cond.times + cond.plus

    def all_of(self, conds: Sequence[tree.Cond], lazy: bool = False) -> tuple[np.ndarray, list[Evaluated]]:
        """Truth of every condition together, and each condition evaluated. `lazy` stops at the
        first condition after which nothing is true anywhere (the rest cannot change that), so
        `done` may then be shorter than `conds`."""
        done = []
        truth = np.ones(self.shape, dtype=bool)
        for c in conds:
            done.append(self.evaluate(c))
            truth &= done[-1].truth
            if lazy and not truth.any():
                break
        return truth, done

    def block(self, block: tree.Block, lazy: bool = False) -> tuple[np.ndarray, list[Evaluated]]:
        """Truth of a block's `all` and (when given) `any` together, and each condition evaluated
        (`lazy`: `any` is skipped where `all` holds nowhere)."""
        truth, done = self.all_of(block.all, lazy)
        if block.any and (truth.any() or not lazy):
            any_done = [self.evaluate(c) for c in block.any]
            truth, done = truth & np.logical_or.reduce([e.truth for e in any_done]), done + any_done
        return truth, done

    def facts_hold(self, facts: Sequence[tree.Fact]) -> np.ndarray:
        """bool [G]: every fact test holds for the group's instance (unknown fact = False)."""
        ok = np.ones(len(self.keys), dtype=bool)
        if not facts:
            return ok
        pos = self.by.index("instance")
        for gi, key in enumerate(self.keys):
            known = self.facts.get(key[pos], {})
            for f in facts:
                have = known.get(f.fact)
                ok[gi] &= have is not None and OPS[f.op](have, f.value)
        return ok


def run_lengths(truth: np.ndarray) -> np.ndarray:
    """For each point, how many consecutive true points end there (0 where false); only rows
    with a true point are computed."""
    live = np.flatnonzero(truth.any(axis=1)) if truth.ndim == 2 else None
    if live is not None and len(live) < truth.shape[0]:
        out = np.zeros(truth.shape, dtype=np.int64)
        if len(live):
            out[live] = _run_lengths(truth[live])
        return out
    return _run_lengths(truth)


def _run_lengths(truth: np.ndarray) -> np.ndarray:
    c = np.cumsum(truth, axis=1)
    reset = np.where(~truth, c, 0)
    np.maximum.accumulate(reset, axis=1, out=reset)
    return c - reset


def latest_run(runs_row: np.ndarray, for_steps: int) -> tuple[int, int] | None:
    """(start, end) indices of the latest run that lasted `for_steps` steps, or None."""
    ok = np.flatnonzero(runs_row - 1 >= for_steps)
    if not ok.size:
        return None
    end = int(ok[-1])
    return end - int(runs_row[end]) + 1, end


def first_run(runs_row: np.ndarray, for_steps: int, not_before: int) -> int | None:
    """Start index of the first run lasting `for_steps` that starts at or after `not_before`."""
    ends = np.flatnonzero(runs_row - 1 >= for_steps)
    starts = ends - runs_row[ends] + 1
    ok = starts[starts >= not_before]
    return int(ok[0]) if ok.size else None
