"""Fuzz targets for engine log reading (issue 25 contract, /work/notes/FUZZ.md): bench/fuzz.py runs
`TARGETS`; `python bench/fuzz_logs.py [--inputs N] [--seed S]` runs them on its own until that runner
lands (same rules: any exception is a crash, an input over --max-ms is a hang).

  engine-log   agent.logs.series.read_log on the bytes (every line through agent.logs.lines.parse_line,
               then the series assembly). It documents no error: it returns a LogRead for any bytes.
Seeds: the excerpts in tests/fixtures/logs, whole and line by line (a few dozen).
"""

from __future__ import annotations

import argparse
import datetime
import io
import random
import sys
import time
from pathlib import Path

from kvscope.agent.logs.series import read_log

LOGS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "logs"
DAY = datetime.date(2026, 11, 24)
DICTIONARY = {"engine-log": [t.encode() for t in (
    "Avg prompt throughput: ", " tokens/s, ", "Avg generation throughput: ", "Running: ", " reqs, ", "Waiting: ",
    "Swapped: ", "Pending: ", "Preemptions: ", "GPU KV cache usage: ", "CPU KV cache usage: ", "%", "%.",
    "Prefix cache hit rate: ", "Prefix cache hit rate: GPU: ", "Engine 000: ", "INFO 11-24 08:00:00 ",
    "(APIServer pid=1) ", "[loggers.py:1] ", "[2025-01-01 00:00:00 DP0 TP0] ", "[23:59:59 TP1] ", "Prefill batch. ",
    "Decode batch, ", "Prefill batch(mixed #running-req: 3). ", " [12], ", "#running-req: ", "#queue-req: ",
    "#new-token: ", "#cached-token: ", "token usage: ", "swa token usage: ", "gen throughput (token/s): ",
    "#retracted_reqs: ", "KV cache pool is full. Retract requests. ", "Decode out of memory happened. ",
    "total_num_cumulative_preemption=", "2026-06-01T12:00:00.123456789Z ", "2026-06-01T12:00:00+02:00 ",
    "[pod/vllm-0/vllm] ", "-1", "1e308", "99999999999999999999", "\u0661", "\n", "\r\n", "\x00", ", ", ": ",
    "Engine " + "9" * 5000 + ": ", " DP" + "9" * 5000)]}


def parse_engine_log(data: bytes) -> object:
    return read_log(io.BytesIO(data), "fuzz", day=DAY)


def engine_log_seeds() -> list[bytes]:
    files = sorted(LOGS.glob("*.log"))
    seeds = [p.read_bytes() for p in files]
    lines = [line for p in files for line in p.read_bytes().splitlines(keepends=True)]
    return seeds + lines[:: max(1, len(lines) // 24)]


TARGETS = {"engine-log": (parse_engine_log, engine_log_seeds)}


def mutate(rng: random.Random, data: bytes, seeds: list[bytes], tokens: list[bytes]) -> bytes:
    """One to four byte-level mutations: flip, insert a token, delete, splice another seed, repeat."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(buf) + 1)
        op = rng.randrange(5)
        if op == 0 and buf:
            buf[min(i, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[i:i] = rng.choice(tokens)
        elif op == 2:
            del buf[i:i + rng.randint(1, 32)]
        elif op == 3:
            other = rng.choice(seeds)
            j = rng.randrange(len(other) + 1)
            buf[i:] = other[j:]
        else:
            j = rng.randrange(len(buf) + 1)
            buf[i:i] = bytes(buf[j:j + rng.randint(1, 64)]) * rng.randint(2, 2000)
    return bytes(buf[: 1 << 22])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-ms", type=float, default=2000.0, help="an input slower than this is a hang")
    args = ap.parse_args(argv)
    failed = 0
    for name, (parse, seeds_fn) in TARGETS.items():
        rng, seeds = random.Random(args.seed), seeds_fn()
        crashes = hangs = 0
        worst = (0.0, 0)
        t0 = time.perf_counter()
        for n in range(args.inputs):
            data = mutate(rng, rng.choice(seeds), seeds, DICTIONARY[name])
            t = time.perf_counter()
            try:
                parse(data)
            except Exception as exc:  # noqa: BLE001 - any escape is a crash
                crashes += 1
                out = Path("artifacts/fuzz") / name / f"crash-{n}.bin"
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(data)
                print(f"{name}: crash {type(exc).__name__}: {exc} -> {out}", file=sys.stderr)
            ms = (time.perf_counter() - t) * 1000
            hangs += ms > args.max_ms
            worst = max(worst, (ms, len(data)))
        rate = args.inputs / (time.perf_counter() - t0)
        print(f"{name}: {args.inputs} inputs, {crashes} crashes, {hangs} hangs (> {args.max_ms:.0f} ms), "
              f"{rate:.0f} inputs/s, slowest {worst[0]:.1f} ms on {worst[1]} bytes")
        failed += crashes + hangs
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
