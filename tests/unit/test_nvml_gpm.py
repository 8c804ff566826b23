"""GPM profiling metrics through NVML (agent/collectors/gpm.py), against FakeNvml, which checks
every sample pair the way NVML would (two distinct live samples of one GPU, in order)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from types import SimpleNamespace

import pytest

from kvscope.agent.collectors.gpm import GPM_METRICS, GpmSampler
from kvscope.agent.collectors.nvml import NvmlCollector
from kvscope.agent.serve.export import canonical_families
from kvscope.core.signals import load_catalog
from testbed.nvml_fake import FakeNvml
from testbed.prometheus import require_binaries

GPM_SIGNALS = {sig for sig, _ in GPM_METRICS}


@pytest.fixture
def h100(load_fixture):
    return json.loads(load_fixture("nvml/h100-2gpu.json"))


@pytest.fixture
def a100(load_fixture):
    return json.loads(load_fixture("nvml/a100-r525.json"))


def _collect(collector):
    return asyncio.run(collector.collect())


def _gpm(out, gpu="0"):
    return {s.name: s.value for s in out.samples if s.name in GPM_SIGNALS and s.label("gpu") == gpu}


def _retry_at_once():
    return SimpleNamespace(collector_options=lambda name: {"retry_s": 0})


def test_first_collection_has_no_gpm_values_the_second_has_the_ratios(h100):
    now = [100.0]
    collector = NvmlCollector(nvml=FakeNvml(h100), clock=lambda: now[0])
    assert _gpm(_collect(collector)) == {}
    now[0] = 110.0
    out = _collect(collector)
    got = _gpm(out)
    assert got == pytest.approx(
        {
            "gpu_graphics_engine_active_ratio": 0.912,
            "gpu_sm_active_ratio": 0.784,
            "gpu_sm_occupancy_ratio": 0.316,
            "gpu_tensor_active_ratio": 0.427,
            "gpu_dram_active_ratio": 0.639,
            "gpu_fp64_pipe_active_ratio": 0.0,
            "gpu_fp32_pipe_active_ratio": 0.084,
            "gpu_fp16_pipe_active_ratio": 0.031,
        }
    )
    (s,) = [s for s in out.samples if s.name == "gpu_sm_active_ratio"]
    assert s.timestamp == 110.0 and s.label("gpu_uuid") == "GPU-5b8f2c1e-7a3d-4e9b-9c2f-1d0e6a4b8c71"
    assert out.health[0].errors == {"NVMLError_GpuIsLost": 1}  # only the fixture's PCIe reading


def test_gpm_signals_are_the_ones_dcgm_profiling_fields_normalize_to():
    catalog = load_catalog()
    dcgm = {sig: {a.name for a in catalog.signals[sig].aliases if a.engine == "dcgm"} for sig in GPM_SIGNALS}
    assert dcgm["gpu_sm_active_ratio"] == {"DCGM_FI_PROF_SM_ACTIVE"}
    assert dcgm["gpu_sm_occupancy_ratio"] == {"DCGM_FI_PROF_SM_OCCUPANCY"}
    assert dcgm["gpu_tensor_active_ratio"] == {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"}
    assert dcgm["gpu_dram_active_ratio"] == {"DCGM_FI_PROF_DRAM_ACTIVE"}
    for sig in GPM_SIGNALS:
        assert catalog.signals[sig].unit == "ratio" and "nvml" in catalog.signals[sig].producers, sig


def test_metric_ids_come_from_the_installed_bindings():
    import pynvml  # a declared dependency (nvidia-ml-py): missing is a broken install

    sampler = GpmSampler(pynvml)
    ids = dict(sampler._metrics)
    # the ids ../shared/reference/engine-metrics.md lists for nvidia-ml-py 13.615
    assert ids["gpu_sm_active_ratio"] == 2 and ids["gpu_sm_occupancy_ratio"] == 3
    assert ids["gpu_tensor_active_ratio"] == 5 and ids["gpu_dram_active_ratio"] == 10
    assert ids["gpu_graphics_engine_active_ratio"] == 1
    assert sampler._bindings_ok and len(ids) == len(GPM_METRICS)


def test_a_mig_enabled_gpu_is_not_sampled_and_the_facts_say_why(h100):
    fake = FakeNvml(h100)
    collector = NvmlCollector(nvml=fake)
    for _ in range(3):
        out = _collect(collector)
    assert _gpm(out, "1") == {}
    assert out.facts["nvml"]["gpm.gpu1"] == "off: mig_enabled"
    assert fake.calls["nvmlGpmQueryDeviceSupport"] == 1  # GPU 0 only, asked once
    assert fake.calls["nvmlGpmSampleGet"] == 3 and len(fake.gpm_samples) == 2  # two buffers, reused


def test_a_pre_hopper_gpu_is_asked_once_and_never_sampled(a100):
    fake = FakeNvml(a100)
    collector = NvmlCollector(nvml=fake)
    for _ in range(3):
        out = _collect(collector)
    assert _gpm(out) == {} and out.health[0].errors == {}
    assert out.facts["nvml"]["gpm.gpu0"] == "off: device_without_gpm"
    assert fake.calls["nvmlGpmQueryDeviceSupport"] == 1
    assert fake.calls["nvmlGpmSampleAlloc"] == 0 and fake.gpm_samples == {}


def test_a_driver_without_gpm_is_off_without_errors(h100):
    h100["devices"][0]["gpm"] = {"error": "FunctionNotFound"}
    fake = FakeNvml(h100)
    collector = NvmlCollector(nvml=fake)
    for _ in range(2):
        out = _collect(collector)
    assert out.facts["nvml"]["gpm.gpu0"] == "off: driver_without_gpm"
    assert out.health[0].errors == {"NVMLError_GpuIsLost": 1} and fake.calls["nvmlGpmQueryDeviceSupport"] == 1


class _OldBindings(FakeNvml):
    """nvidia-ml-py from before GPM: no nvmlGpm* calls at all."""

    def __getattr__(self, name):
        if name.startswith("nvmlGpm"):
            raise AttributeError(name)
        return super().__getattr__(name)


def test_bindings_without_gpm_are_off_and_nothing_else_changes(h100):
    collector = NvmlCollector(nvml=_OldBindings(h100))
    _collect(collector)
    out = _collect(collector)
    assert out.facts["nvml"]["gpm.gpu0"] == "off: bindings_without_gpm"
    assert _gpm(out) == {} and out.health[0].up
    assert any(s.name == "gpu_power_watts" for s in out.samples)


def test_a_support_query_error_is_counted_and_asked_again(h100):
    h100["devices"][0]["gpm"] = {"error": "Unknown"}
    fake = FakeNvml(h100)
    collector = NvmlCollector(nvml=fake)
    out = _collect(collector)
    assert out.health[0].errors["NVMLError_Unknown"] == 1 and "gpm.gpu0" not in out.facts["nvml"]
    h100["devices"][0]["gpm"] = {"supported": 1, "metrics": {"2": 50.0}}
    _collect(collector)
    out = _collect(collector)
    assert _gpm(out) == {"gpu_sm_active_ratio": 0.5} and out.facts["nvml"]["gpm.gpu0"] == "on"


def test_a_lost_sample_mid_run_is_counted_and_the_next_pair_spans_the_gap(h100):
    fake = FakeNvml(h100)
    collector = NvmlCollector(nvml=fake)
    _collect(collector)
    h100["devices"][0]["gpm"]["sample_error"] = "GpuIsLost"
    lost = _collect(collector)
    assert _gpm(lost) == {} and lost.health[0].errors["NVMLError_GpuIsLost"] == 2
    del h100["devices"][0]["gpm"]["sample_error"]
    back = _collect(collector)  # FakeNvml rejects a pair out of order or of a stale buffer
    assert back.health[0].errors == {"NVMLError_GpuIsLost": 1}
    assert _gpm(back)["gpu_sm_active_ratio"] == pytest.approx(0.784)


def test_a_metric_the_gpu_cannot_compute_is_absent_the_others_are_not(h100):
    h100["devices"][0]["gpm"]["metrics"]["3"] = {"error": "NotSupported"}
    del h100["devices"][0]["gpm"]["metrics"]["13"]
    collector = NvmlCollector(nvml=FakeNvml(h100))
    _collect(collector)
    got = _gpm(_collect(collector))
    assert "gpu_sm_occupancy_ratio" not in got and "gpu_fp16_pipe_active_ratio" not in got
    assert got["gpu_tensor_active_ratio"] == pytest.approx(0.427) and len(got) == 6


def test_a_failed_metrics_call_costs_one_collection(h100):
    fake = FakeNvml(h100)
    collector = NvmlCollector(nvml=fake)
    _collect(collector)
    fake._nvmlGpmMetricsGet = lambda request: (_ for _ in ()).throw(fake.NVMLError(fake.NVML_ERROR_UNKNOWN))
    failed = _collect(collector)
    assert _gpm(failed) == {} and failed.health[0].errors["NVMLError_Unknown"] == 1
    del fake._nvmlGpmMetricsGet
    assert _gpm(_collect(collector))["gpu_dram_active_ratio"] == pytest.approx(0.639)


def test_close_frees_every_sample_before_shutdown(h100):
    fake = FakeNvml(h100)
    order = []
    shutdown = fake._nvmlShutdown
    fake._nvmlShutdown = lambda: (order.append(len(fake.gpm_samples)), shutdown())
    collector = NvmlCollector(nvml=fake)
    for _ in range(4):
        _collect(collector)
    assert len(fake.gpm_samples) == 2
    asyncio.run(collector.close())
    assert fake.gpm_samples == {} and order == [0]
    assert fake.calls["nvmlGpmSampleFree"] == 2


def test_close_leaves_the_buffers_to_a_read_still_running(h100):
    fake = FakeNvml(h100)
    collector = NvmlCollector(nvml=fake)
    _collect(collector)
    collector._running = True  # a hung driver call still holds them
    asyncio.run(collector.close())
    assert len(fake.gpm_samples) == 2 and fake.calls["nvmlGpmSampleFree"] == 0


def test_driver_loss_frees_the_buffers_and_the_pair_starts_over(h100):
    fake = FakeNvml(h100)
    collector = NvmlCollector(_retry_at_once(), nvml=fake)
    _collect(collector)
    _collect(collector)
    fake._nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(fake.NVMLError(fake.NVML_ERROR_DRIVER_NOT_LOADED))
    down = _collect(collector)
    assert down.health[0].reason == "NVMLError_DriverNotLoaded" and fake.gpm_samples == {}
    del fake._nvmlDeviceGetCount
    assert _gpm(_collect(collector)) == {}  # a fresh pair needs two samples again
    assert _gpm(_collect(collector))["gpu_sm_active_ratio"] == pytest.approx(0.784)


def test_a_gpu_switched_to_mig_or_gone_gives_its_buffers_back(h100):
    fake = FakeNvml(h100)
    collector = NvmlCollector(nvml=fake)
    _collect(collector)
    h100["devices"][0]["mig_mode"] = [1, 1]
    h100["devices"][0]["max_mig_devices"] = 0
    out = _collect(collector)
    assert fake.gpm_samples == {} and out.facts["nvml"]["gpm.gpu0"] == "off: mig_enabled"
    h100["devices"][0]["mig_mode"] = [0, 0]
    _collect(collector)
    assert len(fake.gpm_samples) == 2
    h100["devices"].pop(0)
    h100["devices"][0]["gpm"] = {"supported": 0}  # what was GPU 1 is now GPU 0, not MIG, no GPM
    h100["devices"][0]["mig_mode"] = [0, 0]
    _collect(collector)
    assert fake.gpm_samples == {}


@pytest.mark.prometheus
def test_the_reexported_gpm_and_clock_event_series_pass_promtool(h100):
    [promtool] = require_binaries("promtool")
    collector = NvmlCollector(nvml=FakeNvml(h100))
    _collect(collector)
    lines: list[str] = []
    for family in canonical_families(_collect(collector).samples, load_catalog()):
        family.render(lines)
    body = "".join(lines)
    assert 'kvscope_gpu_sm_occupancy_ratio{gpu="0"' in body
    assert 'kvscope_gpu_clock_event_active_by_reason{gpu="1"' in body and 'reason="sync_boost"} 1' in body
    res = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=300
    )  # a hang guard only (slow on a loaded 2-core box)
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr
