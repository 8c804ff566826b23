"""The load a change is compared at, as the engine saw it (issue 55, item 2): the prefill the
requests asked of it (prompt tokens less its prefix cache's hits), and, at a replica change, the
engines that neither came nor went (docs/curve.md "Did it help")."""

from __future__ import annotations

import numpy as np

from kvscope.core.signals import make_labels
from kvscope.diagnoser.curve.report import pool_curves
from kvscope.diagnoser.evaluate.frame import Block, Frame
from tests.unit.test_curve import BASE, synth

HALF = 24


def _with_prompts(frame: Frame, hit_share) -> Frame:
    """`frame` with 100 prompt tokens per first token, `hit_share(i)` of them served by the prefix
    cache in interval i (the counters start again where the finished counter does)."""
    T = len(frame.ts)
    first = frame.blocks["request_ttft_seconds_count"].values[0]
    prompt, hits = np.zeros(T), np.zeros(T)
    for i in range(1, T):
        keep = 0.0 if first[i] < first[i - 1] else 1.0
        n = first[i] - keep * first[i - 1]
        prompt[i] = keep * prompt[i - 1] + 100 * n
        hits[i] = keep * hits[i - 1] + 100 * n * hit_share(i)
    lab = make_labels(BASE)
    blocks = dict(frame.blocks)
    blocks["engine_prompt_tokens_total"] = Block([lab], prompt[None, :])
    blocks["engine_prefix_cache_hits_tokens_total"] = Block([lab], hits[None, :])
    return Frame(ts=frame.ts, blocks=blocks)


def _restart(kv_after: float) -> Frame:
    """One engine at 4 requests, restarted at HALF; after it the prefix cache serves 10 % of the
    prompt tokens instead of 60 % (4x the prefill per request) and the slowest 3 % take 2.5 s."""
    frame = synth(
        [4.0] * (2 * HALF),
        tail=lambda c, i: 1 if i < HALF else 5,
        resets=(HALF,),
        kv_cap=[1000.0] * HALF + [kv_after] * HALF,
    )
    return _with_prompts(frame, lambda i: 0.6 if i < HALF else 0.1)


def test_a_cold_prefix_cache_after_a_same_flags_restart_is_not_a_regression():
    """Same flags, same prompts, but the restarted engine's cache is cold: the requests ask it for
    2.25x the prefill. A different workload as the engine saw it, not a change of the engine."""
    (pc,) = pool_curves(_restart(1000.0), settle_s=0.0)
    (j,) = pc.changes
    assert j.change.kind == "restart"
    assert j.offered_load["prompt_tokens_per_request"]["relative"] == 0.0
    assert j.verdict == "not_comparable", (j.verdict, j.worse)
    assert j.reason and "computed_prompt_tokens_per_request 40 -> 90" in j.reason


def test_a_kv_cut_that_empties_the_prefix_cache_is_still_a_regression():
    """The same hits falling with the KV capacity 1000 -> 200: a cache that no longer holds the
    prefixes is what the cut did, so the prefill it adds does not gate the verdict."""
    (pc,) = pool_curves(_restart(200.0), settle_s=0.0)
    (j,) = pc.changes
    assert j.change.kind == "config" and j.verdict == "regression" and j.worse == ["ttft_p99_s"]
    assert j.offered_load["computed_prompt_tokens_per_request"]["relative"] > 1.0


def _instances(frames: dict[str, Frame]) -> Frame:
    """One frame of several single-instance frames (the same grid), each relabelled."""
    first = next(iter(frames.values()))
    blocks = {}
    for name in first.blocks:
        labels, rows = [], []
        for inst, f in frames.items():
            b = f.blocks[name]
            labels += [make_labels(dict(lab) | {"instance": inst}) for lab in b.labels]
            rows.append(b.values)
        blocks[name] = Block(labels, np.vstack(rows))
    return Frame(ts=first.ts, blocks=blocks)


def test_a_cold_replica_joining_is_not_read_as_the_engines_curve_moving():
    """Two engines at 4 requests throughout; a third joins at HALF and, cold, sends 3 % of its
    requests to 2.5 s (it serves 200 a scrape to their 40). More replicas leave the per-instance curve where it is (§8.5): the two that
    stayed did not move, so no regression."""
    steady = synth([4.0] * (2 * HALF), tail=lambda c, i: 1)
    cold = synth([4.0] * (2 * HALF), tail=lambda c, i: 5, n=200, tokens=lambda c: 50 * min(c, 6))
    for b in cold.blocks.values():
        b.values[:, :HALF] = np.nan  # not there before HALF
    (pc,) = pool_curves(_instances({"a": steady, "b": steady, "c": cold}), settle_s=0.0)
    (j,) = pc.changes
    assert j.change.kind == "replicas" and j.change.diff == {"replicas": [2, 3]}
    assert j.verdict == "no_change", (j.verdict, j.worse, j.deltas)


def test_not_comparable_says_how_much_more_traffic_at_which_load_would_decide_it():
    """HALF intervals at 4 requests before a restart, 3 after it (then the window ends): the after
    side's bucket is sparse (5 intervals needed), so no verdict; the change says that 2 more
    intervals (2 x 15 s) at that load after it would make the bucket comparable."""
    (pc,) = pool_curves(synth([4.0] * (HALF + 4), resets=(HALF,)), settle_s=0.0)
    (j,) = pc.changes
    assert j.verdict == "not_comparable" and not j.deltas
    (need,) = j.more_traffic
    assert need["bucket"] == [3.5, 5.0] and need["concurrency"] == 4.0
    assert need["before"]["more_intervals"] == 0 and need["after"] == {
        "intervals": 3,
        "requests": 120.0,
        "more_intervals": 2,
        "more_seconds": 30.0,
        "more_wall_seconds": 30.0,  # every interval of the after side was at that load
    }
    assert "2 more intervals (30 s) after it at 4 requests in the engine" in pc_text(pc)
    assert "(at the mix of load each side held so far, about 30 s after)" in pc_text(pc)


def pc_text(pc) -> str:
    from kvscope.diagnoser.curve.report import changes_text

    return "\n".join(changes_text(pc))
