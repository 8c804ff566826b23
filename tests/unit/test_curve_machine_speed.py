"""A machine that got slower or faster is not a change of the engine (issue 55, item 2).

At matched concurrency a closed system whose every step takes s times as long serves every
request s times slower and s times fewer per second; the engine's mean inter-token latency at the
same batch reads s. A verdict in the step's direction is the machine's speed as much as the
engine's, and is not given (docs/curve.md "Did it help")."""

from __future__ import annotations

import math

import numpy as np

from kvscope.core.signals import make_labels
from kvscope.diagnoser.curve.report import pool_curves, regression_findings
from kvscope.diagnoser.evaluate.frame import Block, Frame
from tests.unit.test_curve import BASE, STAIRS, STEP, hump, synth

ITL_LES = [0.01, 0.025, 0.05, 0.1, 0.25, math.inf]


def _with_itl(frame: Frame, step_s, slow) -> Frame:
    """`frame` with an ITL histogram: interval i's 40 tokens/s / slow(i) each `step_s(i)` apart
    (all in one bucket, the sum exact), the generated tokens to match, and the finished requests
    / slow(i) (the same tokens per request)."""
    T = len(frame.ts)
    buckets, total, gen, fin = np.zeros((len(ITL_LES), T)), np.zeros(T), np.zeros(T), np.zeros(T)
    finished = frame.blocks["engine_requests_finished_total"]
    resets = finished.values[0]
    for i in range(1, T):
        keep = 0.0 if resets[i] < resets[i - 1] else 1.0
        n = 40.0 / slow(i) * STEP
        fin[i] = keep * fin[i - 1] + (resets[i] - keep * resets[i - 1]) / slow(i)
        inc = np.zeros(len(ITL_LES))
        inc[int(np.searchsorted(ITL_LES, step_s(i)))] = n
        buckets[:, i] = keep * buckets[:, i - 1] + np.cumsum(inc)
        total[i] = keep * total[i - 1] + n * step_s(i)
        gen[i] = keep * gen[i - 1] + n
    lab = lambda **extra: make_labels(BASE | extra)  # noqa: E731
    blocks = dict(frame.blocks)
    blocks["request_itl_seconds_bucket"] = Block(
        [lab(le=str(le) if le != math.inf else "+Inf") for le in ITL_LES], buckets
    )
    blocks["request_itl_seconds_count"] = Block([lab()], buckets[-1:].copy())
    blocks["request_itl_seconds_sum"] = Block([lab()], total[None, :])
    blocks["engine_generation_tokens_total"] = Block([lab()], gen[None, :])
    blocks["engine_requests_finished_total"] = Block(finished.labels, fin[None, :])
    return Frame(ts=frame.ts, blocks=blocks)


HALF = 24


def _machine(slow: float, restart: bool = True, cap_after: float = 1000.0) -> Frame:
    """One engine at 4 requests (nothing waits) for 2 x HALF intervals; after HALF every step of
    the machine takes `slow` times as long: the slowest 3 % of TTFT from (0.1, 0.25] to (0.25,
    0.5], ITL 0.02 s x slow, tokens/s / slow. `restart`: the counters start again at HALF with the
    same flags unless the KV capacity moves to `cap_after`."""
    frame = synth(
        [4.0] * (2 * HALF),
        tail=lambda c, i: 2 if i < HALF else 3,
        resets=(HALF,) if restart else (),
        kv_cap=[1000.0] * HALF + [cap_after] * HALF,
    )
    return _with_itl(frame, lambda i: 0.02 * (slow if i >= HALF else 1.0), lambda i: slow if i >= HALF else 1.0)


def test_a_same_flags_restart_on_a_machine_twice_as_slow_is_not_a_regression():
    """Every time x2 and tokens/s / 2 after the restart, with the same flags: the engine's own
    numbers moved, but so does every number of a machine that got twice as slow (a noisy
    neighbour): not_comparable, the reason naming the step, and no finding."""
    (pc,) = pool_curves(_machine(2.0), settle_s=0.0)
    (j,) = pc.changes
    assert j.change.kind == "restart"
    assert j.deltas["output_tokens_per_s"]["relative"] < -0.4 and j.deltas["ttft_p99_s"]["relative"] > 0.1
    assert j.verdict == "not_comparable", (j.verdict, j.worse)
    assert j.reason and "step time" in j.reason and "slower" in j.reason
    assert j.step_time and j.step_time["relative"] > 0.9
    assert regression_findings([pc], (0.0, 1.0), STEP) == []


def test_a_same_flags_restart_read_worse_with_no_step_read_is_not_a_regression():
    """The slowest 3 % from (0.1, 0.25] to 2.5 s after a restart with the same flags, and no ITL
    exported (llama.cpp; the curve's records): nothing says the machine held its speed, so the
    verdict is withheld, the reason says why, and no finding; the same frame with the engine's
    step read the same on both sides is a regression."""
    frame = synth(
        [4.0] * (2 * HALF), tail=lambda c, i: 2 if i < HALF else 5, resets=(HALF,), kv_cap=[1000.0] * 2 * HALF
    )
    (pc,) = pool_curves(frame, settle_s=0.0)
    (j,) = pc.changes
    assert j.change.kind == "restart" and j.step_time is None
    assert j.verdict == "not_comparable" and j.reason and "step time is not read" in j.reason, (j.verdict, j.reason)
    assert j.more_traffic is None  # more of the same traffic would not read the machine's speed
    assert regression_findings([pc], (0.0, 1.0), STEP) == []
    (pc,) = pool_curves(_with_itl(frame, lambda i: 0.02, lambda i: 1.0), settle_s=0.0)
    (j,) = pc.changes
    assert j.verdict == "regression" and j.worse == ["ttft_p99_s"], (j.verdict, j.reason)


def test_a_curve_shift_with_the_step_read_held_is_a_change_without_a_finding():
    """The TTFT tail at 2.5 s at every load from the window's middle, no restart, no config, the
    engine's step (mean ITL) the same in both halves: the pool's curve moved and the machine did
    not, a `curve` regression; no finding (nothing to roll back)."""
    half = 2 * len(STAIRS)  # each half climbs the stairs twice: its earlier and later halves each hold every load
    shifted = synth(STAIRS * 4, tail=lambda c, i: hump(c) if i < half else 5)
    (pc,) = pool_curves(_with_itl(shifted, lambda i: 0.02, lambda i: 1.0), settle_s=0.0)
    (j,) = pc.changes
    assert j.change.kind == "curve" and j.verdict == "regression" and j.worse == ["ttft_p99_s"]
    assert regression_findings([pc], (0.0, 1.0), STEP) == []


def test_a_machine_that_got_faster_mid_window_is_no_curve_shift():
    """No restart, no config change; the machine twice as fast in the window's second half
    (metrics-only-healthy-busy-sticky's box): no `curve` improvement."""
    frame = _machine(2.0, restart=False)
    # read it backwards in speed: the first half slow, the second fast
    for name, block in frame.blocks.items():
        if name.startswith(("request_itl", "engine_generation", "engine_requests_finished", "request_ttft")):
            v = block.values
            inc = np.diff(v, axis=1, prepend=0.0)
            inc[:, 1:] = np.concatenate([inc[:, HALF:], inc[:, 1:HALF]], axis=1)
            frame.blocks[name] = Block(block.labels, np.cumsum(inc, axis=1))
    (pc,) = pool_curves(frame, settle_s=0.0)
    assert pc.changes == [], [(j.change.kind, j.verdict, j.better) for j in pc.changes]


def test_the_engine_better_on_a_slower_machine_is_still_an_improvement():
    """The machine 1.5x slower (ITL and tokens/s) while the slowest 3 % fall from 2.5 s to
    (0.05, 0.1] after a restart with no exported setting changed (one the engine does not export,
    say): against the step's direction, and still better with its ratio divided out."""
    frame = synth(
        [4.0] * (2 * HALF),
        tail=lambda c, i: 5 if i < HALF else 1,
        resets=(HALF,),
        kv_cap=[1000.0] * (2 * HALF),
    )
    frame = _with_itl(frame, lambda i: 0.02 * (1.5 if i >= HALF else 1.0), lambda i: 1.5 if i >= HALF else 1.0)
    (pc,) = pool_curves(frame, settle_s=0.0)
    (j,) = pc.changes
    assert j.step_time and j.step_time["relative"] > 0.4
    assert j.verdict == "improvement" and j.better == ["ttft_p99_s"], (j.verdict, j.reason)


def test_a_kv_cut_that_queues_is_a_regression_whatever_the_step():
    """KV 1000 -> 200: at the same 4 requests in the engine 2 now wait (a smaller batch) and the
    tail is at 2.5 s; the smaller batch steps faster, which reads nothing of the machine: the
    step is read only where the batches match, so the regression stands."""
    frame = synth(
        [4.0] * (2 * HALF),
        tail=lambda c, i: 1 if i < HALF else 5,
        waiting=lambda c: 0.0,
        resets=(HALF,),
        kv_cap=[1000.0] * HALF + [200.0] * HALF,
    )
    wait = frame.blocks["engine_requests_waiting"].values
    run = frame.blocks["engine_requests_running"].values
    wait[:, HALF:], run[:, HALF:] = 2.0, 2.0
    frame = _with_itl(frame, lambda i: 0.02 * (0.5 if i >= HALF else 1.0), lambda i: 1.0)
    (pc,) = pool_curves(frame, settle_s=0.0)
    (j,) = pc.changes
    assert j.step_time is None or j.verdict == "regression"
    assert j.verdict == "regression" and "ttft_p99_s" in j.worse, (j.verdict, j.reason)


def test_a_kv_cut_that_slows_the_step_at_the_same_batch_is_still_a_regression():
    """The same frame with the KV capacity cut 1000 -> 200 at the restart: a setting the engine
    exports changed, and a cache that no longer holds the prefixes slows the steps of the same
    batch (curve-shape-stairs-20: mean ITL +30 % at 1-3 in flight). The step is part of what the
    change did, not the machine's alibi: the regression stands."""
    (pc,) = pool_curves(_machine(2.0, cap_after=200.0), settle_s=0.0)
    (j,) = pc.changes
    assert j.change.kind == "config" and j.step_time and j.step_time["relative"] > 0.9
    assert j.verdict == "regression" and "ttft_p99_s" in j.worse, (j.verdict, j.reason)
