"""Benchmark: the weekly report over 7 days x 100 GPUs at 15 s resolution, against a 10 s goal.

The fleet: 25 engines at TP=4 (100 GPUs) on 13 nodes, 4 pools (2 models x prefill/decode),
20 tenants. Per 15 s point: GPU utilisation per GPU, four token counters per engine and three
counters per tenant, about 10.5 M points. Timed: the report's columns built from the Frame (what
`read_window` hands it from any source), every computation, Markdown and HTML with plots.

    .venv/bin/python bench/report_weekly.py
"""

from __future__ import annotations

import os
import time

import numpy as np

from kvscope.core.signals import make_labels
from kvscope.diagnoser.evaluate.frame import Block, Frame
from kvscope.report.render import render_html, render_markdown
from kvscope.report.weekly import WEEK_S, build_report, columns

GOAL_S = 10.0
STEP_S = 15.0
GPUS, TP, TENANTS = 100, 4, 20
COUNTERS = (
    "engine_generation_tokens_total",
    "engine_prompt_tokens_total",
    "engine_prefix_cache_hits_tokens_total",
    "engine_prefix_cache_queries_tokens_total",
)


def make_fleet(end: float, rng: np.random.Generator) -> Frame:
    """One week of the fleet on a 15 s grid."""
    ts = np.arange(end - WEEK_S + STEP_S, end + 1, STEP_S)
    series, values = [], []
    diurnal = 0.5 + 0.4 * np.sin(2 * np.pi * (ts % 86400) / 86400)

    def add(labels: dict, vals: np.ndarray) -> None:
        series.append(labels)
        values.append(vals)

    for e in range(GPUS // TP):
        node = f"node-{e * TP // 8}"
        pool = {"model": f"model-{e % 2}", "role": ("prefill", "decode")[e // 2 % 2]}
        labels = {"instance": f"10.0.{e}.1:8000", "node": node, **pool}
        rate = 800 * diurnal * rng.uniform(0.5, 1.5)
        for i, name in enumerate(COUNTERS):
            add({"name": name, **labels}, np.cumsum(rate * STEP_S * (4 if i else 1)))
        for g in range(TP):
            gpu = {"node": node, "gpu": str((e * TP + g) % 8), "gpu_uuid": f"GPU-{e}-{g}"}
            add({"name": "gpu_utilization_ratio", **gpu}, np.clip(diurnal + rng.normal(0, 0.05, ts.size), 0, 1))
    for t in range(TENANTS):
        share = rng.uniform(0.2, 2.0)
        for name, per in (
            ("tenant_requests_total", 1),
            ("tenant_prompt_tokens_total", 900),
            ("tenant_cached_tokens_total", 900 * rng.uniform(0, 0.8)),
        ):
            add({"name": name, "tenant": f"tenant-{t:02d}"}, np.cumsum(share * per * diurnal))
    frame = Frame(ts=ts)
    for name in sorted({s["name"] for s in series}):
        rows = [
            (make_labels({k: v for k, v in s.items() if k != "name"}), v)
            for s, v in zip(series, values, strict=True)
            if s["name"] == name
        ]
        frame.blocks[name] = Block([r[0] for r in rows], np.vstack([r[1] for r in rows]))
    return frame


def main() -> None:
    end = 1_800_000_000.0
    frame = make_fleet(end, np.random.default_rng(7))
    n = sum(len(b.labels) for b in frame.blocks.values())
    print(f"fleet: {GPUS} GPUs, {n} series, {n * frame.ts.size / 1e6:.1f} M points over 7 days at {STEP_S:g} s")
    c0, t0 = time.process_time(), time.perf_counter()
    columns(frame)
    t1 = time.perf_counter()
    report = build_report(frame, end, gpu_hour_cost=2.5, source="bench")
    t2 = time.perf_counter()
    md, page = render_markdown(report), render_html(report)
    t3, c3 = time.perf_counter(), time.process_time()
    total = t3 - t0
    print(f"columns of frame {t1 - t0:6.2f} s")
    print(f"compute          {t2 - t1:6.2f} s")
    print(f"render md + html {t3 - t2:6.2f} s  ({len(md):,} + {len(page):,} bytes)")
    print(
        f"total            {total:6.2f} s   goal {GOAL_S:.0f} s   ratio to goal {total / GOAL_S:.2f} "
        f"({'within' if total <= GOAL_S else 'OVER'} goal)"
    )
    print(
        f"cpu time         {c3 - c0:6.2f} s   (this process; wall time also counts other load: "
        f"{os.getloadavg()[0]:.1f} load average now)"
    )
    fleet = report.this.fleet
    print(
        f"check: GPU-hours {fleet['gpu_hours']:,.0f} (expected ~{GPUS * 168:,}), "
        f"tokens/GPU-h {fleet['tokens_per_gpu_hour']:,.0f}, util {fleet['gpu_util']:.2f}"
    )


if __name__ == "__main__":
    main()
