"""Translate the outside corpus' engine log excerpts into OpenMetrics recordings, mechanically.

`python tests/outside/build_incidents.py` reads tests/outside/logs/<name>.log for each entry of
INCIDENTS and writes tests/outside/incidents/<name>.om.gz: one scrape per stats line, at the
line's own timestamp (the thread's year), with the metric names that engine version exports.
Only numbers the log line prints become series: running, waiting, KV usage (gauges), prompt and
generation throughput integrated into the token counters (rate x seconds since the previous line,
the first line starting the counter at 0). A signal the log does not print is absent, never zero
(no preemption counter, no latency histograms). It writes through kvscope's own RecordingWriter,
the writer `kvscope record` uses.
"""

from __future__ import annotations

import calendar
import re
from pathlib import Path

from kvscope.agent.recording.omfile import RecordingWriter
from kvscope.agent.scrape.exposition import parse_exposition

HERE = Path(__file__).resolve().parent
LOGS, OUT = HERE / "logs", HERE / "incidents"

VLLM_V1 = re.compile(
    r"INFO (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) \[loggers\.py:\d+\] Engine (\d+): "
    r"Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, "
    r"Running: (\d+) reqs, Waiting: (\d+) reqs, GPU KV cache usage: ([\d.]+)%"
)
SGLANG = re.compile(
    r"\[(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) TP(\d+)\] Decode batch, #running-req: (\d+), "
    r"(?:#full token|#token): (\d+), (?:full )?token usage: ([\d.]+),.*?gen throughput \(token/s\): "
    r"([\d.]+), #queue-req: (\d+)"
)
SGLANG_03 = re.compile(
    r"\[(\d\d):(\d\d):(\d\d) TP(\d+)\] Prefill batch\. #new-seq: (\d+), #new-token: (\d+), "
    r"#cached-token: (\d+), cache hit rate: [\d.]+%, token usage: ([\d.]+), "
    r"#running-req: (\d+), #queue-req: (\d+)"
)

# name -> (log file, engine, year, model name); the year and model are the thread's
INCIDENTS = {
    "vllm-v1-kv-full-queue-43295": ("vllm-v1-kv-full-queue-43295.log", "vllm-v1", 2026, "unknown-model"),
    "vllm-0.9-v1-kv-rising-no-queue-18115": (
        "vllm-0.9-v1-kv-rising-no-queue-18115.log",
        "vllm-v1-0.9",
        2025,
        "unknown-model",
    ),
    "vllm-v1-burst-queue-draining-37307": ("vllm-v1-burst-queue-draining-37307.log", "vllm-v1", 2026, "unknown-model"),
    "sglang-swa-full-token-usage-26248": ("sglang-swa-full-token-usage-26248.log", "sglang", 2026, "unknown-model"),
    "sglang-decode-healthy-hisparse-22331": (
        "sglang-decode-healthy-hisparse-22331.log",
        "sglang",
        2026,
        "unknown-model",
    ),
    "sglang-0.3-prefill-burst-admitted-1612": (
        "sglang-0.3-prefill-burst-admitted-1612.log",
        "sglang-0.3",
        2024,
        "unknown-model",
    ),
}


def _ts(year: int, mon: int, day: int, h: int, m: int, s: int) -> float:
    return float(calendar.timegm((year, mon, day, h, m, s, 0, 0, 0)))


def _family(name: str, kind: str, labels: str, value: float) -> str:
    sample = f"{name}_total" if kind == "counter" else name
    return f"# HELP {name} {name}.\n# TYPE {name} {kind}\n{sample}{{{labels}}} {value!r}\n"


def vllm_v1_rows(
    text: str, year: int, model: str, kv_name: str = "vllm:kv_cache_usage_perc"
) -> list[tuple[float, str]]:
    """vLLM V1 loggers.py stats lines -> that version's names (KV usage as a ratio 0..1: 0.9 calls it
    gpu_cache_usage_perc, later releases kv_cache_usage_perc)."""
    rows, prompt, gen, last = [], 0.0, 0.0, None
    for m in VLLM_V1.finditer(text):
        mon, day, h, mi, s, eng = (int(x) for x in m.groups()[:6])
        p_rate, g_rate, run, wait, kv = (float(x) for x in m.groups()[6:])
        ts = _ts(year, mon, day, h, mi, s)
        if last is not None:
            prompt += p_rate * (ts - last)
            gen += g_rate * (ts - last)
        last = ts
        labels = f'model_name="{model}",engine="{eng}"'
        body = (
            _family("vllm:num_requests_running", "gauge", labels, run)
            + _family("vllm:num_requests_waiting", "gauge", labels, wait)
            + _family(kv_name, "gauge", labels, kv / 100.0)
            + _family("vllm:prompt_tokens", "counter", labels, prompt)
            + _family("vllm:generation_tokens", "counter", labels, gen)
        )
        rows.append((ts, body))
    return rows


def sglang_rows(text: str, year: int, model: str) -> list[tuple[float, str]]:
    """SGLang scheduler decode lines -> SGLang 0.5.x names (token_usage, num_running_reqs, ...)."""
    rows, gen, last = [], 0.0, None
    for m in SGLANG.finditer(text):
        y, mon, day, h, mi, s, tp = (int(x) for x in m.groups()[:7])
        run, used, usage, g_rate, queue = int(m[8]), int(m[9]), float(m[10]), float(m[11]), int(m[12])
        ts = _ts(y, mon, day, h, mi, s)
        if last is not None and ts > last:
            gen += g_rate * (ts - last)
        if last is not None and ts <= last:
            continue  # several lines in one second: the scrape sees the first
        last = ts
        labels = f'model_name="{model}",engine_type="unified",tp_rank="{tp}",pp_rank="0",dp_rank="0"'
        body = (
            _family("sglang:num_running_reqs", "gauge", labels, run)
            + _family("sglang:num_queue_reqs", "gauge", labels, queue)
            + _family("sglang:token_usage", "gauge", labels, usage)
            + _family("sglang:num_used_tokens", "gauge", labels, used)
            + _family("sglang:gen_throughput", "gauge", labels, g_rate)
            + _family("sglang:generation_tokens", "counter", f'model_name="{model}"', gen)
        )
        rows.append((ts, body))
    return rows


def sglang_03_rows(text: str, year: int, model: str) -> list[tuple[float, str]]:
    """SGLang 0.3 prefill lines (no date in the line: the thread's day, 2024-10-10) -> 0.3 names:
    running, queue, token usage; new and cached prompt tokens summed into the token counters."""
    rows, prompt, cached, last = [], 0.0, 0.0, None
    for m in SGLANG_03.finditer(text):
        h, mi, s, tp = (int(x) for x in m.groups()[:4])
        new, hit, usage, run, queue = int(m[6]), int(m[7]), float(m[8]), int(m[9]), int(m[10])
        ts = _ts(year, 10, 10, h, mi, s)
        prompt += new + hit
        cached += hit
        if last is not None and ts <= last:
            continue
        last = ts
        labels = f'model_name="{model}"'
        body = (
            _family("sglang:num_running_reqs", "gauge", labels, run)
            + _family("sglang:num_queue_reqs", "gauge", labels, queue)
            + _family("sglang:token_usage", "gauge", labels, usage)
            + _family("sglang:prompt_tokens", "counter", labels, prompt)
            + _family("sglang:cached_tokens", "counter", labels, cached)
        )
        rows.append((ts, body))
    return rows


PARSERS = {
    "vllm-v1": vllm_v1_rows,
    "vllm-v1-0.9": lambda t, y, m: vllm_v1_rows(t, y, m, "vllm:gpu_cache_usage_perc"),
    "sglang": sglang_rows,
    "sglang-0.3": sglang_03_rows,
}


def build(name: str, out: Path = OUT) -> Path:
    log, engine, year, model = INCIDENTS[name]
    rows = PARSERS[engine]((LOGS / log).read_text(), year, model)
    if len(rows) < 2:
        raise ValueError(f"{log}: {len(rows)} stats lines parsed, need 2")
    writer = RecordingWriter(out / f"{name}.om.gz")
    for ts, body in rows:
        writer.add_scrape(engine.split("-")[0], f"{engine.split('-')[0]}-0:8000", ts, parse_exposition(body), 0.01)
    return writer.close()


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name in INCIDENTS:
        print(build(name))


if __name__ == "__main__":
    main()
