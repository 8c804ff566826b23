"""The signals the curve reads and its window, through the one reader (`sources.window.read_window`)."""

from __future__ import annotations

from kvscope.diagnoser.evaluate.frame import Frame
from kvscope.diagnoser.sources.window import Source, Span
from kvscope.diagnoser.sources.window import read_window as read_signals

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


def read_window(source: Source, start: float | None, end: float | None, step: float) -> Frame:
    """The curve's signals from any diagnose source (recording, log, agent, Prometheus)."""
    return read_signals(source, SIGNALS, Span(start, end), step)
