"""HostCollector finds a real vLLM (CPU) server's processes and ties them to its target."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import psutil
import pytest

from kvscope.agent.collectors.host import HostCollector

pytestmark = pytest.mark.vllm


def test_real_vllm_processes_are_tied_to_their_scrape_target(vllm_small_kv):
    srv = vllm_small_kv
    instance = f"127.0.0.1:{srv.port}"
    config = SimpleNamespace(
        targets=[SimpleNamespace(url=srv.metrics_url, instance=instance)], collector_options=lambda name: {}
    )
    samples = asyncio.run(HostCollector(config).collect()).samples
    ours = [s for s in samples if s.name.startswith("engine_process_") and s.label("instance") == instance]
    pids = {int(s.label("pid")) for s in ours}
    tree = {srv.proc.pid, *(p.pid for p in psutil.Process(srv.proc.pid).children(recursive=True))}
    # APIServer, EngineCore and its worker(s): all of the server's process tree, nothing else
    assert len(pids) >= 2 and pids <= tree, (pids, tree)
    assert srv.proc.pid in pids
    rss = sum(s.value for s in ours if s.name == "engine_process_resident_memory_bytes")
    assert rss > 500 * 2**20  # ~1.9 GiB measured for the three processes
    cpu = [s.value for s in ours if s.name == "engine_process_cpu_seconds_total"]
    assert all(v > 0 for v in cpu)
    model = srv.command()[4]
    for s in ours:  # no part of the command line (model path, flags) is recorded
        assert all(model not in v and "--" not in v for _, v in s.labels)
