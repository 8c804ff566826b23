"""The live agent's cascade hook on a real KV-pressure run against vLLM on CPU.

The agent (its own collectors and derive hooks, agent/derive/hooks.py) scrapes the shared
small-KV server while test_cascade_vllm.py's load runs, started by what the agent's /metrics
shows: the fill phase ends once `kvscope_engine_cascade_stage_code` reads the root (>= 1). After
every cycle the test reads the stage code from the agent's /metrics and keeps the cycle's
engine samples; afterwards the offline detector (`evaluate_cascade`, the agent's default
thresholds) over the samples up to each cycle must give the stage the live /metrics said then.
"""

import asyncio
import json
import secrets

import aiohttp
import pytest
from agentharness import fetch_metrics, running_agent, value
from test_cascade_vllm import _pressure

from kvscope.agent.derive.cascade import CASCADE_SIGNALS, STAGES, evaluate_cascade

pytestmark = pytest.mark.vllm
INSTANCE = "vllm-0"


async def _cycles(rt, url, stop, out, interval_s=0.3):
    """Run agent cycles until `stop`; append (cycle's cascade samples, stage code on /metrics, why
    the cycle's engine scrape failed: "" when it did not) per cycle."""
    while not stop.is_set():
        await rt.run_cycle()
        _, expo = await fetch_metrics(url)
        samples = [s for s in rt.state.samples.get("engine", []) if s.name in CASCADE_SIGNALS]
        down = [h.reason or "down" for h in rt.state.health.get("engine", []) if h.target and not h.up]
        out.append((samples, value(expo, "kvscope_engine_cascade_stage_code", instance=INSTANCE), ",".join(down)))
        await asyncio.sleep(interval_s)


async def _root_on_metrics(out, poll_s=0.2):
    """The time of the first cycle whose /metrics showed the root (stage code >= 1)."""
    while True:
        hit = next((s[0].timestamp for s, code, _ in out if code is not None and code >= 1 and s), None)
        if hit is not None:
            return hit
        await asyncio.sleep(poll_s)


def _first_rise(samples, name):
    """The time of the first sample at which the counter `name` (summed over its series) rose, read
    from the raw samples; None when it never did."""
    totals = {}
    for x in samples:
        if x.name == name:
            totals[x.timestamp] = totals.get(x.timestamp, 0.0) + x.value
    points = sorted(totals.items())
    return next((t for (_, a), (t, b) in zip(points, points[1:], strict=False) if b > a), None)


def _run(srv):
    async def main():
        doc = {"targets": [{"url": srv.metrics_url, "job": "vllm", "labels": {"instance": INSTANCE}}]}
        cycles, stop = [], asyncio.Event()
        connector = aiohttp.TCPConnector(force_close=True)  # see test_cascade_vllm._run_pressure
        async with (
            running_agent(doc) as (rt, url),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900), connector=connector) as s,
        ):
            agent = asyncio.create_task(_cycles(rt, url, stop, cycles))
            await asyncio.sleep(1.5)  # a healthy baseline first
            requests, root_t, _ = await _pressure(s, srv.url, lambda: _root_on_metrics(cycles), secrets.token_hex(4))
            await asyncio.sleep(1.0)
            stop.set()
            await agent
            dropped = dict(rt.state.dropped)
        return cycles, requests, root_t, dropped

    return asyncio.run(main())


def test_live_agent_exports_the_stage_the_offline_detector_reaches(vllm_small_kv):
    cycles, requests, root_t, dropped = _run(vllm_small_kv)
    assert {status for status, _, _ in requests} == {200}
    assert root_t is not None, "the agent's /metrics never showed the root within 180 s of fill requests"
    seen, live, offline, failed = [], [], [], {}
    for i, (samples, code, down) in enumerate(cycles):
        seen += samples
        report = evaluate_cascade(seen).get(INSTANCE)
        live.append(code)
        # a cycle whose engine scrape failed (the API server of a loaded box answers /metrics past
        # the scrape timeout, or the whole collection past the runtime's collect timeout: then the
        # target reads down with reason collect_timeout) has no samples of the instance: the hook
        # exports nothing for it then (absent, never a stale stage), so the expected code is absent
        offline.append(None if report is None or not samples else float(report.stage))
        if down:
            failed[i] = down
    # a cycle without the instance's samples is one whose scrape the agent reports as failed, and
    # the other way round: the absent codes come from failed scrapes, not from a silent hook
    assert {i for i, (samples, _, _) in enumerate(cycles) if not samples} == set(failed), (failed, live)
    final = evaluate_cascade(seen)[INSTANCE]
    t0 = seen[0].timestamp
    print(
        f"{len(cycles)} cycles; live stage codes {live}; failed scrapes {failed}",
        json.dumps({STAGES[k]: round(v - t0, 2) for k, v in final.onsets.items()}),
        json.dumps(final.evidence),
    )
    assert live == offline  # the same stage, cycle by cycle, over the same samples
    shown = [code for code in live if code is not None]  # the cycles whose scrape succeeded
    assert max(shown) >= 2 and {1, 2} <= set(final.onsets)  # the pool filled and requests were preempted
    # requests were preempted (vLLM's counter rose). Stage 2 is shown by whichever comes first, as
    # kv_pressure_cascade reads it: the counter's rise, or before it the queues holding (pool full,
    # requests waiting, the batch not growing); on a loaded box the queues can come first (ci20)
    rose = _first_rise(seen, "engine_preemptions_total")
    assert rose is not None and final.evidence["evictions_window_total"] > 0
    if final.evicting_from == "counter":
        assert final.onsets[2] == rose
    else:
        assert final.evicting_from == "queues" and final.onsets[2] < rose, (final.onsets, rose)
    assert not [k for k in dropped if k[0] == "derive_cascade"]  # nothing skipped on real data
