"""Fuzz bench (issue 25): mutate real inputs and run every parser on them
with a time and a memory bound per input.

    .venv/bin/python bench/fuzz.py [--inputs N] [--target NAME ...] [--seed S]

Targets come from every `bench/fuzz_<area>.py`: `TARGETS = {name: (parse_fn, seeds_fn[, tokens])}`.
`parse_fn(data: bytes)` runs the product parser and catches only that parser's documented
error type; any exception that escapes is a crash. `seeds_fn()` returns real inputs (a few
dozen at most); `tokens` are format tokens the mutator inserts.

Each target runs in a worker process (one core) under RLIMIT_AS = its size after start-up +
`--memory-mib`: a MemoryError is an input over the memory bound. The worker makes input `i`
from (seed, i) alone and publishes `i` and its start time in shared memory; the parent kills a
worker stuck past `--time-s` on one input, records that input as a hang (made again from its
index) and starts a new worker at `i + 1`. An input that finishes past the bound in CPU time (a
machine busy with other work stalls wall time, not this) is a hang too.
Failing inputs are saved under artifacts/fuzz/<target>/; the exit status is 1 on any failure.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import multiprocessing as mp
import random
import resource
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts" / "fuzz"
MAX_INPUT = 32 << 10
_GENERIC = [
    b"\n",
    b" ",
    b"\t",
    b"\x00",
    b"\xff",
    b"\\",
    b'"',
    b"{",
    b"}",
    b",",
    b"=",
    b"#",
    b"-1",
    b"0",
    b"1e308",
    b"NaN",
    b"+Inf",
    b"\xc3\xa9",
    b"\xf0\x9f\x98\x80",
]


def load_targets() -> dict[str, tuple]:
    """name -> (parse_fn, seeds_fn, tokens) from every bench/fuzz_<area>.py."""
    out: dict[str, tuple] = {}
    for path in sorted(Path(__file__).parent.glob("fuzz_*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name, entry in module.TARGETS.items():
            out[name] = (entry[0], entry[1], list(entry[2]) if len(entry) > 2 else [])
    return out


def mutate(rng: random.Random, seeds: list[bytes], tokens: list[bytes]) -> bytes:
    """One input: a seed (or two spliced) with 1-8 byte-level or token-level edits."""
    data = bytearray(rng.choice(seeds))
    if rng.random() < 0.1:
        other = rng.choice(seeds)
        data = data[: rng.randint(0, len(data))] + other[rng.randint(0, len(other)) :]
    words = tokens + _GENERIC
    for _ in range(rng.randint(1, 8)):
        op, at = rng.random(), rng.randint(0, len(data))
        if op < 0.3 and data:  # flip bits / set a byte
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif op < 0.5:  # insert a token
            data[at:at] = rng.choice(words)
        elif op < 0.7 and data:  # delete a span
            del data[at : at + rng.randint(1, 64)]
        elif op < 0.85 and data:  # repeat a span (pathological lengths)
            span = bytes(data[at : at + rng.randint(1, 32)]) or b"a"
            data[at:at] = span * min(2 ** rng.randint(1, 10), MAX_INPUT // len(span))  # log-uniform
        else:  # copy a span elsewhere
            src = rng.randint(0, len(data))
            data[at:at] = data[src : src + rng.randint(1, 256)]
    return bytes(data[:MAX_INPUT])


def make_input(seed: int, i: int, seeds: list[bytes], tokens: list[bytes]) -> bytes:
    return mutate(random.Random(seed * 1_000_003 + i), seeds, tokens)


def save(target: str, kind: str, data: bytes, note: str = "") -> Path:
    d = ARTIFACTS / target
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{kind}-{hashlib.sha1(data).hexdigest()[:12]}.bin"
    path.write_bytes(data)
    if note:
        path.with_suffix(".txt").write_text(note)
    return path


KINDS = ("inputs", "crashes", "hangs", "memory")


def worker(
    name: str, start: int, stop: int, seed: int, time_s: float, memory_mib: int, current, started, stats
) -> None:
    """Run inputs start..stop-1 of one target; counts go to the shared `stats` (KINDS order) and
    failing inputs straight to disk, so a kill loses nothing."""
    parse, seeds_fn, tokens = load_targets()[name]
    seeds = [s[:MAX_INPUT] for s in seeds_fn()]
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        vm = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (vm + (memory_mib << 20), hard))
    for i in range(start, stop):
        data = make_input(seed, i, seeds, tokens)
        current.value, started.value = i, time.monotonic()
        cpu = time.process_time()
        try:
            parse(data)
        except MemoryError:
            stats[3] += 1
            save(name, "memory", data)
        except Exception:  # noqa: BLE001 - anything the parser lets escape is the finding
            stats[1] += 1
            save(name, "crash", data, traceback.format_exc(limit=6))
        if (took := time.process_time() - cpu) > time_s:  # CPU time: a busy machine is no hang
            stats[2] += 1
            save(name, "hang", data, f"took {took:.2f}s of CPU")
        stats[0] += 1
    started.value = 0.0


def run_target(name: str, n: int, seed: int, time_s: float, memory_mib: int) -> dict[str, int]:
    """Fuzz one target with `n` inputs; prints progress; returns totals."""
    _, seeds_fn, tokens = load_targets()[name]
    seeds = [s[:MAX_INPUT] for s in seeds_fn()]
    ctx = mp.get_context("fork")
    done = dict.fromkeys(KINDS, 0)  # workers that ended
    t0, shown, start = time.monotonic(), 0.0, 0
    while start < n:
        current, started = ctx.Value("q", start, lock=False), ctx.Value("d", 0.0, lock=False)
        stats = ctx.Array("q", len(KINDS), lock=False)
        proc = ctx.Process(target=worker, args=(name, start, n, seed, time_s, memory_mib, current, started, stats))
        proc.start()
        while proc.is_alive():
            began = started.value
            if began and time.monotonic() - began > time_s * 2 + 1:  # stuck: kill, record, go on
                proc.kill()
                break
            if time.monotonic() - shown > 5:
                shown = time.monotonic()
                print(f"  {name}: {_line({k: done[k] + stats[j] for j, k in enumerate(KINDS)}, t0)}", flush=True)
            time.sleep(0.05)
        proc.join()
        for j, k in enumerate(KINDS):
            done[k] += stats[j]
        start = n
        if proc.exitcode != 0:  # killed on a stuck input, or died on one (a signal, an error outside the call)
            kind = "hang" if proc.exitcode == -9 else "crash"
            done["hangs" if kind == "hang" else "crashes"] += 1
            done["inputs"] += 1
            save(
                name,
                kind,
                make_input(seed, current.value, seeds, tokens),
                f"killed after {time_s * 2 + 1:.1f}s" if kind == "hang" else f"worker exit code {proc.exitcode}",
            )
            start = current.value + 1
    print(f"{name}: {_line(done, t0)}", flush=True)
    return done


def _line(t: dict[str, int], t0: float) -> str:
    rate = t["inputs"] / max(time.monotonic() - t0, 1e-9)
    return (
        f"inputs {t['inputs']:,}  crashes {t['crashes']}  hangs {t['hangs']}  "
        f"over-memory {t['memory']}  {rate:,.0f} inputs/s"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=100_000, help="inputs per target (default 100000)")
    ap.add_argument("--target", action="append", help="target name (repeat; default: all)")
    ap.add_argument("--seed", type=int, default=1, help="run seed: input i of a run is made from (seed, i)")
    ap.add_argument("--time-s", type=float, default=1.0, help="time bound per input (default 1 s)")
    ap.add_argument("--memory-mib", type=int, default=512, help="memory bound per input (default 512 MiB)")
    args = ap.parse_args(argv)
    targets = load_targets()
    names = args.target or sorted(targets)
    unknown = sorted(set(names) - set(targets))
    if unknown:
        ap.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(sorted(targets))}")
    failed = False
    for name in names:
        t = run_target(name, args.inputs, args.seed, args.time_s, args.memory_mib)
        failed |= bool(t["crashes"] or t["hangs"] or t["memory"])
    if failed:
        print(f"failing inputs saved under {ARTIFACTS}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
