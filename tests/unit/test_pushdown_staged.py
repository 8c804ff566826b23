"""The staged prefilter (pushdown/candidates.py): conjuncts run cheapest first, the `and` done by
the client, must answer what the one joined query answers. The TSDB here is a table of canned
answers (the real-TSDB proof is tests/integration/test_pushdown.py); this checks the client's
own logic: label matching, `on` groupings, early exit and the time range of later conjuncts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from kvscope.diagnoser.pushdown.candidates import part_cost, query_prefilter, staged_answer
from kvscope.diagnoser.pushdown.prefilter import Prefilter

BUCKETS = '{__name__=~"ttft_bucket"}'
CHEAP = 'max by (instance) ({__name__=~"waiting"}) >= 1'
COSTLY = f"histogram_quantile(0.99, sum by (instance, le) (rate({BUCKETS}[2m]))) >= 2"
MODEL = 'count by (model) ({__name__=~"waiting"}) >= 2'
MIDDLE = 'max by (instance) ({__name__=~"running"}) >= 0.5 * max by (instance) ({__name__=~"limit"})'


class TableTSDB:
    """Answers each expression from a table {expr: [(labels, times where it holds)]}, on the
    queried lattice only, and records what was asked."""

    def __init__(self, table: dict[str, list[tuple[dict[str, str], set[float]]]], shift: float = 0.0) -> None:
        self.table, self.shift = table, shift
        self.calls: list[tuple[str, float, float, float]] = []

    def range_parts(
        self, expr: str, start: float, end: float, step: float, series: int = 0, what: str = ""
    ) -> list[dict[str, Any]]:
        return self.query_range(expr, start, end, step)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        self.calls.append((expr, start, end, step))
        out = []
        for labels, times in self.table.get(expr, []):
            at = sorted(
                t for t in times if start <= t <= end and abs((t - start) / step - round((t - start) / step)) < 1e-9
            )
            if at:
                out.append({"metric": dict(labels), "values": [[t + self.shift, "1"] for t in at]})
        return out


def _pre(*parts: tuple[str, tuple[str, ...]]) -> Prefilter:
    by = parts[0][1]
    expr = f"({parts[0][0]})" + "".join(
        f"\nand{'' if set(b) == set(by) else ' on (' + ', '.join(b) + ')'}\n({e})" for e, b in parts[1:]
    )
    return Prefilter("r", expr, by, step=15.0, hold_steps=0, parts=tuple(parts))


GRID = 1000.0 + 15.0 * np.arange(40)
T = [float(t) for t in GRID]


def test_conjuncts_run_cheapest_first_and_intersect_on_labels() -> None:
    db = TableTSDB(
        {
            COSTLY: [({"instance": "a"}, set(T[5:20])), ({"instance": "b"}, set(T[0:40]))],
            CHEAP: [({"instance": "a"}, set(T[10:30])), ({"instance": "c"}, set(T[0:40]))],
        }
    )
    pre = _pre((COSTLY, ("instance",)), (CHEAP, ("instance",)))
    got = staged_answer(db, pre, GRID, 15.0, 1, len(GRID) - 1)
    assert [c[0] for c in db.calls] == [CHEAP, COSTLY]
    # the joined query: a where both hold (10..19); b has no cheap series, c no costly one
    assert got == [{"metric": {"instance": "a"}, "values": [[t, "1"] for t in T[10:20]]}]


def test_on_grouping_matches_the_other_conjuncts_labels_only() -> None:
    db = TableTSDB(
        {
            COSTLY: [
                ({"instance": "a", "model": "m1"}, set(T[0:40])),
                ({"instance": "b", "model": "m2"}, set(T[0:40])),
            ],
            MODEL: [({"model": "m1"}, set(T[0:5]))],
        }
    )
    pre = _pre((COSTLY, ("instance", "model")), (MODEL, ("model",)))
    got = staged_answer(db, pre, GRID, 15.0, 1, len(GRID) - 1)
    assert got == [{"metric": {"instance": "a", "model": "m1"}, "values": [[t, "1"] for t in T[0:5]]}]


def test_an_empty_cheap_conjunct_spares_the_costly_one() -> None:
    db = TableTSDB({COSTLY: [({"instance": "a"}, set(T))], CHEAP: []})
    pre = _pre((COSTLY, ("instance",)), (CHEAP, ("instance",)))
    assert staged_answer(db, pre, GRID, 15.0, 1, len(GRID) - 1) == []
    assert [c[0] for c in db.calls] == [CHEAP]


def test_later_conjuncts_are_queried_only_where_earlier_ones_held() -> None:
    db = TableTSDB({COSTLY: [({"instance": "a"}, set(T))], CHEAP: [({"instance": "a"}, set(T[12:18]))]})
    pre = _pre((COSTLY, ("instance",)), (CHEAP, ("instance",)))
    staged_answer(db, pre, GRID, 15.0, 1, len(GRID) - 1)
    costly = [c for c in db.calls if c[0] == COSTLY]
    assert costly == [(COSTLY, T[12], T[17], 15.0)]


def test_coarse_lattice_and_tail_as_the_joined_query_asks() -> None:
    """k = 4: coarse points at indices 0, 4, ..., 36, then 37..39 at the grid step; a later
    conjunct's range starts on the lattice."""
    db = TableTSDB({COSTLY: [({"instance": "a"}, set(T))], CHEAP: [({"instance": "a"}, {T[9], T[12], T[38]})]})
    pre = _pre((COSTLY, ("instance",)), (CHEAP, ("instance",)))
    got = staged_answer(db, pre, GRID, 15.0, 4, 36)
    assert got == [{"metric": {"instance": "a"}, "values": [[T[12], "1"], [T[38], "1"]]}]
    costly = [c[1:] for c in db.calls if c[0] == COSTLY]
    assert costly == [(T[12], T[36], 60.0), (T[37], T[38], 15.0)]


def test_an_answer_off_the_queried_steps_falls_back_to_the_joined_query() -> None:
    pre = _pre((COSTLY, ("instance",)), (CHEAP, ("instance",)))
    moved = TableTSDB(
        {
            COSTLY: [({"instance": "a"}, set(T))],
            CHEAP: [({"instance": "a"}, set(T))],
            pre.expr: [({"instance": "a"}, set(T))],
        },
        shift=7.0,
    )
    assert staged_answer(moved, pre, GRID, 15.0, 1, len(GRID) - 1) is None
    hits = query_prefilter(moved, pre, GRID, 15.0)  # the joined expression is what answers
    assert moved.calls[-1][0] == pre.expr and hits.matched == 1


def test_part_cost_orders_gauges_before_histograms_before_subqueries() -> None:
    sub = f"avg_over_time(({COSTLY})[15m:30s] offset 5m)"
    assert part_cost(CHEAP) < part_cost(COSTLY) < part_cost(sub)


def test_fact_tests_become_info_gauge_selectors_and_filter_the_answer() -> None:
    from kvscope.agent.signals import load_catalog
    from kvscope.diagnoser.promql.signals import RecordedSignals
    from kvscope.diagnoser.pushdown.prefilter import compile_prefilter
    from kvscope.diagnoser.rulebook.rule import read_rules

    rule = next(r for r in read_rules() if r.id == "prefix_caching_disabled")
    pre = compile_prefilter(rule, RecordedSignals(), load_catalog(), 15.0)
    assert (
        pre.facts and "vllm:cache_config_info" in pre.facts[0] and 'enable_prefix_caching=~"(?i)False"' in pre.facts[0]
    )
    assert not any("fact" in d for d in pre.dropped)

    class WithInfo(TableTSDB):
        def __init__(self, table: dict, instances: list[str]) -> None:
            super().__init__(table)
            self.instances = instances

        def query(self, expr: str, at: float) -> list[dict[str, Any]]:
            assert "last_over_time(" in expr and f"[{int(T[-1] - T[0]) + 300 + 1}s]" in expr
            return [{"metric": {"instance": i}, "value": [at, "1"]} for i in self.instances]

    answer = {pre.expr: [({"instance": "a"}, set(T)), ({"instance": "b"}, set(T))]}
    assert [g.labels for g in query_prefilter(WithInfo(answer, ["b"]), pre, GRID, 15.0).groups] == [{"instance": "b"}]
    nobody = WithInfo(answer, [])
    assert query_prefilter(nobody, pre, GRID, 15.0).groups == [] and nobody.calls == []


def test_coarse_queries_start_at_a_multiple_of_their_step() -> None:
    """Servers that align steps for their caches answer a query whose start is a multiple of its
    step at the times asked: the lattice starts at the first such grid point, the points before
    it are asked at the grid step."""
    from kvscope.diagnoser.pushdown.candidates import lattice_head, lattice_query, queried_mask

    grid = 1005.0 + 15.0 * np.arange(40)  # 1020 = 17 x 60 is grid[1]
    assert lattice_head(grid, 60.0, 4) == 1 and lattice_head(GRID, 60.0, 4) == 0
    known = queried_mask(40, 4, 37, head=1)
    assert list(np.flatnonzero(known)) == [0, 1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 38, 39]
    db = TableTSDB({CHEAP: [({"instance": "a"}, {float(t) for t in grid})]})
    got = lattice_query(db, CHEAP, grid, 15.0, 4, 37, 0, 39, "x", head=1)
    assert [c[1:] for c in db.calls] == [
        (grid[0], grid[0], 15.0),
        (grid[1], grid[37], 60.0),
        (grid[38], grid[39], 15.0),
    ]
    assert sorted(v[0] for s in got for v in s["values"]) == [float(grid[i]) for i in np.flatnonzero(known)]


def test_coarse_candidates_are_reread_at_the_grid_step_where_they_can_fire() -> None:
    """k = 4, hold 4 (a run of 5 grid points fires), grouped by model (evidence: every replica):
    `m1` holds over 12 grid points, `m2` only at the three query steps 8, 12, 16. Both are coarse
    candidates (the points between query steps are open); re-read at the grid step over their
    span, only `m1` has a run, and its span is where it held. Groups of one instance (evidence:
    its own series) and answers already at the grid step are not re-read."""
    db = TableTSDB({MODEL: [({"model": "m1"}, set(T[8:20])), ({"model": "m2"}, {T[8], T[12], T[16]})]})
    pre = Prefilter("r", MODEL, ("model",), step=60.0, hold_steps=4, parts=((MODEL, ("model",)),))
    hits = query_prefilter(db, pre, GRID, 15.0)
    assert [(g.labels, g.first, g.last) for g in hits.groups] == [({"model": "m1"}, 8, 19)]
    assert hits.coarse == 2 and hits.matched == 2
    assert [c[1:] for c in db.calls][-1] == (T[5], T[19], 15.0)  # the candidates' span, at the grid step
    fine = Prefilter("r", MODEL, ("model",), step=15.0, hold_steps=4, parts=((MODEL, ("model",)),))
    calls = len(db.calls)
    assert query_prefilter(db, fine, GRID, 15.0).coarse is None and len(db.calls) == calls + 1
    own = TableTSDB({CHEAP: [({"instance": "a"}, {T[8], T[12], T[16]})]})
    pre = Prefilter("r", CHEAP, ("instance",), step=60.0, hold_steps=4, parts=((CHEAP, ("instance",)),))
    assert [g.labels for g in query_prefilter(own, pre, GRID, 15.0).groups] == [{"instance": "a"}]
    assert len(own.calls) == 2  # the coarse lattice and its tail


def _narrowable(pre: Prefilter) -> tuple[Prefilter, list[frozenset[str]]]:
    """(`pre` with a `narrowed` that writes each part as `part|instances`, the instance sets it
    was asked for)."""
    asked: list[frozenset[str]] = []

    def narrowed(instances: frozenset[str]) -> tuple[str, ...]:
        asked.append(instances)
        return tuple(e + "|" + ",".join(sorted(instances)) for e, _ in pre.parts)

    return replace(pre, narrowed=narrowed), asked


def test_later_conjuncts_are_asked_for_the_instances_earlier_ones_held_for() -> None:
    db = TableTSDB(
        {
            CHEAP: [({"instance": i}, set(T[0:40])) for i in ("a", "b", "c", "d")] + [({"instance": "e"}, set())],
            MIDDLE: [({"instance": "a"}, set(T[0:20])), ({"instance": "b"}, set(T[5:10]))],
            f"{COSTLY}|a,b": [({"instance": "a"}, set(T[8:12]))],
        }
    )
    pre, asked = _narrowable(_pre((COSTLY, ("instance",)), (CHEAP, ("instance",)), (MIDDLE, ("instance",))))
    got = staged_answer(db, pre, GRID, 15.0, 1, len(GRID) - 1)
    # cheap held for a, b, c, d (no narrowing: as many as any answer held); middle for a, b only
    # (half of those): the costly conjunct is asked for a and b, and the answer is the joined query's
    assert [c[0] for c in db.calls] == [CHEAP, MIDDLE, f"{COSTLY}|a,b"]
    assert asked == [frozenset({"a", "b"})]
    assert got == [{"metric": {"instance": "a"}, "values": [[t, "1"] for t in T[8:12]]}]


def test_conjuncts_that_aggregate_over_instances_are_never_narrowed() -> None:
    peers = f"max by (instance) ({BUCKETS}) > 2 * on () group_left avg(max by (instance) ({BUCKETS}))"
    db = TableTSDB(
        {
            CHEAP: [({"instance": i}, set(T)) for i in ("a", "b")],
            MIDDLE: [({"instance": "a"}, set(T))],
            peers: [({"instance": "a"}, set(T[0:3]))],
        }
    )
    pre, _ = _narrowable(_pre((peers, ("instance",)), (CHEAP, ("instance",)), (MIDDLE, ("instance",))))
    got = staged_answer(db, pre, GRID, 15.0, 1, len(GRID) - 1)
    assert [c[0] for c in db.calls] == [CHEAP, MIDDLE, peers]
    assert got == [{"metric": {"instance": "a"}, "values": [[t, "1"] for t in T[0:3]]}]


def test_per_instance_reads_every_aggregation_and_relabel() -> None:
    from kvscope.diagnoser.pushdown.candidates import per_instance

    assert per_instance(COSTLY) and per_instance(CHEAP)
    assert per_instance("max_over_time((sum by (instance, model) (x))[2m:15s]) >= 1")
    assert per_instance("sum without (le) (rate(x[1m])) > 1")
    assert per_instance("histogram_quantile(0.5, rate(x[2m])) / count_over_time(y[5m]) > 1")
    assert not per_instance(MODEL)
    assert not per_instance("sum(rate(x[1m])) > 1")
    assert not per_instance("sum without (instance) (x) > 1")
    assert not per_instance('max by (instance) (label_replace(x, "instance", "$1", "worker_addr", "(.+)")) > 1')
    assert not per_instance("max by (instance) (x) > scalar(avg(x))")
