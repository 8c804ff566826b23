"""Sizing arithmetic against the worked examples of 002 (§2.2, §2.6, §6.5, §8.3, §9.4)."""

import pytest

from kvscope.diagnoser import sizing

LLAMA3_70B = {"layers": 80, "kv_heads": 8, "head_dim": 128}
GB = 1e9


def test_kv_bytes_per_token_llama3_70b_fp16_from_first_principles():
    # 2 x 80 x 8 x 128 x 2 bytes; 002 rounds this to "about 0.26 MB", 003 to "about 320 KB".
    assert sizing.kv_bytes_per_token(**LLAMA3_70B, bytes_per_element=2) == 327_680


def test_fp8_kv_halves_bytes_per_token():
    fp16 = sizing.kv_bytes_per_token(**LLAMA3_70B, bytes_per_element=sizing.dtype_bytes("fp16"))
    fp8 = sizing.kv_bytes_per_token(**LLAMA3_70B, bytes_per_element=sizing.dtype_bytes("fp8"))
    assert fp8 * 2 == fp16


def test_weights_floor_matches_002_examples():
    assert sizing.weights_bytes(70e9, sizing.dtype_bytes("fp16")) == 140 * GB
    assert sizing.weights_bytes(70e9, sizing.dtype_bytes("int4")) == 35 * GB


def test_memory_budget_worked_example_needs_at_least_four_h100():
    # 002 §2.6: 70B FP16, 50 x 8K, activations 28 GB, overhead 15 GB, H100 80 GB -> 4 GPUs minimum.
    kv = sizing.kv_bytes_per_token(**LLAMA3_70B, bytes_per_element=2)
    budget = sizing.memory_budget(
        weights=140 * GB,
        kv_per_token=kv,
        context_tokens=8000,
        concurrency=50,
        gpu_memory=80 * GB,
        activations=28 * GB,
        overhead=15 * GB,
        headroom=0.5,
    )
    assert budget.kv_bytes == pytest.approx(131.072 * GB)  # first principles; 002 says ~104 GB with 0.26 MB
    assert budget.total_bytes == pytest.approx((140 + 131.072 + 28 + 15) * GB)
    assert budget.min_gpus == 4
    assert budget.recommended_gpus == 6  # 002: "moves the practical minimum from 4 GPUs to 6"


def test_memory_budget_default_overhead_is_five_percent_per_gpu():
    budget = sizing.memory_budget(
        weights=10 * GB, kv_per_token=1000, context_tokens=1000, concurrency=10, gpu_memory=80 * GB
    )
    assert budget.overhead_bytes == pytest.approx(4 * GB)
    assert budget.min_gpus == 1


def test_fleet_size_worked_example_and_littles_law():
    # 002 §8.3: 120 peak RPS / 12 usable = 10 instances x TP4 x 1.3 = 52 GPUs; ceiling 48/2 = 24 RPS.
    fleet = sizing.fleet_size(
        peak_rps=120, usable_rps_per_instance=12, tp_degree=4, safety_factor=1.3, c_max=48, avg_latency_s=2
    )
    assert (fleet.instances, fleet.total_gpus) == (10, 52)
    assert fleet.little_ceiling_rps == 24
    assert fleet.little_gap == 2.0
    assert fleet.benchmark_trustworthy


def test_fleet_size_flags_a_benchmark_with_a_gap_over_two():
    fleet = sizing.fleet_size(
        peak_rps=120, usable_rps_per_instance=5, tp_degree=1, safety_factor=1.2, c_max=48, avg_latency_s=2
    )
    assert fleet.little_gap == pytest.approx(4.8)
    assert not fleet.benchmark_trustworthy


def test_max_queue_depth_worked_example():
    # 002 §9.4: 2 s TTFT SLO x 50 RPS = 100; breaker at 80-90.
    limit = sizing.max_queue_depth(max_wait_s=2, arrival_rps=50)
    assert (limit.max_depth, limit.breaker_low, limit.breaker_high) == (100, 80, 90)


def test_pd_ratio_prefill_heavy_and_decode_heavy():
    rag = sizing.pd_ratio(
        peak_rps=10,
        avg_input_tokens=4000,
        prefill_tokens_per_s_per_gpu=20000,
        avg_output_tokens=200,
        decode_tokens_per_s_per_gpu=250,
    )
    assert rag.prefill_gpus == pytest.approx(2.0)
    assert rag.decode_gpus == pytest.approx(8.0)
    assert rag.render_ratio() == "1:4.0"
    heavy = sizing.pd_ratio(
        peak_rps=1,
        avg_input_tokens=3000,
        prefill_tokens_per_s_per_gpu=1000,
        avg_output_tokens=100,
        decode_tokens_per_s_per_gpu=100,
    )
    assert heavy.render_ratio() == "3.0:1"


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
def test_bad_inputs_raise_a_named_error(bad):
    with pytest.raises(sizing.SizingError, match="layers"):
        sizing.kv_bytes_per_token(layers=bad, kv_heads=8, head_dim=128, bytes_per_element=2)


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(sizing.SizingError, match="unknown dtype"):
        sizing.dtype_bytes("fp5")
