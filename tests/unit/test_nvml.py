"""NvmlCollector against the real bindings on this GPU-less machine, and against FakeNvml."""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from types import SimpleNamespace

import pytest

from kvscope.agent.collectors.base import registered_collectors
from kvscope.agent.collectors.nvml import NvmlCollector, parse_mig_profile
from kvscope.core.signals import load_catalog
from testbed.nvml_fake import FakeNvml

RECORDING = "nvml/h100-2gpu.json"


@pytest.fixture
def recording(load_fixture):
    return json.loads(load_fixture(RECORDING))


def _collect(collector):
    return asyncio.run(collector.collect())


def _by_key(samples):
    return {(s.name, s.label("gpu"), s.label("mig_instance"), s.label("pid")): s for s in samples}


def test_without_a_driver_the_collector_is_down_with_the_nvml_reason():
    import pynvml  # a declared dependency (nvidia-ml-py): missing is a broken install

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver; the no-driver path cannot be observed here")
    out = _collect(NvmlCollector())
    (health,) = out.health
    assert health.collector == "nvml" and not health.up
    assert health.reason == "NVMLError_LibraryNotFound"
    assert out.samples == []


def test_collector_is_registered_as_nvml():
    assert "nvml" in registered_collectors()


def test_reads_every_supported_gpu_value_in_base_units(recording):
    out = _collect(NvmlCollector(nvml=FakeNvml(recording), clock=lambda: 1000.0))
    got = _by_key(out.samples)
    assert out.health[0].up
    assert got[("gpu_utilization_ratio", "0", None, None)].value == 0.87
    assert got[("gpu_memory_used_bytes", "0", None, None)].value == 78642151424  # v2, not v1
    assert got[("gpu_memory_reserved_bytes", "0", None, None)].value == 594542592
    assert got[("gpu_power_watts", "0", None, None)].value == 412.345
    assert got[("gpu_power_limit_watts", "0", None, None)].value == 700.0
    assert got[("gpu_energy_joules_total", "0", None, None)].value == 98765432.1
    assert got[("gpu_temperature_celsius", "0", None, None)].value == 61
    assert got[("gpu_memory_temperature_celsius", "0", None, None)].value == 71
    assert got[("gpu_sm_clock_hertz", "0", None, None)].value == 1.98e9
    assert got[("gpu_pcie_receive_bytes_per_second", "0", None, None)].value == 48000 * 1024
    assert got[("gpu_process_memory_used_bytes", "0", None, "4242")].value == 77309411328
    assert got[("gpu_mig_mode_code", "0", None, None)].value == 0.0
    s = got[("gpu_power_watts", "0", None, None)]
    assert s.label("gpu_uuid") == "GPU-5b8f2c1e-7a3d-4e9b-9c2f-1d0e6a4b8c71"
    assert s.label("gpu_model") == "NVIDIA H100 80GB HBM3" and s.timestamp == 1000.0
    assert out.facts["nvml"] == {"driver_version": "580.95.05", "gpm.gpu0": "on", "gpm.gpu1": "off: mig_enabled"}


def test_unsupported_readings_are_absent_never_zero(recording):
    out = _collect(NvmlCollector(nvml=FakeNvml(recording)))
    got = _by_key(out.samples)
    for name in (
        "gpu_energy_joules_total",
        "gpu_memory_clock_hertz",
        "gpu_memory_temperature_celsius",
        "gpu_pcie_transmit_bytes_per_second",
        "gpu_nvlink_transmit_bytes_per_second",
    ):
        assert (name, "1", None, None) not in got, name
    assert ("gpu_process_memory_used_bytes", "0", None, "5150") not in got  # usedGpuMemory unavailable
    # "not supported" is normal; a lost GPU reading is an error worth counting
    assert out.health[0].errors == {"NVMLError_GpuIsLost": 1}


def test_mig_instances_get_their_own_series(recording):
    out = _collect(NvmlCollector(nvml=FakeNvml(recording)))
    got = _by_key(out.samples)
    assert got[("gpu_mig_mode_code", "1", None, None)].value == 1.0
    big = got[("gpu_memory_used_bytes", "1", "1", None)]
    assert big.value == 40802189312 and big.label("mig_profile") == "3g.40gb"
    small = got[("gpu_memory_used_bytes", "1", "2", None)]
    assert small.value == 20401094656 and small.label("mig_profile") == "2g.20gb"
    assert ("gpu_memory_reserved_bytes", "1", "2", None) not in got  # v1 fallback has no reserved
    assert ("gpu_utilization_ratio", "1", "1", None) not in got  # unsupported on MIG handles
    assert got[("gpu_process_memory_used_bytes", "1", "2", "7002")].value == 20401094656


def test_nvlink_rate_needs_two_collections_and_sums_links(recording):
    now = [100.0]
    fake = FakeNvml(recording)
    collector = NvmlCollector(nvml=fake, clock=lambda: now[0])
    first = _by_key(_collect(collector).samples)
    assert ("gpu_nvlink_transmit_bytes_per_second", "0", None, None) not in first
    fields = recording["devices"][0]["fields"]
    fields["138:0"] += 10240  # KiB over 10 s on link 0 ...
    fields["138:1"] += 10240  # ... and on link 1
    now[0] = 110.0
    second = _by_key(_collect(collector).samples)
    assert second[("gpu_nvlink_transmit_bytes_per_second", "0", None, None)].value == 2 * 10240 * 1024 / 10
    assert second[("gpu_nvlink_receive_bytes_per_second", "0", None, None)].value == 0.0


def test_every_emitted_signal_is_declared_with_nvml_as_producer(recording):
    catalog = load_catalog()
    rec = copy.deepcopy(recording)
    collector = NvmlCollector(nvml=FakeNvml(rec))
    _collect(collector)
    rec["devices"][0]["fields"]["138:0"] += 1
    names = {s.name for s in _collect(collector).samples}
    assert "gpu_nvlink_transmit_bytes_per_second" in names
    for name in names:
        assert name in catalog.signals and "nvml" in catalog.signals[name].producers, name


def test_init_failure_is_retried_only_after_retry_interval():
    fake = FakeNvml({"init_error": "DriverNotLoaded", "devices": []})
    collector = NvmlCollector(nvml=fake)
    for _ in range(3):
        out = _collect(collector)
    assert out.health[0].reason == "NVMLError_DriverNotLoaded" and not out.health[0].up
    assert fake.calls["nvmlInit"] == 1


def test_close_shuts_nvml_down(recording):
    fake = FakeNvml(recording)
    collector = NvmlCollector(nvml=fake)
    _collect(collector)
    asyncio.run(collector.close())
    assert fake.calls["nvmlShutdown"] == 1


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "1g.10gb"),
        ("NVIDIA A100-SXM4-40GB MIG 7g.40gb", "7g.40gb"),
        ("NVIDIA H100 80GB HBM3", None),
    ],
)
def test_parse_mig_profile(name, profile):
    assert parse_mig_profile(name) == profile


def test_driver_lost_after_init_reports_down_and_reinitialises(recording):
    fake = FakeNvml(recording)
    config = SimpleNamespace(collector_options=lambda name: {"retry_s": 0})
    collector = NvmlCollector(config, nvml=fake)
    assert _collect(collector).health[0].up
    fake._nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(fake.NVMLError(fake.NVML_ERROR_DRIVER_NOT_LOADED))
    out = _collect(collector)
    assert not out.health[0].up and out.health[0].reason == "NVMLError_DriverNotLoaded"
    assert out.samples == []
    del fake._nvmlDeviceGetCount  # the driver is back
    assert _collect(collector).health[0].up and fake.calls["nvmlInit"] == 2


def test_a_hung_driver_call_does_not_pile_up_reads(recording):
    fake = FakeNvml(recording)
    release = threading.Event()
    fake._nvmlDeviceGetPowerUsage = lambda h: release.wait(30) and 1000
    collector = NvmlCollector(nvml=fake)

    async def scenario():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(collector.collect(), timeout=0.3)  # the runtime gives up
        busy = await collector.collect()
        release.set()
        for _ in range(100):
            if not collector._running:
                break
            await asyncio.sleep(0.05)
        return busy, await collector.collect()

    busy, after = asyncio.run(scenario())
    assert not busy.health[0].up and busy.health[0].reason == "previous_collection_running"
    assert after.health[0].up and after.samples
