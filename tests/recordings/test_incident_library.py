"""The incident library is what its YAMLs say it is.

For every scenario: the YAML is complete, its LEVERS.md ids are well-formed, the README lists it,
and the recording (replayed through kvscope's own dialects) contains the condition claimed, phase
by phase. Nothing here is a hard-coded output: every number comes from the recorded series.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
import yaml

from kvscope.agent.recording.replay import replay_recording

HERE = Path(__file__).resolve().parent
YAMLS = sorted(HERE.glob("*.yaml"))
LEVER_ID = re.compile(r"^[PKLUR][0-9]{1,2}$")


def _meta(name: str) -> dict:
    return yaml.safe_load((HERE / f"{name}.yaml").read_text())


@cache
def _replay(name: str):
    return replay_recording(HERE / _meta(name)["recording"])


def _window(name: str, phase: str) -> tuple[float, float]:
    meta = _meta(name)
    p = next(p for p in meta["phases"] if p["name"] == phase)
    return meta["recorded_at_unix"] + p["start_s"], meta["recorded_at_unix"] + p["end_s"]


def delta(name: str, signal: str, phase: str, instance: str | None = None) -> float:
    """Increase of a canonical counter over a phase (summed over series, per series last - first)."""
    t0, t1 = _window(name, phase)
    first: dict = {}
    last: dict = {}
    for s in _replay(name).samples:
        if s.name != signal or not t0 <= s.timestamp <= t1:
            continue
        if instance is not None and dict(s.labels).get("instance") != instance:
            continue
        first.setdefault(s.labels, s.value)
        last[s.labels] = s.value
    return sum(last[k] - first[k] for k in last)


def gauge(name: str, signal: str, phase: str, agg=max) -> float:
    t0, t1 = _window(name, phase)
    vals = [s.value for s in _replay(name).samples if s.name == signal and t0 <= s.timestamp <= t1]
    assert vals, f"{signal} absent in {name}/{phase}"
    return agg(vals)


def hit_rate(name: str, phase: str, instance: str | None = None) -> float:
    q = delta(name, "engine_prefix_cache_queries_tokens_total", phase, instance)
    assert q > 0
    return delta(name, "engine_prefix_cache_hits_tokens_total", phase, instance) / q


def hit_rate_between(name: str, start_s: float, end_s: float, instance: str) -> float:
    """Hit rate of one instance between two offsets from the recording start."""
    t0 = _meta(name)["recorded_at_unix"]
    first: dict = {}
    last: dict = {}
    for s in _replay(name).samples:
        if (
            s.name.startswith("engine_prefix_cache_")
            and dict(s.labels).get("instance") == instance
            and t0 + start_s <= s.timestamp <= t0 + end_s
        ):
            first.setdefault(s.name, s.value)
            last[s.name] = s.value
    q = last["engine_prefix_cache_queries_tokens_total"] - first["engine_prefix_cache_queries_tokens_total"]
    h = last["engine_prefix_cache_hits_tokens_total"] - first["engine_prefix_cache_hits_tokens_total"]
    assert q > 0
    return h / q


def mean_ttft(name: str, phase: str) -> float:
    return delta(name, "request_ttft_seconds_sum", phase) / delta(name, "request_ttft_seconds_count", phase)


@pytest.mark.parametrize("path", YAMLS, ids=[p.stem for p in YAMLS])
def test_scenario_yaml_is_complete(path: Path):
    meta = yaml.safe_load(path.read_text())
    for key in ("scenario", "summary", "source", "recording", "phases", "expected", "recorded_at_unix"):
        assert key in meta, key
    assert meta["scenario"] == path.stem
    assert (HERE / meta["recording"]).is_file()
    if meta.get("spans"):
        assert (HERE / meta["spans"]).is_file()
    names = [p["name"] for p in meta["phases"]]
    assert all(0 <= p["start_s"] < p["end_s"] for p in meta["phases"])
    if meta["expected"] != "no warning":
        for e in meta["expected"]:
            assert e["levers"] and all(LEVER_ID.match(lv) for lv in e["levers"]), e
            assert e["phase"] in names
    readme = (HERE / "README.md").read_text()
    assert f"`{path.stem}`" in readme, "README.md must list every scenario"


def test_every_recording_has_a_yaml():
    stems = {p.name.removesuffix(".om.gz") for p in HERE.glob("*.om.gz")}
    assert stems == {p.stem for p in YAMLS}


# ------------------------------------------------------------------ real vLLM scenarios: evidence
def test_healthy_shared_prefix():
    n = "healthy-shared-prefix"
    assert hit_rate(n, "steady") > 0.6
    assert delta(n, "engine_preemptions_total", "steady") == 0
    assert gauge(n, "engine_kv_cache_usage_ratio", "steady") < 0.8


def test_kv_pressure_cascade():
    n = "kv-pressure-cascade"
    assert delta(n, "engine_preemptions_total", "baseline") == 0
    assert delta(n, "engine_preemptions_total", "pressure") > 0
    assert gauge(n, "engine_kv_cache_usage_ratio", "pressure") > 0.9
    assert gauge(n, "engine_requests_waiting", "pressure") > 0
    assert mean_ttft(n, "pressure") > 2 * mean_ttft(n, "baseline")


def test_kv_pressure_tenants():
    """The demo's incident: the same cascade, seen by the request tap per tenant. The chat tenants
    keep sending through the burst and lose their cached prefixes to it (the bulk tenant's
    sequences take the pool); every request passed the tap."""
    n = "kv-pressure-tenants"
    assert delta(n, "engine_preemptions_total", "baseline") == 0
    assert delta(n, "engine_preemptions_total", "pressure") > 0
    assert gauge(n, "engine_kv_cache_usage_ratio", "pressure") > 0.9
    assert gauge(n, "engine_requests_waiting", "pressure") > 0
    assert mean_ttft(n, "pressure") > 2 * mean_ttft(n, "baseline")
    chat = [t for t in _meta(n)["phases"][0]["client"]["tenants"]]
    assert len(chat) >= 3 and "bulk" not in chat
    for phase in ("baseline", "pressure", "recovery"):
        assert delta(n, "tenant_requests_total", phase) == pytest.approx(
            delta(n, "engine_requests_finished_total", phase), rel=0.1
        )
    for t in chat:
        before, during = (tenant_hit(n, t, p) for p in ("baseline", "pressure"))
        assert during < 0.5 * before, (t, before, during)


def tenant_hit(name: str, tenant: str, phase: str) -> float:
    """Cached / prompt tokens of one tenant over a phase, as the request tap counted them."""
    t0, t1 = _window(name, phase)
    first: dict = {}
    last: dict = {}
    for s in _replay(name).samples:
        if s.name in ("tenant_prompt_tokens_total", "tenant_cached_tokens_total") and t0 <= s.timestamp <= t1:
            if dict(s.labels).get("tenant") == tenant:
                first.setdefault(s.name, s.value)
                last[s.name] = s.value
    prompt = last["tenant_prompt_tokens_total"] - first["tenant_prompt_tokens_total"]
    assert prompt > 0
    return (last["tenant_cached_tokens_total"] - first["tenant_cached_tokens_total"]) / prompt


def test_prefix_caching_disabled():
    n = "prefix-caching-disabled"
    facts = _replay(n).facts["replica-0"]["0"]
    assert facts["enable_prefix_caching"] == "False"
    assert delta(n, "engine_prefix_cache_hits_tokens_total", "steady") == 0


def test_round_robin_thrashes_where_sticky_hits():
    n = "round-robin-vs-sticky"
    rr, sticky = hit_rate(n, "round-robin"), hit_rate(n, "sticky")
    assert rr < 0.75 * sticky, (rr, sticky)


def test_the_tap_sees_prefixes_split_only_after_the_switch_to_round_robin():
    n = "round-robin-vs-sticky"
    assert gauge(n, "prefix_split_ratio", "sticky") < 0.1  # each tenant on one replica
    assert gauge(n, "prefix_split_ratio", "round-robin") > 0.3  # the same prefixes on both
    # every request passed the tap: its per-tenant request count equals what the engines finished
    assert delta(n, "tenant_requests_total", "round-robin") == pytest.approx(
        delta(n, "engine_requests_finished_total", "round-robin"), rel=0.1
    )


def test_restarted_replica_is_cold_next_to_a_warm_one():
    n = "replica-restart-cold-cache"
    t0, t1 = _window(n, "restart")
    up = [
        (s.timestamp, s.value)
        for s in _replay(n).samples
        if s.name == "kvscope_target_up" and dict(s.labels)["instance"] == "replica-1"
    ]
    inside = [v for t, v in up if t0 + 5 <= t <= t1 - 5]
    outside = [v for t, v in up if not t0 - 5 <= t <= t1 + 5]
    # the target is down while it restarts; elsewhere only the odd scrape timed out (a saturated box)
    assert inside and sum(v == 0 for v in inside) / len(inside) > 0.9
    assert outside and sum(v == 0 for v in outside) / len(outside) < 0.1
    rejoin = next(p for p in _meta(n)["phases"] if p["name"] == "rejoin")["start_s"]
    # the first 10 s back: the restarted replica hits far less than the warm one
    cold = hit_rate_between(n, rejoin - 2, rejoin + 10, "replica-1")
    warm = hit_rate_between(n, rejoin - 2, rejoin + 10, "replica-0")
    assert cold < 0.75 * warm, (cold, warm)


def test_noisy_tenant_raises_ttft():
    n = "noisy-tenant-long-prompts"
    assert mean_ttft(n, "noisy") > 2 * mean_ttft(n, "quiet")
    assert gauge(n, "engine_requests_waiting", "noisy") > 0
    # the quiet tenants' own client-side TTFT (measured by the load driver during the run) rises too
    client = {p["name"]: p["client"]["tenants"] for p in _meta(n)["phases"]}
    quiet_tenants = [t for t in client["quiet"]]
    assert quiet_tenants and "noisy" not in quiet_tenants
    for t in quiet_tenants:
        assert client["noisy"][t]["ttft_p50_s"] > 2 * client["quiet"][t]["ttft_p50_s"], t


def test_spec_decode_acceptance_is_poor():
    n = "spec-decode-poor-acceptance"
    drafted = delta(n, "engine_spec_draft_tokens_total", "steady")
    accepted = delta(n, "engine_spec_accepted_tokens_total", "steady")
    assert drafted > 0
    assert accepted / drafted < 0.5


# ------------------------------------------------------------------ engine /metrics only (issue 15)
ENGINE_ONLY = sorted(p.stem for p in HERE.glob("metrics-only-*.yaml"))
TWINS = [
    (n, n.replace("-round-robin-", "-sticky-"))
    for n in ENGINE_ONLY
    if "-round-robin-" in n and n.replace("-round-robin-", "-sticky-") in ENGINE_ONLY
]


def _phase(name: str) -> str:
    return _meta(name)["phases"][0]["name"]


@pytest.mark.parametrize("name", ENGINE_ONLY)
def test_engine_only_recordings_hold_the_engines_metrics_and_nothing_else(name):
    meta = _meta(name)
    assert meta["spans"] is None and not meta.get("tap")
    for replica in meta["replicas"]:
        flags = replica["flags"]
        assert "--kv-cache-metrics" not in flags and "--otlp-traces-endpoint" not in flags
        assert "--kv-events-config" not in flags
    assert set(_replay(name).engines.values()) == {"vllm"}
    assert delta(name, "engine_preemptions_total", _phase(name)) == 0  # no K1/K3 here


def test_the_engine_only_set_has_its_twins():
    assert len(TWINS) >= 5 and "metrics-only-healthy-busy-sticky" in ENGINE_ONLY
    assert "metrics-only-little-sharing-round-robin" in ENGINE_ONLY


@pytest.mark.parametrize(("rr", "sticky"), TWINS)
def test_round_robin_hits_less_than_its_sticky_twin_on_the_same_workload(rr, sticky):
    lost = hit_rate(rr, "round-robin") / hit_rate(sticky, "sticky")
    assert lost < 0.85, (rr, lost)
    per_request = [
        delta(n, "engine_prompt_tokens_total", _phase(n)) / delta(n, "request_prompt_tokens_count", _phase(n))
        for n in (rr, sticky)
    ]
    assert per_request[0] == pytest.approx(per_request[1], rel=0.1)  # the same prompts


def test_little_sharing_has_little_to_hit_and_the_busy_sticky_fleet_hits_most():
    assert hit_rate("metrics-only-little-sharing-round-robin", "round-robin") < 0.1
    assert hit_rate("metrics-only-healthy-busy-sticky", "sticky") > 0.7


# ------------------------------------------------------------------ behind the real sglang-router
def router_series(name: str, signal: str, phase: str) -> dict:
    """Per label set of one router signal: (first, last) value inside a phase."""
    t0, t1 = _window(name, phase)
    out: dict = {}
    for s in _replay(name).samples:
        if s.name == signal and dict(s.labels).get("instance") == "router" and t0 <= s.timestamp <= t1:
            out.setdefault(s.labels, [s.value, s.value])[1] = s.value
    return out


def test_router_policy_switch_lowers_the_hit_rate():
    n = "router-cache-aware-vs-round-robin"
    # the router says which policy routed each phase (label of router_decisions_total)
    for phase, policy in (("cache-aware", "cache_aware"), ("round-robin", "round_robin")):
        policies = {
            dict(k)["policy"] for k, (a, b) in router_series(n, "router_decisions_total", phase).items() if b > a
        }
        assert policies == {policy}, (phase, policies)
    assert hit_rate(n, "round-robin") < 0.8 * hit_rate(n, "cache-aware")
    # 0.2.4's cache-aware tree matched most requests; it exports no tree counters under round_robin
    hits = sum(b - a for a, b in router_series(n, "router_cache_hits_total", "cache-aware").values())
    misses = sum(b - a for a, b in router_series(n, "router_cache_misses_total", "cache-aware").values())
    assert hits > 2 * misses
    # every request went through the router: its per-worker counts equal what the engines finished
    routed = sum(b - a for a, b in router_series(n, "router_worker_requests_total", "round-robin").values())
    assert routed == pytest.approx(delta(n, "engine_requests_finished_total", "round-robin"), rel=0.1)


def test_router_drain_removes_the_worker_and_rejoin_brings_it_back_cold():
    n = "router-drain-restart-rejoin"
    workers = _meta(n)["router"]["workers"]
    pool = {
        p: [v for (a, b) in router_series(n, "router_workers", p).values() for v in (a, b)]
        for p in ("warm", "drained", "rejoin")
    }
    assert max(pool["warm"]) == 2 and min(pool["drained"]) == 1 and pool["rejoin"][-1] == 2
    health = router_series(n, "router_worker_health_code", "drained")
    removed = next(v for k, v in health.items() if dict(k)["worker"] == workers["replica-1"])
    assert removed[1] == -1  # 0.3.x marks a removed worker -1
    # while drained the router sent replica-1 nothing
    drained = router_series(n, "router_worker_requests_total", "drained")
    assert all(b == a for k, (a, b) in drained.items() if dict(k)["worker"] == workers["replica-1"])
    rejoin = next(p for p in _meta(n)["phases"] if p["name"] == "rejoin")["start_s"]
    cold = hit_rate_between(n, rejoin - 2, rejoin + 10, "replica-1")
    warm = hit_rate_between(n, rejoin - 2, rejoin + 10, "replica-0")
    assert cold < 0.75 * warm, (cold, warm)


# ------------------------------------------------------------------ real llama.cpp scenarios: evidence
def mean_gauge(name: str, signal: str, phase: str) -> float:
    return gauge(name, signal, phase, agg=lambda v: sum(v) / len(v))


def test_llamacpp_healthy_serves_inside_its_slots_and_reuses_prefixes():
    n = "llamacpp-healthy"
    assert _replay(n).engines == {"replica-0": "llamacpp"}
    assert mean_gauge(n, "engine_requests_waiting", "steady") < 0.5
    assert gauge(n, "engine_requests_running", "steady") <= 4
    assert delta(n, "engine_generation_tokens_total", "steady") > 0
    assert hit_rate(n, "steady") > 0.3  # tenants' system prompts reused from the slots


def test_llamacpp_saturated_fills_both_slots_and_the_queue_grows():
    n = "llamacpp-saturated"
    assert gauge(n, "engine_requests_waiting", "baseline") <= 1
    assert gauge(n, "engine_requests_running", "overload") == 2  # every slot busy
    assert gauge(n, "engine_requests_waiting", "overload") >= 20
    assert mean_gauge(n, "engine_requests_waiting", "overload") > 5 * max(
        0.1, mean_gauge(n, "engine_requests_waiting", "baseline")
    )
    names = {s.name for s in _replay(n).samples}
    assert not names & {
        "engine_requests_finished_total",
        "request_ttft_seconds_count",
        "engine_kv_cache_usage_ratio",
    }  # absent, not zero


# ------------------------------------------------------------------ blind set (testbed/fleetgen/blind*.py)
def quantile(name: str, hist: str, phase: str, q: float) -> float:
    """Upper bound of the bucket holding quantile q of a histogram over a phase (all series)."""
    t0, t1 = _window(name, phase)
    first: dict = {}
    last: dict = {}
    for s in _replay(name).samples:
        if s.name == f"{hist}_bucket" and t0 <= s.timestamp <= t1:
            first.setdefault(s.labels, s.value)
            last[s.labels] = s.value
    by_le: dict[float, float] = {}
    for k in last:
        le = float(dict(k)["le"])
        by_le[le] = by_le.get(le, 0.0) + last[k] - first[k]
    total = by_le[float("inf")]
    assert total > 0, f"{hist} empty in {name}/{phase}"
    return next(le for le in sorted(by_le) if by_le[le] >= q * total)


def test_blind_yamls_name_a_likely_row_and_rows_that_must_not_fire():
    for path in sorted(HERE.glob("blind-*.yaml")):
        meta = yaml.safe_load(path.read_text())
        assert meta["source"].startswith("synthetic"), path.name
        assert meta["must_not"] and all(LEVER_ID.match(r) for r in meta["must_not"]), path.name
        if meta["expected"] != "no warning":
            likely = {r for e in meta["expected"] if e.get("likely") for r in e["levers"]}
            assert likely and not likely & set(meta["must_not"]), path.name


def test_blind_mixed_prompts_widen_the_itl_tail_not_the_median():
    n = "blind-vllm-mixed-prompts-itl-tail"
    assert quantile(n, "request_itl_seconds", "steady", 0.5) <= 0.025
    assert quantile(n, "request_itl_seconds", "steady", 0.99) >= 0.25
    assert quantile(n, "request_prompt_tokens", "steady", 0.95) >= 5 * quantile(
        n, "request_prompt_tokens", "steady", 0.5
    )


def test_blind_sglang_queue_grows_and_clients_abort():
    n = "blind-sglang-queue-overload"
    assert gauge(n, "engine_requests_waiting", "normal") == 0
    assert gauge(n, "engine_requests_waiting", "overloaded") > 50
    assert delta(n, "engine_requests_aborted_total", "overloaded") > 0
    assert gauge(n, "engine_kv_cache_usage_ratio", "overloaded") < 0.9


def test_blind_decode_batch_raises_every_itl_percentile():
    n = "blind-vllm-decode-batch-large"
    for q in (0.5, 0.99):
        assert quantile(n, "request_itl_seconds", "peak", q) > quantile(n, "request_itl_seconds", "evening", q)
    assert gauge(n, "engine_requests_running", "peak", agg=min) > 2 * gauge(n, "engine_requests_running", "evening")
    assert delta(n, "engine_preemptions_total", "peak") == 0


def test_blind_kv_too_small_preempts_once_traffic_rises():
    n = "blind-vllm-kv-too-small"
    assert gauge(n, "engine_kv_cache_usage_ratio", "kv-full") >= 0.97
    assert delta(n, "engine_preemptions_total", "kv-full") > 10 * max(1.0, delta(n, "engine_preemptions_total", "fits"))
    assert mean_ttft(n, "kv-full") > 2 * mean_ttft(n, "fits")


def test_blind_output_length_drifts_while_prompts_hold():
    n = "blind-vllm-output-length-drift"
    assert quantile(n, "request_generation_tokens", "drifting", 0.99) > quantile(
        n, "request_generation_tokens", "steady", 0.99
    )
    assert quantile(n, "request_prompt_tokens", "drifting", 0.99) == quantile(
        n, "request_prompt_tokens", "steady", 0.99
    )


def test_blind_hpa_holds_the_replica_count_while_queues_grow():
    n = "blind-vllm-hpa-wrong-signal"
    t0, t1 = _window(n, "queue-ignored")
    live = {
        dict(s.labels)["instance"]
        for s in _replay(n).samples
        if s.name == "engine_requests_waiting" and t0 <= s.timestamp <= t1
    }
    assert len(live) == 4
    assert gauge(n, "engine_requests_waiting", "warm") == 0
    assert gauge(n, "engine_requests_waiting", "queue-ignored", agg=lambda v: sum(v) / len(v)) > 20


def test_blind_healthy_controls_stay_inside_their_limits():
    n = "blind-healthy-busy-near-knee"
    assert 0.75 < gauge(n, "engine_kv_cache_usage_ratio", "busy") < 0.9
    assert delta(n, "engine_preemptions_total", "busy") == 0
    assert quantile(n, "request_itl_seconds", "busy", 0.99) < 4 * quantile(n, "request_itl_seconds", "busy", 0.5)
    ramp = "blind-healthy-sglang-autoscaled-ramp"
    t0, t1 = _window(ramp, "ramp")
    live = {
        dict(s.labels)["instance"]
        for s in _replay(ramp).samples
        if s.name == "engine_requests_waiting" and t0 <= s.timestamp <= t1
    }
    assert len(live) == 3 + len(_meta(ramp)["scale_up_at_s"]) > 3


def test_blind_surge_adds_unique_prompt_volume_without_losing_hits():
    n = "blind-vllm-long-prompt-surge"
    chat, surge = delta(n, "engine_prompt_tokens_total", "chat"), delta(n, "engine_prompt_tokens_total", "surge")
    assert surge > 4 * chat  # same phase lengths (10 vs 12 min)
    hits_chat = delta(n, "engine_prefix_cache_hits_tokens_total", "chat") / 12
    hits_surge = delta(n, "engine_prefix_cache_hits_tokens_total", "surge") / 10
    assert hits_surge == pytest.approx(hits_chat, rel=0.2)  # the hit rate falls, the hits do not
    assert hit_rate(n, "surge") < 0.5 * hit_rate(n, "chat")
    assert mean_ttft(n, "surge") > 3 * mean_ttft(n, "chat")


def test_blind_hot_prefix_pins_the_queue_to_one_replica():
    n = "blind-sglang-hot-prefix-replica"
    t0, t1 = _window(n, "hotspot")
    peak: dict[str, float] = {}
    for s in _replay(n).samples:
        if s.name == "engine_requests_waiting" and t0 <= s.timestamp <= t1:
            inst = dict(s.labels)["instance"]
            peak[inst] = max(peak.get(inst, 0.0), s.value)
    hot = max(peak, key=peak.get)
    assert hot == "sglang-2" and peak[hot] > 20 and all(v <= 3 for k, v in peak.items() if k != hot)
    assert hit_rate(n, "hotspot", "sglang-2") > hit_rate(n, "hotspot", "sglang-0") + 0.15


def test_blind_flapping_fleet_goes_up_and_down_repeatedly():
    n = "blind-vllm-replica-flapping"
    by_time: dict[float, set] = {}
    for s in _replay(n).samples:
        if s.name == "engine_requests_running":
            by_time.setdefault(s.timestamp, set()).add(dict(s.labels)["instance"])
    counts = [len(by_time[t]) for t in sorted(by_time)]
    ups = sum(1 for a, b in zip(counts, counts[1:], strict=False) if b > a)
    downs = sum(1 for a, b in zip(counts, counts[1:], strict=False) if b < a)
    assert set(counts) == {4, 6} and ups >= 4 and downs >= 4


def test_dynamo_feed_stall_stops_the_routers_events_while_both_frontends_serve():
    name = "dynamo-kv-event-feed-stalled"
    for inst in ("frontend-stalled", "frontend-healthy"):
        assert delta(name, "router_kv_events_total", "healthy", inst) > 0.1 * 600  # above R2's 0.1/s "fed before"
        assert delta(name, "gateway_requests_total", "stalled", inst) > 0.1 * 300  # serving throughout
    assert delta(name, "router_kv_events_total", "stalled", "frontend-stalled") == 0
    assert delta(name, "router_kv_events_total", "stalled", "frontend-healthy") > 0.1 * 300
