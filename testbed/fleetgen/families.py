"""Render engine and GPU state as the exposition text the real exporters serve.

Each `render_*` function takes cumulative counters/histograms and current gauges of one target
and returns Prometheus text (0.0.4) with the upstream names, label sets and bucket bounds:
vLLM 0.33 (`model_name`, `engine`), SGLang 0.5.23 scheduler/tokenizer label sets, dcgm-exporter
(`gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvscope.core.signals import load_catalog

# vLLM 0.33 default bucket families (vllm/v1/metrics/buckets.py)
VLLM_TTFT = load_catalog().buckets("request_ttft_seconds", "vllm")  # catalog.yaml: the one copy
VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80)
VLLM_LATENCY = (0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680)
VLLM_NIXL_XFER = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 5)


def vllm_request_token_bounds(max_model_len: int) -> tuple[int, ...]:
    """vLLM's `request_tokens` family: the 1-2-5 series up to max_model_len (1, 2, 5, ..., 5000 for 8k)."""
    out, mag = [], 1
    while True:
        for m in (1, 2, 5):
            if m * mag > max_model_len:
                return tuple(out)
            out.append(m * mag)
        mag *= 10


# SGLang 0.5.23
SGL_TTFT = load_catalog().buckets("request_ttft_seconds", "sglang")
SGL_ITL = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.035,
    0.04,
    0.06,
    0.08,
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
)
SGL_TOKENS = (
    100,
    300,
    500,
    700,
    1000,
    1500,
    2000,
    3000,
    4000,
    5000,
    6000,
    7000,
    8000,
    9000,
    10000,
    12500,
    15000,
    17500,
    20000,
    22500,
    25000,
    27500,
    30000,
    35000,
    40000,
    60000,
    80000,
    100_000,
    200_000,
    300_000,
    400_000,
    600_000,
    800_000,
    1_000_000,
    1_100_000,
)
SGL_KV_XFER_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
SGL_QUEUE = (
    0,
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.2,
    0.5,
    1,
    2,
    3,
    4,
    5,
    10,
    15,
    20,
    30,
    40,
    50,
    60,
    70,
    80,
    90,
    100,
    200,
    300,
    400,
    500,
    600,
    700,
    800,
    900,
    1000,
    1200,
    1400,
    1600,
    1800,
    2000,
    2500,
    3000,
)


@dataclass
class Histogram:
    """A cumulative histogram with fixed upper bounds (+Inf implied)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket (non-cumulative), last = +Inf
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, n: int = 1) -> None:
        i = next((k for k, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[i] += n
        self.total += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)


def _fmt(v: float) -> str:
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v)}.0"
    return repr(float(v))


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    body = ",".join(f'{k}="{v}"' for k, v in pairs)
    return "{" + body + "}" if body else ""


class Text:
    """Accumulates one exposition, family by family."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_: str) -> None:
        self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, labels: list[tuple[str, str]], value: float) -> None:
        self.lines.append(f"{name}{_labels(labels)} {_fmt(value)}")

    def histogram(self, name: str, labels: list[tuple[str, str]], h: Histogram) -> None:
        cum = 0
        for b, c in zip(h.bounds, h.counts, strict=False):
            cum += c
            self.sample(f"{name}_bucket", labels + [("le", _fmt(b))], cum)
        self.sample(f"{name}_bucket", labels + [("le", "+Inf")], h.count)
        self.sample(f"{name}_count", labels, h.count)
        self.sample(f"{name}_sum", labels, h.total)

    def render(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclass
class VllmState:
    """Cumulative state of one vLLM 0.33 engine (DP rank `engine`)."""

    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    engine: str = "0"
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    num_gpu_blocks: int = 8192
    block_size: int = 16
    prefix_caching: bool = True
    queries: float = 0.0
    hits: float = 0.0
    preemptions: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    success: float = 0.0
    ttft: Histogram = field(default_factory=lambda: Histogram(VLLM_TTFT))
    itl: Histogram = field(default_factory=lambda: Histogram(VLLM_ITL))
    e2e: Histogram = field(default_factory=lambda: Histogram(VLLM_LATENCY))
    queue: Histogram = field(default_factory=lambda: Histogram(VLLM_LATENCY))
    nixl_xfer: Histogram | None = None  # set on P/D replicas (NixlConnector)
    prompt_len: Histogram | None = None  # vllm:request_prompt_tokens (request_tokens buckets)
    gen_len: Histogram | None = None  # vllm:request_generation_tokens
    cache_dtype: str = "auto"


def render_vllm(s: VllmState, text: Text | None = None) -> str:
    """vLLM 0.33 /metrics for one engine (counters with `_total`, as prometheus_client writes)."""
    t = text or Text()
    lab = [("engine", s.engine), ("model_name", s.model)]
    gauges = (
        ("vllm:num_requests_running", "Number of requests in model execution batches.", s.running),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.waiting),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_usage),
    )
    for name, help_, v in gauges:
        t.family(name, "gauge", help_)
        t.sample(name, lab, v)
    counters = (
        ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", s.queries),
        ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", s.hits),
        ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.preemptions),
        ("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens),
        ("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens),
    )
    for name, help_, v in counters:
        t.family(f"{name}_total", "counter", help_)
        t.sample(f"{name}_total", lab, v)
    t.family("vllm:request_success_total", "counter", "Count of successfully processed requests.")
    t.sample("vllm:request_success_total", lab + [("finished_reason", "length")], 0.0)
    t.sample("vllm:request_success_total", lab + [("finished_reason", "stop")], s.success)
    hists = (
        ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft),
        ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", s.itl),
        ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", s.e2e),
        ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", s.queue),
    )
    for name, help_, h in hists:
        t.family(name, "histogram", help_)
        t.histogram(name, lab, h)
    if s.nixl_xfer is not None:
        t.family(
            "vllm:nixl_xfer_time_seconds", "histogram", "Histogram of transfer duration for NIXL KV Cache transfers."
        )
        t.histogram("vllm:nixl_xfer_time_seconds", lab, s.nixl_xfer)
    for name, help_, h in (
        ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", s.prompt_len),
        ("vllm:request_generation_tokens", "Number of generation tokens processed.", s.gen_len),
    ):
        if h is not None:
            t.family(name, "histogram", help_)
            t.histogram(name, lab, h)
    t.family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
    t.sample(
        "vllm:cache_config_info",
        [
            ("block_size", str(s.block_size)),
            ("cache_dtype", s.cache_dtype),
            ("enable_prefix_caching", str(s.prefix_caching)),
            ("engine", s.engine),
            ("gpu_memory_utilization", "0.9"),
            ("num_gpu_blocks", str(s.num_gpu_blocks)),
        ],
        1.0,
    )
    return t.render()


@dataclass
class SglangState:
    """Cumulative state of one SGLang 0.5.23 scheduler (+ its tokenizer-side metrics)."""

    model: str = "Qwen/Qwen3-32B"
    engine_type: str = "unified"  # unified | prefill | decode
    dp_rank: str | None = None
    running: float = 0.0
    queue: float = 0.0
    token_usage: float = 0.0
    max_total_num_tokens: int = 400_000
    cache_hit_rate: float = 0.0  # last prefill batch only, as upstream
    eff_input: float = 0.0  # prefill_effective_tokens_total{mode=input}
    eff_device_hit: float = 0.0
    eff_host_hit: float = 0.0
    retracted: float = 0.0
    hicache_host_used: float | None = None
    hicache_host_total: float | None = None
    load_back_tokens: float = 0.0
    evicted_tokens: float = 0.0
    prompt_tokens: float = 0.0  # tokenizer side, finished requests
    cached_device: float = 0.0
    cached_host: float = 0.0
    num_requests: float = 0.0
    ttft: Histogram = field(default_factory=lambda: Histogram(SGL_TTFT))
    itl: Histogram = field(default_factory=lambda: Histogram(SGL_ITL))
    kv_xfer_ms: Histogram | None = None
    prompt_len: Histogram | None = None  # sglang:prompt_tokens_histogram (tokenizer side)
    gen_len: Histogram | None = None  # sglang:generation_tokens_histogram
    queue_time: Histogram | None = None  # sglang:queue_time_seconds (scheduler side)
    generation_tokens: float = 0.0  # sglang:generation_tokens_total
    aborted: float | None = None  # sglang:num_aborted_requests_total


def _sgl_sched_labels(s: SglangState) -> list[tuple[str, str]]:
    lab = [
        ("engine_type", s.engine_type),
        ("model_name", s.model),
        ("moe_ep_rank", "0"),
        ("pp_rank", "0"),
        ("tp_rank", "0"),
    ]
    if s.dp_rank is not None:
        lab.append(("dp_rank", s.dp_rank))
    return sorted(lab)


def render_sglang(s: SglangState, text: Text | None = None, scheduler: bool = True, tokenizer: bool = True) -> str:
    """SGLang 0.5.23 /metrics: one scheduler (DP rank) and/or the tokenizer-side histograms
    (one tokenizer process per server, so DP ranks share it: render it once)."""
    t = text or Text()
    if scheduler:
        _render_scheduler(s, t)
    if tokenizer:
        tok = [("engine_type", s.engine_type), ("model_name", s.model)]
        stream = tok + [("is_streaming", "true")]
        for name, help_, v in (
            ("sglang:prompt_tokens_total", "Number of prefill tokens processed.", s.prompt_tokens),
            ("sglang:num_requests_total", "Number of requests processed.", s.num_requests),
        ):
            t.family(name, "counter", help_)
            t.sample(name, stream, v)
        t.family("sglang:cached_tokens_total", "counter", "Number of cached prompt tokens by source.")
        for src, v in (("device", s.cached_device), ("host", s.cached_host), ("storage", 0.0)):
            t.sample("sglang:cached_tokens_total", [("cache_source", src)] + tok, v)
        t.family("sglang:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.")
        t.histogram("sglang:time_to_first_token_seconds", tok + [("is_streaming", "true")], s.ttft)
        t.family("sglang:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.")
        t.histogram("sglang:inter_token_latency_seconds", tok, s.itl)
        _render_tokenizer_extras(s, t, tok)
    return t.render()


def _render_tokenizer_extras(s: SglangState, t: Text, tok: list[tuple[str, str]]) -> None:
    """Length histograms, output tokens and aborts, rendered only where a scenario models them."""
    if s.prompt_len is None:
        return
    t.family("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.")
    t.sample("sglang:generation_tokens_total", tok + [("is_streaming", "true")], s.generation_tokens)
    for name, h in (
        ("sglang:prompt_tokens_histogram", s.prompt_len),
        ("sglang:generation_tokens_histogram", s.gen_len),
    ):
        if h is not None:
            t.family(name, "histogram", name.split(":")[1].replace("_", " "))
            t.histogram(name, tok, h)
    if s.aborted is not None:
        t.family("sglang:num_aborted_requests_total", "counter", "Number of requests aborted.")
        t.sample("sglang:num_aborted_requests_total", tok, s.aborted)


def _render_scheduler(s: SglangState, t: Text) -> None:
    lab = _sgl_sched_labels(s)
    for name, v in (
        ("sglang:num_running_reqs", s.running),
        ("sglang:num_queue_reqs", s.queue),
        ("sglang:token_usage", round(s.token_usage, 2)),
        ("sglang:cache_hit_rate", s.cache_hit_rate),
        ("sglang:max_total_num_tokens", s.max_total_num_tokens),
        ("sglang:page_size", 1),
    ):
        t.family(name, "gauge", name.split(":")[1].replace("_", " "))
        t.sample(name, lab, v)
    t.family("sglang:prefill_effective_tokens_total", "counter", "Prefill tokens by mode, retractions removed.")
    for mode, v in (("device_hit", s.eff_device_hit), ("host_hit", s.eff_host_hit), ("input", s.eff_input)):
        t.sample("sglang:prefill_effective_tokens_total", sorted(lab + [("mode", mode)]), v)
    t.family("sglang:num_retracted_requests_total", "counter", "Total retracted requests.")
    t.sample("sglang:num_retracted_requests_total", lab, s.retracted)
    if s.hicache_host_total is not None:
        for name, v in (
            ("sglang:hicache_host_used_tokens", s.hicache_host_used or 0.0),
            ("sglang:hicache_host_total_tokens", s.hicache_host_total),
        ):
            t.family(name, "gauge", name.split(":")[1].replace("_", " "))
            t.sample(name, lab, v)
        radix = [("cache_type", "HiRadixCache"), ("pp_rank", "0"), ("tp_rank", "0")]
        if s.dp_rank is not None:
            radix = sorted(radix + [("dp_rank", s.dp_rank)])
        t.family("sglang:load_back_tokens_total", "counter", "Tokens loaded back from host to device.")
        t.sample("sglang:load_back_tokens_total", sorted(radix + [("pool", "kv")]), s.load_back_tokens)
        t.family("sglang:evicted_tokens_total", "counter", "Device KV slots freed by eviction.")
        t.sample("sglang:evicted_tokens_total", radix, s.evicted_tokens)
    if s.queue_time is not None:
        t.family("sglang:queue_time_seconds", "histogram", "Histogram of queueing time in seconds.")
        t.histogram("sglang:queue_time_seconds", lab, s.queue_time)
    if s.kv_xfer_ms is not None:
        t.family("sglang:kv_transfer_latency_ms", "histogram", "KV transfer latency in milliseconds.")
        t.histogram("sglang:kv_transfer_latency_ms", lab, s.kv_xfer_ms)


@dataclass
class GpuState:
    """One GPU as dcgm-exporter (released 4.5.x images: `Hostname`) reports it."""

    gpu: int
    uuid: str
    hostname: str
    model_name: str = "NVIDIA H100 80GB HBM3"
    util_pct: float = 0.0  # DCGM_FI_DEV_GPU_UTIL: any kernel running
    gr_active: float = 0.0  # DCGM_FI_PROF_GR_ENGINE_ACTIVE ratio
    tensor_active: float = 0.0
    dram_active: float = 0.0
    fb_used_mib: float = 0.0
    fb_free_mib: float = 81559.0
    power_w: float = 70.0
    energy_mj: float = 0.0
    temp_c: float = 35.0
    sm_clock_mhz: float = 1980.0


def render_dcgm(gpus: list[GpuState], driver: str = "570.124.06") -> str:
    """dcgm-exporter default-counters exposition for the GPUs of one node."""
    t = Text()

    def labels(g: GpuState) -> list[tuple[str, str]]:
        return [
            ("gpu", str(g.gpu)),
            ("UUID", g.uuid),
            ("pci_bus_id", f"00000000:{0x18 + g.gpu * 0x10:02X}:00.0"),
            ("device", f"nvidia{g.gpu}"),
            ("modelName", g.model_name),
            ("Hostname", g.hostname),
            ("DCGM_FI_DRIVER_VERSION", driver),
        ]

    rows = (
        ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda g: g.sm_clock_mhz),
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda g: g.temp_c),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda g: g.power_w),
        (
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "counter",
            "Total energy consumption since boot (in mJ).",
            lambda g: g.energy_mj,
        ),
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda g: g.util_pct),
        ("DCGM_FI_DEV_FB_FREE", "gauge", "Frame buffer memory free (in MB).", lambda g: g.fb_free_mib),
        ("DCGM_FI_DEV_FB_USED", "gauge", "Frame buffer memory used (in MB).", lambda g: g.fb_used_mib),
        (
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "gauge",
            "Ratio of time the graphics engine is active.",
            lambda g: g.gr_active,
        ),
        (
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "gauge",
            "Ratio of cycles the tensor (HMMA) pipe is active.",
            lambda g: g.tensor_active,
        ),
        (
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "gauge",
            "Ratio of cycles the device memory interface is active.",
            lambda g: g.dram_active,
        ),
    )
    for name, kind, help_, get in rows:
        t.family(name, kind, help_)
        for g in gpus:
            t.sample(name, labels(g), round(get(g), 4))
    return t.render()
