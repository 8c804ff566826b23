"""Agent /metrics render: kvscope's own text writer (agent/serve/export.py) against a
prometheus_client custom collector serving the same families, in one run.

The store is the real vLLM 0.32 CPU capture (tests/fixtures/scrapes/) normalized for 9 targets,
each with enough `model` label values that the canonical series total about --series. Both
paths start from the same `canonical_families` (grouping and ordering are shared); what is timed
is the family list to body text: `Family.render` for kvscope, and for prometheus_client a
`Collector` whose `collect()` yields one `Metric` per family, written by `generate_latest`.
Medians of --repeat renders each.

    .venv/bin/python bench/agent_exposition.py --series 50000
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kvscope.agent.normalize.dialect import detect_engine, normalize
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.agent.serve.export import Family, canonical_families
from kvscope.core.signals import Sample, load_catalog

CAPTURE = Path(__file__).resolve().parent.parent / "tests/fixtures/scrapes/vllm-0.32.0-cpu-after-load.txt"
TARGETS = 9


def store(series: int) -> list[Sample]:
    """About `series` canonical samples: the capture for 9 targets x N models."""
    expo = parse_exposition(CAPTURE.read_text())
    template = normalize(expo, detect_engine(expo), {"instance": "t", "job": "vllm"}).samples
    models = max(1, round(series / (TARGETS * len(template))))
    out = []
    for t in range(TARGETS):
        for m in range(models):
            for s in template:
                labels = dict(s.labels) | {"instance": f"10.0.0.{t}:8000", "model": f"model-{m}"}
                out.append(Sample(s.name, tuple(sorted(labels.items())), s.value + t + m, s.timestamp))
    return out


class FamiliesCollector(Collector):
    """kvscope's families as prometheus_client metrics (counters lose `_total`: the writer adds it)."""

    def __init__(self, families: list[Family]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for fam in self.families:
            name = fam.name.removesuffix("_total") if fam.kind == "counter" else fam.name
            metric = Metric(name, " ".join(fam.help.split()), fam.kind)
            for sample_name, labels, value in fam.lines:
                metric.add_sample(sample_name, dict(labels), value)
            yield metric


def kvscope_render(families: list[Family]) -> bytes:
    out: list[str] = []
    for fam in families:
        fam.render(out)
    return "".join(out).encode()


def client_render(families: list[Family]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FamiliesCollector(families))
    return generate_latest(registry)


def median_ms(fn, families: list[Family], repeat: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        size = len(fn(families))
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times), size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    samples = store(args.series)
    t0 = time.perf_counter()
    families = canonical_families(samples, load_catalog())
    group_ms = 1000 * (time.perf_counter() - t0)
    series = sum(len(f.lines) for f in families)
    ours, ours_bytes = median_ms(kvscope_render, families, args.repeat)
    theirs, theirs_bytes = median_ms(client_render, families, args.repeat)
    print(
        json.dumps(
            {
                "targets": TARGETS,
                "series": series,
                "families": len(families),
                "group_ms": round(group_ms, 1),
                "kvscope_render_ms": round(ours, 1),
                "prometheus_client_render_ms": round(theirs, 1),
                "ratio": round(theirs / ours, 2),
                "kvscope_bytes": ours_bytes,
                "prometheus_client_bytes": theirs_bytes,
            }
        )
    )


if __name__ == "__main__":
    main()
