"""The blind incident set: fleet scenarios written from the source documents' descriptions of
an incident (shared/seeds, LEVERS.md rows no other recording exercises), with their expected
diagnosis written down before the diagnoser was run on them (tests/recordings/README.md).

Production-like: 15-30 s scrape intervals, 25-60 min, several replicas, Poisson arrivals and
lognormal latencies/lengths. Each scenario's dynamics are a small queueing model of the
mechanism the seed names (decode step time growing with the batch, long prefills stalling the
decode batch, arrivals above the service rate, KV demand above the pool), not a copy of a rule's
threshold. `expected` names the LEVERS.md rows that must come out first (`likely: true`) or may
come out as supporting evidence; `must_not` names rows that would be a wrong diagnosis.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

from testbed.fleetgen.families import (
    SGL_QUEUE,
    SGL_TOKENS,
    Histogram,
    SglangState,
    VllmState,
    render_sglang,
    render_vllm,
    vllm_request_token_bounds,
)
from testbed.fleetgen.sim import Clock, Sink, _observe_lognormal, _poisson

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
H100_BLOCKS = 29_000
"""vLLM blocks of 16 tokens for an 8B model on one H100 at gpu_memory_utilization 0.9 (~58 GiB of
KV at 128 KiB/token, 002 §2's bytes-per-token formula)."""


@dataclass
class Tick:
    """What one vLLM replica did during one scrape interval."""

    n: int  # requests finished
    classes: tuple[tuple[float, float, float], ...]  # (share, mean prompt tokens, mean TTFT s)
    out_mean: float  # mean output tokens
    hit: float  # prefix-cache hit ratio of prompt tokens
    itl: float  # decode step time (median ITL), s
    waiting: float
    running: float
    kv: float
    itl_stalled: tuple[float, float] = (0.0, 0.0)  # (share of tokens, their ITL) e.g. behind a long prefill
    preemptions: float = 0.0
    queue_s: float = 0.002  # mean time in WAITING
    prompt_sigma: float = 0.5
    out_sigma: float = 0.6


def new_vllm(blocks: int = H100_BLOCKS, max_model_len: int = 32_768, **kw) -> VllmState:
    """A vLLM 0.33 replica that also exports the per-request length histograms."""
    bounds = vllm_request_token_bounds(max_model_len)
    return VllmState(
        model=kw.pop("model", LLAMA_8B),
        num_gpu_blocks=blocks,
        prompt_len=Histogram(bounds),
        gen_len=Histogram(bounds),
        **kw,
    )


def advance_vllm(s: VllmState, rng: random.Random, t: Tick) -> None:
    """Add one interval's requests, tokens and latencies to a replica's cumulative series."""
    prompt_total = 0.0
    for share, prompt, ttft in t.classes:
        k = round(t.n * share)
        prompt_total += k * prompt
        _observe_lognormal(rng, s.prompt_len, prompt, k, t.prompt_sigma)
        _observe_lognormal(rng, s.ttft, ttft, k, 0.45)
    s.queries += prompt_total
    s.hits += round(prompt_total * t.hit)
    s.prompt_tokens += prompt_total
    s.generation_tokens += t.n * t.out_mean
    s.success += t.n
    s.preemptions += t.preemptions
    s.waiting, s.running, s.kv_usage = round(t.waiting), round(t.running), min(1.0, t.kv)
    _observe_lognormal(rng, s.gen_len, t.out_mean, t.n, t.out_sigma)
    tokens = min(t.n * 8, 600)  # ITL observations (subsampled, same shape)
    stalled = round(tokens * t.itl_stalled[0])
    _observe_lognormal(rng, s.itl, t.itl, tokens - stalled, 0.2)
    if stalled:
        _observe_lognormal(rng, s.itl, t.itl_stalled[1], stalled, 0.3)
    mean_ttft = sum(sh * tt for sh, _, tt in t.classes)
    _observe_lognormal(rng, s.e2e, mean_ttft + t.out_mean * t.itl, t.n, 0.4)
    _observe_lognormal(rng, s.queue, t.queue_s, t.n, 0.8)


def new_sglang() -> SglangState:
    """An SGLang 0.5.23 replica (Qwen3-32B) that also exports its length and queue-time histograms."""
    return SglangState(
        model="Qwen/Qwen3-32B",
        max_total_num_tokens=120_000,
        prompt_len=Histogram(SGL_TOKENS),
        gen_len=Histogram(SGL_TOKENS),
        queue_time=Histogram(SGL_QUEUE),
        aborted=0.0,
    )


def advance_sglang(
    s: SglangState,
    rng: random.Random,
    n: int,
    prompt: float,
    out: float,
    hit: float,
    wait: float,
    ttft: float,
    itl: float,
    aborted: int = 0,
    hit_sd: float = 0.03,
    prompt_sd: float = 0.5,
) -> None:
    """Add one interval's `n` requests, tokens, aborts and latencies to an SGLang replica's
    cumulative series (its `running`, `queue` and `token_usage` gauges are the caller's)."""
    s.eff_input += n * prompt
    s.eff_device_hit += round(n * prompt * hit)
    s.prompt_tokens += n * prompt
    s.cached_device += round(n * prompt * hit)
    s.generation_tokens += n * out
    s.num_requests += n
    s.aborted += aborted
    s.cache_hit_rate = round(min(0.99, rng.gauss(hit, hit_sd)), 3)
    _observe_lognormal(rng, s.prompt_len, prompt, n, prompt_sd)
    _observe_lognormal(rng, s.gen_len, out, n, 0.6)
    _observe_lognormal(rng, s.queue_time, max(0.002, wait), n, 0.5)
    _observe_lognormal(rng, s.ttft, ttft, n, 0.4)
    _observe_lognormal(rng, s.itl, itl, n * 40, 0.15)


def _wiggle(rng: random.Random, i: int, period: int, amp: float) -> float:
    """Slow traffic wave plus noise: 1 + amp x sin + ~3 % jitter."""
    return (1 + amp * math.sin(2 * math.pi * i / period)) * rng.gauss(1.0, 0.03)


def _phases(*pairs: tuple[str, float, float]) -> list[dict]:
    return [{"name": n, "start_s": a, "end_s": b} for n, a, b in pairs]


# ---------------------------------------------------------------------------------------- L3
def scenario_mixed_prompts_itl_tail(path: Path, cal: dict, seed: int = 11) -> dict:
    """Chat and RAG share 4 replicas without chunked prefill: every long prefill stalls the batch."""
    rng, clock = random.Random(seed), Clock(30.0, 50)
    reps = [new_vllm() for _ in range(4)]
    sink = Sink(path)
    prefill_tok_s, long_prompt, short_prompt, long_share = 30_000.0, 9000.0, 700.0, 0.2
    for i, ts in clock.times():
        for r, s in enumerate(reps):
            rps = 5.0 * _wiggle(rng, i + 7 * r, 40, 0.08)
            long_per_s = rps * long_share
            stall = long_prompt / prefill_tok_s  # a whole long prefill in one step
            step = 0.024
            steps_per_s = (1 - long_per_s * stall) / step
            stalled_share = long_per_s / steps_per_s  # decode steps that waited on one
            wait_behind = long_per_s * stall * stall / 2  # short request arriving mid-prefill
            short_ttft = 0.02 + short_prompt / prefill_tok_s + wait_behind * 4
            long_ttft = 0.02 + stall + wait_behind * 4
            running = rps * (0.15 + 250 * step * 1.1)
            advance_vllm(
                s,
                rng,
                Tick(
                    n=_poisson(rng, rps * clock.dt),
                    hit=0.35,
                    out_mean=250,
                    itl=step,
                    classes=((1 - long_share, short_prompt, short_ttft), (long_share, long_prompt, long_ttft)),
                    itl_stalled=(stalled_share, stall + step),
                    waiting=_poisson(rng, 0.6),
                    running=running,
                    kv=running * 2100 / (H100_BLOCKS * 16),
                    prompt_sigma=0.35,
                ),
            )
            sink.scrape("vllm", f"replica-{r}", ts, render_vllm(s))
    sink.close()
    end = clock.steps * clock.dt
    return {
        "summary": "4 vLLM 0.33 replicas (Llama-3.1-8B, H100) serve chat (~700-token prompts) and RAG "
        "(~9k-token prompts, 20 % of requests) on the same pool with chunked prefill disabled. "
        "Each long prefill runs as one ~0.3 s step and every decoding sequence waits for it: "
        "~3 % of inter-token gaps are ~0.3 s while the median stays ~24 ms. Nothing changes "
        "during the recording: a chronic condition, not an onset.",
        "phases": _phases(("steady", 0.0, end)),
        "expected": [
            {
                "levers": ["L3"],
                "phase": "steady",
                "likely": True,
                "why": "ITL p99 >> p50 with mixed prompt lengths (002 §6.4, §8.5: chunked prefill)",
            }
        ],
        "must_not": ["L4", "L11", "L1", "K1", "K3", "L12", "L14"],
        "engine_flags": {"enable_chunked_prefill": False},
    }


# ---------------------------------------------------------------------------------------- L12
def scenario_sglang_queue_overload(path: Path, cal: dict, seed: int = 12) -> dict:
    """2 SGLang replicas: the daily peak climbs past their service rate and the queue grows."""
    rng, clock = random.Random(seed), Clock(30.0, 80)
    reps = [new_sglang() for _ in range(2)]
    queues = [0.0, 0.0]
    mu, prompt, out, itl = 3.0, 1500.0, 400.0, 0.035  # per replica: 64 running x (0.35 s + 400 x 35 ms)
    ramp0, ramp1 = 10, 40
    sink = Sink(path)
    for i, ts in clock.times():
        level = 0.7 + 0.45 * min(1.0, max(0.0, (i - ramp0) / (ramp1 - ramp0)))
        for r, s in enumerate(reps):
            arrivals = _poisson(rng, level * mu * clock.dt * rng.gauss(1.0, 0.03))
            capacity = _poisson(rng, mu * clock.dt)
            served = min(capacity, queues[r] + arrivals)
            wait = queues[r] / mu  # Little's law: queue ahead / service rate
            gave_up = round(0.25 * arrivals) if wait > 30 else 0  # client timeouts abort queued requests
            queues[r] = max(0.0, queues[r] + arrivals - served - gave_up)
            n = int(served)
            s.running = min(64.0, round(mu * (0.35 + out * itl) * min(1.0, level + queues[r])))
            s.queue = round(queues[r])
            s.token_usage = min(0.95, s.running * (prompt + out / 2) / s.max_total_num_tokens)
            advance_sglang(
                s, rng, n, prompt, out, hit=0.45, wait=wait, ttft=0.35 + wait, itl=itl, aborted=gave_up, hit_sd=0.04
            )
            sink.scrape("sglang", f"sglang-{r}", ts, render_sglang(s))
    sink.close()
    t = clock.dt
    return {
        "summary": "2 SGLang 0.5.23 replicas (Qwen3-32B) each serve ~3 req/s at full batch. The daily "
        "peak climbs from 70 % to 115 % of that service rate between minute 5 and 20 and "
        "stays: the waiting queue grows by ~0.45 req/s per replica, TTFT follows the queue "
        "(Little's law), clients start timing out (aborts) once the wait passes 30 s. KV "
        "usage stays below 0.9 and nothing is retracted: compute throughput, not memory.",
        "phases": _phases(
            ("normal", 0.0, ramp0 * t), ("ramp", ramp0 * t, 30 * t), ("overloaded", 30 * t, clock.steps * t)
        ),
        "expected": [
            {
                "levers": ["L12"],
                "phase": "overloaded",
                "likely": True,
                "why": "queue grows steadily, aborts follow (002 §9.4 admission control, 004)",
            },
            {
                "levers": ["L1", "L2"],
                "phase": "ramp",
                "why": "acceptable on the way up: the tail pulls away, then both percentiles",
            },
        ],
        "must_not": ["K1", "K3", "L4", "L3", "L11", "U1", "U6", "L14"],
    }


# ---------------------------------------------------------------------------------------- L4
def scenario_decode_batch_large(path: Path, cal: dict, seed: int = 13) -> dict:
    """Evening peak on 4 vLLM replicas with a large max_num_seqs: the decode batch doubles and
    every decode step reads more KV, so ITL rises at every percentile."""
    rng, clock = random.Random(seed), Clock(30.0, 60)
    reps = [new_vllm() for _ in range(4)]
    sink = Sink(path)
    peak0, peak1 = 20, 30
    out, prompt = 300.0, 1200.0
    for i, ts in clock.times():
        level = 4.0 + 5.0 * min(1.0, max(0.0, (i - peak0) / (peak1 - peak0)))
        for r, s in enumerate(reps):
            rps = level * rng.gauss(1.0, 0.04)
            # decode is memory-bandwidth bound: step time = weights pass + KV read per running sequence;
            # running = rps x (TTFT + out x step) (Little's law): solve the fixed point
            base, per_seq, ttft = 0.018, 0.00022, 0.08 + 0.0008 * rps**2
            running = rps * (ttft + out * base) / (1 - rps * out * per_seq)
            step = base + per_seq * running
            advance_vllm(
                s,
                rng,
                Tick(
                    n=_poisson(rng, rps * clock.dt),
                    classes=((1.0, prompt, ttft),),
                    out_mean=out,
                    hit=0.5,
                    itl=step,
                    itl_stalled=(0.02, step * 1.8),
                    waiting=_poisson(rng, 0.2),
                    running=running,
                    kv=running * (prompt + out / 2) / (H100_BLOCKS * 16),
                ),
            )
            sink.scrape("vllm", f"replica-{r}", ts, render_vllm(s))
    sink.close()
    t = clock.dt
    return {
        "summary": "4 vLLM 0.33 replicas (Llama-3.1-8B, H100, max_num_seqs 256). Traffic rises from 4 to "
        "9 req/s per replica between minute 10 and 15 with the same prompt/output mix; the "
        "decode batch grows from ~30 to ~120 sequences and, decode being memory-bandwidth "
        "bound, each step reads more KV: ITL p50 ~25 -> ~45 ms and p99 with it; no queue, KV "
        "well below full, prompt lengths unchanged.",
        "phases": _phases(
            ("evening", 0.0, peak0 * t), ("ramp", peak0 * t, peak1 * t), ("peak", peak1 * t, clock.steps * t)
        ),
        "expected": [
            {
                "levers": ["L4"],
                "phase": "peak",
                "likely": True,
                "why": "ITL up at every percentile with the decode batch (002 §9.3 ITL row)",
            }
        ],
        "must_not": ["L3", "L11", "K1", "K3", "L12", "L1", "L14"],
    }


# ---------------------------------------------------------------------------------------- K1
def scenario_kv_too_small(path: Path, cal: dict, seed: int = 14) -> dict:
    """Long-context agents on 24 GB GPUs: the KV pool holds ~6 such sequences; when traffic rises
    the pool stays full and vLLM preempts."""
    rng, clock = random.Random(seed), Clock(30.0, 60)
    blocks = 2250  # 36k tokens: 8B weights leave ~4.5 GB of KV on 24 GB
    reps = [new_vllm(blocks=blocks, max_model_len=16_384) for _ in range(4)]
    sink = Sink(path)
    rise = 20
    prompt, out, step = 5500.0, 400.0, 0.03
    capacity = blocks * 16
    for i, ts in clock.times():
        rps_level = 0.28 if i < rise else 0.52
        for r, s in enumerate(reps):
            rps = _poisson(rng, rps_level * clock.dt) / clock.dt  # bursty: arrivals in this interval
            want = rps * (0.6 + out * step)  # sequences the traffic keeps in flight
            fits = capacity / (prompt + out / 2)  # ~6.3 sequences fit in the pool
            running = min(want, fits * rng.uniform(0.9, 0.98))
            over = max(0.0, want - running)
            preempt = _poisson(rng, over * 0.1 * clock.dt) if over > 0.2 else 0
            waiting = _poisson(rng, 0.5 + 2.0 * over)
            ttft = 0.25 + waiting * 2.5 + preempt * 0.2  # waits for blocks to free
            advance_vllm(
                s,
                rng,
                Tick(
                    n=round(min(rps, fits / (0.6 + out * step)) * clock.dt),
                    classes=((1.0, prompt, ttft),),
                    out_mean=out,
                    hit=0.3,
                    itl=step * (1 + 0.2 * (over > 0.2)),
                    waiting=waiting,
                    running=running,
                    kv=min(1.0, running * (prompt + out / 2) / capacity + rng.uniform(0, 0.02)),
                    preemptions=preempt,
                    queue_s=max(0.002, waiting * 2.5),
                    prompt_sigma=0.3,
                ),
            )
            sink.scrape("vllm", f"replica-{r}", ts, render_vllm(s))
    sink.close()
    t = clock.dt
    return {
        "summary": "4 vLLM 0.33 replicas of Llama-3.1-8B on 24 GB GPUs (2250 KV blocks = 36k tokens each, "
        "cache_dtype auto) serve a long-context agent workload (~5.5k-token prompts, 400-token "
        "outputs). At 0.28 req/s per replica ~4 sequences are in flight (KV ~0.6); from minute "
        "10 traffic is 0.52 req/s, the traffic wants ~7 sequences, ~6 fit: KV usage sits at "
        "0.9-1.0, vLLM preempts ~0.2/s per replica, a few requests wait for blocks and TTFT "
        "rises with them.",
        "phases": _phases(("fits", 0.0, rise * t), ("kv-full", rise * t, clock.steps * t)),
        "expected": [
            {
                "levers": ["K1"],
                "phase": "kv-full",
                "likely": True,
                "why": "KV full with ongoing preemptions: FP8 KV / more KV budget (002 §7.4, §7.5)",
            },
            {
                "levers": ["K2", "K3", "K6"],
                "phase": "kv-full",
                "why": "same mechanism, acceptable as supporting evidence",
            },
        ],
        "must_not": ["L4", "L12", "L11", "L14", "U1", "U6", "L3"],
    }


# ---------------------------------------------------------------------------------------- L14
def scenario_output_length_drift(path: Path, cal: dict, seed: int = 15) -> dict:
    """Answers get longer after a prompt-template change: output p99 drifts up over half an hour."""
    rng, clock = random.Random(seed), Clock(30.0, 120)
    reps = [new_vllm(max_model_len=8192) for _ in range(4)]
    sink = Sink(path)
    drift0 = 50
    prompt = 900.0
    for i, ts in clock.times():
        grow = 1.0 + 1.3 * min(1.0, max(0.0, (i - drift0) / 60))
        for r, s in enumerate(reps):
            rps = 3.0 * _wiggle(rng, i + 11 * r, 60, 0.05)
            out = 280.0 * grow
            step = 0.022 + 0.00004 * rps * out * 0.022 * 10
            running = rps * (0.08 + out * step)
            advance_vllm(
                s,
                rng,
                Tick(
                    n=_poisson(rng, rps * clock.dt),
                    classes=((1.0, prompt, 0.08),),
                    out_mean=out,
                    hit=0.6,
                    itl=step,
                    waiting=_poisson(rng, 0.1),
                    running=running,
                    out_sigma=0.7,
                    kv=running * (prompt + out / 2) / (H100_BLOCKS * 16),
                ),
            )
            sink.scrape("vllm", f"replica-{r}", ts, render_vllm(s))
    sink.close()
    t = clock.dt
    return {
        "summary": "4 vLLM 0.33 replicas (Llama-3.1-8B, H100, max_model_len 8192) at a steady 3 req/s each. "
        "At minute 25 a prompt-template change makes answers longer: the mean output grows "
        "from 280 to ~650 tokens over 30 minutes and its p99 from ~1.1k to ~2.5k; no max_tokens "
        "is set. Batch and KV usage grow with it but stay far from limits; latency per token "
        "barely moves.",
        "phases": _phases(("steady", 0.0, drift0 * t), ("drifting", drift0 * t, clock.steps * t)),
        "expected": [
            {
                "levers": ["L14"],
                "phase": "drifting",
                "likely": True,
                "why": "p99 output length drifting up: finite max_new_tokens (002 §9.4)",
            }
        ],
        "must_not": ["L4", "K1", "L12", "L11", "L3", "L1"],
    }


# ---------------------------------------------------------------------------------------- U8
def scenario_hpa_wrong_signal(path: Path, cal: dict, seed: int = 16) -> dict:
    """An HPA on CPU utilisation: it added one replica at start-up, then never again while the
    queue built up (GPU workers barely use their CPU)."""
    rng, clock = random.Random(seed), Clock(30.0, 80)
    reps = [new_vllm() for _ in range(4)]
    sink = Sink(path)
    joined, ramp0, ramp1 = 8, 16, 40
    queues = [0.0] * 4
    mu, prompt, out = 6.0, 1000.0, 250.0
    for i, ts in clock.times():
        live = 3 if i < joined else 4
        total = 14.0 + 10.8 * min(1.0, max(0.0, (i - ramp0) / (ramp1 - ramp0)))
        for r in range(live):
            s = reps[r]
            arrivals = _poisson(rng, total / live * clock.dt * rng.gauss(1.0, 0.03))
            served = min(_poisson(rng, mu * clock.dt), queues[r] + arrivals)
            wait = queues[r] / mu
            gave_up = round(0.2 * arrivals) if wait > 60 else 0  # client timeouts leave the queue
            queues[r] = max(0.0, queues[r] + arrivals - served - gave_up)
            running = min(120.0, mu * (0.1 + out * 0.03))
            advance_vllm(
                s,
                rng,
                Tick(
                    n=int(served),
                    classes=((1.0, prompt, 0.1 + wait),),
                    out_mean=out,
                    hit=0.55,
                    itl=0.03,
                    waiting=queues[r],
                    running=running * rng.uniform(0.9, 1.0),
                    queue_s=max(0.002, wait),
                    kv=running * (prompt + out / 2) / (H100_BLOCKS * 16),
                ),
            )
            sink.scrape("vllm", f"replica-{r}", ts, render_vllm(s))
    sink.close()
    t = clock.dt
    return {
        "summary": "vLLM 0.33 (Llama-3.1-8B, H100) behind a Kubernetes HPA that targets CPU utilisation. "
        "The HPA scaled 3 -> 4 at minute 4 (start-up CPU burst); from minute 8 to 20 traffic "
        "rises from 14 to ~25 req/s against ~24 req/s of service, so each replica's queue grows "
        "and stays long for 20 minutes. The engines' CPU use does not move with the queue, "
        "so the HPA never adds the fifth replica.",
        "phases": _phases(
            ("warm", 0.0, ramp0 * t), ("ramp", ramp0 * t, ramp1 * t), ("queue-ignored", ramp1 * t, clock.steps * t)
        ),
        "expected": [
            {
                "levers": ["U8"],
                "phase": "queue-ignored",
                "likely": True,
                "why": "replica count changed recently, then flat through sustained queue pressure (004)",
            },
            {"levers": ["L12"], "phase": "queue-ignored", "why": "the queue itself: acceptable as supporting evidence"},
        ],
        "must_not": ["U1", "U6", "K1", "K3", "P3", "P4", "U7", "L4"],
    }


# ---------------------------------------------------------------------------------------- L11 (engine view)
def scenario_long_prompt_surge(path: Path, cal: dict, seed: int = 17) -> dict:
    """A batch-summarisation client floods 20k-token documents into the chat pool for 10 minutes
    (chunked prefill on): prefill work swamps the scheduler, every request's TTFT climbs, and each
    decode step carries a prefill chunk, so ITL rises too - a prefill problem, not the decode batch."""
    rng, clock = random.Random(seed), Clock(30.0, 64)
    reps = [new_vllm() for _ in range(4)]
    sink = Sink(path)
    surge0, surge1 = 24, 44
    prefill_tok_s, chat_prompt, doc_prompt = 40_000.0, 600.0, 20_000.0
    for i, ts in clock.times():
        docs = 1.5 if surge0 <= i < surge1 else 0.0
        for r, s in enumerate(reps):
            chat = 6.0 * rng.gauss(1.0, 0.04)
            demand = (chat * chat_prompt * 0.5 + docs * doc_prompt * 0.95) / prefill_tok_s  # prefill busy share
            step = 0.024 + 0.016 * demand  # a chunk rides on every step
            waiting = _poisson(rng, 0.3 + 12 * demand**3)
            chat_ttft = 0.03 + waiting * 0.12
            doc_ttft = doc_prompt / (prefill_tok_s * max(0.2, 1 - demand)) + waiting * 0.12
            rps = chat + docs
            running = chat * (chat_ttft + 200 * step) + docs * (doc_ttft + 150 * step)
            advance_vllm(
                s,
                rng,
                Tick(
                    n=_poisson(rng, rps * clock.dt),
                    hit=(chat * chat_prompt * 0.5) / (chat * chat_prompt + docs * doc_prompt),
                    classes=((chat / rps, chat_prompt, chat_ttft), (docs / rps, doc_prompt, doc_ttft)),
                    out_mean=(chat * 200 + docs * 150) / rps,
                    itl=step,
                    itl_stalled=(0.05, step * 1.7),
                    waiting=waiting,
                    running=running,
                    queue_s=max(0.002, waiting * 0.12),
                    prompt_sigma=0.35,
                    kv=(chat * (chat_ttft + 200 * step) * 700 + docs * (doc_ttft + 150 * step) * 20_000)
                    / (H100_BLOCKS * 16),
                ),
            )
            sink.scrape("vllm", f"replica-{r}", ts, render_vllm(s))
    sink.close()
    t = clock.dt
    return {
        "summary": "4 vLLM 0.33 replicas (Llama-3.1-8B, H100, chunked prefill on) serve chat at 6 req/s "
        "each (~600-token prompts). From minute 12 to 22 a batch-summarisation client adds 1.5 "
        "req/s per replica of ~20k-token documents: prompt tokens per second rise ~8x, the "
        "prefill share of every step rises, requests queue behind the documents and chat TTFT "
        "climbs several-fold; ITL rises at every percentile because each decode step now "
        "carries a prefill chunk. The flood stops and everything recovers.",
        "phases": _phases(
            ("chat", 0.0, surge0 * t), ("surge", surge0 * t, surge1 * t), ("after", surge1 * t, clock.steps * t)
        ),
        "expected": [
            {
                "levers": ["L11"],
                "phase": "surge",
                "likely": True,
                "why": "a class of long prompts pushes every request's TTFT up (004 noisy neighbours)",
            },
            {
                "levers": ["L12", "L14", "L5", "L2"],
                "phase": "surge",
                "why": "symptoms of the same flood (queue, longer inputs, both SLOs): acceptable behind it",
            },
        ],
        "must_not": ["L4", "L3", "K1", "K3", "P1", "L8"],
    }


# ---------------------------------------------------------------------------------------- P5
def scenario_sglang_hot_prefix_replica(path: Path, cal: dict, seed: int = 18) -> dict:
    """Prefix-hash routing on 4 SGLang replicas: a new agent product's shared system prompt grows to
    35 % of traffic and all of it lands on one replica (002 §7.3 hotspot)."""
    rng, clock = random.Random(seed), Clock(30.0, 70)
    reps = [new_sglang() for _ in range(4)]
    queues = [0.0] * 4
    mu, total, prompt, out, itl, hot = 3.0, 8.0, 2500.0, 350.0, 0.035, 2
    grow0, grow1 = 20, 40
    sink = Sink(path)
    for i, ts in clock.times():
        agent = 0.35 * min(1.0, max(0.0, (i - grow0) / (grow1 - grow0)))  # share of traffic with the prefix
        for r, s in enumerate(reps):
            share = (1 - agent) / 4 + (agent if r == hot else 0.0)
            arrivals = _poisson(rng, total * share * clock.dt * rng.gauss(1.0, 0.03))
            served = min(_poisson(rng, mu * clock.dt), queues[r] + arrivals)
            wait = queues[r] / mu
            gave_up = round(0.35 * arrivals) if wait > 30 else 0  # client time-outs
            queues[r] = max(0.0, queues[r] + arrivals - served - gave_up)
            n = int(served)
            hit = 0.4 + (0.45 * agent / share if r == hot and share else 0.0)
            s.running = round(min(48.0, total * share * (0.3 + out * itl)))
            s.queue = round(queues[r])
            s.token_usage = min(0.95, s.running * (prompt * (1 - 0.5 * (r == hot)) + out / 2) / s.max_total_num_tokens)
            advance_sglang(
                s,
                rng,
                n,
                prompt,
                out,
                hit=hit,
                wait=wait,
                ttft=0.25 + prompt * (1 - hit) / 15_000 + wait,
                itl=itl * (1 + 0.2 * (s.running > 40)),
                aborted=gave_up,
                prompt_sd=0.4,
            )
            sink.scrape("sglang", f"sglang-{r}", ts, render_sglang(s))
    sink.close()
    t = clock.dt
    return {
        "summary": "4 SGLang 0.5.23 replicas (Qwen3-32B) behind prefix-hash routing at 8 req/s in all "
        "(~3 req/s capacity each). From minute 10 to 20 a new agent product, whose requests "
        "share one long system prompt, grows to 35 % of traffic; the hash sends all of it to "
        "sglang-2: its share rises from 25 % to ~51 % (4.1 req/s), its queue grows until "
        "clients time out (~30 s waits, aborts) and its hit rate is high, while the other three "
        "run at ~1.3 req/s with empty queues.",
        "phases": _phases(
            ("balanced", 0.0, grow0 * t), ("growing", grow0 * t, grow1 * t), ("hotspot", grow1 * t, clock.steps * t)
        ),
        "expected": [
            {
                "levers": ["P5"],
                "phase": "hotspot",
                "likely": True,
                "why": "one replica takes a far larger share because a popular prefix pins to it",
            },
            {
                "levers": ["L12"],
                "phase": "hotspot",
                "why": "the hot replica's queue: the symptom, acceptable behind P5",
            },
        ],
        "must_not": ["P2", "P3", "P1", "L4", "L3", "K1", "K3", "U8"],
    }


# ---------------------------------------------------------------------------------------- U7
def scenario_replica_flapping(path: Path, cal: dict, seed: int = 19) -> dict:
    """An HPA on queue depth with no scale-down stabilisation: traffic sits near the 4-replica
    capacity, so the fleet goes 4 -> 6 -> 4 every few minutes; each new replica starts cold."""
    rng, clock = random.Random(seed), Clock(30.0, 90)
    reps = [new_vllm() for _ in range(6)]
    sink = Sink(path)
    mu, prompt, out = 6.0, 1500.0, 250.0
    queues = [0.0] * 6
    live, since_change, joined = 4, 0, [-99] * 6
    for i, ts in clock.times():
        total = 24.5 * _wiggle(rng, i, 30, 0.04)
        avg_q = sum(queues[:live]) / live
        since_change += 1
        if live == 4 and avg_q >= 2 and since_change >= 2:  # scale up on queue depth at once
            live, since_change = 6, 0
            for r in (4, 5):
                joined[r], queues[r] = i + 3, 0.0  # ready after a 90 s cold start
        elif live == 6 and avg_q < 0.5 and since_change >= 6:  # ... and down again after 3 min
            live, since_change = 4, 0
        ready = [r for r in range(live) if joined[r] <= i]
        for r in ready:
            s = reps[r]
            warm = min(1.0, (i - joined[r] + 1) / 6) if r >= 4 else 1.0  # cache refill over ~3 min
            hit = 0.6 * (0.15 + 0.85 * warm)
            arrivals = _poisson(rng, total / len(ready) * clock.dt)
            served = min(_poisson(rng, mu * clock.dt), queues[r] + arrivals)
            wait = queues[r] / mu
            queues[r] = max(0.0, queues[r] + arrivals - served)
            ttft = 0.04 + prompt * (1 - hit) / 25_000 + wait
            running = mu * (ttft + out * 0.028)
            advance_vllm(
                s,
                rng,
                Tick(
                    n=int(served),
                    classes=((1.0, prompt, ttft),),
                    out_mean=out,
                    hit=hit,
                    itl=0.028,
                    waiting=queues[r],
                    running=running,
                    queue_s=max(0.002, wait),
                    kv=running * (prompt + out / 2) / (H100_BLOCKS * 16),
                ),
            )
            sink.scrape("vllm", f"replica-{r}", ts, render_vllm(s))
        for r in range(4, 6):
            if r not in ready and joined[r] >= 0 and joined[r] > i - 3:
                continue  # starting: not yet scraped
            if r not in ready:
                reps[r] = new_vllm()  # scaled in: next start is a new pod
    sink.close()
    return {
        "summary": "vLLM 0.33 (Llama-3.1-8B, H100) behind an HPA on queue depth with no scale-down "
        "stabilisation window. Traffic (~24.5 req/s) sits at the capacity of 4 replicas: the "
        "queue builds, the HPA adds 2 replicas (ready after a 90 s cold start, caches empty), "
        "the queue vanishes, and 3 minutes later it removes them again - 4 -> 6 -> 4 every "
        "few minutes for 45 minutes. The gateway uses consistent hashing, so only the moving "
        "replicas' share of prefixes is cold each time.",
        "phases": _phases(("flapping", 0.0, clock.steps * clock.dt)),
        "expected": [
            {
                "levers": ["U7"],
                "phase": "flapping",
                "likely": True,
                "why": "replica count oscillates within minutes: cooldown from the measured cold "
                "start, scale down gradually (004)",
            },
            {
                "levers": ["P4"],
                "phase": "flapping",
                "why": "each new replica is cold: a consequence, acceptable behind U7",
            },
        ],
        "must_not": ["U8", "P3", "P2", "K1", "K3", "L4", "U1", "U6", "L3"],
    }
