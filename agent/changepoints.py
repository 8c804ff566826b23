"""Change-point encoding of scraped series: what the SQLite store writes, and how it reads back.

Between two scrapes most series of an engine keep their value (an idle histogram bucket, a
config gauge, a counter nobody incremented). Writing a row for each of them every second is
what a naive store spends its CPU on. This module turns a batch of samples into three kinds of
rows, and turns those rows back into exactly the points that were written:

* **stamps** `(group, ts_ms)`: one row per scrape of a *group*. A group is a set of series that
  share their timestamps (one target's scrape; the samples the runtime stamps at the end of a
  cycle). A batch is split into cohorts by timestamp; a cohort takes the group its series
  followed last time, else a new group id.
* **points** `(series, ts_ms, value)`: a real row where a series starts a run, and wherever its
  value differs from its previous point. An unchanged value writes no row.
* **marks** `(series, ts_ms, group)`: from `ts_ms` on the series is present at every stamp of
  `group` (group > 0), or at none (group 0: the series was absent from a scrape of its group,
  so it is stale from there on; a target that stops answering simply stops writing stamps).

Reading back (`fill_points`): the real points in range, plus, for every stamp of the series'
active group inside a run, the value of the latest real point at or before that stamp (which
may lie before the window: the caller passes it as `carry`). The result equals the dense
series that was written; tests/unit/test_changepoints.py checks it sample for sample, with
counter resets, series that vanish and return, targets going down and retention.

Samples older than a series' previous point are dropped (`out_of_order`), as Prometheus does;
a second sample in the same millisecond is dropped (`duplicate`, first write wins).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from kvscope.agent.signals import Labels, Sample

Key = tuple[str, Labels]
Points = list[tuple[float, float]]


@dataclass
class Encoded:
    """Rows for one transaction, and the sample counts behind them."""

    points: list[tuple[int, int, float]] = field(default_factory=list)    # (series id, ts_ms, value)
    marks: list[tuple[int, int, int]] = field(default_factory=list)       # (series id, ts_ms, group)
    stamps: list[tuple[int, int]] = field(default_factory=list)           # (group, ts_ms)
    accepted: int = 0          # samples now queryable (points + elided)
    dropped: Counter[str] = field(default_factory=Counter)


class ChangeEncoder:
    """Writer-side state: the last point of every series and the members of every group.

    `series_id(name, labels)` returns the store's id of a series (creating it) or None when the
    store refuses new series. State lives in memory only: after `reset()` (a failed commit, or a
    fresh process on an existing file) every series starts a new run in a new group, which is
    always correct, and costs one row per series once.
    """

    def __init__(self, series_id: Callable[[str, Labels], int | None], next_group: int = 1) -> None:
        self._series_id = series_id
        self._next_group = max(1, next_group)
        self._last: dict[Key, list] = {}       # key -> [sid, ts_ms, value, group]
        self._members: dict[int, set[Key]] = {}
        self._group_ts: dict[int, int] = {}    # group -> its latest stamp

    def reset(self) -> None:
        """Forget all state (the rows it described may not be on disk)."""
        self._last.clear()
        self._members.clear()
        self._group_ts.clear()

    def forget(self, sids: set[int]) -> None:
        """Drop state of series the store deleted (retention pruned them)."""
        gone = [k for k, st in self._last.items() if st[0] in sids]
        for k in gone:
            st = self._last.pop(k)
            members = self._members.get(st[3])
            if members is not None:
                members.discard(k)

    def encode(self, batch: Iterable[Sample], now: float, out: Encoded | None = None) -> Encoded:
        """Rows for `batch` (in any order; samples without a timestamp are stamped `now`),
        appended to `out` (a new `Encoded` if None)."""
        out = Encoded() if out is None else out
        by_ts: dict[object, list[Sample]] = {}
        for s in batch:
            ts = s[3]
            cohort = by_ts.get(ts)
            if cohort is None:
                by_ts[ts] = [s]
            else:
                cohort.append(s)
        cohorts: dict[int, list[Sample]] = {}
        for ts, samples in by_ts.items():
            try:
                ts_ms = round(float(now if ts is None else ts) * 1000)   # type: ignore[arg-type]
            except (TypeError, ValueError, OverflowError):
                out.dropped["bad_value"] += len(samples)
                continue
            cohorts.setdefault(ts_ms, []).extend(samples)
        used: set[int] = set()
        for ts_ms in sorted(cohorts):
            self._encode_cohort(ts_ms, cohorts[ts_ms], used, out)
        return out

    def _group_for(self, ts_ms: int, cohort: Sequence[Sample], used: set[int]) -> int:
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

    def _encode_cohort(self, ts_ms: int, cohort: list[Sample], used: set[int], out: Encoded) -> None:
        g = self._group_for(ts_ms, cohort, used)
        used.add(g)
        last, members_of = self._last, self._members
        members = members_of.get(g) or set()
        present: set[Key] = set()
        points, marks, dropped = out.points, out.marks, out.dropped
        accepted = 0
        for s in cohort:
            v = s[2]
            if type(v) is not float:
                try:
                    v = float(v)
                except (TypeError, ValueError):
                    dropped["bad_value"] += 1
                    continue
            if v != v:   # NaN: SQLite would store NULL
                dropped["nan"] += 1
                continue
            key = (s[0], s[1])
            st = last.get(key)
            if st is None:
                sid = self._series_id(s[0], s[1])
                if sid is None:
                    dropped["series_limit"] += 1
                    continue
                last[key] = [sid, ts_ms, v, g]
                points.append((sid, ts_ms, v))
                marks.append((sid, ts_ms, g))
            elif st[1] >= ts_ms:
                dropped["duplicate" if st[1] == ts_ms else "out_of_order"] += 1
                continue
            elif st[3] != g:     # starts a run in this group (new, back after a gap, or moved)
                if st[3]:
                    old = members_of.get(st[3])
                    if old is not None:
                        old.discard(key)
                st[1], st[2], st[3] = ts_ms, v, g
                points.append((st[0], ts_ms, v))
                marks.append((st[0], ts_ms, g))
            else:
                st[1] = ts_ms
                if st[2] != v:
                    st[2] = v
                    points.append((st[0], ts_ms, v))
            present.add(key)
            accepted += 1
        if members:
            for key in members - present:   # absent from this scrape of its group: stale from here
                st = last[key]
                if st[3] == g:
                    st[3] = 0
                    marks.append((st[0], ts_ms, 0))
        members_of[g] = present
        self._group_ts[g] = ts_ms
        out.stamps.append((g, ts_ms))
        out.accepted += accepted


# ------------------------------------------------------------------------------------ read side

def fill_points(real: Sequence[tuple[int, float]], carry: tuple[int, float] | None,
                marks: Sequence[tuple[int, int]], stamps_of: Callable[[int, int, int], Sequence[int]],
                lo: int, hi: int) -> Points:
    """The dense points of one series in [lo, hi] (milliseconds in, seconds out).

    `real`: stored points in [lo, hi], sorted; `carry`: the latest stored point before `lo`;
    `marks`: (ts_ms, group) sorted, starting with the mark active at `lo` (if any) and ending at
    `hi`; `stamps_of(group, a, b)`: sorted stamps of `group` in [a, b]. Without marks (a store
    written before change-point encoding) the real points are the answer.
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


class StampIndex:
    """Stamps of each group in one query window, fetched once per group and sliced by bisect."""

    def __init__(self, fetch: Callable[[int], list[int]]) -> None:
        self._fetch = fetch
        self._cache: dict[int, list[int]] = {}

    def __call__(self, group: int, a: int, b: int) -> list[int]:
        stamps = self._cache.get(group)
        if stamps is None:
            stamps = self._cache[group] = self._fetch(group)
        return stamps[bisect.bisect_left(stamps, a):bisect.bisect_right(stamps, b)]
