"""What a full prefix index costs the tap's garbage collections (one stage, not the request path).

The tap's `PrefixIndex` keeps up to `prefix_max_blocks` (200,000 by default) block hashes of recent
prompts. A full collection (generation 2) walks every object the collector tracks, and it runs
while the event loop waits: a pause that lands on whichever request's first token is due. This
times `gc.collect()` in one process with the index empty (the baseline: the tap's other objects)
and then filled with distinct prompts to `--blocks`, and prints the ratio.

    .venv/bin/python bench/tap_gc.py --blocks 200000 --repeat 5
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvscope.agent.tap.proxy import RequestTap, TapConfig  # noqa: E402


def full_collection_ms(repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=200_000, help="prefix blocks to fill (the tap's default cap)")
    ap.add_argument("--repeat", type=int, default=5, help="collections timed per state (median printed)")
    args = ap.parse_args()
    tap = RequestTap(TapConfig(prefix_max_blocks=args.blocks))
    gc.collect()
    empty = full_collection_ms(args.repeat)
    replicas = [f"http://10.0.0.{i}:8000" for i in range(4)]
    prompt = 0
    while len(tap.prefixes) < args.blocks:  # distinct 16-block prompts, as many replicas as a small fleet
        tap.prefixes.observe(f"{prompt:08d}" * 128, replicas[prompt % len(replicas)])
        prompt += 1
    full = full_collection_ms(args.repeat)
    print(f"tracked objects: {len(gc.get_objects()):,}; prefix index: {len(tap.prefixes):,} blocks")
    ratio = f"{full / empty:.2f}x"
    print(f"gc.collect() median of {args.repeat}: empty index {empty:.2f} ms, full index {full:.2f} ms ({ratio})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
