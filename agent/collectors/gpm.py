"""GPU Performance Monitoring (GPM, Hopper and later) through NVML, under the canonical signals
dcgm-exporter's profiling fields (DCGM_FI_PROF_*) normalize to. A metric is computed between two
samples (`GpmSampler` swaps two NVML buffers per GPU, so a GPU's first collection yields nothing);
a GPU that cannot do GPM is asked once, then skipped, `status()` saying why (docs/collectors.md
"nvml"). All calls go through the collector's `_Reader` (errors counted, never raised); constants
and ctypes structures come from the loaded bindings.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kvscope.core.signals import Sample, make_labels

# canonical signal <- NVML_GPM_METRIC_* constant (percent 0..100 in NVML, ratio 0..1 here)
GPM_METRICS = (
    ("gpu_graphics_engine_active_ratio", "NVML_GPM_METRIC_GRAPHICS_UTIL"),  # DCGM_FI_PROF_GR_ENGINE_ACTIVE
    ("gpu_sm_active_ratio", "NVML_GPM_METRIC_SM_UTIL"),  # DCGM_FI_PROF_SM_ACTIVE
    ("gpu_sm_occupancy_ratio", "NVML_GPM_METRIC_SM_OCCUPANCY"),  # DCGM_FI_PROF_SM_OCCUPANCY
    ("gpu_tensor_active_ratio", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),  # DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
    ("gpu_dram_active_ratio", "NVML_GPM_METRIC_DRAM_BW_UTIL"),  # DCGM_FI_PROF_DRAM_ACTIVE
    ("gpu_fp16_pipe_active_ratio", "NVML_GPM_METRIC_FP16_UTIL"),  # DCGM_FI_PROF_PIPE_FP16_ACTIVE
    ("gpu_fp32_pipe_active_ratio", "NVML_GPM_METRIC_FP32_UTIL"),  # DCGM_FI_PROF_PIPE_FP32_ACTIVE
    ("gpu_fp64_pipe_active_ratio", "NVML_GPM_METRIC_FP64_UTIL"),  # DCGM_FI_PROF_PIPE_FP64_ACTIVE
)

# Why GPM is off for a GPU (the value of the `gpm.gpu<N>` fact).
BINDINGS_WITHOUT_GPM = "off: bindings_without_gpm"  # nvidia-ml-py older than the GPM calls
DRIVER_WITHOUT_GPM = "off: driver_without_gpm"  # nvmlGpmQueryDeviceSupport not supported / not found
DEVICE_WITHOUT_GPM = "off: device_without_gpm"  # isSupportedDevice == 0 (pre-Hopper)
MIG_ENABLED = "off: mig_enabled"  # per-instance GPM (nvmlGpmMigSampleGet) is not read
ON = "on"
_NEEDED = (
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMetricsGet",
    "c_nvmlGpmMetricsGet_t",
    "NVML_GPM_METRICS_GET_VERSION",
)


@dataclass
class _Device:
    """GPM state of one GPU: its support verdict and, when on, its two sample buffers."""

    status: str | None = None  # None: not asked yet (or the answer was an error)
    uuid: str | None = None  # a different GPU at the same index starts over
    buffers: list[Any] = field(default_factory=list)  # [previous, current] once allocated
    have_previous: bool = False


class GpmSampler:
    """Per-GPU GPM sample pairs across collections. Not thread-safe: one collection at a time."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._devices: dict[str, _Device] = {}
        self._metrics = [(sig, getattr(nvml, const)) for sig, const in GPM_METRICS if hasattr(nvml, const)]
        self._bindings_ok = all(hasattr(nvml, name) for name in _NEEDED)

    def status(self) -> dict[str, str]:
        """GPU key -> "on" or "off: <why>", for the GPUs asked so far."""
        return {key: dev.status for key, dev in self._devices.items() if dev.status is not None}

    def read(
        self, r: Any, key: str, handle: Any, labels: dict[str, str], now: float, mig_enabled: bool
    ) -> Iterator[Sample]:
        """Take this collection's sample of one GPU; yield the metrics since its previous one."""
        dev = self._devices.setdefault(key, _Device())
        if dev.uuid != labels.get("gpu_uuid"):
            self._release(r, dev)
            dev.status, dev.uuid = None, labels.get("gpu_uuid")
        if mig_enabled:
            self._release(r, dev)
            dev.status = MIG_ENABLED
            return
        if dev.status in (None, MIG_ENABLED):
            dev.status = self._support(r, handle)
        while dev.status == ON and len(dev.buffers) < 2 and (buffer := r.get("nvmlGpmSampleAlloc")) is not None:
            dev.buffers.append(buffer)  # a failed allocation is counted; what was allocated is kept
        if dev.status != ON or len(dev.buffers) < 2:
            return
        previous, current = dev.buffers
        if r.get("nvmlGpmSampleGet", handle, current) is None:
            return  # the previous sample stays valid; the next pair spans the gap
        if dev.have_previous:
            yield from self._metrics_between(r, previous, current, labels, now)
        dev.buffers.reverse()
        dev.have_previous = True

    def _support(self, r: Any, handle: Any) -> str | None:
        if not self._bindings_ok:
            return BINDINGS_WITHOUT_GPM
        seen = sum(r.errors.values())
        support = r.get("nvmlGpmQueryDeviceSupport", handle)
        if support is None:  # an error: ask again next collection; unsupported: remember
            return None if sum(r.errors.values()) > seen else DRIVER_WITHOUT_GPM
        return ON if getattr(support, "isSupportedDevice", 0) else DEVICE_WITHOUT_GPM

    def _metrics_between(self, r: Any, first: Any, second: Any, labels: dict[str, str], now: float) -> Iterator[Sample]:
        nv = self._nvml
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self._metrics)
        request.sample1, request.sample2 = first, second
        for i, (_, metric_id) in enumerate(self._metrics):
            request.metrics[i].metricId = metric_id
        answer = r.get("nvmlGpmMetricsGet", request)
        if answer is None:
            return
        base = make_labels(labels)
        for i, (signal, _) in enumerate(self._metrics):
            metric = answer.metrics[i]
            if metric.nvmlReturn == nv.NVML_SUCCESS and math.isfinite(metric.value):
                yield Sample(signal, base, metric.value / 100.0, now)

    def forget_others(self, r: Any, keep: set[str]) -> None:
        """Free the buffers of GPUs not in `keep` (all of them before nvmlShutdown) and forget them."""
        for key in [k for k in self._devices if k not in keep]:
            self._release(r, self._devices.pop(key))

    def _release(self, r: Any, dev: _Device) -> None:
        for buffer in dev.buffers:
            r.get("nvmlGpmSampleFree", buffer)
        dev.buffers.clear()
        dev.have_previous = False
