"""Efficiency & cost: tokens per GPU-hour, $ per 1M tokens, the utilisation trap, cache savings."""

from kvscope.dashboards import queries as q
from kvscope.dashboards.board import Board, Panel, Row

COST = Row(
    "Cost",
    (
        Panel(
            "Tokens per GPU-hour",
            "Output tokens per GPU-hour across the selection (Sizing LLM Inference for Production §9.3): generated "
            "tokens over the GPUs reporting utilisation. Absent without a GPU collector (DCGM or NVML).",
            (q.tokens_per_gpu_hour(),),
            "tokens_per_gpu_hour",
            width=6,
        ),
        Panel(
            "Tokens per GPU-hour by engine",
            "Per engine, GPUs counted from the agent's engine-GPU join "
            "(engine_gpu_memory_used_bytes, by gpu_mapping, Kubernetes pod labels or NVML pid).",
            (q.tokens_per_gpu_hour(("instance",), "engine_gpu_memory_used_bytes"),),
            "tokens_per_gpu_hour",
            width=6,
        ),
        Panel(
            "$ per 1M output tokens",
            "GPU-hours at $gpu_hour_cost over output tokens. "
            "Idle GPUs count: Sizing LLM Inference for Production §9.2's utilisation trap.",
            (q.COST_PER_MILLION_TOKENS,),
            "currency",
            width=6,
        ),
        Panel(
            "Energy per output token",
            "GPU energy (joules) per generated token.",
            (q.JOULES_PER_TOKEN,),
            "joules",
            width=6,
        ),
    ),
)

UTILISATION = Row(
    "Utilisation and savings",
    (
        Panel(
            "Fleet GPU utilisation",
            "Average GPU utilisation as DCGM GPU_UTIL / NVML report it (a kernel was "
            "running) and, where DCGM profiling is on, graphics-engine activity: GPU_UTIL reads ~94 % on an idle "
            "decode batch. Sizing LLM Inference for Production §9.2: below 40 % real use the fleet pays "
            "2.5x the efficient cost per token.",
            (
                q.Query(q.gauge("gpu_utilization_ratio", "avg"), "GPU_UTIL (a kernel ran)", ("gpu_utilization_ratio",)),
                q.Query(
                    q.gauge("gpu_graphics_engine_active_ratio", "avg"),
                    "graphics engine active",
                    ("gpu_graphics_engine_active_ratio",),
                ),
            ),
            "ratio",
            palette="gpu_util",
        ),
        Panel(
            "Prefill tokens saved by prefix caching",
            "Prompt tokens per second served from the prefix cache instead of recomputed.",
            (q.PREFILL_TOKENS_SAVED,),
            "tokens_per_s",
        ),
        Panel(
            "Prompt tokens by source",
            "Computed vs cached vs transferred prompt tokens.",
            (q.PROMPT_TOKENS_BY_SOURCE,),
            "tokens_per_s",
            stack=True,
        ),
    ),
)

BOARD = Board(
    "kvscope-efficiency",
    "kvscope / Efficiency & cost",
    "Tokens per GPU-hour, cost per token, utilisation, savings.",
    (COST, UTILISATION),
    cost_var=True,
)
