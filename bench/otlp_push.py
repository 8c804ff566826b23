"""OTLP push cost per push: what the agent's push loop does (agent/otel/push.py) vs rendering /metrics.

The same agent state, in one run: `--engines` copies of a real vLLM 0.32 capture (each its own
instance) normalized to canonical samples, as one agent would hold them. Measured, CPU time per
call (so other load on a shared box distorts it little):

* baseline  `render_metrics`: the /metrics body a Prometheus scrape costs the agent;
* genai     `genai_points`: the gen_ai.server.* histograms from the engine histograms;
* convert   the SDK `MetricsData` of /metrics + gen_ai (Converter, cumulative), then its OTLP
            protobuf encoding and serialization (what the SDK exporter sends; no network).

Prints per-call milliseconds, the ratio to the baseline, data points and bytes per push.

    .venv/bin/python bench/otlp_push.py --engines 8
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

from kvscope.agent.normalize.dialect import normalize
from kvscope.agent.otel.convert import Converter
from kvscope.agent.otel.genai import genai_points
from kvscope.agent.runtime import AgentState
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.agent.serve.export import canonical_families, health_families, render_metrics
from kvscope.core.signals import load_catalog

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = ROOT / "tests" / "fixtures" / "scrapes" / "vllm-0.32.0-cpu-after-load.txt"


def state_of(engines: int) -> AgentState:
    catalog = load_catalog()
    expo = parse_exposition(CAPTURE.read_text())
    samples = []
    for i in range(engines):
        target = {"job": "vllm", "instance": f"10.0.0.{i}:8000"}
        samples += list(normalize(expo, "vllm", target, catalog=catalog).samples)
    st = AgentState()
    st.samples["engine"] = samples
    return st


def cpu_ms(fn, repeat: int) -> float:
    fn()  # warm
    t0 = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - t0) / repeat * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", type=int, default=8, help="vLLM instances the agent holds")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    st, catalog = state_of(args.engines), load_catalog()
    samples = st.canonical_samples()
    conv = Converter("cumulative")
    now = [time.time_ns()]

    def push() -> bytes:
        fams = canonical_families(samples, catalog) + health_families(st, None)
        now[0] += 10**9
        data, _, _ = conv.metrics_data(fams, genai_points(samples), now[0])
        return encode_metrics(data).SerializeToString()

    base = cpu_ms(lambda: render_metrics(st, catalog), args.repeat)
    genai = cpu_ms(lambda: genai_points(samples), args.repeat)
    full = cpu_ms(push, args.repeat)
    body = push()
    fams = canonical_families(samples, catalog) + health_families(st, None)
    data, points, _ = conv.metrics_data(fams, genai_points(samples), now[0] + 1)
    print(f"agent state: {args.engines} vLLM instances, {len(samples)} canonical samples")
    print(f"{'step':<34}{'ms/call (CPU)':>14}{'x /metrics':>12}")
    print(f"{'render /metrics (baseline)':<34}{base:>14.2f}{1.0:>12.2f}")
    print(f"{'gen_ai.server.* points':<34}{genai:>14.2f}{genai / base:>12.2f}")
    print(f"{'convert + encode one OTLP push':<34}{full:>14.2f}{full / base:>12.2f}")
    text = render_metrics(st, catalog)
    print(f"one push: {points} data points, {len(body)} bytes of protobuf; /metrics: {len(text)} bytes")


if __name__ == "__main__":
    main()
