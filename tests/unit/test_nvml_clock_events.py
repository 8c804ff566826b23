"""Clock-event (throttle) reasons from NVML: one 0/1 series per reason, absent when unknown."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from kvscope.agent.collectors.nvml import CLOCK_EVENT_REASONS, NvmlCollector, clock_event_bits
from testbed.nvml_fake import FakeNvml

SIGNAL = "gpu_clock_event_active_by_reason"


@pytest.fixture
def h100(load_fixture):
    return json.loads(load_fixture("nvml/h100-2gpu.json"))


@pytest.fixture
def a100(load_fixture):
    return json.loads(load_fixture("nvml/a100-r525.json"))


def _reasons(out, gpu):
    return {s.label("reason"): s.value for s in out.samples if s.name == SIGNAL and s.label("gpu") == gpu}


def _collect(collector):
    return asyncio.run(collector.collect())


def test_every_reason_the_gpu_supports_is_reported_zero_or_one(h100):
    out = _collect(NvmlCollector(nvml=FakeNvml(h100)))
    gpu0 = _reasons(out, "0")
    # supported mask 0xFF: every reason but display_clock_setting (0x100), none active
    assert set(gpu0) == {label for label, _ in CLOCK_EVENT_REASONS} - {"display_clock_setting"}
    assert set(gpu0.values()) == {0.0}
    # no supported mask on GPU 1: all nine reasons; 0x10 is sync boost
    gpu1 = _reasons(out, "1")
    assert len(gpu1) == 9 and gpu1["sync_boost"] == 1.0
    assert sum(gpu1.values()) == 1.0


def test_series_carry_the_gpu_labels_and_the_reason(h100):
    out = _collect(NvmlCollector(nvml=FakeNvml(h100), clock=lambda: 50.0))
    (s,) = [s for s in out.samples if s.name == SIGNAL and s.label("gpu") == "1" and s.label("reason") == "sync_boost"]
    assert s.label("gpu_uuid") == "GPU-0c3e9d7a-2b6f-4a18-8e5d-93f1c2a7b604" and s.label("node")
    assert s.timestamp == 50.0


def test_a_driver_without_the_clocks_event_call_falls_back_to_the_throttle_call(a100):
    fake = FakeNvml(a100)
    out = _collect(NvmlCollector(nvml=fake))
    got = _reasons(out, "0")
    assert got["sw_power_cap"] == 1.0 and sum(got.values()) == 1.0
    assert "display_clock_setting" not in got  # supported throttle mask 0xFF
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1
    assert out.health[0].errors == {}  # FunctionNotFound is not an error


def test_without_either_call_the_reasons_are_absent_never_zero(h100):
    for dev in h100["devices"]:
        dev.pop("clocks_event_reasons")
    out = _collect(NvmlCollector(nvml=FakeNvml(h100)))
    assert not [s for s in out.samples if s.name == SIGNAL]
    assert out.health[0].up and out.health[0].errors == {"NVMLError_GpuIsLost": 1}  # the fixture's PCIe one


def test_a_lost_gpu_on_the_reasons_call_is_counted_once_and_the_other_gpu_still_reports(h100):
    h100["devices"][0]["clocks_event_reasons"] = {"error": "GpuIsLost"}
    fake = FakeNvml(h100)
    out = _collect(NvmlCollector(nvml=fake))
    assert _reasons(out, "0") == {}
    assert _reasons(out, "1")["sync_boost"] == 1.0
    assert out.health[0].errors == {"NVMLError_GpuIsLost": 2}  # this one and the fixture's PCIe one
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 0  # no pointless retry under the old name


def test_the_supported_mask_is_asked_once_per_gpu_and_again_after_an_error(h100):
    h100["devices"][1]["supported_clocks_event_reasons"] = {"error": "Unknown"}
    fake = FakeNvml(h100)
    collector = NvmlCollector(nvml=fake)
    first = _collect(collector)
    assert len(_reasons(first, "1")) == 9  # cannot tell: every reason, none hidden
    h100["devices"][1]["supported_clocks_event_reasons"] = 0x10
    for _ in range(3):
        out = _collect(collector)
    assert _reasons(out, "1") == {"sync_boost": 1.0}
    # GPU 0 answered at once and GPU 1 at its second try: 1 + 2 asks over four collections
    assert fake.calls["nvmlDeviceGetSupportedClocksEventReasons"] == 3


def test_reason_bits_come_from_the_bindings_new_names_first_old_names_otherwise():
    import pynvml  # a declared dependency (nvidia-ml-py): missing is a broken install

    bits = dict(clock_event_bits(pynvml))
    assert bits["sw_power_cap"] == pynvml.nvmlClocksEventReasonSwPowerCap
    assert bits["hw_thermal_slowdown"] == pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert len(bits) == 9 and len(set(bits.values())) == 9
    old = SimpleNamespace(**{k: getattr(pynvml, k) for k in dir(pynvml) if k.startswith("nvmlClocksThrottleReason")})
    assert dict(clock_event_bits(old)) == bits
    assert clock_event_bits(SimpleNamespace()) == []  # bindings that know no reasons: nothing to report
