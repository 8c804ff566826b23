"""Change-point encoding of scraped series: what the SQLite store writes, and how it reads back.

Most series keep their value between scrapes, so a batch becomes three kinds of rows:

* **stamps** `(group, ts_ms)`: one per scrape of a *group* of series sharing their timestamps.
  A batch splits into cohorts by exact timestamp; a cohort takes the group its series followed
  last time, else a new one (grouping changes only the row count, never the points read back).
* **points** `(series, ts_ms, value)`: where a series starts a run or its value changes.
* **marks** `(series, ts_ms, group)`: from `ts_ms` on the series is present at every stamp of
  `group`, or (group 0) at none: absent from a scrape of its group, stale from there on.

`fill_points` reads back exactly the dense series written (tests/unit/test_changepoints.py).
Samples older than a series' previous point are dropped (`out_of_order`), as is a second one in
the same millisecond (`duplicate`, first wins).
"""

from __future__ import annotations

import bisect
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import groupby

from kvscope.core.signals import Labels, Sample

Key = tuple[str, Labels]
_timestamp = operator.itemgetter(3)
Points = list[tuple[float, float]]


@dataclass
class Encoded:
    """Rows for one transaction, and the sample counts behind them."""

    points: list[tuple[int, int, float]] = field(default_factory=list)  # (series id, ts_ms, value)
    marks: list[tuple[int, int, int]] = field(default_factory=list)  # (series id, ts_ms, group)
    stamps: list[tuple[int, int]] = field(default_factory=list)  # (group, ts_ms)
    accepted: int = 0  # samples now queryable (points + elided)
    dropped: Counter[str] = field(default_factory=Counter)


class ChangeEncoder:
    """Writer-side state: the last point of every series and the members of every group. In memory
    only: after `reset()` (a failed commit) or in a new process every series starts a new run in a
    new group, always correct, at one row per series once. `series_id(name, labels)`: the store's
    id of a series (created on first sight), or when the store refuses it None or the reason
    (counted in `dropped`)."""

    def __init__(self, series_id: Callable[[str, Labels], int | str | None], next_group: int = 1) -> None:
        self._series_id = series_id
        self._next_group = max(1, next_group)
        self._last: dict[Key, list] = {}  # key -> [sid, last ts_ms unless in a group, value, group]
        self._by_sid: dict[int, list] = {}  # the same lists by series id
        self._members: dict[int, set[int]] = {}  # group -> series ids in its current run
        self._group_ts: dict[int, int] = {}  # group -> its latest stamp

    def reset(self) -> None:
        """Forget all state (the rows it described may not be on disk)."""
        for state in (self._last, self._by_sid, self._members, self._group_ts):
            state.clear()

    def forget(self, sids: set[int]) -> None:
        """Drop state of series the store deleted (retention pruned them)."""
        gone = [k for k, st in self._last.items() if st[0] in sids]
        for k in gone:
            st = self._last.pop(k)
            del self._by_sid[st[0]]
            members = self._members.get(st[3])
            if members is not None:
                members.discard(st[0])

    def encode(self, batch: Iterable[Sample], now: float, out: Encoded | None = None) -> Encoded:
        """Rows for `batch` (in any order; samples without a timestamp are stamped `now`),
        appended to `out` (a new `Encoded` if None)."""
        out = Encoded() if out is None else out
        by_ts: dict[object, list[Sample]] = {}
        for ts, run in groupby(batch, _timestamp):  # runs of one timestamp (a target's scrape)
            by_ts.setdefault(ts, []).extend(run)
        # A cohort is the samples of one exact timestamp: targets scraped within the same
        # millisecond stay apart (each keeps its own group), though their stamps round alike.
        cohorts: list[tuple[int, float, list[Sample]]] = []
        for ts, samples in by_ts.items():
            try:
                exact = float(now if ts is None else ts)  # type: ignore[arg-type]
                cohorts.append((round(exact * 1000), exact, samples))
            except (TypeError, ValueError, OverflowError):
                out.dropped["bad_value"] += len(samples)
        used: set[int] = set()
        for ts_ms, _, samples in sorted(cohorts, key=lambda c: c[:2]):
            g = self._group_for(ts_ms, samples, used)
            used.add(g)
            self._encode(g, ts_ms, samples, out)
        return out

    def _group_for(self, ts_ms: int, cohort: list[Sample], used: set[int]) -> int:
        """The group this cohort's series followed last (if free and older), else a new one."""
        last = self._last
        for s in cohort[:8]:
            st = last.get((s[0], s[1]))
            if st is not None and st[3]:
                g = st[3]
                if g not in used and self._group_ts.get(g, -1) < ts_ms:
                    return g
                break
        g = self._next_group
        self._next_group += 1
        return g

    def _encode(self, g: int, ts_ms: int, cohort: list[Sample], out: Encoded) -> None:
        last, by_sid, group_ts = self._last, self._by_sid, self._group_ts
        members = self._members.get(g) or set()
        present: set[int] = set()
        points, marks, dropped = out.points, out.marks, out.dropped
        for s in cohort:
            v = s[2]
            if type(v) is not float:
                try:
                    v = float(v)
                except (TypeError, ValueError):
                    dropped["bad_value"] += 1
                    continue
            if v != v:  # NaN: SQLite would store NULL
                dropped["nan"] += 1
                continue
            st = last.get((s[0], s[1]))
            if st is not None and st[3] == g:
                # the hot path: a member of this group's run (in order by construction of g)
                sid = st[0]
                if sid in present:
                    dropped["duplicate"] += 1
                    continue
                present.add(sid)
                if st[2] != v:
                    st[2] = v
                    points.append((sid, ts_ms, v))
                continue
            if st is None:
                sid = self._series_id(s[0], s[1])
                if not isinstance(sid, int):  # refused: None, or the reason
                    dropped[sid or "series_limit"] += 1
                    continue
                st = last[(s[0], s[1])] = by_sid[sid] = [sid, -1, v, 0]
            previous = group_ts[st[3]] if st[3] else st[1]  # a member's last point is its group's last stamp
            if previous >= ts_ms:
                dropped["duplicate" if previous == ts_ms else "out_of_order"] += 1
                continue
            if st[3]:  # moves from another group's run
                self._members[st[3]].discard(st[0])
            st[1], st[2], st[3] = previous, v, g
            present.add(st[0])
            points.append((st[0], ts_ms, v))
            marks.append((st[0], ts_ms, g))
        if members:
            before = group_ts.get(g, -1)
            for sid in members - present:  # absent from this scrape of its group: stale from here
                st = by_sid[sid]
                if st[3] == g:
                    st[1], st[3] = before, 0
                    marks.append((sid, ts_ms, 0))
        self._members[g] = present
        group_ts[g] = ts_ms
        out.stamps.append((g, ts_ms))
        out.accepted += len(present)


# ------------------------------------------------------------------------------------ read side


def fill_points(
    real: Sequence[tuple[int, float]],
    carry: tuple[int, float] | None,
    marks: Sequence[tuple[int, int]],
    stamps_of: Callable[[int, int, int], Sequence[int]],
    lo: int,
    hi: int,
) -> Points:
    """The dense points of one series in [lo, hi] (milliseconds in, seconds out).

    `real`: stored points in [lo, hi], sorted; `carry`: the latest stored point before `lo`;
    `marks`: (ts_ms, group) sorted, starting with the mark active at `lo` (if any) and ending at
    `hi`; `stamps_of(group, a, b)`: sorted stamps of `group` in [a, b]. Without marks the real
    points are the answer.
    """
    if not marks:
        return [(t / 1000, v) for t, v in real]
    dense: dict[int, float] = {}
    real_ts = [t for t, _ in real]
    for i, (m_ts, group) in enumerate(marks):
        if not group:
            continue
        a = max(lo, m_ts)
        b = min(hi, marks[i + 1][0] - 1) if i + 1 < len(marks) else hi
        if a > b:
            continue
        for t in stamps_of(group, a, b):
            j = bisect.bisect_right(real_ts, t) - 1
            if j >= 0:
                dense[t] = real[j][1]
            elif carry is not None and carry[0] <= t:
                dense[t] = carry[1]
    for t, v in real:
        dense[t] = v
    return [(t / 1000, dense[t]) for t in sorted(dense)]


@dataclass
class StampIndex:
    """Stamps of each group in one query window, fetched once per group and sliced by bisect."""

    _fetch: Callable[[int], list[int]]
    _cache: dict[int, list[int]] = field(default_factory=dict)

    def __call__(self, group: int, a: int, b: int) -> list[int]:
        stamps = self._cache.get(group)
        if stamps is None:
            stamps = self._cache[group] = self._fetch(group)
        return stamps[bisect.bisect_left(stamps, a) : bisect.bisect_right(stamps, b)]
