"""GPU & host joined to engines: DCGM/NVML next to the serving numbers, on the `node` label."""

from kvscope.dashboards import queries as q
from kvscope.dashboards.board import Board, Panel, Row

JOINED = Row(
    "Serving vs GPU",
    (
        Panel(
            "Output tokens / s per SM-active",
            "Generated tokens per second divided by summed SM activity, per "
            "node: falling while SM activity stays high means the GPUs are busy on something else.",
            (q.TOKENS_PER_SM_ACTIVE,),
            "tokens_per_s",
            width=12,
        ),
        Panel(
            "KV pressure vs HBM used",
            "Fullest engine KV pool next to GPU memory used, per node.",
            q.KV_VS_HBM,
            "ratio",
            palette="kv_usage",
            width=12,
        ),
    ),
)

GPU = Row(
    "GPUs",
    (
        Panel(
            "GPU utilisation",
            "Share of time a kernel ran (DCGM GPU_UTIL / NVML). A coarse signal: see SM active.",
            (q.gpu_gauge("gpu_utilization_ratio"),),
            "ratio",
            palette="gpu_util",
        ),
        Panel("SM active", "DCGM profiling SM-active ratio.", (q.gpu_gauge("gpu_sm_active_ratio"),), "ratio"),
        Panel(
            "GPU memory used",
            "Framebuffer used / total per GPU. Sizing LLM Inference for Production §9.3 target 80-90 %.",
            (q.GPU_MEMORY_USED_RATIO,),
            "ratio",
            palette="kv_usage",
        ),
        Panel("Power", "Board power draw per GPU.", (q.gpu_gauge("gpu_power_watts"),), "watts"),
        Panel("Temperature", "GPU temperature.", (q.gpu_gauge("gpu_temperature_celsius", "max"),), "celsius"),
        Panel(
            "Last XID",
            "Most recent XID error code per GPU (0 = none).",
            (q.gpu_gauge("gpu_xid_last_code", "max"),),
            "count",
        ),
    ),
)

HOST = Row(
    "Host and engine processes",
    (
        Panel("Host CPU", "Host CPU utilisation (0-1) per node.", (q.HOST_CPU,), "ratio"),
        Panel("Host memory", "Host memory used / total per node.", (q.HOST_MEMORY_RATIO,), "ratio"),
        Panel("Engine process RSS", "Resident memory of engine processes.", (q.ENGINE_RSS,), "bytes"),
        Panel("Engine process CPU", "CPU seconds per second used by engine processes.", (q.ENGINE_CPU,), "cores"),
    ),
)

BOARD = Board(
    "kvscope-gpu",
    "kvscope / GPU & host",
    "GPU telemetry (DCGM / NVML) and host metrics joined to engines.",
    (JOINED, GPU, HOST),
)
