"""The eviction-cascade detector on hand-built canonical series (002 §7.4 stages)."""

from pathlib import Path

import pytest

from kvscope.agent.derive.cascade import STAGES, CascadeConfig, evaluate_cascade, render_cascade_samples
from kvscope.agent.recording.replay import replay_recording
from kvscope.core.signals import Sample, make_labels

INST = {"instance": "e0:8000", "engine": "vllm"}


def _ordered(rep) -> bool:
    """The root came first: onset(1) <= onsets 2, 3, 4, and onset(3) <= onset(4). Stage 2 is not
    ordered against 3 and 4: with admission control arrivals queue, and their TTFT grows, as soon
    as the pool is full, while running requests are preempted only later (docs/requests.md).
    Missing stages are skipped; ties are allowed."""
    o = rep.onsets
    return all(o[a] <= o[b] for a, b in [(1, 2), (1, 3), (1, 4), (3, 4)] if a in o and b in o)


def _series(name, values, labels=INST, t0=0.0, step=5.0):
    lab = make_labels(labels)
    return [Sample(name, lab, float(v), t0 + i * step) for i, v in enumerate(values)]


def _ttft(means_per_step, n_per_step=10):
    """Cumulative _sum/_count giving the wanted windowed mean per step."""
    s = c = 0.0
    sums, counts = [], []
    for m in means_per_step:
        s += m * n_per_step
        c += n_per_step
        sums.append(s)
        counts.append(c)
    return _series("request_ttft_seconds_sum", sums) + _series("request_ttft_seconds_count", counts)


def _cascade_run():
    # t = 0, 5, ..., 45.  KV fills at t=10, evictions from t=20, queue from t=25, TTFT x4 from t=35.
    return (
        _series("engine_kv_cache_usage_ratio", [0.3, 0.6, 0.92, 0.97, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
        + _series("engine_preemptions_total", [0, 0, 0, 0, 2, 6, 12, 20, 30, 41])
        + _series("engine_requests_waiting", [0, 0, 0, 0, 0, 3, 8, 12, 15, 15])
        + _ttft([0.05, 0.05, 0.05, 0.06, 0.07, 0.08, 0.09, 0.25, 0.4, 0.5])
    )


def test_full_cascade_reaches_stage_4_with_ordered_onsets_and_lead_time():
    rep = evaluate_cascade(_cascade_run())["e0:8000"]
    assert rep.stage == 4 and STAGES[rep.stage] == "latency"
    assert rep.onsets == {1: 10.0, 2: 20.0, 3: 25.0, 4: 35.0}
    assert _ordered(rep)
    assert rep.lead_time_s == 25.0
    assert rep.evidence["ttft_baseline_s"] == 0.05
    assert rep.evidence["evictions_window_total"] == 41.0
    assert "gpu_utilization_ratio" in rep.signals_missing


def test_queue_without_kv_pressure_is_not_a_cascade():
    samples = (
        _series("engine_kv_cache_usage_ratio", [0.2] * 6)
        + _series("engine_preemptions_total", [0] * 6)
        + _series("engine_requests_waiting", [0, 5, 9, 9, 9, 9])
        + _ttft([0.05, 0.05, 0.3, 0.4, 0.5, 0.5])
    )
    rep = evaluate_cascade(samples)["e0:8000"]
    assert rep.stage == 0
    assert 1 not in rep.onsets and 3 in rep.onsets


def test_stage_stops_at_evicting_while_latency_is_still_healthy():
    samples = (
        _series("engine_kv_cache_usage_ratio", [0.5, 0.95, 0.99, 0.99])
        + _series("engine_preemptions_total", [0, 0, 1, 3])
        + _series("engine_requests_waiting", [0, 0, 0, 0])
        + _ttft([0.05, 0.05, 0.05, 0.06])
    )
    rep = evaluate_cascade(samples)["e0:8000"]
    assert rep.stage == 2
    assert rep.lead_time_s is None


def test_counter_reset_is_not_read_as_negative_or_missed():
    samples = _series("engine_kv_cache_usage_ratio", [0.95, 0.95, 0.95]) + _series(
        "engine_preemptions_total", [10, 2, 2]
    )
    rep = evaluate_cascade(samples)["e0:8000"]
    assert rep.onsets[2] == 5.0  # restart then 2 preemptions: evicting at t=5
    assert rep.stage == 1  # no eviction in the last interval


def test_gpu_utilisation_drop_counts_as_the_latency_symptom():
    gpu_labels = {"instance": "e0:8000", "gpu": "0"}
    samples = (
        _series("engine_kv_cache_usage_ratio", [0.5, 0.95, 0.99, 0.99, 0.99])
        + _series("engine_preemptions_total", [0, 0, 2, 5, 9])
        + _series("engine_requests_waiting", [0, 0, 0, 4, 6])
        + _series("gpu_utilization_ratio", [0.8, 0.8, 0.75, 0.5, 0.4], gpu_labels)
    )
    rep = evaluate_cascade(samples)["e0:8000"]
    assert rep.stage == 4 and rep.onsets[4] == 15.0
    assert rep.evidence["gpu_utilization_baseline_ratio"] == 0.8


def test_missing_kv_usage_gives_no_stage_series():
    samples = _series("engine_requests_waiting", [0, 4])
    reports = evaluate_cascade(samples)
    assert reports["e0:8000"].stage == 0
    assert "engine_kv_cache_usage_ratio" in reports["e0:8000"].signals_missing
    assert render_cascade_samples(reports) == []


def test_rendered_series_carry_stage_onsets_and_lead():
    out = render_cascade_samples(evaluate_cascade(_cascade_run()), timestamp=50.0)
    by = {(s.name, s.label("stage")): s.value for s in out}
    assert by[("engine_cascade_stage_code", None)] == 4.0
    assert by[("engine_cascade_stage_onset_timestamp_seconds", "kv_high")] == 10.0
    assert by[("engine_cascade_stage_onset_timestamp_seconds", "latency")] == 35.0
    assert by[("engine_cascade_lead_seconds", None)] == 25.0


def test_thresholds_are_configurable():
    rep = evaluate_cascade(_cascade_run(), CascadeConfig(kv_high_ratio=0.99))["e0:8000"]
    assert rep.onsets[1] == 20.0


def test_dp_ranks_of_one_instance_are_combined():
    a = {"instance": "e0:8000", "dp_rank": "0"}
    b = {"instance": "e0:8000", "dp_rank": "1"}
    samples = (
        _series("engine_kv_cache_usage_ratio", [0.2, 0.2], a)
        + _series("engine_kv_cache_usage_ratio", [0.2, 0.96], b)
        + _series("engine_preemptions_total", [0, 0], a)
        + _series("engine_preemptions_total", [0, 3], b)
    )
    rep = evaluate_cascade(samples)["e0:8000"]
    assert rep.stage == 2


def test_an_eviction_is_evidence_of_a_full_pool_even_when_the_sampled_gauge_missed_it():
    samples = _series("engine_kv_cache_usage_ratio", [0.5, 0.7, 0.8, 0.75]) + _series(
        "engine_preemptions_total", [0, 0, 3, 3]
    )
    rep = evaluate_cascade(samples)["e0:8000"]
    assert rep.onsets == {1: 10.0, 2: 10.0}
    assert rep.stage == 0  # usage 0.75 and no eviction in the last interval


def test_a_request_caught_waiting_for_one_sample_is_not_a_queue():
    samples = _series("engine_kv_cache_usage_ratio", [0.5, 0.6, 0.95, 0.97, 0.97]) + _series(
        "engine_requests_waiting", [0, 1, 0, 2, 3]
    )
    rep = evaluate_cascade(samples)["e0:8000"]
    assert rep.onsets[3] == 15.0  # the blip at t=5 is ignored; the queue starts at t=15
    assert evaluate_cascade(samples, CascadeConfig(queue_samples=1))["e0:8000"].onsets[3] == 5.0


def test_ttft_rise_without_a_queue_is_not_the_cascade_symptom():
    samples = (
        _series("engine_kv_cache_usage_ratio", [0.3, 0.4, 0.5, 0.95, 0.97, 0.97])
        + _series("engine_preemptions_total", [0, 0, 0, 0, 2, 4])
        + _series("engine_requests_waiting", [0, 0, 0, 0, 3, 5])
        + _ttft([0.05, 0.05, 0.5, 0.5, 0.6, 0.7])
    )  # slow from t=10: starved host, no queue yet
    rep = evaluate_cascade(samples)["e0:8000"]
    assert rep.onsets[4] == 20.0 and _ordered(rep)  # counted once the queue exists


def test_current_stage_does_not_flap_when_evictions_pause_for_an_interval():
    samples = (
        _series("engine_kv_cache_usage_ratio", [0.5, 0.95, 0.99, 0.99])
        + _series("engine_preemptions_total", [0, 0, 4, 4])
        + _series("engine_requests_waiting", [0, 3, 5, 7])
    )
    assert evaluate_cascade(samples)["e0:8000"].stage == 3


def test_a_queue_is_sustained_by_time_not_by_how_often_it_was_scraped():
    # the same 1.2 s of waiting scraped every 0.2 s (7 samples) and every 0.6 s (3 samples)
    kv, fast, slow = [0.95] * 10, [0, 0, 4, 4, 4, 4, 4, 4, 4, 0], [0, 3, 3, 3, 0]
    cfg = CascadeConfig(queue_samples=2, queue_min_s=1.0)
    for waiting, step, onset in ((fast, 0.2, 0.4), (slow, 0.6, 0.6)):
        samples = _series("engine_kv_cache_usage_ratio", kv[: len(waiting)], step=step) + _series(
            "engine_requests_waiting", waiting, step=step
        )
        assert evaluate_cascade(samples, cfg)["e0:8000"].onsets[3] == onset
    # waiting for 0.8 s at a 0.2 s cadence (5 samples) is no 1 s queue; two such blips are not one
    blips = [0, 2, 2, 2, 2, 2, 0, 2, 2, 2, 2, 2, 0]
    samples = _series("engine_kv_cache_usage_ratio", [0.95] * len(blips), step=0.2) + _series(
        "engine_requests_waiting", blips, step=0.2
    )
    assert 3 not in evaluate_cascade(samples, cfg)["e0:8000"].onsets
    assert evaluate_cascade(samples, CascadeConfig(queue_samples=5))["e0:8000"].onsets[3] == 0.2


def test_default_queue_criterion_is_two_samples_whatever_their_spacing():
    samples = _series("engine_kv_cache_usage_ratio", [0.95] * 4, step=0.1) + _series(
        "engine_requests_waiting", [0, 1, 1, 0], step=0.1
    )
    assert evaluate_cascade(samples)["e0:8000"].onsets[3] == 0.1


def _no_counter(running, waiting=(0, 0, 4, 6) + (7,) * 20, kv=(0.5, 0.8, 0.95) + (1.0,) * 21):
    """KV fills, a queue forms (4 min); no preemption counter (SGLang, a V1 log). 10 s apart."""
    return (
        _series("engine_kv_cache_usage_ratio", kv, step=10.0)
        + _series("engine_requests_waiting", waiting, step=10.0)
        + _series("engine_requests_running", running, step=10.0)
    )


def test_without_a_counter_a_held_queue_and_a_flat_batch_show_stage_2_from_the_queues():
    rep = evaluate_cascade(_no_counter([8, 12, 16] + [16, 15] * 10 + [16]))["e0:8000"]
    # the 2m slope of running's 1m mean reaches <= 0.005/s once the ramp-up has left both windows
    assert rep.evicting_from == "queues" and 20.0 == rep.onsets[1] < rep.onsets[2] <= 200.0
    assert rep.stage == 3 and rep.evidence["evictions_window_total"] is None  # absent, not zero
    assert "engine_preemptions_total|engine_kv_evicted_tokens_total|kv_blocks_evicted_recomputed_total" in (
        rep.signals_missing
    )
    assert rep.not_evaluable == ["latency"]  # no TTFT, no GPU: stage 4 cannot be shown


def test_without_a_counter_a_growing_batch_is_admission_not_eviction():
    rep = evaluate_cascade(_no_counter(list(range(8, 56, 2))))["e0:8000"]
    assert 2 not in rep.onsets and rep.evicting_from is None and rep.stage == 3
    assert rep.evidence["running_growth_per_s"] == 0.2  # 2 per 10 s


def test_without_a_counter_or_a_running_gauge_stage_2_is_not_evaluable():
    samples = [s for s in _no_counter([16] * 24) if s.name != "engine_requests_running"]
    rep = evaluate_cascade(samples)["e0:8000"]
    assert 2 not in rep.onsets and rep.not_evaluable == ["evicting", "latency"]
    assert rep.evidence["running_growth_per_s"] is None


def test_a_silent_counter_does_not_hide_the_queue_reading():
    samples = _no_counter([16] * 24) + _series("engine_preemptions_total", [3] * 24, step=10.0)
    rep = evaluate_cascade(samples)["e0:8000"]
    assert rep.evicting_from == "queues" and rep.evidence["evictions_window_total"] == 0.0
    assert rep.not_evaluable == ["latency"]


def test_a_queue_reading_needs_the_pool_full():
    rep = evaluate_cascade(_no_counter([16] * 24, kv=[0.5, 0.7] + [0.85] * 22))["e0:8000"]
    assert 2 not in rep.onsets and rep.stage == 0


COUNTERS = {"engine_preemptions_total", "engine_kv_evicted_tokens_total", "kv_blocks_evicted_recomputed_total"}
RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"


@pytest.mark.parametrize(
    ("name", "pressure"),
    [("kv-pressure-cascade", True), ("blind-vllm-kv-too-small", True), ("blind-sglang-queue-overload", False)],
)
def test_library_recordings_without_their_eviction_counters(name, pressure):
    """Real (vLLM on CPU) and fleetgen KV-pressure recordings with every eviction counter removed
    still reach stage 2, from the queues; a queue overload with KV below full does not."""
    samples = replay_recording(RECORDINGS / f"{name}.om.gz").samples
    for inst, rep in evaluate_cascade([s for s in samples if s.name not in COUNTERS]).items():
        assert rep.evicting_from == ("queues" if pressure else None), (inst, rep.onsets, rep.evidence)
        assert rep.evidence["evictions_window_total"] is None and rep.onsets.get(2, 1e18) >= rep.onsets.get(1, 0)
    if pressure:
        assert {r.evicting_from for r in evaluate_cascade(samples).values()} == {"counter"}
