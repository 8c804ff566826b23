"""Healthy controls of the blind set: fleets that look alarming at a glance but need no action.
The diagnoser must stay quiet (nothing above `info`)."""

from __future__ import annotations

import random
from pathlib import Path

from testbed.fleetgen.blind import Tick, _phases, _wiggle, advance_sglang, advance_vllm, new_sglang, new_vllm
from testbed.fleetgen.families import render_sglang, render_vllm
from testbed.fleetgen.sim import Clock, Sink, _poisson


def scenario_healthy_busy_near_knee(path: Path, cal: dict, seed: int = 21) -> dict:
    """6 busy vLLM replicas with chunked prefill, KV 80-88 %, a mixed prompt workload, the odd
    request waiting: high utilisation, stable latency."""
    rng, clock = random.Random(seed), Clock(30.0, 60)
    reps = [new_vllm() for _ in range(6)]
    sink = Sink(path)
    for i, ts in clock.times():
        for r, s in enumerate(reps):
            rps = 7.0 * _wiggle(rng, i + 5 * r, 45, 0.06)
            step = 0.028 + 0.001 * (rps - 7.0)
            running = rps * (0.2 + 280 * step)
            # chunked prefill: a long prompt is split over several steps, each a little slower (~40 ms)
            advance_vllm(
                s,
                rng,
                Tick(
                    n=_poisson(rng, rps * clock.dt),
                    hit=0.55,
                    out_mean=280,
                    itl=step,
                    classes=((0.8, 800.0, 0.12), (0.2, 6000.0, 0.6)),
                    itl_stalled=(0.12, step * 1.6),
                    waiting=_poisson(rng, 0.7),
                    running=running,
                    queue_s=0.02,
                    prompt_sigma=0.35,
                    kv=0.8 + 0.06 * (rps / 7.0 - 1) * 5 + rng.uniform(-0.02, 0.02),
                ),
            )
            sink.scrape("vllm", f"replica-{r}", ts, render_vllm(s))
    sink.close()
    return {
        "summary": "6 vLLM 0.33 replicas (Llama-3.1-8B, H100, chunked prefill on) near their planned peak: "
        "~7 req/s each with a chat + RAG prompt mix (p95 prompt ~8x p50), ~60 running, KV usage "
        "0.78-0.88, a request occasionally waiting, TTFT p50 ~0.15 s, ITL p50 ~28 ms with chunk "
        "steps at ~45 ms. Busy and steady: no preemption, no growing queue, no widening tail.",
        "phases": _phases(("busy", 0.0, clock.steps * clock.dt)),
        "expected": "no warning",
        "must_not": ["K1", "K2", "K3", "L1", "L3", "L4", "L12", "U2"],
    }


def scenario_healthy_autoscaled_ramp(path: Path, cal: dict, seed: int = 22) -> dict:
    """Morning ramp on SGLang: traffic doubles, the autoscaler (on queue depth) adds a replica
    each time the per-replica queue builds; the gateway routes by consistent hashing and ramps a
    new replica's share over two minutes."""
    rng, clock = random.Random(seed), Clock(30.0, 80)
    reps = [new_sglang() for _ in range(6)]
    joined: list[int | None] = [-20, -20, -20, None, None, None]  # steps
    queues = [0.0] * 6
    mu, prompt, out, itl = 3.0, 1500.0, 400.0, 0.035
    sink = Sink(path)
    for i, ts in clock.times():
        total = 5.4 + 5.4 * min(1.0, max(0.0, (i - 10) / 50))  # 5.4 -> 10.8 req/s over 25 min
        live = [r for r, j in enumerate(joined) if j is not None]
        per = total / sum(min(1.0, (i - joined[r] + 1) / 4) for r in live)
        avg_q = sum(queues[r] for r in live) / len(live)
        if avg_q >= 1.5 and len(live) < 6 and all(i - joined[r] >= 4 for r in live):
            joined[len(live)] = i  # scale up on queue depth
        for r in live:
            s = reps[r]
            share = min(1.0, (i - joined[r] + 1) / 4)  # slow start over 2 minutes
            warm = min(1.0, (i - joined[r] + 1) / 6)  # cache refill over ~3 minutes
            arrivals = _poisson(rng, per * share * clock.dt)
            served = min(_poisson(rng, mu * clock.dt), queues[r] + arrivals)
            wait = queues[r] / mu
            queues[r] = max(0.0, queues[r] + arrivals - served)
            n, hit = int(served), 0.5 * (0.3 + 0.7 * warm)
            s.running = round(min(64.0, per * share * (0.35 + out * itl)))
            s.queue = round(queues[r])
            s.token_usage = min(0.95, s.running * (prompt + out / 2) / s.max_total_num_tokens)
            advance_sglang(
                s, rng, n, prompt, out, hit=hit, wait=wait, ttft=0.35 + prompt * (1 - hit) / 20_000 + wait, itl=itl
            )
            sink.scrape("sglang", f"sglang-{r}", ts, render_sglang(s))
    sink.close()
    scale_ups = [round(j * clock.dt) for j in joined[3:] if j is not None]
    return {
        "summary": "SGLang 0.5.23 (Qwen3-32B), 3 replicas at 5.4 req/s; the morning ramp doubles traffic "
        "over 25 minutes. A KEDA autoscaler on sglang:num_queue_reqs adds a replica whenever "
        "the mean queue reaches 1.5 (2 min cooldown); the gateway's consistent hashing moves "
        "only the new replica's share of prefixes, ramped in over 2 minutes, and the new "
        "replica's cache refills in ~3. Queues drain after each step.",
        "phases": _phases(("before", 0.0, 300.0), ("ramp", 300.0, clock.steps * clock.dt)),
        "scale_up_at_s": scale_ups,
        "expected": "no warning",
        "must_not": ["L12", "U8", "U7", "P3", "P4", "L1", "L2", "K1"],
    }
