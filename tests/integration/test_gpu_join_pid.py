"""The engine<->GPU join by pid, on a real NVIDIA GPU.

The unit tests join recorded series; here every input is live: NVML on a real GPU lists the
processes holding its memory, psutil finds the engine process by its command line and the port
it listens on, the engine collector scrapes that port, and `derive_engine_gpu` must tie the
target's instance to the GPU with that process's memory (`join="pid"`).

The engine is a stand-in process (no vLLM build exists for the GPU machine): it is started as
`python -m vllm.entrypoints.openai.api_server --port N`, as vLLM's API server is, serves a real
vLLM 0.32 /metrics capture (tests/fixtures/scrapes/) and holds 1 GiB of GPU memory through
PyTorch. Skipped where no NVIDIA driver answers or PyTorch is missing (CI has no GPU).
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from pathlib import Path

import pynvml  # a declared dependency (nvidia-ml-py)
import pytest


def _gpu_with_torch() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    return True


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _gpu_with_torch(), reason="no NVIDIA driver or GPU (or no PyTorch) here"),
]

CAPTURE = Path(__file__).parent.parent / "fixtures" / "scrapes" / "vllm-0.32.0-cpu-after-load.txt"
STAND_IN = """
import http.server, sys, torch
body = open(sys.argv[sys.argv.index("--capture") + 1], "rb").read()
held = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
class Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), Metrics)
print("ready", flush=True)
server.serve_forever()
"""


@pytest.fixture
def engine(tmp_path):
    """(port, pid) of the stand-in engine process."""
    from testbed.procs import free_port

    pkg = tmp_path / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "vllm", tmp_path / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(STAND_IN)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--port", str(port), "--capture", str(CAPTURE)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield port, proc.pid
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_engine_is_joined_to_its_gpu_by_pid(engine):
    from kvscope.agent.collectors.engine import EngineCollector
    from kvscope.agent.collectors.host import HostCollector
    from kvscope.agent.collectors.nvml import NvmlCollector
    from kvscope.agent.config import AgentConfig, Target
    from kvscope.agent.derive.gpu_join import derive_engine_gpu

    port, pid = engine
    config = AgentConfig(targets=[Target(url=f"http://127.0.0.1:{port}/metrics", job="vllm", instance="engine-0")])

    async def collect():
        eng = EngineCollector(config)
        try:
            return [await eng.collect(), await HostCollector(config).collect(), await NvmlCollector().collect()]
        finally:
            await eng.close()

    collections = asyncio.run(collect())
    assert all(h.up for c in collections for h in c.health), [h for c in collections for h in c.health]
    samples = [s for c in collections for s in c.samples]
    # the host collector's per-process series carry `pid`; `engine_process_start_time_seconds`,
    # mapped from the engine's own /metrics, does not
    per_pid = [dict(s.labels) for s in samples if s.name.startswith("engine_process_") and "pid" in dict(s.labels)]
    procs = {labels["pid"]: labels.get("instance") for labels in per_pid}
    assert procs.get(str(pid)) == "engine-0", procs
    held = [s.value for s in samples if s.name == "gpu_process_memory_used_bytes" and dict(s.labels)["pid"] == str(pid)]
    assert held and held[0] >= 1 << 30

    joined = [s for s in derive_engine_gpu(samples) if s.name == "engine_gpu_memory_used_bytes"]
    print("joined:", [(dict(s.labels), s.value) for s in joined])
    assert [(dict(s.labels)["instance"], dict(s.labels)["join"], dict(s.labels)["gpu"], s.value) for s in joined] == [
        ("engine-0", "pid", "0", held[0])
    ]
