"""R8 (engine_hung) on a real vLLM on CPU made to hang: its engine-core process is stopped (SIGSTOP)
while the API server keeps answering /health and /metrics, the way a deadlocked collective or a
stuck kernel leaves a GPU engine.

Verdicts, written before the first run (EXPECTED below):

* idle (no request, 60 s): quiet. Nothing is in the engine, so flat counters are expected.
* slow but progressing (a closed loop of 4 long requests of different lengths, the engine core stopped 6 s of every 8 s,
  70 s): quiet. Tokens are produced in every cycle, so no stall window is flat.
* hung (the same load, the engine core stopped for good, 120 s): fires, critical, with kvscope's
  /health probe at 1 (the API server still says healthy), its onset no earlier than the hang and no
  later than the rule's stated conditions allow: `stall` after the last progress of any counter it
  reads, and `stall` + `max_sample_interval` after the last sample with no request in the engine
  (the stall must be observed from its start), then `for`, plus two scrape steps.

The engine is stopped only once its own gauges show a request in it: its gauges freeze at the last
step's values, and an engine stopped between a finish and the next arrival reports nothing in it,
where the rule rightly stays quiet (a CI run on a loaded box did that; the test now checks the
frozen engine holds requests before it judges the rule).

The rule's durations are absolute (never time-scaled); the test sets its `stall` to 40 s, `for` to
10 s and `max_sample_interval` to 20 s (parameters a user may set the same way; the stall still
spans five of the slow phase's 8 s stop-and-run cycles), so the run takes about 4 minutes after
the server started. The agent's own engine collector scrapes every 2 s (the scrape timeout is
long: a loaded 2-core box may answer /metrics late); nothing asserts a wall-clock duration: the
onset bound is in the data's own time.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time

import aiohttp
import psutil
import pytest

from kvscope.agent.collectors.engine import HEALTH_SIGNAL, EngineCollector
from kvscope.agent.config import AgentConfig, Target
from kvscope.diagnoser.evaluate.evaluator import diagnose
from kvscope.diagnoser.evaluate.frame import frame_from_samples
from kvscope.diagnoser.rulebook.rule import parse_duration, read_rules
from testbed.tenants import synthetic_text
from testbed.tiny_model import SERVED_NAME
from testbed.vllm_server import VllmConfig, VllmServer

pytestmark = pytest.mark.vllm

STEP = 2.0
PARAMS = {"stall": "40s", "for": "10s", "max_sample_interval": "20s"}
IDLE_S, SLOW_S, HUNG_S = 60.0, 70.0, 120.0
STOP_S, RUN_S = 6.0, 2.0  # the slow phase: engine core stopped, then running, per cycle
CLIENTS = 4
EXPECTED = {"idle": [], "slow": [], "hung": ["engine_hung"]}
# its own server (not the session pool's): the test stops its engine and drops it afterwards
CONFIG = VllmConfig(service_name="vllm-hung", kv_cache_metrics=False)
GEN = "engine_generation_tokens_total"
PROGRESS = (GEN, "engine_prompt_tokens_total", "engine_iteration_tokens_count", "request_itl_seconds_count")
"""Every forward-progress counter the rule reads: the stall starts after the last of them moved."""


def _engine_core(server_pid: int) -> psutil.Process:
    """The engine-core process (vLLM titles it VLLM::EngineCore) under the API server."""
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
                return child
        except psutil.Error:
            continue
    raise AssertionError(f"no EngineCore process under pid {server_pid}")


async def _client(
    session: aiohttp.ClientSession, base: str, key: str, stop: asyncio.Event, done: list, max_tokens: int = 600
) -> None:
    """A closed loop of long completions until `stop` (the last one may stay pending in a hang).
    Each client asks for a different length, so the clients do not finish in the same engine step
    and leave the engine empty for a scrape (the engine could then stop with nothing in it)."""
    i = 0
    while not stop.is_set():
        body = {
            "model": SERVED_NAME,
            "prompt": synthetic_text(f"{key}/{i}", 60),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
        }
        try:
            async with session.post(base + "/v1/completions", json=body) as r:
                await r.read()
                done.append(r.status)
        except aiohttp.ClientError as e:  # the load goes on (a client that died would stop it unseen)
            done.append(f"{type(e).__name__}: {e}")
            await asyncio.sleep(0.5)
        i += 1


_IN_ENGINE = re.compile(r"^vllm:num_requests_(?:running|waiting)\{[^}]*\} ([0-9.e+-]+)$", re.M)


async def _until_engine_holds_requests(
    session: aiohttp.ClientSession, metrics_url: str, timeout_s: float = 120
) -> None:
    """Until the engine's own gauges show a request running or waiting in it (the engine runs)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if await _in_engine(session, metrics_url) >= 1:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"the load never put a request in the engine in {timeout_s:g} s")


async def _in_engine(session: aiohttp.ClientSession, metrics_url: str) -> float:
    """Requests running plus waiting, as the engine's own gauges say now."""
    async with session.get(metrics_url) as r:
        return sum(float(v) for v in _IN_ENGINE.findall(await r.text()))


async def _stop_holding_requests(
    core: psutil.Process, session: aiohttp.ClientSession, metrics_url: str, attempts: int = 60
) -> float:
    """Stop the engine core so that it freezes with requests in it; the time of that stop.

    A check before the stop cannot promise it: the tiny model finishes a request in under a second,
    and between a check that saw one running and the SIGSTOP the engine can drain (one CI run froze
    it with 0 in it after a check that saw 1). So the frozen gauges are read once the stats sent
    before the stop have reached the API server; where they show nothing in the engine, it runs
    again until it holds requests and is stopped again."""
    for attempt in range(1, attempts + 1):
        await _until_engine_holds_requests(session, metrics_url)
        core.send_signal(signal.SIGSTOP)
        stopped = time.time()
        await asyncio.sleep(STEP)  # the last stats the core sent reach the API server's gauges
        if await _in_engine(session, metrics_url) >= 1:
            print(f"the engine froze holding requests at stop {attempt}")
            return stopped
        core.send_signal(signal.SIGCONT)
    raise AssertionError(f"the engine drained before each of {attempts} stops")


async def _scraper(collector: EngineCollector, out: list, stop: asyncio.Event) -> None:
    while not stop.is_set():
        got = await collector.collect()
        out.extend(got.samples)
        await asyncio.sleep(STEP)


def _gen_points(samples: list, name: str = GEN) -> list[tuple[float, float]]:
    return sorted((s.timestamp, sum(x.value for x in group)) for s, group in _by_scrape(samples, name))


def _by_scrape(samples: list, name: str) -> list:
    """(a sample, every sample of `name` with its timestamp): one entry per scrape."""
    groups: dict[float, list] = {}
    for s in samples:
        if s.name == name:
            groups.setdefault(s.timestamp, []).append(s)
    return [(g[0], g) for g in groups.values()]


def _last_progress(samples: list, until: float) -> tuple[float, str]:
    """The first scrape that showed the final value of the last progress counter to move before
    `until`, and its name."""
    last = (0.0, "")
    for name in PROGRESS:
        points = [(t, v) for t, v in _gen_points(samples, name) if t <= until]
        changed = [t for (_, a), (t, b) in zip(points, points[1:], strict=False) if b != a]
        if changed and changed[-1] > last[0]:
            last = (changed[-1], name)
    return last


def _print_phase_series(samples: list, m: dict[str, float]) -> None:
    """Every series the rule reads, from 30 s before the hang, relative to the run's start."""
    for name in ("engine_requests_running", "engine_requests_waiting", *PROGRESS):
        points = [(round(t - m["start"], 1), v) for t, v in _gen_points(samples, name) if t >= m["hang"] - 30]
        print(name, points)


def _last_empty(samples: list, until: float) -> float:
    """The last scrape before `until` whose gauges showed no request running or waiting (0: none)."""
    running = dict(_gen_points(samples, "engine_requests_running"))
    waiting = dict(_gen_points(samples, "engine_requests_waiting"))
    return max((t for t, v in running.items() if t <= until and v + waiting.get(t, 0.0) < 1), default=0.0)


def _widest_gap(samples: list, start: float, end: float) -> float:
    """The longest interval between two scrapes in [start, end]: the data's own sampling step."""
    times = [t for t, _ in _gen_points(samples) if start <= t <= end]
    return max((b - a for a, b in zip(times, times[1:], strict=False)), default=STEP)


async def _wait_progress(samples: list, since: float, timeout_s: float = 300.0) -> None:
    """Until the scrapes after `since` show generated tokens rising."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        pts = [p for p in _gen_points(samples) if p[0] >= since]
        if len(pts) >= 2 and pts[-1][1] > pts[0][1]:
            return
        await asyncio.sleep(1.0)
    raise AssertionError("the load never produced tokens")


async def _run(srv: VllmServer) -> dict:
    core = _engine_core(srv.proc.pid)
    collector = EngineCollector(AgentConfig(targets=[Target(srv.metrics_url, "vllm", "vllm-0")], timeout_s=30.0))
    samples: list = []
    marks: dict[str, float] = {}
    health_during_hang: list[int] = []
    stop_scrape, stop_load = asyncio.Event(), asyncio.Event()
    done: list[int | str] = []  # each request's status, or the client error it met
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(force_close=True)) as session:
        scraper = asyncio.create_task(_scraper(collector, samples, stop_scrape))
        try:
            marks["start"] = time.time()
            await asyncio.sleep(IDLE_S)
            marks["idle_end"] = time.time()
            clients = [
                asyncio.create_task(_client(session, srv.url, f"c{i}", stop_load, done, 540 + 20 * i))
                for i in range(CLIENTS)
            ]
            await _wait_progress(samples, marks["idle_end"])
            marks["slow_start"] = time.time()
            while time.time() - marks["slow_start"] < SLOW_S:
                core.send_signal(signal.SIGSTOP)
                await asyncio.sleep(STOP_S)
                core.send_signal(signal.SIGCONT)
                await asyncio.sleep(RUN_S)
            # the hang starts while the engine holds requests (its gauges freeze at the last step's
            # values: stopped between a finish and the next arrival, it would report none in it)
            marks["slow_end"] = time.time()
            try:
                marks["hang"] = await _stop_holding_requests(core, session, srv.metrics_url)
            except AssertionError as e:  # what the load saw, for a failure's record
                raise AssertionError(f"{e}; the clients' last answers: {done[-8:]}") from e
            while time.time() - marks["hang"] < HUNG_S:
                async with session.get(srv.url + "/health") as r:
                    health_during_hang.append(r.status)
                await asyncio.sleep(10.0)
            marks["end"] = time.time()
        finally:
            core.send_signal(signal.SIGCONT)
            stop_load.set()
            stop_scrape.set()
            await scraper
            await collector.close()
        await asyncio.wait_for(asyncio.gather(*clients), timeout=600)
    return {"samples": samples, "marks": marks, "health": health_during_hang, "done": done}


def _verdict(rule, samples: list, start: float, end: float):
    frame = frame_from_samples(samples, start, end, STEP)
    return diagnose(frame, rules=[rule], params={"engine_hung": PARAMS}, source="test", workers=1)


def test_engine_hung_fires_on_a_stopped_vllm_engine_core_and_not_on_idle_or_slow():
    rule = next(r for r in read_rules() if r.id == "engine_hung")
    with VllmServer(CONFIG) as srv:
        got = asyncio.run(_run(srv))
    samples, m = got["samples"], got["marks"]
    gen = _gen_points(samples)
    _print_phase_series(samples, m)  # what the rule read around the hang, for a failure's record
    start = m["start"]
    timeline = [(round(t - start, 1), v) for t, v in gen]
    # the phases are what they claim: progress in every slow cycle's reach, none during the hang
    slow = [(t, v) for t, v in gen if m["slow_start"] <= t <= m["slow_end"]]
    assert slow and slow[-1][1] > slow[0][1], timeline
    assert set(got["health"]) == {200}, got["health"]  # the API server calls the hung engine healthy
    probes = {s.value for s in samples if s.name == HEALTH_SIGNAL and s.timestamp > m["hang"]}
    assert probes == {1.0}, probes  # and so does kvscope's own /health probe
    hung_values = {v for t, v in gen if t > m["hang"] + 2 * STEP}
    assert len(hung_values) == 1, timeline
    # and the engine stopped with requests in it (what a hang with traffic is; not the rule's doing)
    running = dict(_gen_points(samples, "engine_requests_running"))
    waiting = dict(_gen_points(samples, "engine_requests_waiting"))
    held = [running[t] + waiting.get(t, 0.0) for t in running if t > m["hang"] + 2 * STEP]
    assert held and min(held) >= 1, ("the engine stopped with no request in it", held)

    verdicts = {}
    for phase, end in (("idle", m["idle_end"]), ("slow", m["slow_end"]), ("hung", m["end"])):
        d = _verdict(rule, samples, start, end)
        found = [f for f in [d.likely_cause, *d.competing, *d.other] if f is not None]
        verdicts[phase] = found
    print(
        json.dumps({k: [f.summary for f in v] for k, v in verdicts.items()}),
        "marks",
        json.dumps({k: round(v - start, 1) for k, v in m.items()}),
    )
    assert [f.rule_id for f in verdicts["idle"]] == EXPECTED["idle"], timeline
    assert [f.rule_id for f in verdicts["slow"]] == EXPECTED["slow"], timeline
    assert [f.rule_id for f in verdicts["hung"]] == EXPECTED["hung"], timeline
    finding = verdicts["hung"][0]
    assert finding.severity == "critical" and finding.active
    # the first scrape that showed the final value of the last counter to move: the last progress
    # seen (the prompt, step and inter-token counters can move a scrape after the generated tokens)
    last_progress, moved = _last_progress(samples, finding.since)
    # the rule's own conditions: every progress counter flat over `stall`, and requests in the engine
    # at every sample of `stall` and of the `max_sample_interval` before it (the stall observed from
    # its start). vLLM's gauges can read 0 in the engine while it is stopped in the slow phase, so
    # the last such sample can hold the onset back by up to max_sample_interval
    stall = parse_duration(PARAMS["stall"])
    before = parse_duration(PARAMS["max_sample_interval"])
    last_empty = _last_empty(samples, finding.since)
    earliest = max(last_progress + stall, last_empty + stall + before)
    hold = parse_duration(PARAMS["for"])
    # two of the data's own steps: a loaded box stretches the scrape interval beyond STEP
    step = max(STEP, _widest_gap(samples, last_progress - STEP, finding.since))
    print(
        f"onset {finding.since - start:.1f}s, last progress ({moved}) {last_progress - start:.1f}s, last sample"
        f" with nothing in the engine {last_empty - start:.1f}s, hang {m['hang'] - start:.1f}s: the rule's"
        f" conditions hold from {earliest - start:.1f}s, then `for` {hold:.0f}s + 2 scrape steps of {step:.1f}s"
    )
    assert m["slow_end"] - STEP <= finding.since <= earliest + hold + 2 * step, (
        finding.since - start,
        last_progress - start,
        moved,
        last_empty - start,
        earliest - start,
        step,
    )
    health = next(e for e in finding.evidence if e.key == "health")
    assert health.value == 1.0, finding.evidence
