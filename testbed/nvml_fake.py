"""FakeNvml: the in-memory twin of the `pynvml` module (nvidia-ml-py) that the NVML collector's
unit tests run against, fed from a JSON recording of one node (tests/fixtures/nvml/).

It exposes the same function names, arguments, return shapes and `NVMLError` classes as the
real bindings; constants, exception classes and ctypes structures (`c_nvmlGpmMetricsGet_t`,
`c_nvmlGpmSupport_t`, GPM sample pointers) are the real ones. A call the recording cannot
answer raises AttributeError, as bindings without that call would.
"""

from __future__ import annotations

import ctypes
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any


class FakeNvml:
    """Stands in for the `pynvml` module, from a JSON recording of one node.

    In the recording, any reading may be `{"error": "NotSupported"}` (or another NVML error
    name) and the call then raises that error; a reading that is missing raises NotSupported.
    `{"init_error": "LibraryNotFound"}` makes nvmlInit fail. `calls` counts every call by name.

    GPM (`"gpm"` on a device): `{"supported": 1, "metrics": {"<NVML_GPM_METRIC id>": percent}}`.
    nvmlGpmMetricsGet answers those percentages for a valid pair only: two distinct, live
    samples taken of the same GPU, the first one earlier; anything else is InvalidArgument, as
    NVML would reject it. `"sample_error"` makes nvmlGpmSampleGet fail with that error.
    """

    def __init__(self, recording: dict[str, Any]) -> None:
        import pynvml  # constants, structures and exception classes come from the real bindings

        self._real = pynvml
        self._rec = recording
        self.calls: Counter[str] = Counter()
        self.gpm_samples: dict[int, dict[str, Any]] = {}  # address -> {"buffer", "device", "seq"}
        self._seq = 0

    @classmethod
    def from_file(cls, path: str | Path) -> FakeNvml:
        return cls(json.loads(Path(path).read_text()))

    def __getattr__(self, name: str) -> Any:
        if hasattr(type(self), "_" + name):
            method = getattr(self, "_" + name)

            def call(*args: Any, **kwargs: Any) -> Any:
                self.calls[name] += 1
                return method(*args, **kwargs)

            return call
        real = getattr(self._real, name)
        if name.startswith("nvml") and callable(real):
            raise AttributeError(name)  # a call the recording cannot answer: as if the bindings lacked it
        return real  # constants, structures and exception classes

    def _code(self, name: str) -> int:
        return getattr(
            self._real, "NVML_ERROR_" + "".join("_" + c if c.isupper() else c.upper() for c in name).lstrip("_")
        )

    def _error(self, name: str) -> Exception:
        return self._real.NVMLError(self._code(name))

    def _answer(self, value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {"error"}:
            raise self._error(value["error"])
        return value

    def _dev(self, handle: Any) -> dict[str, Any]:
        return handle if isinstance(handle, dict) else self._rec["devices"][handle]

    def _get(self, handle: Any, key: str) -> Any:
        dev = self._dev(handle)
        if key not in dev:
            raise self._error("NotSupported")
        return self._answer(dev[key])

    def _nvmlInit(self) -> None:
        if "init_error" in self._rec:
            raise self._error(self._rec["init_error"])

    def _nvmlShutdown(self) -> None:
        pass

    def _nvmlSystemGetDriverVersion(self) -> str:
        return str(self._answer(self._rec.get("driver_version", {"error": "NotSupported"})))

    def _nvmlDeviceGetCount(self) -> int:
        return len(self._rec["devices"])

    def _nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def _nvmlDeviceGetUUID(self, h: Any) -> str:
        return str(self._get(h, "uuid"))

    def _nvmlDeviceGetName(self, h: Any) -> str:
        return str(self._get(h, "name"))

    def _nvmlDeviceGetUtilizationRates(self, h: Any) -> SimpleNamespace:
        return SimpleNamespace(**self._get(h, "utilization"))

    def _nvmlDeviceGetMemoryInfo(self, h: Any, version: Any = None) -> SimpleNamespace:
        mem = dict(self._get(h, "memory_v2" if version else "memory"))
        if version:
            mem["version"] = version
        return SimpleNamespace(**mem)

    def _nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return int(self._get(h, "power_mw"))

    def _nvmlDeviceGetEnforcedPowerLimit(self, h: Any) -> int:
        return int(self._get(h, "power_limit_mw"))

    def _nvmlDeviceGetTotalEnergyConsumption(self, h: Any) -> int:
        return int(self._get(h, "energy_mj"))

    def _nvmlDeviceGetTemperatureV(self, h: Any, sensor: int) -> int:
        return int(self._get(h, "temperature_c")[str(sensor)])

    def _nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:
        return int(self._answer(self._get(h, "clocks_mhz")[str(clock)]))

    def _nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return int(self._get(h, "clocks_event_reasons"))

    def _nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Any) -> int:
        return int(self._get(h, "clocks_throttle_reasons"))

    def _nvmlDeviceGetSupportedClocksEventReasons(self, h: Any) -> int:
        return int(self._get(h, "supported_clocks_event_reasons"))

    def _nvmlDeviceGetSupportedClocksThrottleReasons(self, h: Any) -> int:
        return int(self._get(h, "supported_clocks_throttle_reasons"))

    def _nvmlDeviceGetPcieThroughput(self, h: Any, counter: int) -> int:
        return int(self._answer(self._get(h, "pcie_kb_s")[str(counter)]))

    def _nvmlDeviceGetFieldValues(self, h: Any, field_ids: list[Any]) -> list[SimpleNamespace]:
        fields = self._get(h, "fields")
        return [self._field_value(fields, f) for f in field_ids]

    def _field_value(self, fields: dict[str, Any], fid: Any) -> SimpleNamespace:
        key = f"{fid[0]}:{fid[1]}" if isinstance(fid, tuple) else str(fid)
        raw = fields.get(key, {"error": "NotSupported"})
        if isinstance(raw, dict):
            code = self._real.NVML_ERROR_NOT_SUPPORTED
            return SimpleNamespace(nvmlReturn=code, valueType=0, value=SimpleNamespace())
        return SimpleNamespace(
            nvmlReturn=0,
            valueType=self._real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
            value=SimpleNamespace(ullVal=int(raw)),
        )

    def _nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[SimpleNamespace]:
        return [SimpleNamespace(**p) for p in self._get(h, "processes")]

    def _nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        return list(self._get(h, "mig_mode"))

    def _nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        return int(self._get(h, "max_mig_devices"))

    def _nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, index: int) -> dict[str, Any]:
        slots = self._get(h, "mig_devices")
        if index >= len(slots) or slots[index] is None:
            raise self._error("NotFound")
        return dict(slots[index])

    def _nvmlDeviceGetGpuInstanceId(self, h: Any) -> int:
        return int(self._get(h, "gpu_instance_id"))

    # ------------------------------------------------------------------------------------- GPM

    def _nvmlGpmQueryDeviceSupport(self, h: Any) -> Any:
        support = self._real.c_nvmlGpmSupport_t()
        support.version = self._real.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(self._get(h, "gpm")["supported"])
        return support

    def _nvmlGpmSampleAlloc(self) -> Any:
        buffer = self._real.struct_c_nvmlGpmSample_t()
        sample = ctypes.pointer(buffer)
        self.gpm_samples[ctypes.addressof(buffer)] = {"buffer": buffer, "device": None, "seq": None}
        return sample

    def _nvmlGpmSampleFree(self, sample: Any) -> None:
        self.gpm_samples.pop(self._live(sample))

    def _nvmlGpmSampleGet(self, h: Any, sample: Any) -> Any:
        gpm = self._get(h, "gpm")
        if "sample_error" in gpm:
            raise self._error(gpm["sample_error"])
        self._seq += 1
        self.gpm_samples[self._live(sample)].update(device=h, seq=self._seq)
        return sample

    def _nvmlGpmMetricsGet(self, request: Any) -> Any:
        if request.version != self._real.NVML_GPM_METRICS_GET_VERSION:
            raise self._error("ArgumentVersionMismatch")
        first = self.gpm_samples[self._live(request.sample1)]
        second = self.gpm_samples[self._live(request.sample2)]
        if (
            first is second
            or first["seq"] is None
            or second["seq"] is None
            or first["device"] != second["device"]
            or first["seq"] >= second["seq"]
        ):
            raise self._error("InvalidArgument")
        if not 0 < request.numMetrics <= self._real.NVML_GPM_METRIC_MAX:
            raise self._error("InvalidArgument")
        recorded = self._get(first["device"], "gpm").get("metrics", {})
        for i in range(request.numMetrics):
            self._fill_metric(request.metrics[i], recorded.get(str(request.metrics[i].metricId)))
        return request

    def _fill_metric(self, metric: Any, value: Any) -> None:
        if value is None or isinstance(value, dict):
            error = "NotSupported" if value is None else value["error"]
            metric.nvmlReturn = self._code(error)
        else:
            metric.nvmlReturn, metric.value = self._real.NVML_SUCCESS, float(value)

    def _live(self, sample: Any) -> int:
        """The address of a sample this fake allocated and has not freed, else InvalidArgument."""
        try:
            address = ctypes.addressof(sample.contents)
        except (ValueError, AttributeError, TypeError):  # NULL pointer or not a sample at all
            raise self._error("InvalidArgument") from None
        if address not in self.gpm_samples:
            raise self._error("InvalidArgument")
        return address
