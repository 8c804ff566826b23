"""Fleet scenarios: a seeded, time-stepped model of replicas, rendered with the real exporters'
names and written as a recording. Each `scenario_*` function returns its YAML description and
fills a RecordingWriter; `generate()` runs one by name.

Dynamics (per scrape interval of `dt` seconds, per replica):
* requests arrive at rate `rps`; each has `prompt` tokens of which a fraction `hit` is served from
  the prefix cache, so queries += n * prompt and hits += n * prompt * hit;
* TTFT = queue wait + prefill of the uncached tokens; the queue effect uses the TTFT-vs-waiting
  slope measured on real vLLM (calibration.yaml), each observation drawn lognormally around it;
* everything stays cumulative the way the engines export it (counters, histogram buckets).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from kvscope.agent.recording.omfile import RecordingWriter
from kvscope.agent.scrape.exposition import parse_exposition
from testbed.fleetgen.families import (
    SGL_KV_XFER_MS,
    GpuState,
    Histogram,
    SglangState,
    Text,
    VllmState,
    render_dcgm,
    render_sglang,
    render_vllm,
)

CALIBRATION = Path(__file__).with_name("calibration.yaml")
START = 1_795_300_000.0  # a fixed epoch (2026-11) so outputs are reproducible


def load_calibration() -> dict:
    """Numbers measured on the real recordings (see calibrate.py)."""
    return yaml.safe_load(CALIBRATION.read_text())


@dataclass
class Clock:
    dt: float
    steps: int

    def times(self):
        for i in range(self.steps):
            yield i, START + i * self.dt


class Sink:
    """Renders text expositions into a recording, as `kvscope record` would store them."""

    def __init__(self, path: Path) -> None:
        self.writer = RecordingWriter(path)

    def scrape(self, job: str, instance: str, ts: float, text: str) -> None:
        expo = parse_exposition(text)
        assert not expo.issues, expo.issues[:3]
        self.writer.add_scrape(job, instance, ts, expo, duration_s=0.012)

    def close(self) -> Path:
        return self.writer.close()


def _observe_lognormal(rng: random.Random, h: Histogram, mean: float, n: int, sigma: float = 0.35) -> None:
    """n observations from a lognormal with this mean: sampled one by one for small n, spread over
    the buckets by the distribution's CDF for large n (same expectation, no per-token loop)."""
    mu = math.log(max(mean, 1e-6)) - sigma * sigma / 2
    if n <= 200:
        for _ in range(n):
            h.observe(rng.lognormvariate(mu, sigma))
        return
    cdf = [0.5 * (1 + math.erf((math.log(b) - mu) / (sigma * math.sqrt(2)))) if b > 0 else 0.0 for b in h.bounds] + [
        1.0
    ]
    given = 0
    for i, c in enumerate(cdf):
        k = round(n * c) - given
        h.counts[i] += k
        given += k
    h.total += n * mean


def _poisson(rng: random.Random, lam: float) -> int:
    if lam > 50:
        return max(0, int(round(rng.gauss(lam, math.sqrt(lam)))))
    k, p, limit = 0, 1.0, math.exp(-lam)
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def step_vllm(
    s: VllmState,
    rng: random.Random,
    cal: dict,
    dt: float,
    rps: float,
    prompt: int,
    hit: float,
    out_tokens: int = 200,
    waiting: float = 0.0,
    prefill_tok_s: float = 12_000,
    itl_s: float = 0.025,
) -> None:
    """Advance one vLLM engine by one interval."""
    n = _poisson(rng, rps * dt)
    uncached = prompt * (1 - hit)
    slope = cal["ttft_vs_queue"]["ratio_per_waiting_request"]
    ttft = (0.015 + uncached / prefill_tok_s) * (1 + max(0.0, slope) * waiting)
    s.queries += n * prompt
    s.hits += round(n * prompt * hit)
    s.prompt_tokens += n * prompt
    s.generation_tokens += n * out_tokens
    s.success += n
    s.waiting = waiting
    s.running = min(256, rps * (ttft + out_tokens * itl_s))
    s.kv_usage = min(1.0, s.running * (prompt + out_tokens / 2) / (s.num_gpu_blocks * s.block_size))
    _observe_lognormal(rng, s.ttft, ttft, n)
    _observe_lognormal(rng, s.itl, itl_s, min(n * 4, 400), 0.2)
    _observe_lognormal(rng, s.e2e, ttft + out_tokens * itl_s, n, 0.2)
    _observe_lognormal(rng, s.queue, 0.001 + waiting * 0.05, n, 0.5)


# ---------------------------------------------------------------------------------------------
def scenario_fleet_round_robin(path: Path, cal: dict, seed: int = 0) -> dict:
    """8 vLLM replicas: cache-aware (prefix-hash) routing, then a switch to round-robin."""
    rng, clock, n = random.Random(seed), Clock(10.0, 72), 8
    sticky_hit = cal["routing_2_replicas"]["sticky"]
    reps = [VllmState(engine="0") for _ in range(n)]
    sink = Sink(path)
    switch = 36
    for i, ts in clock.times():
        for r, s in enumerate(reps):
            # round-robin: each replica sees every prefix, its cache holds 1/N of them -> hit ~ sticky/N
            hit = sticky_hit if i < switch else sticky_hit / n
            step_vllm(s, rng, cal, clock.dt, rps=6.0, prompt=3000, hit=max(0.0, rng.gauss(hit, 0.01)))
            sink.scrape("vllm", f"replica-{r}", ts, render_vllm(s))
    sink.close()
    return {
        "summary": f"{n} vLLM 0.33 replicas behind a gateway; the gateway switches from prefix-hash "
        f"routing to round-robin. Each replica's cache holds about 1/{n} of the tenants' "
        "prefixes, so under round-robin the hit rate drops to ~1/N of the sticky rate and "
        "TTFT rises with the recomputed prefill.",
        "phases": [
            {"name": "prefix-hash", "start_s": 0.0, "end_s": switch * clock.dt},
            {"name": "round-robin", "start_s": switch * clock.dt, "end_s": clock.steps * clock.dt},
        ],
        "expected": [
            {"levers": ["P2"], "phase": "round-robin", "why": f"hit rate ~{sticky_hit:.2f}/{n} on every replica"}
        ],
        "calibration": {
            "sticky_hit_rate": sticky_hit,
            "ttft_ratio_per_waiting": cal["ttft_vs_queue"]["ratio_per_waiting_request"],
        },
    }


def scenario_scale_out_hash_mod(path: Path, cal: dict, seed: int = 4) -> dict:
    """8 -> 9 vLLM replicas behind hash-mod-N routing: nearly every prefix changes owner at once."""
    rng, clock = random.Random(seed), Clock(10.0, 72)
    warm = cal["routing_2_replicas"]["sticky"]
    # refill: the real cold replica needed k requests per prefix to reach 90 % of warm; here each replica
    # owns `prefixes / 9` prefixes at 6*8/9 req/s, so t90 = k * prefixes/9 / rps (ln 10 time constants)
    prefixes = 2000
    k = cal["cold_start"].get("requests_per_prefix_to_90pct") or 2.0
    t90 = k * (prefixes / 9) / (6.0 * 8 / 9)
    tau = t90 / math.log(10)
    reps = [VllmState() for _ in range(9)]
    sink = Sink(path)
    grow = 30
    for i, ts in clock.times():
        live = 8 if i < grow else 9
        since = (i - grow) * clock.dt
        # hash mod N remaps 1 - 1/N of the keys: the hit rate restarts from ~1/N of warm and refills
        hit = warm if i < grow else warm - (warm - warm / live) * math.exp(-since / tau)
        for r in range(live):
            step_vllm(reps[r], rng, cal, clock.dt, rps=6.0 * 8 / live, prompt=3000, hit=max(0.0, rng.gauss(hit, 0.01)))
            sink.scrape("vllm", f"replica-{r}", ts, render_vllm(reps[r]))
    sink.close()
    return {
        "summary": "8 vLLM 0.33 replicas behind hash-mod-N prefix routing; a 9th replica joins. "
        "hash mod 9 sends ~8/9 of the prefixes to a different replica than hash mod 8 did, "
        "so the hit rate collapses on every replica at once and refills over the measured "
        "cold-start time; consistent hashing would have moved only ~1/9.",
        "phases": [
            {"name": "steady-8", "start_s": 0.0, "end_s": grow * clock.dt},
            {"name": "scaled-to-9", "start_s": grow * clock.dt, "end_s": clock.steps * clock.dt},
        ],
        "expected": [
            {
                "levers": ["P3"],
                "phase": "scaled-to-9",
                "why": "fleet-wide hit-rate collapse right after the replica count changed",
            }
        ],
        "calibration": {
            "warm_hit_rate": warm,
            "requests_per_prefix_to_90pct": k,
            "prefixes": prefixes,
            "t90_s": round(t90, 1),
        },
    }


def scenario_pd_kv_transfer(path: Path, cal: dict, seed: int = 1) -> dict:
    """SGLang P/D: one prefill, two decode servers; KV transfer latency climbs (link saturating)."""
    rng, clock = random.Random(seed), Clock(10.0, 60)
    prefill = SglangState(engine_type="prefill", kv_xfer_ms=Histogram(SGL_KV_XFER_MS))
    decodes = [SglangState(engine_type="decode") for _ in range(2)]
    sink = Sink(path)
    ramp = 20
    for i, ts in clock.times():
        xfer_ms = 20.0 if i < ramp else 20.0 * math.exp((i - ramp) / 10)  # ~20 ms -> ~1 s
        n = _poisson(rng, 8.0 * clock.dt)
        _observe_lognormal(rng, prefill.kv_xfer_ms, xfer_ms, n, 0.3)
        prefill.eff_input += n * 4000
        prefill.eff_device_hit += n * 1200
        prefill.prompt_tokens += n * 4000
        prefill.cached_device += n * 1200
        prefill.num_requests += n
        prefill.running, prefill.queue = 4, max(0.0, (xfer_ms - 200) / 100)
        prefill.token_usage = min(0.95, 0.3 + xfer_ms / 2000)
        _observe_lognormal(rng, prefill.ttft, 0.35 + xfer_ms / 1000, n)
        sink.scrape("sglang", "prefill-0", ts, render_sglang(prefill))
        for d, s in enumerate(decodes):
            s.running, s.token_usage = 40, 0.55
            _observe_lognormal(rng, s.itl, 0.022, n * 20, 0.15)
            sink.scrape("sglang", f"decode-{d}", ts, render_sglang(s))
    sink.close()
    return {
        "summary": "SGLang 0.5.23 prefill/decode disaggregation (1 prefill, 2 decode servers). "
        "sglang:kv_transfer_latency_ms climbs from ~20 ms to ~1 s while prefill compute and "
        "decode ITL stay flat; TTFT follows the transfer time.",
        "phases": [
            {"name": "normal", "start_s": 0.0, "end_s": ramp * clock.dt},
            {"name": "transfer-rising", "start_s": ramp * clock.dt, "end_s": clock.steps * clock.dt},
        ],
        "expected": [
            {
                "levers": ["L7"],
                "phase": "transfer-rising",
                "why": "KV transfer time rising with flat compute: interconnect, not GPU",
            }
        ],
    }


def scenario_dcgm_trap(path: Path, cal: dict, seed: int = 2) -> dict:
    """8 GPUs on 2 nodes report ~95 % DCGM_FI_DEV_GPU_UTIL while the engines barely work."""
    rng, clock = random.Random(seed), Clock(10.0, 60)
    gpus = [
        GpuState(gpu=g % 4, uuid=f"GPU-{seed:04x}{g:04x}-5e1c-4c2a-9b9e-00000000{g:04d}", hostname=f"node-{g // 4}")
        for g in range(8)
    ]
    reps = [VllmState() for _ in range(8)]
    sink = Sink(path)
    for _i, ts in clock.times():
        for g in gpus:
            g.util_pct = min(100.0, rng.gauss(94, 2))  # a kernel is always running...
            g.gr_active = max(0.0, rng.gauss(0.22, 0.03))  # ...but the SMs are mostly idle
            g.tensor_active = max(0.0, rng.gauss(0.06, 0.01))
            g.dram_active = max(0.0, rng.gauss(0.18, 0.02))
            g.fb_used_mib, g.fb_free_mib = 74_200.0, 7_359.0  # KV pool pre-allocated
            g.power_w = rng.gauss(240, 10)
            g.energy_mj += g.power_w * clock.dt * 1000
            g.temp_c = rng.gauss(48, 1)
        for node in (0, 1):
            sink.scrape("dcgm", f"node-{node}:9400", ts, render_dcgm(gpus[node * 4 : (node + 1) * 4]))
        for r, s in enumerate(reps):
            step_vllm(s, rng, cal, clock.dt, rps=0.8, prompt=1200, hit=0.6, out_tokens=300)
            sink.scrape("vllm", f"replica-{r}", ts, render_vllm(s))
    sink.close()
    return {
        "summary": "Eight H100s (2 nodes x 4, dcgm-exporter 4.5.x default counters) behind 8 vLLM "
        "replicas at low load: DCGM_FI_DEV_GPU_UTIL reads ~94 % because a decode kernel is "
        "almost always running, while DCGM_FI_PROF_GR_ENGINE_ACTIVE is ~0.22 and tensor "
        "activity ~0.06; queues are empty and the KV pools far from full.",
        "phases": [{"name": "steady", "start_s": 0.0, "end_s": clock.steps * clock.dt}],
        "expected": [
            {
                "levers": ["U1", "U6"],
                "phase": "steady",
                "why": "real compute activity < 40 % and zero queue despite a 94 % 'utilization'",
            }
        ],
    }


def scenario_sglang_dp_split(path: Path, cal: dict, seed: int = 3) -> dict:
    """One SGLang server with DP attention (4 ranks): sessions spread over ranks, then pinned."""
    rng, clock = random.Random(seed), Clock(10.0, 60)
    ranks = [SglangState(model="deepseek-ai/DeepSeek-V3", dp_rank=str(r)) for r in range(4)]
    rank_hit_split = (0.34, 0.22, 0.15, 0.1)  # uneven: sessions land on several ranks
    sticky_hit = cal["routing_2_replicas"]["sticky"]
    sink = Sink(path)
    tokenizer = SglangState(model="deepseek-ai/DeepSeek-V3")
    pin = 30
    for i, ts in clock.times():
        text = Text()
        for r, s in enumerate(ranks):
            hit = rank_hit_split[r] if i < pin else sticky_hit
            n = _poisson(rng, 3.0 * clock.dt)
            s.eff_input += n * 5000
            s.eff_device_hit += round(n * 5000 * hit)
            tokenizer.prompt_tokens += n * 5000
            tokenizer.cached_device += round(n * 5000 * hit)
            tokenizer.num_requests += n
            s.cache_hit_rate = round(max(0.0, rng.gauss(hit, 0.03)), 3)
            s.running, s.queue, s.token_usage = 12, 0, 0.6
            _observe_lognormal(rng, tokenizer.ttft, 0.25 + 5000 * (1 - hit) / 20_000, n)
            render_sglang(s, text, tokenizer=False)
        render_sglang(tokenizer, text, scheduler=False)
        sink.scrape("sglang", "sglang-dp4", ts, _dedupe_families(text.render()))
    sink.close()
    return {
        "summary": "SGLang 0.5.23 with --dp-size 4 (DP attention): one target exports per-rank scheduler "
        "series (dp_rank label). The gateway spreads a session's turns over ranks, so each "
        "rank's hit rate is low and uneven; then requests pin their rank (routed_dp_rank) and "
        "every rank reaches the sticky hit rate.",
        "phases": [
            {"name": "spread", "start_s": 0.0, "end_s": pin * clock.dt},
            {"name": "pinned", "start_s": pin * clock.dt, "end_s": clock.steps * clock.dt},
        ],
        "expected": [
            {
                "levers": ["P6"],
                "phase": "spread",
                "why": "hit rate differs by dp_rank (0.10-0.34) for the same workload",
            }
        ],
    }


def scenario_sglang_hicache(path: Path, cal: dict, seed: int = 5) -> dict:
    """SGLang HiCache: the hot working set outgrows device KV, the host tier serves hits, and the
    load-backs show up as ITL tail spikes on an interactive workload."""
    rng, clock = random.Random(seed), Clock(10.0, 60)
    s = SglangState(model="Qwen/Qwen3-32B", hicache_host_used=0.0, hicache_host_total=2_000_000.0)
    sink = Sink(path)
    grow = 25
    warm = cal["routing_2_replicas"]["sticky"]
    for i, ts in clock.times():
        n = _poisson(rng, 10.0 * clock.dt)
        prompt = 4000
        over = 0.0 if i < grow else min(1.0, (i - grow) / 15)  # share of hits now on the host tier
        host_share = 0.6 * over
        s.eff_input += n * prompt
        s.eff_device_hit += round(n * prompt * warm * (1 - host_share))
        s.eff_host_hit += round(n * prompt * warm * host_share)
        s.prompt_tokens += n * prompt
        s.cached_device += round(n * prompt * warm * (1 - host_share))
        s.cached_host += round(n * prompt * warm * host_share)
        s.num_requests += n
        s.load_back_tokens += round(n * prompt * warm * host_share)
        s.evicted_tokens += round(n * prompt * (0.05 + 0.5 * over))
        s.hicache_host_used = min(s.hicache_host_total, 150_000 + 1_600_000 * over)
        s.running, s.queue = 48, 0
        s.token_usage = 0.7 + 0.25 * over
        s.cache_hit_rate = round(warm, 3)
        _observe_lognormal(rng, s.ttft, 0.3, n)
        decode_tokens = n * 300
        stalled = round(decode_tokens * 0.04 * over)  # tokens that waited on a load-back
        _observe_lognormal(rng, s.itl, 0.02, decode_tokens - stalled, 0.15)
        _observe_lognormal(rng, s.itl, 0.3, stalled, 0.3)
        sink.scrape("sglang", "sglang-0", ts, render_sglang(s))
    sink.close()
    return {
        "summary": "SGLang 0.5.23 with --enable-hierarchical-cache on an interactive chat workload. The hot "
        "working set outgrows device KV: evictions rise, the host (L2) tier fills to ~1.75M "
        "tokens and serves up to 60 % of the hits through load-backs; ITL p50 stays ~20 ms while "
        "the ~4 % of tokens that wait on a load-back push ITL p99 to ~0.3 s.",
        "phases": [
            {"name": "fits-on-device", "start_s": 0.0, "end_s": grow * clock.dt},
            {"name": "host-tier-in-use", "start_s": grow * clock.dt, "end_s": clock.steps * clock.dt},
        ],
        "expected": [
            {
                "levers": ["K6", "K7"],
                "phase": "host-tier-in-use",
                "why": "working set beyond device KV; host-tier reloads stall ITL (interactive)",
            },
            {
                "levers": ["L3"],
                "phase": "host-tier-in-use",
                "why": "ITL p99 spikes while p50 is flat (a diagnoser must prefer K7 here: the "
                "prompt mix did not change, the reloads did)",
            },
        ],
    }


def _dedupe_families(text: str) -> str:
    """Merge a family repeated per rank into one contiguous block (as one registry serves it)."""
    blocks: dict[str, list[str]] = {}
    heads: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            current = line.split()[2]
            heads.setdefault(current, [])
            if line not in heads[current]:
                heads[current].append(line)
            blocks.setdefault(current, [])
        elif current is not None:
            if line not in blocks[current]:
                blocks[current].append(line)
    return "".join("\n".join(heads[f] + blocks[f]) + "\n" for f in heads)


SCENARIOS: dict[str, Callable[[Path, dict], dict]] = {
    "fleet-8-replicas-round-robin": scenario_fleet_round_robin,
    "fleet-scale-out-hash-mod": scenario_scale_out_hash_mod,
    "fleet-pd-kv-transfer-rising": scenario_pd_kv_transfer,
    "fleet-dcgm-utilization-trap": scenario_dcgm_trap,
    "fleet-sglang-dp-split-cache": scenario_sglang_dp_split,
    "fleet-sglang-hicache-reload-stalls": scenario_sglang_hicache,
}


def blind_scenarios() -> dict[str, Callable[[Path, dict], dict]]:
    """The blind set (blind.py, blind_healthy.py: written from the seeds, expectations set before
    diagnosing). Imported lazily: those modules build on this one."""
    from testbed.fleetgen.blind import (
        scenario_decode_batch_large,
        scenario_hpa_wrong_signal,
        scenario_kv_too_small,
        scenario_long_prompt_surge,
        scenario_mixed_prompts_itl_tail,
        scenario_output_length_drift,
        scenario_replica_flapping,
        scenario_sglang_hot_prefix_replica,
        scenario_sglang_queue_overload,
    )
    from testbed.fleetgen.blind_healthy import scenario_healthy_autoscaled_ramp, scenario_healthy_busy_near_knee

    return {
        "blind-vllm-mixed-prompts-itl-tail": scenario_mixed_prompts_itl_tail,
        "blind-sglang-queue-overload": scenario_sglang_queue_overload,
        "blind-vllm-decode-batch-large": scenario_decode_batch_large,
        "blind-vllm-kv-too-small": scenario_kv_too_small,
        "blind-vllm-output-length-drift": scenario_output_length_drift,
        "blind-vllm-hpa-wrong-signal": scenario_hpa_wrong_signal,
        "blind-vllm-long-prompt-surge": scenario_long_prompt_surge,
        "blind-sglang-hot-prefix-replica": scenario_sglang_hot_prefix_replica,
        "blind-vllm-replica-flapping": scenario_replica_flapping,
        "blind-healthy-busy-near-knee": scenario_healthy_busy_near_knee,
        "blind-healthy-sglang-autoscaled-ramp": scenario_healthy_autoscaled_ramp,
    }


def all_scenarios() -> dict[str, Callable[[Path, dict], dict]]:
    """Every scenario `python -m testbed.fleetgen` can write: the fleet set and the blind set."""
    return {**SCENARIOS, **blind_scenarios()}


def generate(name: str, out_dir: Path, cal: dict | None = None) -> Path:
    """Write <name>.om.gz and <name>.yaml into out_dir; return the YAML path."""
    cal = cal or load_calibration()
    rec = out_dir / f"{name}.om.gz"
    meta = all_scenarios()[name](rec, cal)
    doc = {
        "scenario": name,
        "summary": meta.pop("summary"),
        "source": "synthetic: testbed/fleetgen (exact upstream names/labels/buckets; dynamics "
        "calibrated on the real recordings, see testbed/fleetgen/README.md)",
        "recording": rec.name,
        "spans": None,
        "recorded_at_unix": START,
        **meta,
        "regenerate": f"python -m testbed.fleetgen {name}",
    }
    path = out_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=100))
    return path
