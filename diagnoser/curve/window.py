"""The signals the curve reads and its window, through the one reader (`sources.window.read_window`)."""

from __future__ import annotations

from kvscope.diagnoser.evaluate.frame import Frame
from kvscope.diagnoser.sources.promapi import MAX_POINTS
from kvscope.diagnoser.sources.window import Source, Span
from kvscope.diagnoser.sources.window import read_window as read_signals

CONCURRENCY_SIGNAL = "engine_requests_running"
"""Requests in one engine's running batch (vLLM num_requests_running, SGLang num_running_reqs,
llama.cpp requests_processing): the curve's concurrency, per instance."""

HISTOGRAMS = ("request_ttft_seconds", "request_itl_seconds")
OBJECTIVE_HISTOGRAMS = ("request_tpot_seconds", "request_e2e_seconds")
"""The per-request TPOT and e2e histograms: their p99 per point, judged against the TPOT and e2e
objectives beside TTFT for C_max (operating.py `c_max`); read on the full path only, not recorded
(records.py), so the recorded curve judges C_max on TTFT alone and says so."""
LITTLE_SUMS = (("request_queue_seconds", "request_inference_seconds"), ("request_e2e_seconds",))
"""Histograms whose `_sum` integrates the time requests spend in the engine, in the order the
curve prefers them (intervals.py, Little's law): queue + inference time (scheduler queue to last
token: the time a request is counted in running + waiting), else end to end (arrival to finish,
the API server's own part included). Each family's last histogram is read with its `_count` too
(the requests behind the sum)."""
GAUGES = (CONCURRENCY_SIGNAL, "engine_requests_waiting", "engine_kv_cache_usage_ratio")
COUNTERS = ("engine_requests_finished_total", "engine_generation_tokens_total", "engine_preemptions_total")
MIX_COUNTERS = ("engine_prompt_tokens_total",)
"""Read per interval only to compare the two sides' token mix (prompt tokens per request) at a
change; not a point's field and not in the records."""
STEP_COUNTERS = ("request_itl_seconds_sum",)
"""Read per interval only for the engine's mean step time at a change (the ITL histogram's sum over
its count: compare.py `step_time`); not a point's field and not in the records."""
CACHE_HITS = "engine_prefix_cache_hits_tokens_total"
"""Read per interval only for the prompt tokens the engine computed (its prompt tokens less those
its prefix cache served: compare.MIX); not a point's field and not in the records."""
CONFIG_GAUGES = (
    "engine_kv_capacity_tokens",
    "engine_lora_max_adapters",
    "engine_prefix_caching_mode_code",
    "engine_kv_cache_fp8_code",
    "engine_kv_block_size_tokens",
    "engine_gpu_memory_utilization_ratio",
)
"""Canonical gauges of the engines' settings, read from their `*_info` series (vLLM
cache_config_info, lora_requests_info) and static gauges (SGLang max_total_num_tokens,
page_size): their value over time is the configuration over time."""

START_TIME = "engine_process_start_time_seconds"
"""The serving process's start time (prometheus_client's process collector): a new value is a
restart even where no counter is seen to drop (a scrape gap longer than the new process took to
pass its old counts: at 30 s scrapes a restart that takes 25 s and serves 60 s is that)."""

SIGNALS = (
    frozenset({f"{h}_bucket" for h in HISTOGRAMS} | {f"{h}_count" for h in HISTOGRAMS} | set(GAUGES) | set(COUNTERS))
    | frozenset(f"{h}_bucket" for h in OBJECTIVE_HISTOGRAMS)
    | frozenset(MIX_COUNTERS)
    | frozenset(STEP_COUNTERS)
    | frozenset({CACHE_HITS})
    | frozenset(CONFIG_GAUGES)
    | frozenset({START_TIME})
    | frozenset(f"{h}_sum" for hs in LITTLE_SUMS for h in hs)
    | frozenset(f"{hs[-1]}_count" for hs in LITTLE_SUMS)
)


def read_window(source: Source, start: float | None, end: float | None, step: float) -> Frame:
    """The curve's signals from any diagnose source (recording, log, agent, Prometheus)."""
    return read_signals(source, SIGNALS, Span(start, end), step)


def curve_step(source: Source, start: float | None, end: float | None, fallback: float) -> float:
    """The step the curve reads [start, end] at, whatever step the findings use: the interval the
    source sampled the engines at. The curve's intervals are scrape intervals (docs/curve.md): a
    coarser step merges loads into one interval and leaves a short phase a few intervals (too few
    to compare at matched load), a finer one repeats the same sample and counts intervals that hold
    no new data. A recording or log: its own scrape interval; a TSDB: the median gap between the
    raw samples of the concurrency signal; the agent: its targets' scrape history (each source's
    `scrape_interval`); at least the window over Prometheus' points-per-series limit; `fallback`
    when the source cannot say (no target scraped twice, a TSDB without the signal in the window)."""
    natural = source.natural_step()
    if natural:
        return natural
    probe = getattr(source, "scrape_interval", None)
    if probe is None or start is None or end is None or end <= start:
        return fallback
    measured = probe({CONCURRENCY_SIGNAL}, start, end)
    return max(measured, (end - start) / MAX_POINTS) if measured else fallback
