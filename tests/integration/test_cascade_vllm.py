"""A real KV-pressure run against vLLM on CPU produces the 002 §7.4 cascade in order.

The load is shaped by the engine's state, not by the client's clock: long requests until the
scrapes show the pool full, then a wave of requests that all arrive to it. An earlier version
trickled arrivals every 100 ms and parsed every scrape on the client's event loop; on a loaded
2-core host that loop fell behind (scrapes up to ~1.8 s apart, arrivals ~0.4 s apart on
average), the warmed tiny model served each late arrival at once, and no queue lasted 1 s
(docs/requests.md §5).
"""

import asyncio
import json
import secrets
import statistics
import time

import aiohttp
import pytest

from kvscope.agent.derive.cascade import STAGES, CascadeConfig, evaluate_cascade, render_cascade_samples
from kvscope.agent.normalize.dialect import normalize
from kvscope.agent.scrape.exposition import parse_exposition
from testbed.tenants import synthetic_text
from testbed.tiny_model import SERVED_NAME

pytestmark = pytest.mark.vllm

# On a shared 2-core CPU, batching alone moves TTFT by tens of ms: the symptom threshold is 3x the
# pre-pressure baseline and at least 250 ms above it. A queue is requests waiting in consecutive
# scrapes spanning 1 s, not an arrival waiting for the next engine step. By time, not by a count
# of scrapes: a CPU-starved API server answers /metrics late (4 s apart seen at load 9), and
# 5 scrapes then meant a 20 s queue.
CFG = CascadeConfig(ttft_factor=3.0, ttft_min_delta_s=0.25, queue_samples=2, queue_min_s=1.0)
BLIND_S = 3.0  # a scrape gap after the wave longer than this (nominal 0.2 s) leaves the queue unobservable
PROMPT_WORDS, LONG_OUTPUT = 300, 650  # ~950 tokens = ~30 of the pool's 128 blocks at full length


def _canonical(scrapes: list[tuple[float, str]]) -> list:
    """Canonical samples of (scrape time, exposition text) pairs."""
    out = []
    for t, text in scrapes:
        out.extend(normalize(parse_exposition(text), "vllm", {"instance": "vllm-0"}, timestamp=t).samples)
    return out


async def _scrape_until(session, url, stop, out, interval_s=0.2):
    """Append (time, text) of /metrics every `interval_s`. Parsing waits until after the run: at
    5 scrapes/s it took most of a loaded host's client CPU and delayed the arrivals it measured."""
    while not stop.is_set():
        t = time.time()
        async with session.get(url) as r:
            out.append((t, await r.text()))
        await asyncio.sleep(interval_s)


async def _complete(session, base, key, words, max_tokens):
    """(status, sent, answered): one completion; the times are the client's wall clock."""
    body = {
        "model": SERVED_NAME,
        "prompt": synthetic_text(key, words),
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    t = time.time()
    async with session.post(base + "/v1/completions", json=body) as r:
        await r.read()
        return r.status, t, time.time()


# the signals of the cascade's root (stage 1): KV usage, evictions and preemptions
ROOT_SIGNALS = frozenset(
    {
        "engine_kv_cache_usage_ratio",
        "engine_preemptions_total",
        "engine_kv_evicted_tokens_total",
        "kv_blocks_evicted_recomputed_total",
    }
)


async def _root_shown(scrapes, since, poll_s=0.2):
    """Return the onset time once the scrapes from index `since` on show the cascade's root
    (stage 1: pool full or evicting). Parses each new scrape once and keeps only the root's
    signals, so a check costs the loop a few ms, not a growing re-read of every sample."""
    samples, seen = [], since
    while True:
        new, seen = scrapes[seen:], len(scrapes)
        samples += [s for s in _canonical(new) if s.name in ROOT_SIGNALS]
        report = evaluate_cascade(samples, CFG).get("vllm-0")
        if report is not None and 1 in report.onsets:
            return report.onsets[1]
        await asyncio.sleep(poll_s)


async def _pressure(session, base, root_shown, nonce, fill_batch=4, max_fill=64, wave=32, fill_timeout_s=180.0):
    """Three phases, each started by the engine's state rather than by a clock:

    1. baseline: six requests of the same prompt shape with 8 output tokens, one at a time
       (TTFT = one 300-token prefill, nothing queued);
    2. fill: long requests (300-word prompts, 650 output tokens), `fill_batch` every 200 ms, until
       the scrapes show the pool full (at most `max_fill`, `fill_timeout_s`). They fit the
       128-block pool at first and overflow it as they decode. Batches, not one every 50 ms: a
       client the host starves of CPU (event loop > 0.3 s late in 48 of 180 heartbeats in one
       run) still adds a batch per wake-up, and 4 x 300-token prefills in one step is mild
       contention. How many it takes depends on how fast this client sends and the engine serves
       (11-64 seen), so the phase ends on the engine's state;
    3. a `wave` of long requests at once: they arrive to a full pool, so they wait. The pool holds
       about 4 requests at full length, so 32 is 8 pool-fulls of work: the queue outlasts the 1 s
       criterion even on an idle host and a warmed server.

    Prompts start with a per-run nonce, so no block can come from an earlier test's prefix cache.
    `root_shown()` is a coroutine that returns the root's onset once it shows. Returns (status, sent, answered) per request, when the root showed (None: not within
    `fill_timeout_s`) and when the wave was sent.
    """
    answered = [await _complete(session, base, f"{nonce}/warm/{i}", PROMPT_WORDS, 8) for i in range(6)]
    root = asyncio.create_task(root_shown())
    tasks, t0 = [], time.time()
    while not root.done() and time.time() - t0 < fill_timeout_s:
        for _ in range(min(fill_batch, max_fill - len(tasks))):
            tasks.append(
                asyncio.create_task(_complete(session, base, f"{nonce}/fill/{len(tasks)}", PROMPT_WORDS, LONG_OUTPUT))
            )
        await asyncio.sleep(0.2)
    root_t = root.result() if root.done() else None
    root.cancel()
    wave_t = time.time()
    if root_t is not None:
        tasks += [
            asyncio.create_task(_complete(session, base, f"{nonce}/wave/{i}", PROMPT_WORDS, LONG_OUTPUT))
            for i in range(wave)
        ]
    return answered + list(await asyncio.gather(*tasks)), root_t, wave_t


def _run_pressure(srv):
    async def main():
        scrapes, stop = [], asyncio.Event()
        timeout = aiohttp.ClientTimeout(total=900)
        # a fresh connection per request: a keep-alive connection the server is closing just as a
        # request reuses it fails the write ("Cannot write to closing transport")
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as s:
            scraper = asyncio.create_task(_scrape_until(s, srv.metrics_url, stop, scrapes))
            await asyncio.sleep(1.0)  # a healthy baseline first
            root_shown = lambda: _root_shown(scrapes, len(scrapes))  # noqa: E731 - from the scrapes after the warm-up
            requests, root_t, wave_t = await _pressure(s, srv.url, root_shown, secrets.token_hex(4))
            await asyncio.sleep(0.5)
            stop.set()
            await scraper
        return scrapes, requests, root_t, wave_t

    return asyncio.run(main())


def _timeline(samples, requests, t0) -> str:
    """`seconds kv running waiting preemptions client-in-flight` per scrape: the evidence a failure
    message carries (the last column: requests this client had sent and not had answered)."""
    cols = (
        "engine_kv_cache_usage_ratio",
        "engine_requests_running",
        "engine_requests_waiting",
        "engine_preemptions_total",
    )
    rows: dict[float, dict[str, float]] = {}
    for s in samples:
        if s.name in cols:
            rows.setdefault(s.timestamp, {})[s.name] = s.value
    return "; ".join(
        f"{t - t0:.1f} "
        + " ".join(f"{r.get(c, float('nan')):.4g}" for c in cols)
        + f" {sum(a <= t < b for _, a, b in requests)}"
        for t, r in sorted(rows.items())
    )


def test_kv_pressure_run_produces_an_ordered_cascade(vllm_small_kv):
    scrapes, requests, root_t, wave_t = _run_pressure(vllm_small_kv)
    assert {status for status, _, _ in requests} == {200}
    samples = _canonical(scrapes)
    report = evaluate_cascade(samples, CFG)["vllm-0"]
    times = [t for t, _ in scrapes]
    t0 = times[0]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    print(
        json.dumps({STAGES[k]: round(v - t0, 2) for k, v in report.onsets.items()}),
        f"fill {len(requests) - 6 - 32 * (root_t is not None)} wave {wave_t - t0:.2f}s lead {report.lead_time_s}",
        f"scrapes {len(times)} gap median {statistics.median(gaps):.2f}s max {max(gaps):.2f}s",
        json.dumps(report.evidence),
    )
    print("timeline (s kv running waiting preemptions client-in-flight):", _timeline(samples, requests, t0))
    assert root_t is not None, (
        "the pool never filled within 180 s of fill requests",
        report.evidence,
        _timeline(samples, requests, t0),
    )
    after_wave = [b - a for a, b in zip(times, times[1:], strict=False) if b >= wave_t]
    blind_s = max(after_wave, default=0.0)
    assert {1, 2} <= set(report.onsets) and report.onsets[1] <= report.onsets[2], (
        report.onsets,
        report.evidence,
        _timeline(samples, requests, t0),
    )
    if not {3, 4} <= set(report.onsets) and blind_s > BLIND_S:
        # The engine's own /metrics went unanswered for seconds while the wave arrived: its API
        # server shares the 2 cores with the engine core and the client, and answers scrapes only
        # between tokenizing dozens of long prompts. A queue that came and went inside such a gap
        # cannot be seen by any scraper; that is a harness limit on this box, not a detector
        # verdict. Reported with the numbers; the root and eviction stages were asserted just above.
        pytest.xfail(
            f"/metrics unanswered for {blind_s:.1f} s after the wave (> {BLIND_S} s): "
            f"stages seen {sorted(report.onsets)}; {_timeline(samples, requests, t0)}"
        )
    # every stage shows: the root (KV full), eviction/preemption, a queue lasting 1 s, and TTFT
    # 3x and 250 ms over its baseline while requests queue
    assert set(report.onsets) == {1, 2, 3, 4}, (report.onsets, report.evidence, _timeline(samples, requests, t0))
    o = report.onsets
    # An onset is known only to within one scrape: the condition began somewhere in the interval
    # before the scrape that first showed it. So "the pool was full before the symptom" allows the
    # KV onset to trail by at most the interval that ended at it (on a loaded box scrapes come
    # late: the real interval, not the nominal 200 ms).
    tol = o[1] - max((t for t in times if t < o[1]), default=o[1])
    assert o[1] <= o[2]  # evicting implies a full pool: never before the root
    assert o[1] <= o[3] + tol  # a full pool is what makes arrivals wait ...
    assert o[1] <= o[4] + tol  # ... and the root precedes the symptom
    assert o[3] <= o[4]  # the symptom counts only while requests queue
    assert o[1] <= wave_t  # the wave was sent once the scrapes showed the root
    assert report.evidence["evictions_window_total"] > 0
    assert report.evidence["ttft_last_s"] is not None
    assert "gpu_utilization_ratio" in report.signals_missing  # CPU engine: symptom from TTFT alone
    names = {s.name for s in render_cascade_samples({"vllm-0": report})}
    assert names == {
        "engine_cascade_stage_code",
        "engine_cascade_stage_onset_timestamp_seconds",
        "engine_cascade_lead_seconds",
    }
