"""Fuzz targets for engine log reading (issue 25): `bench/fuzz.py --target engine-log` runs them.

  engine-log   agent.logs.series.read_log on the bytes (every line through agent.logs.lines.parse_line,
               then the series assembly). It documents no error: it returns a LogRead for any bytes.
Seeds: the excerpts in tests/fixtures/logs, whole and line by line (a few dozen).
"""

from __future__ import annotations

import datetime
import io
from pathlib import Path

from kvscope.agent.logs.series import read_log

LOGS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "logs"
DAY = datetime.date(2026, 11, 24)
DICTIONARY = {
    "engine-log": [
        t.encode()
        for t in (
            "Avg prompt throughput: ",
            " tokens/s, ",
            "Avg generation throughput: ",
            "Running: ",
            " reqs, ",
            "Waiting: ",
            "Swapped: ",
            "Pending: ",
            "Preemptions: ",
            "GPU KV cache usage: ",
            "CPU KV cache usage: ",
            "%",
            "%.",
            "Prefix cache hit rate: ",
            "Prefix cache hit rate: GPU: ",
            "Engine 000: ",
            "INFO 11-24 08:00:00 ",
            "(APIServer pid=1) ",
            "[loggers.py:1] ",
            "[2025-01-01 00:00:00 DP0 TP0] ",
            "[23:59:59 TP1] ",
            "Prefill batch. ",
            "Decode batch, ",
            "Prefill batch(mixed #running-req: 3). ",
            " [12], ",
            "#running-req: ",
            "#queue-req: ",
            "#new-token: ",
            "#cached-token: ",
            "token usage: ",
            "swa token usage: ",
            "gen throughput (token/s): ",
            "#retracted_reqs: ",
            "KV cache pool is full. Retract requests. ",
            "Decode out of memory happened. ",
            "total_num_cumulative_preemption=",
            "SpecDecoding metrics: ",
            "Mean acceptance length: ",
            "Accepted: ",
            "Drafted: ",
            " tokens, ",
            "KV Transfer metrics: ",
            "Num successful transfers=",
            "Avg xfer time (ms)=",
            "Avg MB per transfer=",
            "Num failed transfers=",
            "Num failed recvs=",
            "vllm:kv_offload_load_bytes=",
            "vllm:kv_offload_load_time=",
            "vllm:kv_offload_allocation_failure=",
            "1.2e-05",
            "Speculative metrics: ",
            "Number of speculative tokens: ",
            "Number of accepted tokens: ",
            "Number of draft tokens: ",
            "Stored ",
            " out of total ",
            "[2025-06-21 20:59:57,672] LMCache INFO: ",
            "\x1b[32;20m",
            "Reqid: r, Total tokens ",
            "LMCache hit tokens: ",
            "Retrieved ",
            " out of ",
            " required tokens",
            "2026-06-01T12:00:00.123456789Z ",
            "2026-06-01T12:00:00+02:00 ",
            "[pod/vllm-0/vllm] ",
            "-1",
            "1e308",
            "99999999999999999999",
            "\u0661",
            "\n",
            "\r\n",
            "\x00",
            ", ",
            ": ",
            "Engine " + "9" * 5000 + ": ",
            " DP" + "9" * 5000,
        )
    ]
}


def parse_engine_log(data: bytes) -> object:
    return read_log(io.BytesIO(data), "fuzz", day=DAY)


def engine_log_seeds() -> list[bytes]:
    files = sorted(LOGS.glob("*.log"))
    seeds = [p.read_bytes() for p in files]
    lines = [line for p in files for line in p.read_bytes().splitlines(keepends=True)]
    return seeds + lines[:: max(1, len(lines) // 24)]


TARGETS = {"engine-log": (parse_engine_log, engine_log_seeds, DICTIONARY["engine-log"])}
