"""Benchmark: diagnose a fleet of 1000 engines over 6 hours at 15 s resolution.

The input is what the Prometheus source hands the engine: a Frame of canonical series on the
query grid (range-query answers are already on start + k x step), generated in-process with
vLLM's real bucket layouts and label sets, so no HTTP or JSON cost is measured, only diagnosis.
The workload is not flat: a tenth of the engines go through a KV-pressure episode, so rules fire
and findings are built, not just skipped.

Goal: under 5 s for the whole rule set. Prints the time and the ratio to the goal, and a named
baseline measured in the same run: one series (TTFT p99 over 5 minutes, per engine, at every
grid point) computed with the scalar per-series functions of kvscope.agent.derive
(`window_quantile`, as the agent uses them) on a sample of engines and scaled to the fleet,
against the vectorised grid path for the same series.

    .venv/bin/python bench/diagnose_scale.py [--engines 1000] [--hours 6] [--step 15] [--repeat 3]
    .venv/bin/python bench/diagnose_scale.py --no-baseline --profile   # where the time goes
    .venv/bin/python bench/diagnose_scale.py --against 4a33186          # the engine before this work
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

# One BLAS thread: on a shared machine idle BLAS threads spin and inflate the CPU time without
# making anything faster.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from kvscope.core.signals import load_catalog, make_labels  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from testbed.fleetgen.capture_fleet import lognormal_cdf  # noqa: E402

try:
    from kvscope.diagnoser.evaluate.evaluator import diagnose
    from kvscope.diagnoser.evaluate.frame import Block, Frame, make_grid
    from kvscope.diagnoser.rulebook.rule import read_rules
except ImportError:  # a revision before the per-stage layout, run by bench/diagnose_golden.py --against
    from kvscope.diagnoser.engine import diagnose  # type: ignore[no-redef]
    from kvscope.diagnoser.frame import Block, Frame, make_grid  # type: ignore[no-redef]
    from kvscope.diagnoser.rule import read_rules  # type: ignore[no-redef]

GOAL_S = 5.0
WORKERS = 1  # set by --workers; 1 measures the algorithm's own cost
# vLLM 0.33 default buckets (reference/engine-metrics.md §1.4), +Inf appended.
TTFT_LE = list(load_catalog().buckets("request_ttft_seconds", "vllm"))
ITL_LE = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
LATENCY_LE = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
TOKENS_LE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]


def engine_labels(n: int) -> list[dict[str, str]]:
    return [
        {
            "instance": f"10.0.{i // 250}.{i % 250}:8000",
            "job": "vllm",
            "engine": "vllm",
            "model": f"model-{i % 4}",
            "dp_rank": "0",
        }
        for i in range(n)
    ]


def counter(rng: np.random.Generator, n: int, t: int, mean: float) -> np.ndarray:
    return np.cumsum(rng.poisson(mean, size=(n, t)).astype(float), axis=1)


def histogram(
    rng,
    name: str,
    labels: list[dict[str, str]],
    les: list[float],
    t: int,
    scale: float,
    stressed: np.ndarray,
    blocks: dict[str, Block],
    sigma: float = 0.5,
) -> None:
    """Cumulative bucket counters: observations ~ lognormal around `scale`, 3x slower when stressed."""
    n = len(labels)
    edges = np.array(les + [np.inf])
    per_step = rng.poisson(8, size=(n, t)).astype(float)
    shift = np.where(stressed, 3.0, 1.0)
    # share of observations at or below each bound, per engine and step (testbed.fleetgen)
    cdf = lognormal_cdf(edges[None, :, None], scale * shift[:, None, :], sigma)
    cdf[:, -1, :] = 1.0
    counts = np.cumsum(per_step[:, None, :] * cdf, axis=2)
    rows, vals = [], []
    for b, le in enumerate(les + ["+Inf"]):
        for i in range(n):
            rows.append(make_labels({**labels[i], "le": str(float(le)) if le != "+Inf" else "+Inf"}))
        vals.append(counts[:, b, :])
    blocks[name + "_bucket"] = Block(rows, np.vstack(vals))
    plain = [make_labels(d) for d in labels]
    blocks[name + "_count"] = Block(plain, counts[:, -1, :].copy())
    blocks[name + "_sum"] = Block(plain, counts[:, -1, :] * scale)


def build_frame(engines: int, hours: float, step: float, seed: int = 7) -> Frame:
    rng = np.random.default_rng(seed)
    ts = make_grid(1.8e9, 1.8e9 + hours * 3600, step)
    t = len(ts)
    labels = engine_labels(engines)
    plain = [make_labels(d) for d in labels]
    stressed = np.zeros((engines, t), dtype=bool)
    hot = rng.choice(engines, size=engines // 10, replace=False)
    start = rng.integers(t // 4, t // 2, size=len(hot))
    for e, s in zip(hot, start, strict=True):
        stressed[e, s : s + t // 6] = True
    blocks: dict[str, Block] = {}
    kv = np.clip(0.5 + 0.1 * rng.standard_normal((engines, t)), 0, 1)
    kv[stressed] = 0.97
    blocks["engine_kv_cache_usage_ratio"] = Block(plain, kv)
    waiting = rng.poisson(0.3, size=(engines, t)).astype(float) + np.where(stressed, 8.0, 0.0)
    blocks["engine_requests_waiting"] = Block(plain, waiting)
    blocks["engine_requests_running"] = Block(plain, rng.poisson(12, size=(engines, t)).astype(float))
    blocks["engine_preemptions_total"] = Block(plain, np.cumsum(np.where(stressed, 2.0, 0.0), axis=1))
    queries = counter(rng, engines, t, 4000)
    blocks["engine_prefix_cache_queries_tokens_total"] = Block(plain, queries)
    blocks["engine_prefix_cache_hits_tokens_total"] = Block(plain, np.floor(queries * 0.7))
    blocks["engine_prompt_tokens_total"] = Block(plain, queries)
    blocks["engine_generation_tokens_total"] = Block(plain, counter(rng, engines, t, 1500))
    fin = [make_labels({**d, "reason": "stop"}) for d in labels]
    blocks["engine_requests_finished_total"] = Block(fin, counter(rng, engines, t, 8))
    histogram(rng, "request_ttft_seconds", labels, TTFT_LE, t, 0.15, stressed, blocks)
    histogram(rng, "request_itl_seconds", labels, ITL_LE, t, 0.03, stressed, blocks, sigma=0.3)
    histogram(rng, "request_queue_seconds", labels, LATENCY_LE, t, 0.05, stressed, blocks)
    histogram(rng, "request_prompt_tokens", labels, TOKENS_LE, t, 800, np.zeros_like(stressed), blocks)
    histogram(rng, "request_generation_tokens", labels, TOKENS_LE, t, 200, np.zeros_like(stressed), blocks)
    histogram(rng, "request_prefill_computed_tokens", labels, TOKENS_LE, t, 250, np.zeros_like(stressed), blocks)
    gpu = [
        make_labels({"instance": d["instance"].replace(":8000", ":9400"), "gpu": "0", "job": "dcgm"}) for d in labels
    ]
    util = np.clip(0.7 + 0.1 * rng.standard_normal((engines, t)), 0, 1)
    blocks["gpu_utilization_ratio"] = Block(gpu, util)
    blocks["gpu_memory_used_bytes"] = Block(gpu, np.full((engines, t), 70e9))
    blocks["gpu_memory_free_bytes"] = Block(gpu, np.full((engines, t), 10e9))
    return Frame(ts=ts, blocks=blocks)


def run(frame: Frame, rules, cache: bool) -> tuple[float, float, float, int]:
    """(wall seconds, CPU seconds of this process, of which system (kernel: page faults), findings).
    CPU time is reported too because the benchmark machine may be shared: wall time then
    includes waiting for a core."""
    frame.cache = {} if cache else None
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0, c0 = time.perf_counter(), time.process_time()
    d = diagnose(frame, rules, time_scale=1.0, source="bench", workers=WORKERS)
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    frame.cache = None
    return took, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_stime - r0.ru_stime, len(d.findings)


def profile_run(frame: Frame, rules, top: int) -> None:
    """One more diagnose under cProfile with per-rule and per-node CPU times; prints the top ones.
    Node times include the nodes they refer to; signal-form nodes are computed once per frame, so
    the rule that asks first pays."""
    import cProfile
    import pstats

    frame.cache, frame.profile = {}, {}
    prof = cProfile.Profile()
    prof.enable()
    diagnose(frame, rules, time_scale=1.0, source="bench", workers=1)
    prof.disable()
    spent, frame.profile = frame.profile, None
    rule_t = sorted(((t, k[1]) for k, t in spent.items() if k[0] == "rule"), reverse=True)
    print(f"\nprofile (CPU s, under cProfile): rules total {sum(t for t, _ in rule_t):.2f} s; top {top} rules:")
    for t, rid in rule_t[:top]:
        print(f"  {t:7.3f}  {rid}")
    print(f"top {top} series nodes (rule / name / form / signal):")
    node_t = sorted(((t, k[1:]) for k, t in spent.items() if k[0] == "node"), reverse=True)
    for t, (rid, name, form, sig) in node_t[:top]:
        print(f"  {t:7.3f}  {rid} / {name} / {form} / {sig}")
    print(f"top {top} functions by own time:")
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def baseline_scalar(frame: Frame, sample: int) -> tuple[float, float, np.ndarray]:
    """(seconds per engine, vectorised seconds for all engines, scalar p99s of the sample engines):
    TTFT p99 over 5 m at every grid point, per engine."""
    from kvscope.diagnoser.evaluate.expr import SeriesEvaluator
    from kvscope.diagnoser.rulebook.rule import Rule, parse_yaml, rule_from_doc
    from testbed.promref import window_quantile

    block = frame.blocks["request_ttft_seconds_bucket"]
    by_engine: dict[str, dict[float, np.ndarray]] = {}
    for labels, row in zip(block.labels, block.values, strict=True):
        d = dict(labels)
        le = float("inf") if d["le"] == "+Inf" else float(d["le"])
        by_engine.setdefault(d["instance"], {})[le] = row
    engines = sorted(by_engine)[:sample]
    k = int(300 / frame.step)
    t0 = time.process_time()
    scalar = np.full((len(engines), len(frame.ts)), np.nan)
    for e, inst in enumerate(engines):
        for t in range(1, len(frame.ts)):
            j = max(0, t - k)
            window = {
                le: list(zip(frame.ts[j : t + 1], row[j : t + 1], strict=True)) for le, row in by_engine[inst].items()
            }
            q = window_quantile(0.99, window)
            scalar[e, t] = np.nan if q is None else q
    per_engine = (time.process_time() - t0) / len(engines)
    doc = parse_yaml(
        "id: b\nby: [instance]\nseries:\n  p99: {quantile: 0.99, histogram: request_ttft_seconds, range: 5m}\n"
    )
    rule: Rule = rule_from_doc(doc, "b.yaml")
    frame.cache = None
    t0 = time.process_time()
    grouped = SeriesEvaluator(rule, frame).get("p99")
    vector_s = time.process_time() - t0
    rows = [grouped.keys.index((inst,)) for inst in engines]
    np.testing.assert_allclose(grouped.values[rows], scalar, rtol=1e-6, equal_nan=True)
    return per_engine, vector_s, scalar


def time_revision(rev: str, args: argparse.Namespace) -> list[float]:
    """CPU seconds of each diagnose (--repeat of them) by `rev`'s engine on this workload (a child
    process builds the same frame: same seed). Prints the child's diagnose lines."""
    import re
    import subprocess
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from diagnose_golden import engine_at_revision

    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--no-baseline",
        "--engines",
        str(args.engines),
        "--hours",
        str(args.hours),
        "--step",
        str(args.step),
        "--workers",
        str(args.workers),
        "--repeat",
        str(args.repeat),
    ]
    with engine_at_revision(rev) as env:
        out = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True).stdout
    lines = [x for x in out.splitlines() if x.startswith("diagnose")]
    for line in lines:
        print(f"[{rev}] {line}")
    return [float(re.search(r"([0-9.]+) s CPU", line).group(1)) for line in lines]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=1000)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--step", type=float, default=15.0)
    ap.add_argument("--no-baseline", action="store_true", help="skip the scalar-analytics baseline")
    ap.add_argument("--workers", type=int, default=1, help="threads evaluating rules side by side (default 1)")
    ap.add_argument("--baseline-sample", type=int, default=3, help="engines timed with the scalar functions")
    ap.add_argument("--repeat", type=int, default=1, help="time diagnose this many times (fresh cache each)")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="after the timed run(s), profile one more: top rules, series nodes and functions",
    )
    ap.add_argument("--top", type=int, default=15, help="how many entries --profile prints per table")
    ap.add_argument(
        "--against",
        metavar="REV",
        help="also time the diagnoser of git revision REV (the whole revision, extracted and imported "
        "as kvscope by diagnose_golden.engine_at_revision) on the same workload, in a "
        "child process, and print the ratio",
    )
    args = ap.parse_args()
    global WORKERS
    WORKERS = args.workers
    t0 = time.perf_counter()
    frame = build_frame(args.engines, args.hours, args.step)
    points = sum(b.values.size for b in frame.blocks.values())
    series = sum(len(b.labels) for b in frame.blocks.values())
    print(
        f"frame: {args.engines} engines x {args.hours:g} h at {args.step:g} s = {len(frame.ts)} steps, "
        f"{series:,} series, {points / 1e6:.1f} M points (built in {time.perf_counter() - t0:.1f} s)"
    )
    rules = read_rules()
    cpus = []
    for _ in range(max(1, args.repeat)):
        took, cpu, sys_s, fired = run(frame, rules, cache=True)
        cpus.append(cpu)
        print(
            f"diagnose ({len(rules)} rules, {WORKERS} thread(s)): {took:.2f} s wall, {cpu:.2f} s CPU "
            f"({sys_s:.2f} s system), "
            f"{fired} findings; goal {GOAL_S:.0f} s -> {took / GOAL_S:.2f}x of the goal "
            f"({'met' if took < GOAL_S else 'NOT met'})"
        )
    if args.profile:
        profile_run(frame, rules, args.top)
    if args.against:
        old_cpus = time_revision(args.against, args)
        for i, (old_cpu, new_cpu) in enumerate(zip(old_cpus, cpus, strict=False), start=1):
            print(
                f"run {i}: engine at {args.against} {old_cpu:.2f} s CPU vs this engine {new_cpu:.2f} s CPU "
                f"-> {old_cpu / max(new_cpu, 1e-9):.1f}x faster"
            )
    if not args.no_baseline:
        per_engine, vector_s, _ = baseline_scalar(frame, args.baseline_sample)
        scalar_s = per_engine * args.engines
        print(
            f"baseline, one series (TTFT p99 5m per engine at every step): scalar agent.derive "
            f"{scalar_s:.1f} s CPU (measured on {args.baseline_sample} engines, x{args.engines}) vs grid path "
            f"{vector_s:.3f} s CPU -> {scalar_s / max(vector_s, 1e-9):.0f}x faster, same values"
        )


if __name__ == "__main__":
    main()
