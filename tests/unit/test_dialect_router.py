"""The sglang-router dialect on real /metrics captures (tests/fixtures/scrapes/sglang-router-*).

Captured from the real router (0.3.2 and 0.2.4, PyPI sglang-router) in front of two real vLLM
0.32 CPU servers, before and after ~100 chat requests of 12 tenants (testbed/router.py). Worker
A is http://127.0.0.1:54613, worker B http://127.0.0.1:44795."""

import pytest

from kvscope.agent.normalize.dialect import detect_engine, normalize
from kvscope.agent.scrape.exposition import parse_exposition

TARGET = {"instance": "router", "job": "sglang-router"}
A, B = "http://127.0.0.1:54613", "http://127.0.0.1:44795"


def canon(load_fixture, name):
    expo = parse_exposition(load_fixture(f"scrapes/sglang-router-{name}.txt"))
    engine = detect_engine(expo)
    return normalize(expo, engine, TARGET, 100.0)


def values(norm, name, **labels):
    return {
        dict(s.labels).get("worker", dict(s.labels).get("policy")): s.value
        for s in norm.samples
        if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items())
    }


def names(norm):
    return {s.name for s in norm.samples}


@pytest.mark.parametrize("version", ["0.3.2", "0.2.4"])
def test_router_captures_are_detected_as_the_router_dialect(load_fixture, version):
    for policy in ("round_robin", "cache_aware"):
        for state in ("idle", "loaded"):
            assert canon(load_fixture, f"{version}-{policy}-{state}").engine == "sglang_router"


def test_032_per_worker_requests_policy_and_health(load_fixture):
    rr = canon(load_fixture, "0.3.2-round_robin-loaded")
    # the circuit breaker's per-worker outcomes equal what each vLLM server counted (60 / 59)
    assert values(rr, "router_worker_requests_total") == {A: 60.0, B: 59.0}
    assert values(rr, "router_decisions_total") == {"round_robin": 119.0}
    dec = next(s for s in rr.samples if s.name == "router_decisions_total")
    assert dict(dec.labels) == {**TARGET, "engine": "sglang_router", "model": "tiny-llama", "policy": "round_robin"}
    assert values(rr, "router_worker_health_code") == {A: 1.0, B: 1.0}
    assert values(rr, "router_workers") == {None: 2.0}
    assert values(rr, "router_request_seconds_count") == {None: 119.0}
    ca = canon(load_fixture, "0.3.2-cache_aware-loaded")
    # 0.3.2 does not always export its in-flight gauge (absent from the round-robin capture,
    # present in this one, both taken right after the load): absent then, never zero
    assert values(ca, "router_worker_requests_running") == {A: 0.0, B: 0.0}
    assert values(ca, "router_decisions_total") == {"cache_aware": 120.0}
    assert values(ca, "router_worker_requests_total") == {A: 74.0, B: 46.0}


def test_032_exports_no_cache_tree_counters(load_fixture):
    """0.3.x dropped the cache-aware hit/miss counters: absent, never zero."""
    ca = canon(load_fixture, "0.3.2-cache_aware-loaded")
    assert not names(ca) & {
        "router_cache_hits_total",
        "router_cache_misses_total",
        "router_load_balancing_events_total",
    }


def test_024_per_worker_requests_policy_and_cache_tree_hits(load_fixture):
    ca = canon(load_fixture, "0.2.4-cache_aware-loaded")
    assert values(ca, "router_worker_requests_total") == {A: 53.0, B: 58.0}
    # 0.2.x counts decisions per policy and worker: summed per policy, kept per worker
    assert {
        (dict(s.labels)["policy"], dict(s.labels)["worker"]): s.value
        for s in ca.samples
        if s.name == "router_decisions_total"
    } == {("cache_aware", A): 53.0, ("cache_aware", B): 58.0}
    assert values(ca, "router_cache_hits_total") == {None: 99.0}
    assert values(ca, "router_cache_misses_total") == {None: 12.0}
    assert values(ca, "router_worker_requests_running") == {A: 0.0, B: 0.0}
    assert values(ca, "router_worker_health_code") == {A: 1.0, B: 1.0}
    # 0.2.4's sgl_router_active_workers reads 0 with two healthy workers: not mapped
    assert "router_workers" not in names(ca)
    rr = canon(load_fixture, "0.2.4-round_robin-loaded")
    assert values(rr, "router_decisions_total") == {A: 48.0, B: 48.0}
    assert "router_cache_hits_total" not in names(rr)  # the tree exists under cache_aware only


def test_idle_router_has_no_traffic_series(load_fixture):
    idle = canon(load_fixture, "0.3.2-round_robin-idle")
    assert "router_decisions_total" not in names(idle)
    assert "router_worker_requests_total" not in names(idle)
    assert values(idle, "router_worker_health_code") == {A: 1.0, B: 1.0}


def test_router_series_never_carry_engine_only_labels(load_fixture):
    for name in ("0.3.2-cache_aware-loaded", "0.2.4-cache_aware-loaded"):
        for s in canon(load_fixture, name).samples:
            assert not {"outcome", "worker_type", "connection_mode", "router_type"} & set(dict(s.labels))
