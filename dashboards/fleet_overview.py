"""Fleet overview: is the fleet meeting its latency SLOs, how busy is it, and what does it cost.

Tier 1 of the suite (like llm-d's failure/saturation tier): tiles for the answer at a glance,
then latency, throughput and saturation rows with drill-downs into the detail dashboards.
"""

from kvscope.dashboards import queries as q
from kvscope.dashboards.board import Board, Panel, Row
from kvscope.dashboards.style import drilldown


def _tile(
    title: str, description: str, query: q.Query, unit: str, palette: str = "none", link: dict | None = None
) -> Panel:
    """A stat tile of the 'At a glance' row: one query, 3 of 24 columns."""
    return Panel(title, description, (query,), unit, "stat", palette, width=3, links=(link,) if link else ())


TILES = Row(
    "At a glance",
    (
        _tile("Requests / s", "Finished requests per second across the selection.", q.REQUEST_RATE, "reqps"),
        _tile("Output tok/s", "Generated tokens per second across the selection.", q.token_rates()[1], "tokens_per_s"),
        _tile(
            "TTFT p99", "99th percentile time to first token over the window.", q.p99("request_ttft_seconds"), "seconds"
        ),
        _tile(
            "ITL p99", "99th percentile inter-token latency over the window.", q.p99("request_itl_seconds"), "seconds"
        ),
        _tile(
            "TTFT SLO attainment",
            "Share of requests whose TTFT was under the $ttft_slo bucket.",
            q.slo_attainment("request_ttft_seconds", "ttft_slo"),
            "ratio",
            "slo",
        ),
        _tile(
            "KV cache (fullest engine)",
            "Highest KV pool usage of any engine (0-1). Sizing LLM Inference for Production §9.3 target 75-90 %.",
            q.KV_USAGE_SPREAD[0],
            "ratio",
            "kv_usage",
            drilldown("kvscope-kv", "KV cache & prefix"),
        ),
        _tile(
            "Prefix hit ratio",
            "Token-weighted local prefix-cache hit ratio over the window.",
            q.prefix_hit_ratio(),
            "ratio",
            "hit_ratio",
            drilldown("kvscope-kv", "KV cache & prefix"),
        ),
        _tile(
            "Targets down",
            "Scrape targets whose last scrape failed (kvscope_target_up == 0).",
            q.TARGETS_DOWN,
            "count",
            "down",
        ),
    ),
)

LATENCY = Row(
    "Latency",
    (
        Panel(
            "Time to first token",
            "TTFT p50, p99 and windowed mean (rate(_sum)/rate(_count)).",
            q.TTFT,
            "seconds",
            links=(drilldown("kvscope-phases", "Request phases"),),
        ),
        Panel(
            "Inter-token latency",
            "ITL p50, p99 and mean. SGLang and older vLLM call this TPOT.",
            q.ITL,
            "seconds",
        ),
        Panel("End-to-end latency", "Request E2E p50, p99 and mean.", q.E2E, "seconds"),
        Panel(
            "ITL SLO attainment",
            "Share of inter-token gaps under the $itl_slo bucket.",
            (q.slo_attainment("request_itl_seconds", "itl_slo"),),
            "ratio",
            palette="slo",
        ),
        Panel(
            "TTFT p99 per instance (recorded)",
            "Per-instance TTFT p99 over 5 minutes from kvscope's recording "
            "rules (rules/prometheus/kvscope-derived.yml): cheap to query over long ranges, and the series "
            "the SLO alerts read. Needs the rules loaded in Prometheus.",
            (q.recorded("instance:request_ttft_seconds:p99_5m"),),
            "seconds",
        ),
        Panel(
            "Mean time per request phase",
            "Queue, prefill and decode means, stacked: where E2E time goes.",
            tuple(q.phase_means()),
            "seconds",
            stack=True,
            links=(drilldown("kvscope-phases", "Request phases"),),
        ),
    ),
)

THROUGHPUT = Row(
    "Throughput",
    (
        Panel(
            "Token throughput by model",
            "Input and output tokens per second per model.",
            tuple(q.token_rates(("model",))),
            "tokens_per_s",
        ),
        Panel(
            "Finished requests by reason",
            "Finished requests per second by finish reason (stop, length, abort...).",
            (q.FINISH_REASONS,),
            "reqps",
            stack=True,
        ),
        Panel(
            "Tokens per GPU-hour",
            "Output tokens per GPU-hour: Sizing LLM Inference for Production §9.3's core efficiency number. Absent "
            "without a GPU collector (DCGM or NVML).",
            (q.tokens_per_gpu_hour(),),
            "tokens_per_gpu_hour",
            links=(drilldown("kvscope-efficiency", "Efficiency & cost"),),
        ),
    ),
)

SATURATION = Row(
    "Saturation",
    (
        Panel("Scheduler queue", "Running and waiting requests summed over engines.", q.RUNNING_WAITING, "count"),
        Panel(
            "KV cache usage",
            "Max, average and min KV pool usage across engines: a wide spread is a load-balance problem.",
            q.KV_USAGE_SPREAD,
            "ratio",
            palette="kv_usage",
        ),
        Panel(
            "Preemptions / s",
            "Requests preempted (KV evicted and recomputed) per second.",
            (q.preemptions(),),
            "per_s",
            palette="rate_bad",
            links=(drilldown("kvscope-kv", "KV cache & prefix"),),
        ),
        Panel(
            "Restarts and KV-capacity changes",
            "Per engine, restarts (its finished-requests counter dropped) and KV-capacity changes in the 15 minutes "
            "before each point: a step up is a change (a restart down for longer than 15 minutes is not seen). "
            "Whether serving got better or worse after one, at the same load, is what `kvscope curve` and the "
            "Alertmanager webhook judge (the curve before against after).",
            q.CHANGES,
            "count",
            width=24,
        ),
    ),
)

OPERATING = Row(
    "Operating point",
    (
        Panel(
            "TTFT p99 and p50 against concurrency: $model",
            "One point per time step: the mean requests in an engine (running plus waiting, running alone where "
            "the engine exports no queue) against TTFT p99 and p50 of the requests answered in the same window, "
            "pooled over the model's engines and instances; one chart per selected model. Where p99 leaves p50 "
            "while p50 stays flat is the knee (Sizing LLM Inference for Production §8.1). Windows that mix loads "
            "land between levels: `kvscope curve` buckets scrape intervals by concurrency instead, and gives the "
            "knee, C_max at the TTFT SLO, each point's interval and what changed at matched load.",
            q.OPERATING_POINT,
            "seconds",
            kind="xychart",
            width=12,
            repeat="model",
        ),
    ),
)

BOARD = Board(
    "kvscope-fleet",
    "kvscope / Fleet overview",
    "Latency SLOs, throughput, saturation and efficiency across vLLM and SGLang engines.",
    (TILES, LATENCY, OPERATING, THROUGHPUT, SATURATION),
    slo_vars=True,
)
