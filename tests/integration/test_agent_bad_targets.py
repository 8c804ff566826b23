"""The agent against bad targets served by real local aiohttp servers.

Every kind of bad input gets its own server (its own instance), the agent scrapes them all
concurrently, keeps running, and its own /metrics says why each one is down or lossy.
Also: the canonical round trip through /metrics, the golden /metrics, and the JSON API.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
from agentharness import fetch_metrics, fetch_text, running_agent, target_server, value
from aiohttp import web

from kvscope.agent.collectors.base import Collection
from kvscope.agent.normalize.dialect import normalize
from kvscope.agent.runtime import AgentState
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.agent.serve.export import render_metrics
from kvscope.agent.store.sqlite import MEMORY, SqliteStore
from kvscope.core.signals import load_catalog
from testbed.procs import free_port
from testbed.prometheus import require_binaries

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "scrapes"
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "agent-e2e.prom"
VLLM = (FIXTURES / "vllm-0.32.0-cpu-after-load.txt").read_text()
DCGM = (FIXTURES / "dcgm-exporter-4.5.3-constructed-2gpu.txt").read_text()
# sglang-router 0.3.2's /engine_metrics in front of two stub workers serving VLLM (real router)
ROUTER = (FIXTURES / "sglang-router-0.3.2-engine_metrics-2x-vllm-0.32.txt").read_text()
ROUTER_WORKERS = ("127.0.0.1:57947", "127.0.0.1:52251")
# a vLLM payload whose every family is one the catalog does not map (real lines of the capture)
UNMAPPED = "".join(
    ln + "\n"
    for ln in VLLM.splitlines()
    if ln.startswith(("vllm:request_params_n", "# HELP vllm:request_params_n", "# TYPE vllm:request_params_n"))
)
RUNNING = 'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0\n'
WAITING = 'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 0.0\n'
KV_USAGE = 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.0\n'
QUERIES = 'vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama"} 16028.0\n'
assert all(line in VLLM for line in (RUNNING, WAITING, KV_USAGE, QUERIES)), "fixture changed"


def text(body: str):
    async def handler(request):
        return web.Response(text=body, content_type="text/plain")

    return handler


async def huge(request):
    """50 MB, streamed without Content-Length."""
    resp = web.StreamResponse()
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    chunk = b'vllm:num_requests_running{engine="0"} 1\n' * 25_000
    try:
        for _ in range(50_000_000 // len(chunk)):
            await resp.write(chunk)
    except ConnectionResetError:
        pass  # the agent hung up at its byte cap, as it should
    return resp


async def hang(request):
    await asyncio.sleep(60)
    return web.Response(text=VLLM)


async def slow(request):
    await asyncio.sleep(0.2)
    return web.Response(text=VLLM)


async def unavailable(request):
    return web.Response(status=503, text="engine starting")


def resetting():
    """Serves the capture, then the same engine after a restart (a counter went down)."""
    calls = {"n": 0}

    async def handler(request):
        calls["n"] += 1
        body = VLLM if calls["n"] == 1 else VLLM.replace(QUERIES, QUERIES.replace("16028.0", "12.0"))
        return web.Response(text=body)

    return handler


SCENARIOS = {
    "good": text(VLLM),
    "malformed": text(VLLM.replace(RUNNING, RUNNING + "this is not a metric\nvllm:num_requests_waiting{engine=0} 3\n")),
    "truncated": text(VLLM[: len(VLLM) // 2].rstrip("\n")[:-3]),
    "nonfinite": text(
        VLLM.replace(KV_USAGE, KV_USAGE.replace("0.0", "NaN")).replace(WAITING, WAITING.replace("0.0", "+Inf"))
    ),
    "duplicate": text(VLLM + RUNNING),
    "huge": huge,
    "slow": slow,
    "hang": hang,
    "unavailable": unavailable,
    "reset": resetting(),
    "unknown": text("# TYPE node_load1 gauge\nnode_load1 0.52\n"),
    "dcgm": text(DCGM),
    "unmapped": text(UNMAPPED),
    "router": text(ROUTER),
    "label_limit": text(VLLM),  # served whole; its target sets label_limit 2 (histograms carry 3)
}
# 60k series of one family behind a real capture: past the default sample_limit (50k). Finding that
# out means parsing the first 50k samples (~0.5 s of CPU), and that parse must end within what is left
# of scrape.timeout_s after the fetch, on the wall clock (docs/collectors.md); a 2-core box at load
# ~20 gives this process about a tenth of a core, and the same parse then took 1.7-4.3 s, so under the
# bad-target run's 2 s timeout it failed as parse_timeout. Its own agent below gives it 30 s: a bound
# it does not wait for (the target answers at once), 50x that CPU time.
MANY_SERIES = VLLM + "".join(f'vllm:lora_requests_info{{id="{i}"}} 1\n' for i in range(60_000))


def agent_doc(base: str, down_port: int) -> dict:
    targets = [{"url": f"{base}/{name}", "job": name, "labels": {"instance": name}} for name in SCENARIOS]
    targets[list(SCENARIOS).index("label_limit")]["label_limit"] = 2
    targets.append({"url": f"http://127.0.0.1:{down_port}/metrics", "job": "down", "labels": {"instance": "down"}})
    # The timeout only has to end the hanging target's scrape; every other target answers at once. At
    # 2 s a 2-core box at load ~8 could not fetch and parse the over-cap body in time (`huge` read
    # as a timeout on one cycle of two), so it is 10 s: well above any honest target's fetch and
    # parse under load, and the hang still ends as a timeout (each cycle waits for it once).
    return {"scrape": {"interval_s": 20, "timeout_s": 10}, "targets": targets}


async def bad_targets_run(cycles: int = 2):
    routes = {f"/{name}": handler for name, handler in SCENARIOS.items()}
    async with (
        target_server(routes) as base,
        running_agent(agent_doc(base, free_port()), SqliteStore(MEMORY, background=False)) as (rt, url),
    ):
        for _ in range(cycles):
            await rt.run_cycle()
        body, expo = await fetch_metrics(url)
        _, health = await fetch_text(url + "/api/v1/health")
        _, ready = await fetch_text(url + "/-/ready")
        return body, expo, json.loads(health), ready


@pytest.fixture(scope="module")
def bad_run():
    return asyncio.run(bad_targets_run())


async def many_series_run(cycles: int = 2):
    """The MANY_SERIES target alone under the default limits, with a timeout its parse fits in."""
    async with target_server({"/many_series": text(MANY_SERIES)}) as base:
        target = {"url": f"{base}/many_series", "job": "many_series", "labels": {"instance": "many_series"}}
        doc = {"scrape": {"interval_s": 60, "timeout_s": 30}, "targets": [target]}
        async with running_agent(doc, SqliteStore(MEMORY, background=False)) as (rt, url):
            for _ in range(cycles):
                await rt.run_cycle()
            _, expo = await fetch_metrics(url)
            return expo


def assert_target_status(expo, instance: str, up: int, reason: str) -> None:
    """kvscope_target_up and the status reason; a down target also counts that reason once per
    cycle (2) and keeps no series."""
    assert value(expo, "kvscope_target_up", instance=instance) == up
    assert value(expo, "kvscope_target_status", instance=instance, reason=reason) == 1
    if not up:
        assert value(expo, "kvscope_scrape_errors_total", instance=instance, reason=reason) == 2
        assert value(expo, "kvscope_target_series", instance=instance) == 0


@pytest.mark.parametrize(
    "instance, up, reason",
    [
        ("good", 1, "ok"),
        ("slow", 1, "ok"),
        ("malformed", 1, "ok"),
        ("truncated", 1, "ok"),
        ("nonfinite", 1, "ok"),
        ("duplicate", 1, "ok"),
        ("reset", 1, "ok"),
        ("dcgm", 1, "ok"),
        ("huge", 0, "body_too_large"),
        ("hang", 0, "timeout"),
        ("unavailable", 0, "http_503"),
        ("unknown", 0, "unknown_engine"),
        ("down", 0, "connection_refused"),
        ("unmapped", 0, "no_canonical_series"),
        ("router", 1, "aggregated_workers"),
        ("label_limit", 0, "label_limit_exceeded"),
    ],
)
def test_agent_metrics_say_why_each_target_is_down(bad_run, instance, up, reason):
    _, expo, _, _ = bad_run
    assert_target_status(expo, instance, up, reason)


def test_agent_metrics_say_the_many_series_target_is_past_the_default_sample_limit():
    assert_target_status(asyncio.run(many_series_run()), "many_series", 0, "sample_limit_exceeded")


@pytest.mark.parametrize(
    "instance, reason, count",
    [
        ("malformed", "malformed_line", 2),
        ("malformed", "malformed_labels", 2),
        ("truncated", "truncated", 2),
        ("nonfinite", "non_finite", 4),
        ("duplicate", "duplicate_series", 2),
    ],
)
def test_agent_counts_dropped_lines_by_reason(bad_run, instance, reason, count):
    _, expo, _, _ = bad_run
    assert value(expo, "kvscope_samples_dropped_total", instance=instance, reason=reason) == count


def test_good_data_of_lossy_targets_is_kept_and_bad_values_are_absent_not_zero(bad_run):
    _, expo, _, _ = bad_run
    for inst in ("good", "slow", "malformed", "duplicate", "reset"):
        assert value(expo, "kvscope_engine_kv_cache_usage_ratio", instance=inst) == 0.0
    assert value(expo, "kvscope_engine_kv_cache_usage_ratio", instance="nonfinite") is None
    assert value(expo, "kvscope_engine_requests_waiting", instance="nonfinite") is None
    assert value(expo, "kvscope_engine_requests_running", instance="nonfinite") == 0.0
    assert value(expo, "kvscope_engine_requests_running", instance="malformed") == 0.0
    assert value(expo, "kvscope_gpu_memory_used_bytes", instance="dcgm", gpu="1") == 76463 * 2**20
    good = value(expo, "kvscope_target_series", instance="good")
    assert good > 300 and value(expo, "kvscope_target_series", instance="truncated") < good


def test_a_routers_engine_metrics_stay_one_series_set_per_worker(bad_run):
    """sglang-router's /engine_metrics labels each worker's series with worker_addr: the agent
    keeps the workers apart (instance = the worker's host:port) instead of summing their
    counters into the router's instance; both workers served the same capture."""
    _, expo, _, _ = bad_run
    for worker in ROUTER_WORKERS:
        assert value(expo, "kvscope_engine_prefix_cache_queries_tokens_total", instance=worker) == 16028.0
        assert value(expo, "kvscope_engine_requests_running", instance=worker) == 0.0
    assert value(expo, "kvscope_engine_prefix_cache_queries_tokens_total", instance="router") is None
    assert value(expo, "kvscope_target_series", instance="router") > 600


def test_agent_counts_a_counter_reset_once(bad_run):
    _, expo, _, _ = bad_run
    assert value(expo, "kvscope_target_resets_total", instance="reset") == 1
    assert value(expo, "kvscope_target_resets_total", instance="good") is None
    assert value(expo, "kvscope_engine_prefix_cache_queries_tokens_total", instance="reset") == 12.0


def test_agent_reports_engine_facts_and_stays_ready(bad_run):
    _, expo, health, ready = bad_run
    info = [dict(s.labels) for s in expo.samples if s.name == "kvscope_engine_info"]
    good = next(i for i in info if i["instance"] == "good")
    assert (good["engine"], good["block_size"], good["enable_prefix_caching"], good["cache_dtype"]) == (
        "vllm",
        "32",
        "True",
        "auto",
    )
    assert {i["instance"]: i["engine"] for i in info}["dcgm"] == "dcgm"
    assert value(expo, "kvscope_collector_up", collector="engine") == 1
    assert ready.startswith("ready")
    reasons = {t["instance"]: t["reason"] for t in health["data"]["targets"]}
    assert reasons["hang"] == "timeout" and reasons["good"] == "ok"
    assert health["data"]["cycles"] == 2


@pytest.mark.prometheus
def test_agent_metrics_with_bad_targets_pass_promtool(bad_run, tmp_path):
    body, _, _, _ = bad_run
    assert_promtool_clean(body)


def assert_promtool_clean(body: str) -> None:
    [promtool] = require_binaries("promtool")
    res = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res.stdout + res.stderr


# ------------------------------------------------------------------------------ collector crash


class ExplodingCollector:
    name = "exploding"

    async def collect(self) -> Collection:
        raise RuntimeError("bug in a collector")

    async def close(self) -> None:
        return None


def test_a_collector_that_raises_is_reported_and_the_others_go_on():
    async def main():
        async with target_server({"/metrics": text(VLLM)}) as base:
            doc = {"targets": [{"url": base + "/metrics", "labels": {"instance": "good"}}]}
            from kvscope.agent.collectors.engine import EngineCollector
            from kvscope.agent.config import build_config

            collectors = [ExplodingCollector(), EngineCollector(build_config(doc, environ={}))]
            async with running_agent(doc, collectors=collectors) as (rt, url):
                await rt.run_cycle()
                await rt.run_cycle()
                return await fetch_metrics(url)

    _, expo = asyncio.run(main())
    assert value(expo, "kvscope_collector_up", collector="exploding") == 0
    assert value(expo, "kvscope_collector_status", collector="exploding", reason="exception_RuntimeError") == 1
    assert value(expo, "kvscope_target_up", instance="good") == 1
    assert value(expo, "kvscope_cycles_total") == 2


# ------------------------------------------------------------------------------------ round trip


def test_canonical_samples_round_trip_through_agent_metrics():
    catalog = load_catalog()
    state = AgentState()
    vllm = normalize(parse_exposition(VLLM), "vllm", {"job": "vllm", "instance": "a:1"}, None, catalog)
    dcgm = normalize(parse_exposition(DCGM), "dcgm", {"job": "dcgm", "instance": "b:2"}, None, catalog)
    state.samples = {"engine": vllm.samples + dcgm.samples}
    back = parse_exposition(render_metrics(state, catalog))
    assert not back.issues
    got = {
        (s.name.removeprefix("kvscope_"), s.labels, s.value)
        for s in back.samples
        if s.name.removeprefix("kvscope_") in catalog.series_names()
    }
    want = {(s.name, s.labels, s.value) for s in state.samples["engine"]}
    assert len(want) > 300
    assert got == want


# ---------------------------------------------------------------------------------- golden file


def _mask_durations(body: str) -> str:
    """Durations vary run to run; everything else in the e2e output is deterministic."""
    lines = []
    for line in body.splitlines(keepends=True):
        if not line.startswith("#") and "_duration_seconds" in line.split("{")[0].split(" ")[0]:
            line = line.rsplit(" ", 1)[0] + " 0.0\n"
        lines.append(line)
    return "".join(lines)


async def golden_run() -> str:
    routes = {"/vllm": text(VLLM), "/dcgm": text(DCGM)}
    async with target_server(routes) as base:
        doc = {
            "targets": [
                {"url": base + "/vllm", "job": "vllm", "labels": {"instance": "vllm-0:8000", "node": "gpu-node-1"}},
                {"url": base + "/dcgm", "job": "dcgm", "labels": {"instance": "gpu-node-1:9400"}},
            ]
        }
        async with running_agent(doc) as (rt, url):
            await rt.run_cycle()
            body, _ = await fetch_metrics(url)
    return _mask_durations(body)


@pytest.fixture(scope="module")
def golden_body():
    return asyncio.run(golden_run())


def test_agent_metrics_match_golden(golden_body, update_golden):
    if update_golden:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(golden_body)
    assert GOLDEN.exists(), "run: pytest --update-golden tests/integration/test_agent_bad_targets.py"
    assert golden_body == GOLDEN.read_text(), "agent /metrics changed; review and run: pytest --update-golden"


@pytest.mark.prometheus
def test_golden_agent_metrics_pass_promtool_check_metrics():
    assert_promtool_clean(GOLDEN.read_text())


# ------------------------------------------------------------------------------------- JSON API


def test_samples_api_serves_stored_canonical_samples_and_rejects_bad_requests():
    async def main():
        store = SqliteStore(MEMORY, background=False)
        async with target_server({"/metrics": text(VLLM)}) as base:
            doc = {"targets": [{"url": base + "/metrics", "job": "vllm", "labels": {"instance": "good"}}]}
            async with running_agent(doc, store) as (rt, url):
                await rt.run_cycle()
                await rt.run_cycle()
                store.flush()
                ok = await fetch_text(url + "/api/v1/samples?match=engine_kv_cache_usage_ratio|kvscope_target_up")
                bad = await fetch_text(url + "/api/v1/samples?match=(")
                missing = await fetch_text(url + "/api/v1/samples")
                facts = await fetch_text(url + "/api/v1/facts")
                return ok, bad, missing, facts

    ok, bad, missing, facts = asyncio.run(main())
    assert ok[0] == 200
    series = json.loads(ok[1])["data"]["series"]
    by_name = {s["name"]: s for s in series}
    assert set(by_name) == {"engine_kv_cache_usage_ratio", "kvscope_target_up"}
    kv = by_name["engine_kv_cache_usage_ratio"]
    assert kv["labels"]["instance"] == "good" and len(kv["points"]) == 2
    assert [p[1] for p in by_name["kvscope_target_up"]["points"]] == [1.0, 1.0]
    assert bad[0] == 400 and "match: not a supported pattern" in json.loads(bad[1])["error"]
    assert missing[0] == 400 and "match: required" in json.loads(missing[1])["error"]
    assert json.loads(facts[1])["data"]["good"]["facts"]["block_size"] == "32"


def test_api_refuses_bodies_long_queries_and_bad_ranges():
    import aiohttp

    async def main():
        async with running_agent({}, SqliteStore(MEMORY, background=False)) as (rt, url):
            not_ready = await fetch_text(url + "/-/ready")
            await rt.run_cycle()
            async with aiohttp.ClientSession() as s:
                async with s.get(url + "/api/v1/health", data=b"x" * 100) as r:
                    body = (r.status, await r.json())
            long = await fetch_text(url + "/api/v1/samples?match=" + "a" * 3000)
            backwards = await fetch_text(url + "/api/v1/samples?match=x&start=20&end=10")
            huge = await fetch_text(url + "/api/v1/samples?match=x&start=0&end=1e10")
            nan = await fetch_text(url + "/api/v1/samples?match=x&end=nan")
            ready = await fetch_text(url + "/-/ready")
            return not_ready, body, long, backwards, huge, nan, ready

    not_ready, body, long, backwards, huge, nan, ready = asyncio.run(main())
    assert not_ready[0] == 503 and ready[0] == 200
    assert body == (413, {"status": "error", "error": "requests must not carry a body"})
    assert long[0] == 414
    assert backwards[0] == 400 and "start: must not be after end" in backwards[1]
    assert huge[0] == 400 and "range longer than" in huge[1]
    assert nan[0] == 400 and "end: must be finite" in nan[1]
