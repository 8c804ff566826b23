"""NVML collector: per-GPU utilisation, memory, power, energy, temperature, clocks and clock-event
(throttle) reasons, PCIe and NVLink throughput, per-process memory, MIG layout and GPM metrics
(agent/collectors/gpm.py), through NVIDIA's `nvidia-ml-py` bindings (`import pynvml`). An
unsupported getter yields nothing (absent, never 0); without a driver the collector is down and
retries every `retry_s`. Calls, failure modes and the fake it is tested on: docs/collectors.md "nvml".
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from kvscope.agent.collectors.base import Collection, Health, register_collector
from kvscope.agent.collectors.gpm import GpmSampler
from kvscope.core.signals import Sample, make_labels

NAME = "nvml"
RETRY_S = 60.0
KIB = 1024.0
FI_MEMORY_TEMP = 82  # NVML_FI_DEV_MEMORY_TEMP, HBM temperature in C
FI_NVLINK_LINK_COUNT = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
FI_NVLINK_DATA_TX = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, cumulative KiB per link
FI_NVLINK_DATA_RX = 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId of a process outside any MIG instance
# `reason` label <- suffix of the bit constants nvmlClocksEventReason* (current bindings)
# or, in older bindings, nvmlClocksThrottleReason*; the bit values are read from the bindings.
CLOCK_EVENT_REASONS = (
    ("gpu_idle", "GpuIdle"),
    ("applications_clocks_setting", "ApplicationsClocksSetting"),
    ("sw_power_cap", "SwPowerCap"),
    ("hw_slowdown", "HwSlowdown"),
    ("sync_boost", "SyncBoost"),
    ("sw_thermal_slowdown", "SwThermalSlowdown"),
    ("hw_thermal_slowdown", "HwThermalSlowdown"),
    ("hw_power_brake_slowdown", "HwPowerBrakeSlowdown"),
    ("display_clock_setting", "DisplayClockSetting"),
)
CURRENT_REASONS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
SUPPORTED_REASONS = ("nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetSupportedClocksThrottleReasons")


class _Reader:
    """Calls NVML getters for one collection, turning 'not supported' into None and counting
    every other NVML error by class name."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.errors: Counter[str] = Counter()
        self.quiet = {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_ERROR_FUNCTION_NOT_FOUND}

    def get(self, fn: str, *args: Any, **kwargs: Any) -> Any | None:
        func = getattr(self.nvml, fn, None)
        if func is None:  # bindings older than the call
            return None
        try:
            return func(*args, **kwargs)
        except self.nvml.NVMLError as exc:
            if exc.value not in self.quiet:
                self.errors[type(exc).__name__] += 1
            return None
        except Exception as exc:  # noqa: BLE001 - a binding bug costs one reading, not the collection
            self.errors[type(exc).__name__] += 1
            return None

    def first(self, fns: tuple[str, ...], *args: Any) -> Any | None:
        """The answer of the first of several equivalent getters (newest name first) that has
        one. A counted error ends the search: the older call would only fail the same way."""
        for fn in fns:
            seen = sum(self.errors.values())
            value = self.get(fn, *args)
            if value is not None or sum(self.errors.values()) > seen:
                return value
        return None


def clock_event_bits(nvml: Any) -> list[tuple[str, int]]:
    """(reason label, bit) for every clock-event reason the bindings define."""
    old = {s: getattr(nvml, "nvmlClocksThrottleReason" + s, None) for _, s in CLOCK_EVENT_REASONS}
    bits = [(label, getattr(nvml, "nvmlClocksEventReason" + s, old[s])) for label, s in CLOCK_EVENT_REASONS]
    return [(label, int(bit)) for label, bit in bits if bit is not None]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_mig_profile(device_name: str) -> str | None:
    """'NVIDIA H100 80GB HBM3 MIG 3g.40gb' -> '3g.40gb' (the GPU_I_PROFILE dcgm-exporter uses)."""
    head, sep, profile = device_name.rpartition(" MIG ")
    return profile.strip() or None if sep else None


def field_value(nvml: Any, fv: Any) -> float | None:
    """The number inside one nvmlFieldValue_t, or None when NVML returned an error for it."""
    if fv.nvmlReturn != nvml.NVML_SUCCESS:
        return None
    member = {
        nvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }.get(fv.valueType)
    return None if member is None else float(getattr(fv.value, member))


@register_collector(NAME, default_enabled=True)
class NvmlCollector:
    """Per-GPU utilisation, memory, power, clocks, interconnect and processes, read through NVML.
    Its options (`collectors: {nvml: {...}}`) are in OPTIONS."""

    name = NAME
    OPTIONS = {
        "node": "value of the node label (default: the host name)",
        "retry_s": "seconds between NVML initialisation attempts while it is unavailable",
    }

    def __init__(self, config: Any = None, nvml: Any | None = None, clock: Callable[[], float] = time.time) -> None:
        opts = config.collector_options(NAME) if hasattr(config, "collector_options") else {}
        self.node = str(opts.get("node") or socket.gethostname())
        self.retry_s = float(opts.get("retry_s", RETRY_S))
        self._nvml = nvml
        self._clock = clock
        self._ready = False
        self._down_reason = ""
        self._next_init = 0.0
        self._nvlink_prev: dict[tuple[str, str], tuple[float, float]] = {}
        self._supported_reasons: dict[str, int | None] = {}  # gpu uuid (or index) -> mask, None: all
        self._gpm: GpmSampler | None = None
        self._running = False

    async def collect(self) -> Collection:
        # A hung driver call (a GPU falling off the bus) must not pile up worker threads: while
        # one read is still running, the next collection reports that instead of starting another.
        if self._running:
            return Collection(health=[Health(collector=NAME, up=False, reason="previous_collection_running")])
        return await asyncio.to_thread(self._collect_tracked)

    def _collect_tracked(self) -> Collection:
        # The flag lives on the worker thread: a caller that gave up waiting (a timeout) leaves
        # it set until the read really ends.
        self._running = True
        try:
            return self.collect_sync()
        finally:
            self._running = False

    def collect_sync(self) -> Collection:
        """One blocking NVML read (collect() runs it off the event loop)."""
        t0 = time.perf_counter()
        health = Health(collector=NAME)
        out = Collection(health=[health])
        if not self._ensure_init():
            health.up, health.reason = False, self._down_reason
        else:
            reader = _Reader(self._nvml)
            count = reader.get("nvmlDeviceGetCount")
            if count is None:  # the driver went away under us: report it and initialise again
                health.up = False
                health.reason = next(iter(reader.errors), "device_count_unavailable")
                self._ready, self._down_reason = False, health.reason
                self._forget_devices(_Reader(self._nvml))  # its errors would hide the reason
            else:
                out.samples = list(self._read_all(reader, count))
                out.facts["nvml"] = self._facts(reader)
            health.errors = reader.errors
        health.series = len(out.samples)
        health.duration_s = time.perf_counter() - t0
        return out

    def _ensure_init(self) -> bool:
        if self._ready:
            return True
        now = time.monotonic()
        if now < self._next_init and self._down_reason:
            return False
        self._next_init = now + self.retry_s
        try:
            if self._nvml is None:
                import pynvml  # the bindings shipped by nvidia-ml-py

                self._nvml = pynvml
            self._nvml.nvmlInit()
        except ImportError:
            self._down_reason = "bindings_missing"
            return False
        except Exception as exc:  # noqa: BLE001 - any failure to start NVML means "down", with its class
            self._down_reason = type(exc).__name__
            return False
        self._ready, self._down_reason = True, ""
        return True

    def _facts(self, reader: _Reader) -> dict[str, str]:
        version = reader.get("nvmlSystemGetDriverVersion")
        facts = {} if version is None else {"driver_version": _text(version)}
        if self._gpm is not None:
            facts.update({f"gpm.{key}": status for key, status in sorted(self._gpm.status().items())})
        return facts

    def _read_all(self, r: _Reader, count: int) -> Iterator[Sample]:
        now = self._clock()
        if self._gpm is None:
            self._gpm = GpmSampler(self._nvml)
        for index in range(count):
            handle = r.get("nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                continue
            yield from self._read_device(r, handle, index, now)
        self._gpm.forget_others(r, {f"gpu{i}" for i in range(count)})

    def _forget_devices(self, r: _Reader) -> None:
        """Drop per-GPU state (GPM buffers, supported reasons) before NVML is started again."""
        if self._gpm is not None:
            self._gpm.forget_others(r, set())
            self._gpm = None
        self._supported_reasons.clear()

    def _device_labels(self, r: _Reader, handle: Any, index: int) -> dict[str, str]:
        labels = {"gpu": str(index), "node": self.node}
        for label, getter in (("gpu_uuid", "nvmlDeviceGetUUID"), ("gpu_model", "nvmlDeviceGetName")):
            if (value := r.get(getter, handle)) is not None:
                labels[label] = _text(value)
        return labels

    def _read_device(self, r: _Reader, handle: Any, index: int, now: float) -> Iterator[Sample]:
        labels = self._device_labels(r, handle, index)
        base = make_labels(labels)
        for name, value in self._device_values(r, handle):
            if value is not None:
                yield Sample(name, base, float(value), now)
        yield from self._clock_events(r, handle, labels, now)
        yield from self._nvlink(r, handle, labels, now)
        mig_on = self._mig_enabled(r, handle)
        if mig_on is not None:
            yield Sample("gpu_mig_mode_code", base, 1.0 if mig_on else 0.0, now)
        if self._gpm is not None:
            yield from self._gpm.read(r, f"gpu{index}", handle, labels, now, bool(mig_on))
        yield from self._processes(r, handle, labels, now, bool(mig_on))
        if mig_on:
            yield from self._mig_devices(r, handle, labels, now)

    def _device_values(self, r: _Reader, h: Any) -> Iterator[tuple[str, float | None]]:
        nv = self._nvml
        assert nv is not None  # devices are read only once the bindings are loaded
        util = r.get("nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            yield "gpu_utilization_ratio", util.gpu / 100.0
            yield "gpu_memory_copy_utilization_ratio", util.memory / 100.0
        yield from self._memory(r, h)
        power = r.get("nvmlDeviceGetPowerUsage", h)
        yield "gpu_power_watts", None if power is None else power / 1000.0
        limit = r.get("nvmlDeviceGetEnforcedPowerLimit", h)
        yield "gpu_power_limit_watts", None if limit is None else limit / 1000.0
        energy = r.get("nvmlDeviceGetTotalEnergyConsumption", h)
        yield "gpu_energy_joules_total", None if energy is None else energy / 1000.0
        yield "gpu_temperature_celsius", r.get("nvmlDeviceGetTemperatureV", h, nv.NVML_TEMPERATURE_GPU)
        yield "gpu_memory_temperature_celsius", self._field(r, h, FI_MEMORY_TEMP)
        for sig, clock in (("gpu_sm_clock_hertz", nv.NVML_CLOCK_SM), ("gpu_memory_clock_hertz", nv.NVML_CLOCK_MEM)):
            mhz = r.get("nvmlDeviceGetClockInfo", h, clock)
            yield sig, None if mhz is None else mhz * 1e6
        for sig, counter in (
            ("gpu_pcie_transmit_bytes_per_second", nv.NVML_PCIE_UTIL_TX_BYTES),
            ("gpu_pcie_receive_bytes_per_second", nv.NVML_PCIE_UTIL_RX_BYTES),
        ):
            kbs = r.get("nvmlDeviceGetPcieThroughput", h, counter)
            yield sig, None if kbs is None else kbs * KIB

    def _memory(self, r: _Reader, h: Any) -> Iterator[tuple[str, float | None]]:
        mem = r.get("nvmlDeviceGetMemoryInfo", h, version=getattr(self._nvml, "nvmlMemory_v2", None))
        if mem is None:  # v2 is missing on older drivers: fall back to v1 (no `reserved`)
            mem = r.get("nvmlDeviceGetMemoryInfo", h)
        if mem is None:
            return
        yield "gpu_memory_used_bytes", mem.used
        yield "gpu_memory_free_bytes", mem.free
        yield "gpu_memory_total_bytes", mem.total
        yield "gpu_memory_reserved_bytes", getattr(mem, "reserved", None)

    def _clock_events(self, r: _Reader, h: Any, labels: dict[str, str], now: float) -> Iterator[Sample]:
        """One series per clock-event (throttle) reason: 1 while active, 0 while not. A reason
        the GPU does not report (its supported mask lacks the bit) is absent, as is every reason
        when the driver has neither the current nor the deprecated call."""
        mask = r.first(CURRENT_REASONS, h)
        if mask is None:
            return
        supported = self._supported_mask(r, h, labels.get("gpu_uuid") or labels["gpu"])
        for reason, bit in clock_event_bits(self._nvml):
            if supported is None or supported & bit:
                rlabels = make_labels({**labels, "reason": reason})
                yield Sample("gpu_clock_event_active_by_reason", rlabels, 1.0 if mask & bit else 0.0, now)

    def _supported_mask(self, r: _Reader, h: Any, gpu: str) -> int | None:
        """The reasons this GPU can report, asked once per GPU (None when it cannot say)."""
        if gpu not in self._supported_reasons:
            seen = sum(r.errors.values())
            mask = r.first(SUPPORTED_REASONS, h)
            if mask is None and sum(r.errors.values()) > seen:
                return None  # an error: assume all, and ask again next collection
            self._supported_reasons[gpu] = mask
        return self._supported_reasons[gpu]

    def _field(self, r: _Reader, h: Any, field_id: int | tuple[int, int]) -> float | None:
        values = r.get("nvmlDeviceGetFieldValues", h, [field_id])
        return None if not values else field_value(self._nvml, values[0])

    def _nvlink(self, r: _Reader, h: Any, labels: dict[str, str], now: float) -> Iterator[Sample]:
        """NVLink data throughput: NVML keeps cumulative KiB per link; the rate is the sum over
        links between two collections, so the first collection has none."""
        links = self._field(r, h, FI_NVLINK_LINK_COUNT)
        if not links:
            return
        ids = [(f, link) for link in range(int(links)) for f in (FI_NVLINK_DATA_TX, FI_NVLINK_DATA_RX)]
        values = r.get("nvmlDeviceGetFieldValues", h, ids) or []
        totals: dict[int, float] = {}
        for (fid, _), fv in zip(ids, values, strict=False):
            v = field_value(self._nvml, fv)
            if v is not None:
                totals[fid] = totals.get(fid, 0.0) + v * KIB
        for fid, sig in (
            (FI_NVLINK_DATA_TX, "gpu_nvlink_transmit_bytes_per_second"),
            (FI_NVLINK_DATA_RX, "gpu_nvlink_receive_bytes_per_second"),
        ):
            if fid not in totals:
                continue
            total, prev = totals[fid], self._nvlink_prev.get((labels["gpu"], sig))
            self._nvlink_prev[(labels["gpu"], sig)] = (now, total)
            if prev is not None and now > prev[0]:
                delta = total - prev[1] if total >= prev[1] else total  # a reset counts from zero
                yield Sample(sig, make_labels(labels), delta / (now - prev[0]), now)

    def _mig_enabled(self, r: _Reader, h: Any) -> bool | None:
        mode = r.get("nvmlDeviceGetMigMode", h)
        return None if mode is None else mode[0] == getattr(self._nvml, "NVML_DEVICE_MIG_ENABLE", 1)

    def _processes(self, r: _Reader, h: Any, labels: dict[str, str], now: float, mig: bool) -> Iterator[Sample]:
        for proc in r.get("nvmlDeviceGetComputeRunningProcesses", h) or []:
            used = getattr(proc, "usedGpuMemory", None)
            if used is None:  # not available (e.g. WDDM, or no permission to see it)
                continue
            plabels = {**labels, "pid": str(proc.pid)}
            gi = getattr(proc, "gpuInstanceId", NO_INSTANCE)
            if mig and gi is not None and gi != NO_INSTANCE:
                plabels["mig_instance"] = str(gi)
            yield Sample("gpu_process_memory_used_bytes", make_labels(plabels), float(used), now)

    def _mig_devices(self, r: _Reader, h: Any, labels: dict[str, str], now: float) -> Iterator[Sample]:
        for i in range(r.get("nvmlDeviceGetMaxMigDeviceCount", h) or 0):
            mig = r.get("nvmlDeviceGetMigDeviceHandleByIndex", h, i)
            if mig is None:  # empty slot (NVML_ERROR_NOT_FOUND)
                continue
            gi = r.get("nvmlDeviceGetGpuInstanceId", mig)
            mlabels = {**labels, "mig_instance": str(gi if gi is not None else i)}
            name = r.get("nvmlDeviceGetName", mig)
            profile = parse_mig_profile(_text(name)) if name is not None else None
            if profile:
                mlabels["mig_profile"] = profile
            base = make_labels(mlabels)
            for sig, value in self._memory(r, mig):
                if value is not None:
                    yield Sample(sig, base, float(value), now)
            util = r.get("nvmlDeviceGetUtilizationRates", mig)  # commonly unsupported on MIG
            if util is not None:
                yield Sample("gpu_utilization_ratio", base, util.gpu / 100.0, now)

    async def close(self) -> None:
        if self._ready:
            if not self._running:  # a hung read may still be using the GPM buffers: leave them
                self._forget_devices(_Reader(self._nvml))
            assert self._nvml is not None  # _ready is set only after the bindings loaded
            with contextlib.suppress(Exception):  # shutting down a broken driver must not fail close()
                self._nvml.nvmlShutdown()
            self._ready = False
