"""Engine <-> GPU join from dcgm-exporter (Kubernetes mode), NVML process pids and configuration."""

from __future__ import annotations

import asyncio
import json

import pytest

from kvscope.agent.collectors.nvml import NvmlCollector
from kvscope.agent.derive.gpu_join import (
    engine_gpu_hook,
    join_engines_to_gpus,
    parse_gpu_mapping,
    render_engine_gpu_samples,
)
from kvscope.agent.normalize.dialect import detect_engine, normalize
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.core.signals import Sample, load_catalog, make_labels
from testbed.nvml_fake import FakeNvml

UUID0 = "GPU-5b8f2c1e-7a3d-4e9b-9c2f-1d0e6a4b8c71"
UUID1 = "GPU-0c3e9d7a-2b6f-4a18-8e5d-93f1c2a7b604"
UUID2 = "GPU-77aa11bb-22cc-33dd-44ee-55ff66aa77bb"

# dcgm-exporter 4.5.x in Kubernetes mode (released images label the host `Hostname`; FB in MiB).
# GPU 2 is in MIG mode; its 3g.40gb instance serves another pod.
DCGM = f"""\
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{{gpu="0",UUID="{UUID0}",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.95.05",container="vllm",namespace="llm",pod="llama-0"}} 75000
DCGM_FI_DEV_FB_USED{{gpu="1",UUID="{UUID1}",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.95.05",container="vllm",namespace="llm",pod="llama-0"}} 74000
DCGM_FI_DEV_FB_USED{{gpu="2",UUID="{UUID2}",pci_bus_id="00000000:3A:00.0",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.95.05",container="sglang",namespace="llm",pod="qwen-0"}} 39000
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{UUID0}",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.95.05",container="vllm",namespace="llm",pod="llama-0"}} 93
DCGM_FI_DEV_GPU_UTIL{{gpu="3",UUID="GPU-idle",pci_bus_id="00000000:4A:00.0",device="nvidia3",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.95.05"}} 0
"""


def _dcgm_samples():
    expo = parse_exposition(DCGM)
    assert detect_engine(expo) == "dcgm"
    return normalize(expo, "dcgm", {"instance": "node-a:9400", "job": "dcgm"}, timestamp=100.0).samples


def _engine_samples(load_fixture, instance, pod, container="vllm"):
    expo = parse_exposition(load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt"))
    labels = {"instance": instance, "job": "vllm", "pod": pod, "namespace": "llm", "container": container}
    return normalize(expo, detect_engine(expo), labels, timestamp=100.0).samples


def test_kubernetes_mode_joins_on_pod_namespace_and_container(load_fixture):
    samples = [
        *_dcgm_samples(),
        *_engine_samples(load_fixture, "10.0.0.5:8000", "llama-0"),
        *_engine_samples(load_fixture, "10.0.0.6:8000", "qwen-0", container="sglang"),
    ]
    found = join_engines_to_gpus(samples)
    assert {(a.instance, a.device.gpu_uuid, a.device.mig_instance, a.join) for a in found} == {
        ("10.0.0.5:8000", UUID0, None, "kubernetes"),
        ("10.0.0.5:8000", UUID1, None, "kubernetes"),
        ("10.0.0.6:8000", UUID2, "1", "kubernetes"),
    }
    mem = {(s.label("instance"), s.label("gpu")): s for s in render_engine_gpu_samples(found, 100.0)}
    assert mem[("10.0.0.5:8000", "0")].value == 75000 * 1048576  # the GPU's used memory
    assert mem[("10.0.0.6:8000", "2")].label("mig_instance") == "1"
    assert mem[("10.0.0.5:8000", "0")].label("node") == "node-a"


def test_kubernetes_join_requires_the_same_container_when_both_have_one(load_fixture):
    samples = [*_dcgm_samples(), *_engine_samples(load_fixture, "10.0.0.5:8000", "llama-0", container="sidecar")]
    assert join_engines_to_gpus(samples) == []


def test_engine_without_pod_labels_is_not_joined_by_kubernetes(load_fixture):
    expo = parse_exposition(load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt"))
    engine = normalize(expo, "vllm", {"instance": "127.0.0.1:8000", "job": "vllm"}).samples
    assert join_engines_to_gpus([*_dcgm_samples(), *engine]) == []


def _host_process(pid, instance, node="vm"):
    return Sample(
        "engine_process_resident_memory_bytes",
        make_labels({"pid": str(pid), "process": "VLLM::EngineCor", "instance": instance, "node": node}),
        2e9,
        100.0,
    )


def test_nvml_pid_joins_local_engine_processes(load_fixture):
    fake = FakeNvml(json.loads(load_fixture("nvml/h100-2gpu.json")))
    gpu = asyncio.run(NvmlCollector(nvml=fake, config=None).collect()).samples
    node = gpu[0].label("node")
    samples = [
        *gpu,
        _host_process(4242, "127.0.0.1:8000", node),
        _host_process(7002, "127.0.0.1:8001", node),
        _host_process(7001, "127.0.0.1:8001", "another-node"),
    ]  # same pid elsewhere: no match
    found = join_engines_to_gpus(samples)
    assert {(a.instance, a.device.gpu, a.device.mig_instance, a.join, a.memory_bytes) for a in found} == {
        ("127.0.0.1:8000", "0", None, "pid", 77309411328.0),
        ("127.0.0.1:8001", "1", "2", "pid", 20401094656.0),
    }


def test_configured_mapping_wins_and_accepts_uuid_or_index(load_fixture):
    fake = FakeNvml(json.loads(load_fixture("nvml/h100-2gpu.json")))
    gpu = asyncio.run(NvmlCollector(nvml=fake).collect()).samples
    node = gpu[0].label("node")
    samples = [*gpu, _host_process(4242, "127.0.0.1:8000", node)]
    found = join_engines_to_gpus(samples, {UUID0: "127.0.0.1:8000", "1": ["127.0.0.1:8002", "127.0.0.1:8003"]})
    by = {(a.instance, a.device.gpu): a for a in found}
    assert len(found) == 3  # the pid join of GPU 0 is not repeated
    assert by[("127.0.0.1:8000", "0")].join == "config"
    assert by[("127.0.0.1:8002", "1")].device.gpu_uuid == UUID1
    assert by[("127.0.0.1:8003", "1")].memory_bytes == 44660949000.0


def test_mapping_to_an_unseen_gpu_is_kept_as_configured():
    (a,) = join_engines_to_gpus([], {"GPU-not-here": "e:1"})
    assert a.device.gpu_uuid == "GPU-not-here" and a.memory_bytes is None
    assert render_engine_gpu_samples([a]) == []  # memory unknown: absent, not 0


@pytest.mark.parametrize("bad", [["GPU-1"], {"0": ""}, {"0": 5}, {"0": []}])
def test_bad_gpu_mapping_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="gpu_mapping"):
        parse_gpu_mapping(bad)


def test_join_signal_is_declared_in_the_catalog():
    sig = load_catalog().signals["engine_gpu_memory_used_bytes"]
    assert sig.kind == "gauge" and "join" in sig.labels


def test_runtime_hook_stamps_join_with_the_cycle_time(load_fixture):
    hook = engine_gpu_hook({UUID0: "127.0.0.1:8000"})
    fake = FakeNvml(json.loads(load_fixture("nvml/h100-2gpu.json")))
    gpu = asyncio.run(NvmlCollector(nvml=fake, clock=lambda: 123.0).collect()).samples
    (s,) = hook(gpu)
    assert s.name == "engine_gpu_memory_used_bytes" and s.timestamp == 123.0
    assert dict(s.labels)["join"] == "config" and s.value == 78642151424
    assert hook.__name__ == "engine_gpu"
    with pytest.raises(ValueError, match="gpu_mapping"):
        engine_gpu_hook("GPU-0")
