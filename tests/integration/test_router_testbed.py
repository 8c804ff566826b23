"""testbed/router.py drives the real sglang-router: workers registered, removed and re-added
through its API, a policy change on the same ports, and a stop that leaves no process.

The workers are stand-ins of our own (a /health that answers 200): what is tested is the test
bed's handling of the real router binary, not routing (tests/integration/test_router_vllm.py
routes real vLLM)."""

from __future__ import annotations

import os

import pytest

from testbed.httpstub import serving, static_body_handler
from testbed.router import ROUTER_VERSIONS, SglangRouter, router_unavailable_reason


@pytest.mark.parametrize("version", ROUTER_VERSIONS)
def test_router_workers_policy_and_stop(version):
    reason = router_unavailable_reason(version)
    if reason:
        pytest.fail(reason, pytrace=False)  # `make test` installs it: missing is a broken install
    handler = static_body_handler(b"{}", content_type="application/json")
    with serving(handler) as a, serving(handler) as b:
        url_a = f"http://127.0.0.1:{a.server_address[1]}"
        url_b = f"http://127.0.0.1:{b.server_address[1]}"
        router = SglangRouter([url_a, url_b], policy="round_robin", version=version).start()
        try:
            assert sorted(router.healthy_workers()) == sorted([url_a, url_b])
            router.remove_worker(url_b)
            assert router.healthy_workers() == [url_a]
            health = [line for line in router.scrape().splitlines() if "health{" in line and url_b in line]
            assert health and float(health[0].rsplit(" ", 1)[1]) == (-1.0 if version == "0.3.2" else 0.0)
            router.add_worker(url_b)
            assert sorted(router.healthy_workers()) == sorted([url_a, url_b])
            ports = (router.port, router.metrics_port)
            router.restart(policy="cache_aware", workers=[url_a])
            assert (router.port, router.metrics_port) == ports and router.policy == "cache_aware"
            assert router.healthy_workers() == [url_a]
            with pytest.raises(ValueError, match="unknown router policy"):
                router.restart(policy="hash_mod")
        finally:
            pid = router.proc.pid if router.proc else None
            router.close()
        assert router.proc is None
        if pid is not None:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
