"""Render the outside corpus' static /metrics bodies from the engines' own metric definitions.

Run once by hand (`python tests/outside/render_bodies.py`); its output is committed under
tests/outside/bodies/*-rendered.txt and the test reads the files, not this script. Every body is
a healthy, static server: counters hold a plausible history, gauges a moderate load, histograms a
log-logistic spread around a typical value. Names, kinds and label names come from the source each
spec cites (for vLLM and SGLang as gathered into tests/fixtures/engine_names/ from the release's own
code; for LMCache, TGI, SMG, Dynamo and dcgm-exporter from the upstream file named in the spec).
Families whose label values the engine only sets per event (a stage, a reason, an operation) are
left out rather than invented, unless the spec names their values. Buckets follow the source where
it lists them (LMCache, SMG, SGLang's docs); elsewhere they are generic and the README says so.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
NAMES = HERE.parents[0] / "fixtures" / "engine_names"
OUT = HERE / "bodies"

SEC = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
REQ = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0]
TOK = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
MS = [1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000]
SMG_DURATION = [
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    15.0,
    30.0,
    45.0,
    60.0,
    90.0,
    120.0,
    180.0,
    240.0,
]

ZERO = re.compile(
    r"preempt|retract|abort|fail|error|timeout|corrupt|dropped|evict|unfulfilled|deferred|expired|"
    r"rejection|skipped|migration|disconnected|paused|backpressure|unhealthy|slow_retrieval|forced|"
    r"watermark|0_hit|corrupted|retries|exhausted"
)

# (pattern, typical value, buckets) for histograms; first match wins
HISTS = [
    (r"_ms$|latency_ms|_bootstrap_ms|_alloc_ms", 5.0, MS),
    (r"time_to_first_token|ttft", 0.12, SEC),
    (r"inter_token|time_per_output|tpot|itl", 0.025, ITL),
    (r"queue_time|queue_duration|queue_latency", 0.02, SEC),
    (r"prefill_time|prefill_kv", 0.1, SEC),
    (r"e2e|request_duration|inference_time|decode_time|generation_duration|request_latency", 4.0, REQ),
    (r"prompt_tokens|input_tokens|input_length|input_sequence|prefill_computed|prefill_kv_computed", 900, TOK),
    (r"generation_tokens|output_tokens|generated_tokens|output_sequence|max_num_generation", 180, TOK),
    (r"max_tokens|max_new_tokens", 1024, TOK),
    (r"iteration_tokens", 256, TOK),
    (r"params_n|num_preemptions", 1, [1, 2, 5, 10, 20]),
    (r"_seconds$|_time$|duration|latency", 0.01, SEC),
]

LABEL_VALUES = {
    "model_name": ["Qwen/Qwen3-8B"],
    "model": ["Qwen/Qwen3-8B"],
    "engine": ["0"],
    "engine_type": ["unified"],
    "tp_rank": ["0"],
    "pp_rank": ["0"],
    "moe_ep_rank": ["0"],
    "dp_rank": ["0"],
    "is_streaming": ["true"],
    "finished_reason": ["stop", "length"],
    "position": ["0", "1", "2"],
    "pp_size": ["1"],
    "attn_cp_rank": ["0"],
    "attn_cp_size": ["1"],
    "storage_backend": ["file"],
    "cache_type": ["radix"],
    "pool": ["kv"],
}


class Body:
    """One exposition, written family by family in prometheus_client's text format."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    @staticmethod
    def _labels(labels: dict[str, str]) -> str:
        return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""

    def family(self, name: str, kind: str, help_: str, series: list[tuple[dict[str, str], float]]) -> None:
        base = name[:-6] if kind == "counter" and name.endswith("_total") else name
        self.lines += [f"# HELP {base} {help_}", f"# TYPE {base} {kind}"]
        for labels, value in series:
            self.lines.append(f"{base}{'_total' if kind == 'counter' else ''}{self._labels(labels)} {_num(value)}")

    def histogram(
        self,
        name: str,
        help_: str,
        label_sets: list[dict[str, str]],
        buckets: list[float],
        typical: float,
        count: float,
    ) -> None:
        self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        for labels in label_sets:
            for le in buckets:
                frac = 1.0 / (1.0 + (typical / le) ** 3)
                self.lines.append(
                    f"{name}_bucket{self._labels({**labels, 'le': _num(float(le))})} "
                    f"{_num(float(math.floor(count * frac)))}"
                )
            self.lines.append(f"{name}_bucket{self._labels({**labels, 'le': '+Inf'})} {_num(float(count))}")
            self.lines.append(f"{name}_count{self._labels(labels)} {_num(float(count))}")
            self.lines.append(f"{name}_sum{self._labels(labels)} {_num(round(count * typical * 1.1, 3))}")

    def summary(self, name: str, help_: str, labels: dict[str, str], typical: float, count: float) -> None:
        self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} summary"]
        for q, f in (("0", 0.2), ("0.5", 1.0), ("0.9", 1.8), ("0.95", 2.2), ("0.99", 3.0), ("0.999", 4.0), ("1", 5.0)):
            self.lines.append(f"{name}{self._labels({**labels, 'quantile': q})} {_num(round(typical * f, 6))}")
        self.lines.append(f"{name}_sum{self._labels(labels)} {_num(round(count * typical * 1.1, 3))}")
        self.lines.append(f"{name}_count{self._labels(labels)} {_num(float(count))}")

    def text(self, eof: bool = False) -> str:
        return "\n".join(self.lines) + ("\n# EOF\n" if eof else "\n")


def _num(v: float) -> str:
    return repr(float(v)) if not float(v).is_integer() or abs(v) < 1e15 else f"{v:.6e}"


def _label_sets(names: list[str], extra: dict[str, list[str]]) -> list[dict[str, str]] | None:
    """Every combination of the known values of `names`; None if a label has no known value."""
    sets: list[dict[str, str]] = [{}]
    for n in names:
        values = extra.get(n) or LABEL_VALUES.get(n)
        if not values:
            return None
        sets = [{**s, n: v} for s in sets for v in values]
    return sets


def _counter_value(name: str, counters: dict[str, float]) -> float:
    for pat, v in counters.items():
        if re.search(pat, name):
            return v
    if ZERO.search(name):
        return 0.0
    if re.search(r"tokens|bytes", name):
        return 2.5e6
    return 3500.0


def render_from_names(
    names_file: str,
    *,
    gauges: dict[str, float],
    counters: dict[str, float] | None = None,
    labels: dict[str, list[str]] | None = None,
    default_labels: list[str] | None = None,
    skip: str = r"$^",
    only: str = r"",
    info: dict[str, dict[str, str]] | None = None,
    hist_count: dict[str, float] | None = None,
) -> str:
    """A body with every family a release's name list holds (filtered), valued as the spec says."""
    doc = yaml.safe_load((NAMES / names_file).read_text())
    body = Body()
    counters, labels, info, hist_count = counters or {}, labels or {}, info or {}, hist_count or {}
    for entry in sorted(doc["names"], key=lambda e: e["name"]):
        name, kind, lnames = entry["name"], entry["type"], entry["labels"]
        if re.search(skip, name) or (only and not re.search(only, name)) or kind in ("unknown", "summary"):
            continue
        if name in info:
            body.family(name, "gauge", "Information of the engine's configuration.", [(info[name], 1.0)])
            continue
        if lnames is None:
            lnames = list(default_labels or [])
        sets = _label_sets([n for n in lnames if n != "le"], labels) if "gt" not in lnames else None
        if sets is None:
            continue
        help_ = f"{name.split(':')[-1].replace('_', ' ')}."
        if kind == "counter":
            body.family(name, "counter", help_, [(s, _counter_value(name, counters)) for s in sets])
        elif kind == "gauge":
            if name not in gauges and not re.search(r"info$", name):
                value = 0.0
            else:
                value = gauges.get(name, 1.0)
            body.family(name, "gauge", help_, [(s, value) for s in sets])
        elif kind == "histogram":
            count = next((v for p, v in hist_count.items() if re.search(p, name)), 0.0 if ZERO.search(name) else 3500.0)
            typical, buckets = next(((t, b) for p, t, b in HISTS if re.search(p, name)), (10.0, TOK))
            body.histogram(name, help_, sets, buckets, typical, count)
    return body.text()


VLLM_CACHE_INFO = {
    "block_size": "16",
    "cache_dtype": "auto",
    "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.9",
    "num_gpu_blocks": "27648",
    "num_cpu_blocks": "0",
    "num_gpu_blocks_override": "None",
    "sliding_window": "None",
    "swap_space_bytes": "0",
}
VLLM_GAUGES = {
    "vllm:num_requests_running": 14,
    "vllm:num_requests_waiting": 0,
    "vllm:gpu_cache_usage_perc": 0.42,
    "vllm:kv_cache_usage_perc": 0.42,
}
VLLM_COUNTERS = {
    r"prefix_cache_queries": 3.2e6,
    r"prefix_cache_hits": 1.4e6,
    r"prompt_tokens": 3.2e6,
    r"generation_tokens": 6.4e5,
}
NO_SPEC = r"spec_decode"


def vllm(names: str, *, spec: bool = False, skip: str = "", gauges: dict | None = None) -> str:
    counters = dict(VLLM_COUNTERS)
    if spec:
        counters.update(
            {
                r"spec_decode_num_drafts": 4.0e4,
                r"spec_decode_num_draft_tokens": 1.2e5,
                r"spec_decode_num_accepted_tokens_per_pos": 2.8e4,
                r"spec_decode_num_accepted_tokens$": 8.4e4,
            }
        )
    pattern = "|".join(p for p in (skip, "" if spec else NO_SPEC, r"lora_requests_info") if p) or r"$^"
    return render_from_names(
        names,
        gauges={**VLLM_GAUGES, **(gauges or {})},
        counters=counters,
        default_labels=["model_name"],
        skip=pattern,
        info={"vllm:cache_config_info": VLLM_CACHE_INFO},
    )


SG_GAUGES = {
    "sglang:num_running_reqs": 24,
    "sglang:num_queue_reqs": 0,
    "sglang:token_usage": 0.38,
    "sglang:cache_hit_rate": 0.41,
    "sglang:gen_throughput": 1450.0,
    "sglang:num_used_tokens": 52000,
    "sglang:max_total_num_tokens": 137000,
    "sglang:page_size": 1,
    "sglang:context_len": 32768,
    "sglang:kv_used_tokens": 52000,
    "sglang:kv_available_tokens": 85000,
    "sglang:full_token_usage": 0.38,
    "sglang:utilization": 0.55,
    "sglang:is_cuda_graph": 1,
    "sglang:new_token_ratio": 0.4,
    "sglang:kv_evictable_tokens": 30000,
    "sglang:num_pages": 137000,
    "sglang:kv_cache_memory_usage_gb": 18.8,
    "sglang:weight_memory_usage_gb": 15.3,
}
SG_COUNTERS = {
    r"cached_tokens": 1.3e6,
    r"prompt_tokens": 3.2e6,
    r"generation_tokens": 6.4e5,
    r"num_requests_total": 3500,
    r"realtime_tokens": 3.8e6,
}
SG_SKIP = (
    r"encoder_|grammar|eplb|mamba|swa_|dp_attention|dp_cooperation|routing_key|lora_|startup|weight_load|"
    r"http_|process_cpu|func_latency|prefill_delayer|streaming_session|graph_memory|per_stage|"
    r"scheduler_stage|forward_execution|cuda_graph_passes|decode_deferred|failed_session|hisparse"
)
SG_HICACHE = r"hicache|backup|prefetch|load_back|storage_"
SG_PD = r"bootstrap|prealloc|transfer|inflight_queue|infight_queue|decode_host"


def sglang(
    names: str,
    *,
    spec: bool,
    hicache: bool = False,
    pd: str = "",
    gauges: dict | None = None,
    counters: dict | None = None,
) -> str:
    """SGLang's scheduler and tokenizer collectors; spec gauges are always set (0 without speculation)."""
    skip = [SG_SKIP]
    if not hicache:
        skip.append(SG_HICACHE)
    if not pd:
        skip.append(SG_PD)
    g = {**SG_GAUGES, **(gauges or {})}
    if spec:
        g.update(
            {
                "sglang:spec_accept_length": 2.9,
                "sglang:spec_accept_rate": 0.72,
                "sglang:spec_num_steps": 3,
                "sglang:spec_num_draft_tokens": 4,
            }
        )
    else:
        g.update({"sglang:spec_accept_length": 0.0, "sglang:spec_accept_rate": 0.0})
    extra = {"engine_type": [pd or "unified"], "cache_source": ["device", "host"] if hicache else ["device"]}
    return render_from_names(
        names,
        gauges=g,
        counters={**SG_COUNTERS, **(counters or {})},
        labels=extra,
        skip="|".join(skip),
        hist_count={r"kv_transfer|bootstrap|prealloc": 3500.0} if pd else {},
    )


def lmcache() -> str:
    """LMCache's PrometheusLogger (lmcache/observability.py): counters, gauges, retrieve/store histograms."""
    b = Body()
    lab = [{"model_name": "Qwen/Qwen3-8B", "worker_id": "0"}]
    for name, v in (
        ("num_retrieve_requests", 3400),
        ("num_store_requests", 3500),
        ("num_lookup_requests", 3500),
        ("num_requested_tokens", 3.1e6),
        ("num_hit_tokens", 1.2e6),
        ("num_stored_tokens", 2.9e6),
        ("num_lookup_tokens", 3.2e6),
        ("num_lookup_hits", 1.2e6),
        ("num_vllm_hit_tokens", 0.9e6),
        ("num_prompt_tokens", 3.2e6),
        ("num_remote_read_requests", 0),
        ("num_remote_read_bytes", 0),
        ("num_remote_write_requests", 0),
        ("num_remote_write_bytes", 0),
        ("local_cpu_evict_count", 120),
        ("local_cpu_evict_keys_count", 2400),
        ("local_cpu_evict_failed_count", 0),
        ("forced_unpin_count", 0),
        ("lookup_0_hit_requests", 1900),
        ("num_slow_retrieval_by_time", 0),
        ("num_slow_retrieval_by_speed", 0),
    ):
        b.family(f"lmcache:{name}_total", "counter", f"{name.replace('_', ' ')}.", [(lab[0], v)])
    for name, v in (
        ("retrieve_hit_rate", 0.39),
        ("lookup_hit_rate", 0.37),
        ("local_cache_usage", 2.1e10),
        ("remote_cache_usage", 0),
        ("local_storage_usage", 0),
        ("active_memory_objs_count", 310),
        ("pinned_memory_objs_count", 0),
        ("lmcache_is_healthy", 1),
    ):
        b.family(f"lmcache:{name}", "gauge", f"{name.replace('_', ' ')}.", [(lab[0], v)])
    lmc_sec = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
    b.histogram("lmcache:time_to_retrieve", "Time to retrieve from lmcache (seconds)", lab, lmc_sec, 0.02, 3400)
    b.histogram("lmcache:time_to_store", "Time to store to lmcache (seconds)", lab, lmc_sec, 0.03, 3500)
    b.histogram(
        "lmcache:time_to_lookup",
        "Time to lookup in lmcache (seconds)",
        lab,
        [0.00001 * 2**i for i in range(20)],
        0.0004,
        3500,
    )
    speed = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
    b.histogram("lmcache:retrieve_speed", "Retrieve speed of lmcache (tokens per second)", lab, speed, 30000, 3400)
    b.histogram("lmcache:store_speed", "Store speed of lmcache (tokens per second)", lab, speed, 25000, 3500)
    return b.text()


def tgi() -> str:
    """TGI's router metrics (docs/source/reference/metrics.md; router/src/server.rs for the buckets it sets with
    metrics-exporter-prometheus: a 1.5x geometric series from 0.00015 s for every *duration, max_input_tokens/100
    and max_total_tokens/100 steps for the token histograms, here with 4095 / 4096). tgi_batch_next_size (1024
    one-wide buckets) is left out to keep the body small."""
    b = Body()
    b.family("tgi_batch_current_max_tokens", "gauge", "tgi_batch_current_max_tokens", [({}, 16000)])
    b.family("tgi_batch_current_size", "gauge", "tgi_batch_current_size", [({}, 12)])
    b.family("tgi_queue_size", "gauge", "tgi_queue_size", [({}, 0)])
    b.family("tgi_request_count", "counter", "tgi_request_count", [({}, 3500)])
    b.family("tgi_request_success", "counter", "tgi_request_success", [({}, 3490)])
    b.family(
        "tgi_batch_inference_count",
        "counter",
        "tgi_batch_inference_count",
        [({"method": "prefill"}, 3500), ({"method": "decode"}, 610000)],
    )
    b.family(
        "tgi_batch_inference_success",
        "counter",
        "tgi_batch_inference_success",
        [({"method": "prefill"}, 3500), ({"method": "decode"}, 610000)],
    )
    durations = [round(0.0001 * 1.5 ** (i + 1), 10) for i in range(35)]
    for name, t in (
        ("tgi_request_duration", 4.0),
        ("tgi_request_queue_duration", 0.02),
        ("tgi_request_inference_duration", 3.9),
        ("tgi_request_mean_time_per_token_duration", 0.022),
        ("tgi_request_validation_duration", 0.0004),
    ):
        b.histogram(name, name, [{}], durations, t, 3500)
    for m, t in (("prefill", 0.09), ("decode", 0.021)):
        b.histogram("tgi_batch_forward_duration", "tgi_batch_forward_duration", [{"method": m}], durations, t, 3500)
    b.histogram(
        "tgi_request_input_length", "tgi_request_input_length", [{}], [40.95 * (x + 1) for x in range(100)], 900, 3500
    )
    for name, t in (("tgi_request_generated_tokens", 180), ("tgi_request_max_new_tokens", 1024)):
        b.histogram(name, name, [{}], [40.96 * (x + 1) for x in range(100)], t, 3500)
    return b.text()


def smg() -> str:
    """The SGLang model gateway (sgl-model-gateway/src/observability/metrics.rs): gateway, router and worker
    layers; duration_seconds histograms with the default buckets, other histograms as summaries."""
    b = Body()
    model = "Qwen/Qwen3-8B"
    workers = ["http://10.0.0.11:30000", "http://10.0.0.12:30000"]
    b.family(
        "smg_http_requests_total",
        "counter",
        "Total HTTP requests by method and path",
        [({"method": "POST", "path": "/v1/chat/completions"}, 7000)],
    )
    b.family(
        "smg_http_responses_total",
        "counter",
        "Total HTTP responses by status_code and error_code",
        [({"status_code": "200", "error_code": ""}, 6998), ({"status_code": "503", "error_code": "no_workers"}, 2)],
    )
    b.family("smg_http_connections_active", "gauge", "Currently active HTTP connections", [({}, 28)])
    b.histogram(
        "smg_http_request_duration_seconds",
        "HTTP request duration by method and path",
        [{"method": "POST", "path": "/v1/chat/completions"}],
        SMG_DURATION,
        4.0,
        7000,
    )
    rl = {
        "router_type": "http",
        "backend_type": "regular",
        "connection_mode": "http",
        "model": model,
        "endpoint": "chat",
    }
    b.family("smg_router_requests_total", "counter", "Total routed requests", [({**rl, "streaming": "true"}, 7000)])
    b.family("smg_router_request_errors_total", "counter", "Router errors", [({**rl, "error_type": "no_workers"}, 2)])
    b.histogram("smg_router_request_duration_seconds", "Router request duration", [rl], SMG_DURATION, 4.0, 7000)
    b.family(
        "smg_worker_pool_size",
        "gauge",
        "Current worker pool size",
        [({"worker_type": "regular", "connection_mode": "http", "model": model}, 2)],
    )
    b.family(
        "smg_worker_requests_active",
        "gauge",
        "Currently running requests per worker",
        [({"worker": w}, v) for w, v in zip(workers, (13, 15), strict=True)],
    )
    b.family(
        "smg_worker_health",
        "gauge",
        "Worker health status (1=healthy, 0=unhealthy)",
        [({"worker": w}, 1) for w in workers],
    )
    b.family(
        "smg_worker_selection_total",
        "counter",
        "Worker selection events",
        [
            (
                {
                    "worker_type": "regular",
                    "connection_mode": "http",
                    "model": model,
                    "policy": "cache_aware",
                    "worker": w,
                },
                v,
            )
            for w, v in zip(workers, (3480, 3520), strict=True)
        ],
    )
    b.family(
        "smg_worker_cb_state",
        "gauge",
        "Circuit breaker state per worker (0=closed, 1=open, 2=half_open)",
        [({"worker": w}, 0) for w in workers],
    )
    b.family(
        "smg_worker_retries_total",
        "counter",
        "Total retry attempts",
        [({"worker_type": "regular", "endpoint": "chat"}, 0)],
    )
    b.family("smg_discovery_workers_discovered", "gauge", "Workers known via discovery", [({"source": "static"}, 2)])
    return b.text()


def dynamo_frontend() -> str:
    """Dynamo's HTTP frontend (lib/runtime/src/metrics/prometheus_names.rs frontend_service, histograms per
    lib/llm/src/http/service/metrics.rs)."""
    b = Body()
    m = {"model": "Qwen/Qwen3-8B"}
    b.family(
        "dynamo_frontend_requests_total",
        "counter",
        "Total number of LLM requests processed",
        [({**m, "endpoint": "chat_completions", "request_type": "stream", "status": "success"}, 3500)],
    )
    b.family("dynamo_frontend_queued_requests", "gauge", "Number of requests in HTTP processing queue", [(m, 0)])
    b.family("dynamo_frontend_inflight_requests", "gauge", "Number of inflight requests", [(m, 24)])
    b.family("dynamo_frontend_disconnected_clients", "gauge", "Number of disconnected clients", [({}, 0)])
    b.family("dynamo_frontend_output_tokens_total", "counter", "Total number of output tokens generated", [(m, 6.4e5)])
    b.histogram("dynamo_frontend_request_duration_seconds", "Duration of LLM requests", [m], REQ, 4.0, 3500)
    b.histogram("dynamo_frontend_time_to_first_token_seconds", "Time to first token in seconds", [m], SEC, 0.12, 3500)
    b.histogram("dynamo_frontend_inter_token_latency_seconds", "Inter-token latency in seconds", [m], ITL, 0.025, 3500)
    b.histogram("dynamo_frontend_input_sequence_tokens", "Input sequence length in tokens", [m], TOK, 900, 3500)
    b.histogram("dynamo_frontend_output_sequence_tokens", "Output sequence length in tokens", [m], TOK, 180, 3500)
    b.histogram("dynamo_frontend_cached_tokens", "Number of cached tokens per request", [m], TOK, 380, 3500)
    b.histogram(
        "dynamo_frontend_kv_hit_rate",
        "Predicted KV cache hit rate at routing time",
        [m],
        [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
        0.4,
        3500,
    )
    for name, v in (
        ("model_total_kv_blocks", 27648),
        ("model_max_num_seqs", 256),
        ("model_max_num_batched_tokens", 8192),
        ("model_context_length", 32768),
        ("model_kv_cache_block_size", 16),
        ("model_migration_limit", 0),
    ):
        b.family(f"dynamo_frontend_{name}", "gauge", name.replace("_", " "), [(m, v)])
    b.family(
        "dynamo_frontend_model_migration_total",
        "counter",
        "Request migrations",
        [({**m, "migration_type": "new_request"}, 0)],
    )
    workers = [{**m, "worker_id": w, "dp_rank": "0", "worker_type": "aggregated"} for w in ("7587888", "7587889")]
    b.family(
        "dynamo_frontend_worker_active_decode_blocks",
        "gauge",
        "Active decode blocks per worker",
        [(w, v) for w, v in zip(workers, (11500, 11800), strict=True)],
    )
    b.family(
        "dynamo_frontend_worker_active_prefill_tokens",
        "gauge",
        "Active prefill tokens per worker",
        [(w, v) for w, v in zip(workers, (0, 900), strict=True)],
    )
    b.family(
        "dynamo_frontend_router_queue_pending_requests",
        "gauge",
        "Requests pending in the router queue",
        [({**m, "worker_type": "aggregated"}, 0)],
    )
    return b.text()


def dynamo_worker() -> str:
    """A Dynamo vLLM worker: dynamo_component_* work-handler metrics plus the engine's own vllm: series that
    Dynamo re-exports with its labels injected (labels module of prometheus_names.rs)."""
    dyn = {
        "dynamo_namespace": "dynamo",
        "dynamo_component": "backend",
        "dynamo_endpoint": "generate",
        "model": "Qwen/Qwen3-8B",
    }
    b = Body()
    b.family(
        "dynamo_component_requests_total",
        "counter",
        "Total number of requests processed by work handler",
        [(dyn, 3500)],
    )
    b.family("dynamo_component_inflight_requests", "gauge", "Requests being processed by work handler", [(dyn, 14)])
    b.family(
        "dynamo_component_errors_total",
        "counter",
        "Total number of errors in work handler processing",
        [({**dyn, "error_type": "generate"}, 0)],
    )
    b.family("dynamo_component_request_bytes_total", "counter", "Total bytes received", [(dyn, 1.4e7)])
    b.family("dynamo_component_response_bytes_total", "counter", "Total bytes sent", [(dyn, 9.1e7)])
    b.histogram("dynamo_component_request_duration_seconds", "Time spent processing requests", [dyn], REQ, 4.0, 3500)
    engine = vllm("vllm-0.11.0.yaml")
    inject = ",".join(f'{k}="{v}"' for k, v in dyn.items() if k != "model")
    engine = re.sub(r'(model_name="[^"]*")', rf"\1,{inject}", engine)
    return b.text() + engine


def vllm_v0_04() -> str:
    """vLLM's V0 Metrics class as stored at vllm-project/vllm@00c33e81 (vllm/engine/metrics.py, the 0.4 line):
    its names, label names and buckets; request token buckets from build_1_2_5_buckets(4096)."""
    b = Body()
    m = {"model_name": "Qwen/Qwen3-8B"}
    info = {
        "block_size": "16",
        "cache_dtype": "auto",
        "enable_prefix_caching": "False",
        "gpu_memory_utilization": "0.9",
        "num_cpu_blocks": "2048",
        "num_gpu_blocks": "27648",
        "num_gpu_blocks_override": "None",
        "sliding_window": "None",
        "swap_space_bytes": "4294967296",
    }
    b.family("vllm:cache_config_info", "gauge", "information of cache_config", [(info, 1.0)])
    for name, help_, v in (
        ("num_requests_running", "Number of requests currently running on GPU.", 14),
        ("num_requests_waiting", "Number of requests waiting to be processed.", 0),
        ("num_requests_swapped", "Number of requests swapped to CPU.", 0),
        ("gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", 0.42),
        ("cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.", 0.0),
    ):
        b.family(f"vllm:{name}", "gauge", help_, [(m, v)])
    b.family("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", [(m, 0)])
    b.family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", [(m, 3.2e6)])
    b.family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", [(m, 6.4e5)])
    b.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        [m],
        [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0],
        0.12,
        3500,
    )
    b.histogram(
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds.",
        [m],
        [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5],
        0.025,
        630000,
    )
    b.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of end to end request latency in seconds.",
        [m],
        [1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0],
        4.0,
        3500,
    )
    tok = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    b.histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", [m], tok, 900, 3500)
    b.histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", [m], tok, 180, 3500)
    b.histogram(
        "vllm:request_params_best_of", "Histogram of the best_of request parameter.", [m], [1, 2, 5, 10, 20], 1, 3500
    )
    b.histogram("vllm:request_params_n", "Histogram of the n request parameter.", [m], [1, 2, 5, 10, 20], 1, 3500)
    b.family(
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
        [({**m, "finished_reason": "stop"}, 3100), ({**m, "finished_reason": "length"}, 400)],
    )
    b.family("vllm:avg_prompt_throughput_toks_per_s", "gauge", "Average prefill throughput in tokens/s.", [(m, 1800.0)])
    b.family(
        "vllm:avg_generation_throughput_toks_per_s", "gauge", "Average generation throughput in tokens/s.", [(m, 360.0)]
    )
    return b.text()


def dcgm(version_csv: str) -> str:
    """dcgm-exporter's default counters (etc/default-counters.csv at the tag), two healthy H100s."""
    b = Body()
    gpus = [("0", "GPU-2f6c2f1e-0c1b-4b7e-9a55-3c1d2e4f5a60"), ("1", "GPU-7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c0d")]
    values = {
        "DCGM_FI_DEV_SM_CLOCK": 1755,
        "DCGM_FI_DEV_MEM_CLOCK": 2619,
        "DCGM_FI_DEV_MEMORY_TEMP": 41,
        "DCGM_FI_DEV_GPU_TEMP": 52,
        "DCGM_FI_DEV_POWER_USAGE": 412.5,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 9.1e11,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
        "DCGM_FI_DEV_GPU_UTIL": 71,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 38,
        "DCGM_FI_DEV_ENC_UTIL": 0,
        "DCGM_FI_DEV_DEC_UTIL": 0,
        "DCGM_FI_DEV_XID_ERRORS": 0,
        "DCGM_FI_DEV_FB_FREE": 3921,
        "DCGM_FI_DEV_FB_USED": 76032,
        "DCGM_FI_DEV_FB_RESERVED": 606,
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 1.3e12,
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.68,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.31,
        "DCGM_FI_PROF_DRAM_ACTIVE": 0.44,
        "DCGM_FI_PROF_PCIE_TX_BYTES": 2.1e8,
        "DCGM_FI_PROF_PCIE_RX_BYTES": 3.4e8,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT": 700,
    }
    for line in version_csv.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        field, kind, help_ = (p.strip() for p in line.split(",", 2))
        if kind == "label" or field not in values:
            continue
        b.lines += [f"# HELP {field} {help_}", f"# TYPE {field} {kind}"]
        for gpu, uuid in gpus:
            labels = {
                "gpu": gpu,
                "UUID": uuid,
                "pci_bus_id": f"00000000:{18 + int(gpu):02X}:00.0",
                "device": f"nvidia{gpu}",
                "modelName": "NVIDIA H100 80GB HBM3",
                "Hostname": "gpu-node-3",
                "DCGM_FI_DRIVER_VERSION": "570.124.06",
            }
            b.lines.append(f"{field}{Body._labels(labels)} {_num(float(values[field]))}")
    return b.text()


def rendered() -> dict[str, str]:
    """Every rendered body: file name -> text."""
    bodies = {
        "vllm-v0-0.10.2-rendered.txt": vllm("vllm-v0-0.10.2.yaml"),
        "vllm-0.10.2-rendered.txt": vllm("vllm-0.10.2.yaml"),
        "vllm-0.11.0-specdec-rendered.txt": vllm("vllm-0.11.0.yaml", spec=True),
        "vllm-0.33.0-rendered.txt": vllm(
            "vllm-0.33.0.yaml",
            skip=r"kv_offload|nixl|mooncake|hf3fs|umbp|simple_kv|"
            r"hisparse|diffusion|rl_weight|sleep|websocket|tool_call",
        ),
        "vllm-0.33.0-offload-nixl-rendered.txt": vllm(
            "vllm-0.33.0.yaml",
            skip=r"mooncake|hf3fs|umbp|simple_kv|hisparse|diffusion|rl_weight|sleep|websocket|"
            r"tool_call|kv_offload_tiering",
            gauges={"vllm:kv_offload_cpu_cache_usage_perc": 0.35},
        ),
        "sglang-0.4.6.post5-rendered.txt": sglang("sglang-0.4.6.post5.yaml", spec=False),
        "sglang-0.5.5-rendered.txt": sglang("sglang-0.5.5.yaml", spec=False),
        "sglang-0.5.8-rendered.txt": sglang("sglang-0.5.8.yaml", spec=False),
        "sglang-0.5.8-eagle-rendered.txt": sglang("sglang-0.5.8.yaml", spec=True),
        "sglang-0.5.23-rendered.txt": sglang("sglang-0.5.23.yaml", spec=False),
        "sglang-0.5.23-hicache-rendered.txt": sglang(
            "sglang-0.5.23.yaml",
            spec=False,
            hicache=True,
            gauges={"sglang:hicache_host_total_tokens": 1.2e6, "sglang:hicache_host_used_tokens": 4.1e5},
            counters={
                r"load_back_tokens|backup_tokens|backuped_tokens|prefetched_tokens|storage_prefetch_hit": 6.0e5,
                r"load_back_bytes|backup_bytes": 2.4e10,
            },
        ),
        "sglang-0.5.23-pd-prefill-rendered.txt": sglang("sglang-0.5.23.yaml", spec=False, pd="prefill"),
        "sglang-0.5.23-pd-decode-rendered.txt": sglang("sglang-0.5.23.yaml", spec=False, pd="decode"),
        "vllm-0.11.0-lmcache-rendered.txt": vllm("vllm-0.11.0.yaml") + lmcache(),
        "tgi-3.3.7-rendered.txt": tgi(),
        "smg-gateway-rendered.txt": smg(),
        "dynamo-frontend-rendered.txt": dynamo_frontend(),
        "dynamo-worker-vllm-rendered.txt": dynamo_worker(),
    }
    for tag in ("4.5.3-4.8.2", "3.3.9-3.6.1"):
        csv = HERE / "sources" / f"dcgm-exporter-{tag}-default-counters.csv"
        bodies[f"dcgm-exporter-{tag}-rendered.txt"] = dcgm(csv.read_text())
    bodies["vllm-0.4-v0-rendered.txt"] = vllm_v0_04()
    bodies["vllm-0.33.0-specdec-rendered.txt"] = vllm(
        "vllm-0.33.0.yaml",
        spec=True,
        skip=r"kv_offload|nixl|mooncake|hf3fs|umbp|simple_kv|hisparse|diffusion|rl_weight|sleep|websocket|tool_call",
    )
    bodies["sglang-0.5.23-eagle-rendered.txt"] = sglang("sglang-0.5.23.yaml", spec=True)
    return bodies


def main() -> None:
    OUT.mkdir(exist_ok=True)
    bodies = rendered()
    for name, text in bodies.items():
        (OUT / name).write_text(text)
        print(f"{name}: {len(text)} bytes")


if __name__ == "__main__":
    main()
