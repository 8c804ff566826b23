"""Exposition parse throughput: kvscope's parser against prometheus_client's, on the same text.

The input is a realistic ~10k-series exposition: the real vLLM 0.32 CPU capture
(tests/fixtures/scrapes/) repeated for several DP ranks and models, i.e. what one large
multi-engine node exposes. Both parsers read the full text into samples; the median of
--repeat runs is reported, and the ratio baseline / kvscope (goal >= 3x).

    .venv/bin/python bench/parse_throughput.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from kvscope.agent.scrape.exposition import parse_exposition

CAPTURE = Path(__file__).resolve().parent.parent / "tests/fixtures/scrapes/vllm-0.32.0-cpu-after-load.txt"


def build_exposition(target_series: int) -> tuple[str, int]:
    """The capture's vLLM families repeated across ranks/models until ~target_series samples."""
    lines = CAPTURE.read_text().splitlines()
    header = [ln for ln in lines if not ln.startswith("vllm:")]
    families: dict[str, list[str]] = {}
    current = None
    for ln in lines:
        if ln.startswith("# HELP vllm:") or ln.startswith("# TYPE vllm:"):
            current = ln.split()[2]
            families.setdefault(current, []).append(ln)
        elif ln.startswith("vllm:") and current is not None:
            families[current].append(ln)
    per_copy = sum(1 for f in families.values() for ln in f if not ln.startswith("#"))
    copies = max(1, target_series // per_copy)
    out = list(header)
    seen: set[str] = set()  # info gauges carry no model label: keep each distinct line once
    for fam in families.values():
        out.extend(ln for ln in fam if ln.startswith("#"))
        for i in range(copies):
            rank, model = str(i % 8), f"model-{i}"
            for ln in fam:
                if not ln.startswith("#"):
                    new = ln.replace('engine="0"', f'engine="{rank}"').replace(
                        'model_name="tiny-llama"', f'model_name="{model}"'
                    )
                    if new not in seen:
                        seen.add(new)
                        out.append(new)
    text = "\n".join(out) + "\n"
    return text, len(parse_exposition(text).samples)


def time_ms(fns, text: str, repeat: int) -> list[list[float]]:
    """Run the parsers alternately (so machine noise hits both alike); ms per run per parser."""
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for times, fn in zip(out, fns, strict=True):
            t0 = time.perf_counter()
            fn(text)
            times.append((time.perf_counter() - t0) * 1000)
    return out


def parse_kvscope(text: str) -> int:
    return len(parse_exposition(text).samples)


def parse_prometheus_client(text: str) -> int:
    return sum(len(f.samples) for f in text_string_to_metric_families(text))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=10_000, help="approximate samples in the exposition")
    ap.add_argument("--repeat", type=int, default=15, help="runs per parser (median reported)")
    args = ap.parse_args()
    text, n = build_exposition(args.series)
    assert parse_kvscope(text) == parse_prometheus_client(text) == n, "parsers disagree on the sample count"
    ours, base = time_ms((parse_kvscope, parse_prometheus_client), text, args.repeat)
    mo, mb = statistics.median(ours), statistics.median(base)
    print(f"input: {n} samples, {len(text) / 1e6:.2f} MB (vLLM 0.32 capture x ranks/models)")
    print(f"kvscope parse_exposition                 median {mo:8.1f} ms  (min {min(ours):.1f})")
    print(f"prometheus_client text_string_to_metric_families  median {mb:8.1f} ms  (min {min(base):.1f})")
    print(f"speedup (baseline / kvscope): {mb / mo:.2f}x median, {min(base) / min(ours):.2f}x best-of  (goal >= 3x)")


if __name__ == "__main__":
    main()
