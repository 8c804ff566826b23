"""CPU per agent cycle of the live cascade hook (agent/derive/cascade.py `CascadeWindow`), and its
share of the agent's in-process cycle.

--engines vLLM targets (default 100) each serve the real vLLM 0.32 CPU capture
(tests/fixtures/scrapes/vllm-0.32.0-cpu-after-load.txt, 713 lines) at a --interval (default 15 s)
of data time; every cycle moves --move (default 0.3) of its sample values, and the cascade's
signals (KV usage, waiting, running, preemptions, TTFT sum/count) follow a KV-pressure run on
every third engine from cycle 30 on (the others stay healthy), so the detector's every stage is
computed. The first window_s / interval cycles (60: 15 min) fill the hook's window; the next
--cycles are measured. Per cycle, CPU time (time.process_time, this one thread) of

* agent: what the agent does in process each cycle but the HTTP scrape: parse + normalize with
  each target's memo (as the engine collector does), the counter-reset check, the GPU-join and
  fairness hooks, and the change-point SQLite store's write + flush (background=False);
* cascade: the cascade hook over the same cycle.

Printed: the medians, the hook's share of agent + hook, and the points its window holds.

    .venv/bin/python bench/cascade_hook.py
    .venv/bin/python bench/cascade_hook.py --engines 20 --interval 1 --cycles 5
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from kvscope.agent.config import build_config
from kvscope.agent.derive.cascade import CascadeWindow
from kvscope.agent.derive.hooks import derive_hooks
from kvscope.agent.normalize.dialect import MappingMemo, normalize
from kvscope.agent.runtime import CounterResets
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.agent.store.sqlite import SqliteStore
from kvscope.core.signals import load_catalog

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests/fixtures/scrapes/vllm-0.32.0-cpu-after-load.txt"
CASCADE_LINES = {
    "vllm:kv_cache_usage_perc": "kv",
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_running": "running",
    "vllm:num_preemptions_total": "preempted",
    "vllm:time_to_first_token_seconds_sum": "ttft_sum",
    "vllm:time_to_first_token_seconds_count": "ttft_count",
}
_VALUE = re.compile(r"^([^#][^ ]*(?:\{[^}]*\})?) (\S+)$")


def signals(engine: int, cycle: int, rng: random.Random) -> dict[str, float]:
    """The cascade's signals of one engine at one cycle (cumulative counters)."""
    pressure = engine % 3 == 0 and cycle >= 30
    k = max(0, cycle - 30) if pressure else 0
    return {
        "kv": min(1.0, 0.93 + 0.01 * k) if pressure else 0.2 + 0.3 * rng.random(),
        "waiting": float(min(40, 2 * k)) if pressure else float(rng.random() < 0.1),
        "running": 16.0 if pressure else float(rng.randint(2, 12)),
        "preempted": float(3 * k * (k + 1) // 2),
        "ttft_count": 10.0 * cycle,
        "ttft_sum": 10.0 * sum(0.05 * (1 + 0.5 * max(0, c - 30) * pressure) for c in range(cycle)),
    }


def body(lines: list[str], values: dict[str, float], move: float, rng: random.Random) -> str:
    out = []
    for line in lines:
        m = _VALUE.match(line)
        if m:
            key = CASCADE_LINES.get(m.group(1).split("{")[0])
            if key is not None:
                line = f"{m.group(1)} {values[key]!r}"
            elif rng.random() < move:
                line = f"{m.group(1)} {float(m.group(2)) + rng.randint(1, 50)!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=100)
    ap.add_argument("--interval", type=float, default=15.0, help="seconds of data time per cycle")
    ap.add_argument("--window", type=float, default=900.0, help="the hook's window, seconds")
    ap.add_argument("--cycles", type=int, default=10, help="measured cycles, after the window filled")
    ap.add_argument("--move", type=float, default=0.3, help="share of other sample values moved per cycle")
    args = ap.parse_args()
    rng = random.Random(7)
    lines = FIXTURE.read_text().splitlines()
    catalog = load_catalog()
    memos = [MappingMemo() for _ in range(args.engines)]
    others = derive_hooks(build_config({"targets": []}, environ={}, flags=[]))
    others = [h for h in others if not isinstance(h, CascadeWindow)]
    hook, resets, counts = CascadeWindow(args.window), CounterResets(), Counter[str]()
    warm = int(args.window / args.interval)
    agent_ms, hook_ms, out_n = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "bench.db", retention_s=1e12, background=False)
        for cycle in range(warm + args.cycles):
            ts = 1.7e9 + cycle * args.interval
            texts = [body(lines, signals(e, cycle, rng), args.move, rng) for e in range(args.engines)]
            t0 = time.process_time()
            parts: list = []
            for e, (memo, text) in enumerate(zip(memos, texts, strict=True)):
                expo = parse_exposition(text)
                labels = {"job": "vllm", "instance": f"10.0.0.{e}:8000"}
                parts.extend(normalize(expo, "vllm", labels, ts, catalog, memo).samples)
            resets.observe(parts, counts)
            for h in others:
                parts.extend(list(h(parts)))
            t1 = time.process_time()
            out = hook(parts)
            t2 = time.process_time()
            parts.extend(out)
            store.write(parts)
            store.flush()
            t3 = time.process_time()
            if cycle >= warm:
                agent_ms.append((t1 - t0 + t3 - t2) * 1e3)
                hook_ms.append((t2 - t1) * 1e3)
                out_n = len(out)
        store.close()
    a, c = statistics.median(agent_ms), statistics.median(hook_ms)
    points = sum(len(p) for ser in hook.series.values() for p in ser.values())
    print(
        f"{args.engines} engines, {args.interval:g} s interval, {args.window:g} s window ({warm} cycles), "
        f"{len(parts)} samples per cycle, {out_n} cascade samples out"
    )
    print(f"agent in-process cycle (parse, normalize, resets, gpu join, fairness, store): {a:.1f} ms CPU (median)")
    print(f"cascade hook: {c:.1f} ms CPU (median, min {min(hook_ms):.1f}, max {max(hook_ms):.1f})")
    print(f"hook share of the cycle: {100 * c / (a + c):.1f} %; {100 * c / 1e3 / args.interval:.3f} % of a core")
    print(f"window: {len(hook.series)} instances, {points}+ points, dropped {dict(hook.dropped)}")


if __name__ == "__main__":
    main()
