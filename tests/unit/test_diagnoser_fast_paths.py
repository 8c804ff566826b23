"""The diagnoser's fast paths give exactly what the straightforward paths give.

bench/diagnose_scale.py needs the quantile, window and run-length shortcuts (planes built from
cumulative counters, counting planes below the rank, gap-free averages, run lengths of live
rows only); each is checked here element for element against the plain grid functions, so a
speed change cannot change a number. bench/diagnose_golden.py checks whole diagnoses.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvscope.core.signals import make_labels
from kvscope.diagnoser.evaluate import grid
from kvscope.diagnoser.evaluate.conditions import _run_lengths, run_lengths
from kvscope.diagnoser.evaluate.evaluator import diagnose
from kvscope.diagnoser.evaluate.expr import SeriesEvaluator, _quantiles, align
from kvscope.diagnoser.evaluate.frame import Block, Frame, make_grid
from kvscope.diagnoser.rulebook.rule import parse_yaml, read_rules, rule_from_doc

BOUNDS = [-1.0, 0.0, 0.05, 0.1, 0.5, 1.0, 2.5, 10.0, 100.0]


def _random_histograms(rng: np.random.Generator, integer: bool):
    n_g, n_b, n_t = int(rng.integers(1, 6)), int(rng.integers(1, 7)), int(rng.integers(2, 40))
    step_counts = rng.poisson(2, (n_g * n_b, n_t)).astype(float) if integer else rng.random((n_g * n_b, n_t)) * 3
    if rng.random() < 0.2:
        step_counts[:] = 0.0  # no observations at all: every quantile absent
    cumulative = np.cumsum(step_counts, axis=1)
    les = np.append(np.sort(rng.choice(BOUNDS, size=n_b - 1, replace=False)), np.inf)
    if rng.random() < 0.5:
        rows = rng.permutation(n_g * n_b).reshape(n_g, n_b)  # gathered rows
    else:
        rows = np.arange(n_g * n_b).reshape(n_b, n_g).T  # evenly spaced: read in place
    return cumulative, les, rows


@pytest.mark.parametrize("integer", [True, False])
def test_quantile_from_planes_equals_bucket_quantile_of_window_increase(integer):
    rng = np.random.default_rng(11 if integer else 12)
    for _ in range(400):
        cumulative, les, rows = _random_histograms(rng, integer)
        k = int(rng.integers(1, 50))
        q = float(rng.choice([0.0, 0.25, 0.5, 0.9, 0.99, 1.0, 1.5]))
        expected = grid.bucket_quantile(q, les, grid.window_increase(cumulative, k), rows)
        got = grid.quantile_from_planes(q, les, grid.window_bucket_planes(cumulative, rows, k))
        np.testing.assert_array_equal(got, expected)


def test_window_bucket_planes_writes_into_scratch_and_reads_strided_rows_in_place():
    rng = np.random.default_rng(3)
    cumulative = np.cumsum(rng.poisson(3, (12, 30)).astype(float), axis=1)
    rows = np.arange(12).reshape(4, 3).T  # bucket b = rows b, b+3, b+6, b+9
    scratch = np.empty(4 * 3 * 30 + 5)
    planes = grid.window_bucket_planes(cumulative, rows, 4, scratch)
    assert np.shares_memory(planes, scratch)
    inc = grid.window_increase(cumulative, 4)
    inc[:, 0] = 0.0
    np.testing.assert_array_equal(planes, np.maximum.accumulate(inc[rows.T], axis=0))
    assert grid._rows_view(cumulative, rows[:, 1]).base is not None  # a view, not a copy


def test_window_quantile_in_chunks_equals_one_pass(monkeypatch):
    rng = np.random.default_rng(4)
    n_g, n_b, n_t = 37, 6, 50
    cumulative = np.cumsum(rng.random((n_g * n_b, n_t)) * 5, axis=1)
    les = np.array([0.1, 0.2, 0.5, 1.0, 5.0, np.inf])
    rows = rng.permutation(n_g * n_b).reshape(n_g, n_b)
    monkeypatch.setattr(grid, "PLANES_CHUNK_BYTES", 8 * n_b * n_t * 5)  # chunks of 5 groups
    order = rng.permutation(n_g)
    for q in (0.5, 0.9, 0.99):
        values = grid.window_quantile(q, les, cumulative, rows, 7)
        moved = grid.window_quantile(q, les, cumulative, rows, 7, order)
        expected = grid.bucket_quantile(q, les, grid.window_increase(cumulative, 7), rows)
        np.testing.assert_array_equal(values, expected)
        np.testing.assert_array_equal(moved[order], expected)  # group i went to row order[i]


def test_sum_dense_groups_matches_reduce_groups():
    rng = np.random.default_rng(5)
    for n_groups in (1, 3, 70):
        values = rng.poisson(4, (300, 25)).astype(float)  # integer sums are exact in any order
        inverse = rng.integers(0, n_groups, 300)
        expected = grid.reduce_groups(values, inverse, n_groups, "sum")
        got = grid.sum_dense_groups(values, inverse, n_groups)
        present = np.isin(np.arange(n_groups), inverse)
        np.testing.assert_array_equal(got[present], expected[present])
        assert (got[~present] == 0).all()


def test_avg_over_time_without_gaps_equals_the_counting_path():
    rng = np.random.default_rng(8)
    for _ in range(100):
        values = rng.random((int(rng.integers(1, 5)), int(rng.integers(1, 60)))) * 100
        k = int(rng.integers(0, 70))
        counts = grid._trailing_sum(np.ones_like(values), k)  # the general path's arithmetic
        reference = grid._trailing_sum(values, k) / counts
        got = grid.over_time(values, k, "avg")
        np.testing.assert_array_equal(got, reference)
        t = values.shape[1] - 1
        assert got[0, t] == pytest.approx(values[0, max(0, t - k) :].mean())
    gappy = np.array([[1.0, np.nan, 3.0, 5.0]])
    np.testing.assert_allclose(grid.over_time(gappy, 1, "avg"), [[1.0, 1.0, 3.0, 4.0]])


def test_run_lengths_of_live_rows_only_equal_the_full_computation():
    rng = np.random.default_rng(9)
    truth = rng.random((50, 40)) < 0.3
    truth[rng.random(50) < 0.7] = False  # most groups never true
    np.testing.assert_array_equal(run_lengths(truth), _run_lengths(truth))
    np.testing.assert_array_equal(run_lengths(np.zeros((3, 5), dtype=bool)), np.zeros((3, 5), dtype=int))


def _bench_like_frame(engines: int = 12, n_t: int = 80) -> Frame:
    """Integer bucket counters of two models (sums are exact in any order), le-major rows."""
    rng = np.random.default_rng(21)
    les = ["0.1", "0.5", "1.0", "5.0", "+Inf"]
    labels, rows = [], []
    per_step = rng.poisson(5, (engines, n_t)).astype(float)
    share = np.cumsum(rng.dirichlet(np.ones(len(les)), size=(engines, n_t)), axis=2)
    counts = np.cumsum(np.floor(per_step[:, :, None] * share), axis=1)
    counts[:, :, -1] = np.cumsum(per_step, axis=1)
    for b, le in enumerate(les):
        for e in range(engines):
            labels.append(make_labels({"instance": f"e{e}", "model": f"m{e % 2}", "le": le}))
            rows.append(counts[e, :, b])
    ts = make_grid(1e9, 1e9 + 15 * (n_t - 1), 15)
    return Frame(ts=ts, blocks={"request_ttft_seconds_bucket": Block(labels, np.vstack(rows))})


@pytest.mark.parametrize("by", [["instance"], ["model"], [], ["instance", "model"]])
@pytest.mark.parametrize("q", [0.5, 0.99])
def test_dense_quantile_path_equals_increase_then_sum_then_quantile(by, q):
    frame = _bench_like_frame()
    rule = rule_from_doc(
        parse_yaml(
            f"id: t\nby: {by}\nseries:\n  p: {{quantile: {q}, histogram: request_ttft_seconds, range: 2m}}\n"
            "  sibling: {quantile: 0.75, histogram: request_ttft_seconds, range: 2m}\n"
        ),
        "t.yaml",
    )
    ev = SeriesEvaluator(rule, frame)
    block = frame.blocks["request_ttft_seconds_bucket"]
    keys, inv = grid.group_index([tuple(dict(lbl).get(k, "") for k in (*by, "le")) for lbl in block.labels])
    summed = grid.reduce_groups(grid.window_increase(block.values, 8), inv, len(keys), "sum")
    for name, quantile in (("p", q), ("sibling", 0.75)):
        got = ev.get(name)
        groups, expected = _quantiles(quantile, keys, summed, len(by))
        assert got.keys == groups
        np.testing.assert_array_equal(got.values, expected)
        assert np.isfinite(got.values[:, 1:]).any()


def test_align_of_the_same_keys_is_the_series_itself_and_remembered():
    frame = _bench_like_frame()
    rule = rule_from_doc(
        parse_yaml(
            "id: t\nby: [instance]\nseries:\n  p: {quantile: 0.5, histogram: request_ttft_seconds, range: 2m}\n"
        ),
        "t.yaml",
    )
    ev = SeriesEvaluator(rule, frame)
    g = ev.get("p")
    assert align(g, g.by, list(g.keys)) is g.values
    keys = g.keys[::-1]
    first = ev.aligned("p", ("instance",), keys)
    np.testing.assert_array_equal(first, g.values[::-1])
    assert ev.aligned("p", ("instance",), keys) is first


def test_profile_collects_rule_and_node_times_without_changing_the_diagnosis():
    frame = _bench_like_frame()
    rules = read_rules()
    plain = diagnose(frame, rules, time_scale=1.0, workers=1).to_dict()
    frame.cache, frame.profile = {}, {}
    profiled = diagnose(frame, rules, time_scale=1.0, workers=1).to_dict()
    assert profiled == plain
    rule_ids = {k[1] for k in frame.profile if k[0] == "rule"}
    assert rule_ids == {r.id for r in rules}
    assert any(k[0] == "node" and k[3] == "quantile" for k in frame.profile)
    assert all(t >= 0 for t in frame.profile.values())


@pytest.mark.parametrize("agg", ["max", "min"])
def test_sliding_max_min_equal_a_reduce_over_each_window(agg):
    rng = np.random.default_rng(13)
    ufunc = np.fmax if agg == "max" else np.fmin
    for _ in range(300):
        values = rng.random((int(rng.integers(1, 4)), int(rng.integers(1, 50))))
        values[rng.random(values.shape) < 0.3] = np.nan  # absent points are ignored
        k = int(rng.integers(0, 60))
        expected = ufunc.reduce(grid.window_view(values, k), axis=-1)
        np.testing.assert_array_equal(grid.over_time(values, k, agg), expected)


def test_lazy_all_of_stops_once_nothing_holds_and_gives_the_same_truth():
    from kvscope.diagnoser.evaluate.conditions import ConditionEvaluator

    frame = _bench_like_frame()
    rule = rule_from_doc(
        parse_yaml(
            "id: t\nby: [instance]\nseries:\n  p: {quantile: 0.5, histogram: request_ttft_seconds, range: 2m}\n"
        ),
        "t.yaml",
    )
    ev = SeriesEvaluator(rule, frame)
    keys = ev.get("p").keys
    ce = ConditionEvaluator(ev, ("instance",), keys, {})
    from kvscope.diagnoser.rulebook.tree import Cond, Value

    conds = [
        Cond("p", ">", Value(0.2)),
        Cond("p", ">", Value(1e9)),
        Cond("p", "<", Value(100)),
    ]
    eager, done_eager = ce.all_of(conds)
    lazy, done_lazy = ce.all_of(conds, lazy=True)
    np.testing.assert_array_equal(lazy, eager)
    assert not lazy.any() and len(done_eager) == 3 and len(done_lazy) == 2
    holds, done = ce.all_of([conds[0], conds[2]], lazy=True)
    assert holds.any() and len(done) == 2


def test_threads_and_a_warm_cache_give_the_same_diagnosis():
    """Rules evaluated side by side share the frame cache (layouts, label columns, quantiles)."""
    frame = _bench_like_frame(engines=16, n_t=120)
    rules = read_rules()
    one = diagnose(frame, rules, time_scale=1.0, workers=1).to_json()
    frame.cache = {}
    assert diagnose(frame, rules, time_scale=1.0, workers=4).to_json() == one
    assert diagnose(frame, rules, time_scale=1.0, workers=4).to_json() == one  # cache already full
