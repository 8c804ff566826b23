"""The one place the curve obtains its window: a Frame of the signals it reads."""

from __future__ import annotations

from typing import Any

from kvscope.diagnoser.evaluate.frame import Frame

CONCURRENCY_SIGNAL = "engine_requests_running"
"""Requests in one engine's running batch (vLLM num_requests_running, SGLang num_running_reqs,
llama.cpp requests_processing): the curve's concurrency, per instance."""

HISTOGRAMS = ("request_ttft_seconds", "request_itl_seconds")
GAUGES = (CONCURRENCY_SIGNAL, "engine_requests_waiting", "engine_kv_cache_usage_ratio")
COUNTERS = ("engine_requests_finished_total", "engine_generation_tokens_total", "engine_preemptions_total")
CONFIG_GAUGES = ("engine_kv_capacity_tokens", "engine_lora_max_adapters")
"""Canonical gauges read from the engines' `*_info` series (vLLM cache_config_info,
lora_requests_info): their value over time is the configuration over time."""

SIGNALS = frozenset(
    {f"{h}_bucket" for h in HISTOGRAMS} | {f"{h}_count" for h in HISTOGRAMS} | set(GAUGES) | set(COUNTERS)
) | frozenset(CONFIG_GAUGES)


def read_window(source: Any, start: float | None, end: float | None, step: float) -> Frame:
    """The curve's window from any diagnose source (recording, log, agent, Prometheus)."""
    return source.read_frame(set(SIGNALS), start, end, step)
