"""Request phases across prefill/decode: where the time goes, split by the `role` label (not pod names)."""

from kvscope.dashboards import queries as q
from kvscope.dashboards.board import Board, Panel, Row

PHASES = Row(
    "Phases",
    (
        Panel(
            "Mean phase time by role",
            "Mean queue, prefill and decode time per role (prefill | decode | "
            "unified). Under P/D, per-instance TTFT looks low while client TTFT is high (vLLM #22454).",
            tuple(q.phase_means(("role",))),
            "seconds",
            stack=True,
            width=12,
        ),
        Panel(
            "Queue time",
            "Time requests wait before scheduling: p50, p99, mean.",
            q.latency("request_queue_seconds"),
            "seconds",
            width=12,
        ),
        Panel("Prefill time", "Prefill phase p50, p99, mean.", q.latency("request_prefill_seconds"), "seconds"),
        Panel("Decode time", "Decode phase p50, p99, mean.", q.latency("request_decode_seconds"), "seconds"),
        Panel(
            "TTFT p99 by role", "99th percentile TTFT per role.", (q.p99("request_ttft_seconds", ("role",)),), "seconds"
        ),
    ),
)

TRACED = Row(
    "Stitched from traces",
    (
        Panel(
            "Phase p99 (traces)",
            "Per-request phase p99 stitched from OTLP traces across P/D hops: queue, "
            "prefill, kv_transfer, decode. kv_transfer is measured, not inferred.",
            (q.PHASE_P99,),
            "seconds",
            width=12,
        ),
        Panel(
            "Phase mean (traces)",
            "Mean per-request phase time from traces, stacked.",
            (q.PHASE_MEAN,),
            "seconds",
            stack=True,
            width=12,
        ),
    ),
)

TRANSFER = Row(
    "KV transfer (P/D)",
    (
        Panel(
            "KV transfer time",
            "Prefill-to-decode KV transfer p99 and mean per role (NIXL / Mooncake).",
            q.KV_TRANSFER,
            "seconds",
        ),
        Panel(
            "KV transfer bandwidth",
            "Bytes moved per second between pools.",
            (q.KV_TRANSFER_BANDWIDTH,),
            "bytes_per_s",
        ),
        Panel(
            "KV transfer failures / s",
            "Failed KV transfers per second.",
            (q.KV_TRANSFER_FAILURES,),
            "per_s",
            palette="rate_bad",
        ),
    ),
    collapsed=True,
)

BOARD = Board(
    "kvscope-phases",
    "kvscope / Request phases (P/D)",
    "Queue, prefill, decode and KV transfer time, split by prefill/decode role.",
    (PHASES, TRACED, TRANSFER),
)
