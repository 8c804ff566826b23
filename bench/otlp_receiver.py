"""OTLP receiver throughput, spans per second on one core, against a plain protobuf decode.

Payload: OTLP/HTTP protobuf export requests of 512 spans each (the SDK's default batch size),
built like the real traffic the receiver sees: per request a tap root span (with
`kvscope.tenant`) and a vLLM `llm_request` span with the 13 attributes vLLM 0.32 sets.

Measured in one run, each on the same payloads:

* baseline  `ExportTraceServiceRequest.FromString(body)` and a walk over every span (the least
            any Python OTLP receiver must do);
* to_dict   `json_format.MessageToDict` of the same request: protobuf's own generic full decode,
            the reference for "read every field";
* decode    kvscope's `parse_otlp_traces` (flat spans with typed attributes and resources);
* pipeline  decode + stitching (trace buffering, pairing, phase extraction) + phase histograms:
            everything the receiver does per body except HTTP;
* http      (with --http) the real aiohttp receiver in a subprocess pinned to one core
            (`taskset -c 0`), fed over loopback by a client on the other core.

Rates are spans per CPU-second of the receiving code (single-threaded, so per core), which other
load on a shared machine does not distort; the HTTP line also shows the wall-clock rate.
Prints spans/s and the ratio to the baseline; the goal is >= 20,000 spans/s for the pipeline and
for HTTP.

    .venv/bin/python bench/otlp_receiver.py --bodies 60 --http
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from tqdm import tqdm

from kvscope.agent.traces.export import encode_spans
from kvscope.agent.traces.otlp import Span, parse_otlp_traces
from kvscope.agent.traces.receiver import OtlpTraceReceiver
from kvscope.agent.traces.stitch import StitchConfig

RESOURCE = {
    "service.name": "vllm",
    "vllm.instrumenting_module_name": "vllm.llm_engine",
    "vllm.process_id": "31468",
    "telemetry.sdk.language": "python",
    "telemetry.sdk.name": "opentelemetry",
    "telemetry.sdk.version": "1.45.2",
}


def build_bodies(n_bodies: int, spans_per_body: int = 512) -> list[bytes]:
    """Export bodies of tap + llm_request span pairs (each pair one trace)."""
    bodies, k = [], 0
    t0 = time.time_ns()
    for _ in range(n_bodies):
        spans = []
        for _ in range(spans_per_body // 2):
            tid, root, child = f"{k:032x}", f"{2 * k + 1:016x}", f"{2 * k + 2:016x}"
            start = t0 + k * 1_000_000
            spans.append(
                Span(
                    tid,
                    root,
                    "",
                    "POST /v1/chat/completions",
                    2,
                    start,
                    start + 70_000_000,
                    {"kvscope.tenant": f"t{k % 7}", "http.response.status_code": 200},
                    {"service.name": "kvscope-tap"},
                )
            )
            spans.append(
                Span(
                    tid,
                    child,
                    root,
                    "llm_request",
                    2,
                    start + 1_000_000,
                    start + 63_000_000,
                    {
                        "gen_ai.latency.time_to_first_token": 0.016,
                        "gen_ai.latency.e2e": 0.062,
                        "gen_ai.latency.time_in_queue": 3.4e-05,
                        "gen_ai.usage.prompt_tokens": 9,
                        "gen_ai.usage.completion_tokens": 16,
                        "gen_ai.latency.time_in_model_prefill": 0.0101,
                        "gen_ai.latency.time_in_model_decode": 0.0464,
                        "gen_ai.latency.time_in_model_inference": 0.0566,
                        "gen_ai.request.id": f"chatcmpl-{k:016x}",
                        "gen_ai.request.top_p": 1.0,
                        "gen_ai.request.max_tokens": 16,
                        "gen_ai.request.temperature": 1.0,
                        "gen_ai.request.n": 1,
                    },
                    RESOURCE,
                )
            )
            k += 1
        bodies.append(encode_spans(spans))
    return bodies


def run_baseline(bodies: list[bytes]) -> int:
    n = 0
    for b in bodies:
        req = ExportTraceServiceRequest.FromString(b)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                n += len(ss.spans)
    return n


def run_todict(bodies: list[bytes]) -> int:
    n = 0
    for b in bodies:
        doc = MessageToDict(ExportTraceServiceRequest.FromString(b))
        n += sum(len(ss["spans"]) for rs in doc["resourceSpans"] for ss in rs["scopeSpans"])
    return n


def run_decode(bodies: list[bytes]) -> int:
    return sum(len(parse_otlp_traces(b, "application/x-protobuf")) for b in bodies)


def run_pipeline(bodies: list[bytes]) -> int:
    rx = OtlpTraceReceiver(stitch_config())
    n = 0
    for b in bodies:
        spans = parse_otlp_traces(b, "application/x-protobuf")
        n += len(spans)
        rx._emit(rx.stitcher.add(spans))
    rx._emit(rx.stitcher.flush(force=True))
    assert rx.stats["requests"] == n // 2, rx.stats
    return n


def stitch_config():
    from kvscope.agent.traces.receiver import OtlpConfig

    return OtlpConfig(listen="127.0.0.1:0", stitch=StitchConfig(max_traces=100_000, settle_s=0.0))


def timed(fn, bodies, repeat: int) -> float:
    """Best spans per CPU-second over `repeat` runs (single-threaded: one core). CPU time, not
    wall time, so other load on a shared machine does not count against the receiver."""
    best = 0.0
    for _ in range(repeat):
        t = time.process_time()
        n = fn(bodies)
        best = max(best, n / (time.process_time() - t))
    return best


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all threads (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


SERVER = r"""
import asyncio, sys
from kvscope.agent.traces.receiver import OtlpConfig, OtlpTraceReceiver
from kvscope.agent.traces.stitch import StitchConfig
async def main():
    rx = OtlpTraceReceiver(OtlpConfig(listen="127.0.0.1:0", max_body_bytes=64 << 20,
                                      stitch=StitchConfig(max_traces=200_000, settle_s=0.2)))
    await rx.start()
    print(rx.port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await rx.stop()
    print(rx.stats["spans"], rx.stats["requests"], flush=True)
asyncio.run(main())
"""


async def post_all(port: int, bodies: list[bytes], concurrency: int) -> float:
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/traces"
    queue = list(bodies)
    bar = tqdm(total=len(bodies), desc="http", unit="body", leave=False)

    async def worker(s):
        while queue:
            body = queue.pop()
            async with s.post(url, data=body, headers={"Content-Type": "application/x-protobuf"}) as r:
                assert r.status == 200, r.status
                await r.read()
            bar.update()

    async with aiohttp.ClientSession() as s:
        t = time.perf_counter()
        await asyncio.gather(*(worker(s) for _ in range(concurrency)))
        dt = time.perf_counter() - t
    bar.close()
    return dt


def run_http(bodies: list[bytes], concurrency: int) -> tuple[float, str]:
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") and os.cpu_count() and os.cpu_count() > 1 else []
    proc = subprocess.Popen(
        [*pin, sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(proc.stdout.readline())
        cpu0 = cpu_seconds(proc.pid)
        dt = asyncio.run(post_all(port, bodies, concurrency))
        proc.stdin.write("\n")
        proc.stdin.flush()
        spans, requests = proc.stdout.readline().split()
        cpu = cpu_seconds(proc.pid) - cpu0  # receive + stitch of everything, stop included
        assert int(spans) == sum(len(parse_otlp_traces(b, "application/x-protobuf")) for b in bodies)
        where = "receiver pinned to core 0" if pin else "not pinned (no taskset)"
        return int(spans) / cpu, f"{where}; wall-clock rate {int(spans) / dt:,.0f} spans/s"
    finally:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bodies", type=int, default=40, help="export bodies of 512 spans (default 40)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per in-process variant; the best counts")
    ap.add_argument("--http", action="store_true", help="also measure the real HTTP receiver end to end")
    ap.add_argument("--concurrency", type=int, default=4, help="concurrent HTTP exports (default 4)")
    args = ap.parse_args(argv)
    bodies = build_bodies(args.bodies)
    print(f"payload: {len(bodies)} bodies x 512 spans, {sum(map(len, bodies)) / len(bodies) / 1024:.0f} KiB/body")
    results = {}
    variants = [("baseline", run_baseline), ("to_dict", run_todict), ("decode", run_decode), ("pipeline", run_pipeline)]
    for name, fn in tqdm(variants, desc="in-process", leave=False):
        results[name] = timed(fn, bodies, args.repeat)
    note = ""
    if args.http:
        results["http"], note = run_http(bodies, args.concurrency)
    base = results["baseline"]
    print(f"{'variant':<10} {'spans/s':>12} {'vs baseline':>12}")
    for name, v in results.items():
        print(f"{name:<10} {v:>12,.0f} {v / base:>11.2f}x" + (f"   ({note})" if name == "http" else ""))
    goal = min(v for k, v in results.items() if k in ("pipeline", "http"))
    print(f"goal >= 20,000 spans/s (pipeline and http): {'met' if goal >= 20_000 else 'NOT met'} ({goal:,.0f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
