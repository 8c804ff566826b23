"""The NVML collector on a real NVIDIA GPU.

The unit tests run the collector against `FakeNvml`, recorded from NVML's documented shapes.
This is the proof on hardware: it is skipped where no NVIDIA driver answers (CI has no GPU) and
runs wherever one does (`pytest tests/integration/test_nvml_gpu.py` on a GPU machine).

While a bf16 matmul loop keeps GPU 0 busy (in its own process, when PyTorch is installed), two
collections a second apart must give memory numbers equal to NVML's own and to nvidia-smi's,
utilisation, power, temperature and clocks in range, SM and tensor activity from GPM where the
GPU supports it, and every process NVML lists with its memory under its pid. With
KVSCOPE_NVML_DUMP set, the samples of the second collection are written there as JSON lines.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import pynvml  # a declared dependency (nvidia-ml-py)
import pytest


def _driver_answers() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    return True


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _driver_answers(), reason="no NVIDIA driver or GPU on this machine"),
]

LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
"""


@pytest.fixture
def busy_gpu():
    """A process running matmuls on GPU 0 for ~20 s (None without PyTorch)."""
    if importlib.util.find_spec("torch") is None:
        yield None
        return
    proc = subprocess.Popen([sys.executable, "-c", LOAD, "20"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(2.0)  # let utilisation and GPM windows fill
        yield proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def _by(samples, name):
    return {dict(s.labels)["gpu"]: s.value for s in samples if s.name == name and "pid" not in dict(s.labels)}


def _smi(query: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [[v.strip() for v in line.split(",")] for line in out.strip().splitlines()]


def test_collector_reads_a_real_gpu_as_nvml_and_nvidia_smi_do(busy_gpu):
    from kvscope.agent.collectors.nvml import NvmlCollector

    collector = NvmlCollector()
    collector.collect_sync()
    time.sleep(1.0)
    got = collector.collect_sync()
    [health] = got.health
    assert health.up, (health.reason, health.errors)
    samples = got.samples
    if os.environ.get("KVSCOPE_NVML_DUMP"):
        with open(os.environ["KVSCOPE_NVML_DUMP"], "w", encoding="utf-8") as f:
            for s in samples:
                f.write(json.dumps({"name": s.name, "labels": dict(s.labels), "value": s.value}) + "\n")
        print("health:", health, "facts:", got.facts)

    count = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    uuids = {str(i): pynvml.nvmlDeviceGetUUID(h) for i, h in enumerate(handles)}
    seen = {dict(s.labels)["gpu"]: dict(s.labels)["gpu_uuid"] for s in samples if "gpu_uuid" in dict(s.labels)}
    assert {k: v for k, v in seen.items() if k in uuids} == uuids

    total = _by(samples, "gpu_memory_total_bytes")
    used = _by(samples, "gpu_memory_used_bytes")
    for i, h in enumerate(handles):
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        assert total[str(i)] == mem.total
        assert abs(used[str(i)] - mem.used) <= 0.02 * mem.total  # read a moment apart
    if shutil.which("nvidia-smi"):
        for i, (mib,) in enumerate(_smi("memory.total")):
            assert abs(total[str(i)] / 2**20 - float(mib)) <= 0.01 * float(mib) + 1

    util = _by(samples, "gpu_utilization_ratio")
    power = _by(samples, "gpu_power_watts")
    limit = _by(samples, "gpu_power_limit_watts")
    temp = _by(samples, "gpu_temperature_celsius")
    sm_clock = _by(samples, "gpu_sm_clock_hertz")
    for g in uuids:
        assert 0.0 <= util[g] <= 1.0
        assert 10.0 < power[g] <= limit[g] * 1.1
        assert 10.0 < temp[g] < 100.0
        assert 1e8 < sm_clock[g] < 4e9
    if busy_gpu is None:
        return
    assert util["0"] > 0.5, util
    sm_active = _by(samples, "gpu_sm_active_ratio")
    if pynvml.nvmlGpmQueryDeviceSupport(handles[0]).isSupportedDevice:
        assert sm_active["0"] > 0.3, sm_active
        assert _by(samples, "gpu_tensor_active_ratio")["0"] > 0.0
    else:
        assert "0" not in sm_active  # absent, never 0
    listed = {
        str(p.pid) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handles[0]) if p.usedGpuMemory is not None
    }
    procs = {
        dict(s.labels)["pid"]
        for s in samples
        if s.name == "gpu_process_memory_used_bytes" and dict(s.labels)["gpu"] == "0"
    }
    print("load pid", busy_gpu.pid, "NVML lists", sorted(listed), "collector", sorted(procs))
    assert procs == listed
