"""Sizing arithmetic from first principles (source: 002 §2, §6.5, §8.3, §9.4).

Pure functions in base units (bytes, seconds, requests per second, tokens); results carry their
inputs so the UI can show the working. KV bytes per token is always computed (2 × layers × KV
heads × head dim × bytes), never taken from the documents' rounded figures, which disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BYTES_PER_DTYPE = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
"""Bytes per element for the precisions of 002 §2.1 (and FP8 KV, 002 §4.3)."""

LITTLE_GAP_LIMIT = 2.0
"""002 §8.3: a gap between the Little's Law ceiling and measured RPS above 2× means the
benchmark does not reflect production."""


class SizingError(ValueError):
    """An input is out of range; the message names it."""


def _positive(**values: float) -> None:
    """SizingError naming the first value (all of a function's inputs: `**locals()`) that is not > 0."""
    for name, value in values.items():
        if value is None or not math.isfinite(value) or value <= 0:
            raise SizingError(f"{name} must be a positive number, got {value!r}")


def dtype_bytes(dtype: str) -> float:
    """Bytes per element for a precision name (fp16, bf16, fp8, int8, int4, fp32)."""
    try:
        return BYTES_PER_DTYPE[dtype.lower()]
    except KeyError:
        raise SizingError(f"unknown dtype {dtype!r}; known: {sorted(BYTES_PER_DTYPE)}") from None


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_element: float) -> float:
    """KV cache bytes one token occupies: 2 × layers × KV heads × head dim × bytes (002 §2.2).

    Use the KV head count, not the attention head count (GQA shares KV heads).
    """
    _positive(**locals())
    return 2.0 * layers * kv_heads * head_dim * bytes_per_element


def weights_bytes(parameters: float, bytes_per_parameter: float) -> float:
    """Model weight memory, the floor: parameters × bytes per parameter (002 §2.1)."""
    _positive(**locals())
    return parameters * bytes_per_parameter


@dataclass(frozen=True)
class MemoryBudget:
    """The minimum-GPU formula of 002 §2.6, term by term."""

    weights_bytes: float
    kv_bytes: float
    activations_bytes: float
    overhead_bytes: float
    adapters_bytes: float
    gpu_memory_bytes: float
    headroom: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_bytes + self.activations_bytes + self.overhead_bytes + self.adapters_bytes

    @property
    def min_gpus(self) -> int:
        """ceil(total / GPU memory): fits, with no headroom at all."""
        return math.ceil(self.total_bytes / self.gpu_memory_bytes)

    @property
    def recommended_gpus(self) -> int:
        """min GPUs with the headroom 002 §2.6 asks for (30-50 %) applied to the total."""
        return math.ceil(self.total_bytes * (1.0 + self.headroom) / self.gpu_memory_bytes)


def memory_budget(
    *,
    weights: float,
    kv_per_token: float,
    context_tokens: int,
    concurrency: int,
    gpu_memory: float,
    activations: float = 0.0,
    overhead: float | None = None,
    adapters: int = 0,
    adapter_bytes: float = 0.0,
    headroom: float = 0.3,
) -> MemoryBudget:
    """Memory needed at peak concurrency (002 §2.2, §2.4-2.6).

    `overhead` defaults to 5 % of `gpu_memory` (the low end of 002 §2.4's 5-10 % of VRAM)
    per GPU that weights + KV alone would need.
    """
    _positive(
        weights=weights,
        kv_per_token=kv_per_token,
        context_tokens=context_tokens,
        concurrency=concurrency,
        gpu_memory=gpu_memory,
    )
    if not 0 <= headroom <= 2:
        raise SizingError(f"headroom must be between 0 and 2, got {headroom!r}")
    kv = kv_per_token * context_tokens * concurrency
    if overhead is None:
        overhead = 0.05 * gpu_memory * math.ceil((weights + kv + activations) / gpu_memory)
    return MemoryBudget(weights, kv, activations, overhead, adapters * adapter_bytes, gpu_memory, headroom)


@dataclass(frozen=True)
class FleetSize:
    """Fleet size from a benchmark's SLO-constrained operating point (002 §8.3)."""

    instances: int
    total_gpus: int
    little_ceiling_rps: float
    little_gap: float

    @property
    def benchmark_trustworthy(self) -> bool:
        """False when the Little's Law ceiling exceeds measured RPS by more than 2×."""
        return self.little_gap <= LITTLE_GAP_LIMIT


def fleet_size(
    *,
    peak_rps: float,
    usable_rps_per_instance: float,
    tp_degree: int,
    safety_factor: float,
    c_max: float,
    avg_latency_s: float,
) -> FleetSize:
    """instances = ceil(peak / usable); GPUs = instances × TP × safety; Little's Law check.

    `usable_rps_per_instance` is the throughput measured at C_max (where TTFT p99 meets the
    SLO). The Little's Law ceiling is C_max / average latency; the gap is ceiling / usable.
    """
    _positive(**locals())
    instances = math.ceil(peak_rps / usable_rps_per_instance)
    gpus = math.ceil(round(instances * tp_degree * safety_factor, 9))
    ceiling = c_max / avg_latency_s
    return FleetSize(instances, gpus, ceiling, ceiling / usable_rps_per_instance)


@dataclass(frozen=True)
class QueueLimit:
    """Circuit-breaker queue depth from Little's Law (002 §9.4)."""

    max_depth: float
    breaker_low: int
    breaker_high: int


def max_queue_depth(*, max_wait_s: float, arrival_rps: float) -> QueueLimit:
    """Maximum safe queue depth = acceptable wait × arrival rate; break at 80-90 % of it."""
    _positive(**locals())
    depth = max_wait_s * arrival_rps
    return QueueLimit(depth, math.floor(0.8 * depth), math.floor(0.9 * depth))


@dataclass(frozen=True)
class PdRatio:
    """Prefill and decode GPU demand and their ratio (002 §6.5)."""

    prefill_gpus: float
    decode_gpus: float

    @property
    def ratio(self) -> float:
        """Prefill GPUs per decode GPU (0.25 reads as 1:4)."""
        return self.prefill_gpus / self.decode_gpus

    def render_ratio(self) -> str:
        """'1:3.2' or '2.5:1', the larger side normalised to the smaller."""
        if self.ratio >= 1:
            return f"{self.ratio:.1f}:1"
        return f"1:{1 / self.ratio:.1f}"


def pd_ratio(
    *,
    peak_rps: float,
    avg_input_tokens: float,
    prefill_tokens_per_s_per_gpu: float,
    avg_output_tokens: float,
    decode_tokens_per_s_per_gpu: float,
) -> PdRatio:
    """(peak × input / prefill throughput) ÷ (peak × output / decode throughput)."""
    _positive(**locals())
    return PdRatio(
        peak_rps * avg_input_tokens / prefill_tokens_per_s_per_gpu,
        peak_rps * avg_output_tokens / decode_tokens_per_s_per_gpu,
    )
