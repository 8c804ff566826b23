"""Record a real GPU's NVML answers as a `FakeNvml` recording (tests/fixtures/nvml/).

`RecordingNvml` wraps the real `pynvml` module: every call goes to the driver, and its answer
(or its NVML error) is kept under the key `FakeNvml` reads it from, so the unit tests can
replay a real node. Run the real `NvmlCollector` through it and save:

    python -m testbed.nvml_record tests/fixtures/nvml/h100-real.json --samples h100-real.samples.jsonl

The recording holds each call's last answer (the collector's second collection: GPM needs two
samples). `--samples` writes that collection's canonical samples as JSON lines, the expected
output of replaying the recording. Nothing but numbers, names, ids and pids is recorded.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path
from typing import Any

# call name -> (recording key, how the call's extra argument sub-keys it)
_SIMPLE = {
    "nvmlDeviceGetUUID": "uuid",
    "nvmlDeviceGetName": "name",
    "nvmlDeviceGetPowerUsage": "power_mw",
    "nvmlDeviceGetEnforcedPowerLimit": "power_limit_mw",
    "nvmlDeviceGetTotalEnergyConsumption": "energy_mj",
    "nvmlDeviceGetCurrentClocksEventReasons": "clocks_event_reasons",
    "nvmlDeviceGetSupportedClocksEventReasons": "supported_clocks_event_reasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons": "clocks_throttle_reasons",
    "nvmlDeviceGetSupportedClocksThrottleReasons": "supported_clocks_throttle_reasons",
    "nvmlDeviceGetMaxMigDeviceCount": "max_mig_devices",
}
_KEYED = {
    "nvmlDeviceGetTemperatureV": "temperature_c",
    "nvmlDeviceGetClockInfo": "clocks_mhz",
    "nvmlDeviceGetPcieThroughput": "pcie_kb_s",
}


def _address(pointer: Any) -> Any:
    """What a device handle or GPM sample stands for, stable across copies: the address a ctypes
    pointer holds (real NVML), the index an int handle is (FakeNvml), else the object itself."""
    if isinstance(pointer, int):
        return ("index", pointer)
    try:
        return ctypes.cast(pointer, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return id(pointer)


def _error_name(exc: Exception) -> str:
    return type(exc).__name__.removeprefix("NVMLError_")


class RecordingNvml:
    """Stands in for `pynvml`: calls the real one and records each answer for `FakeNvml`."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.recording: dict[str, Any] = {"devices": []}
        self._index: dict[Any, int] = {}  # handle address -> device index

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._real, name)
        if not (name.startswith("nvml") and callable(real)):
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                value = real(*args, **kwargs)
            except self._real.NVMLError as e:
                self._keep(name, args, kwargs, {"error": _error_name(e)})
                raise
            self._keep(name, args, kwargs, value)
            return value

        return call

    def _device(self, handle: Any) -> dict[str, Any] | None:
        index = self._index.get(_address(handle))
        return None if index is None else self.recording["devices"][index]

    def _keep(self, name: str, args: tuple, kwargs: dict, value: Any) -> None:
        err = isinstance(value, dict) and "error" in value
        if name == "nvmlDeviceGetHandleByIndex" and not err:
            self._index[_address(value)] = args[0]
            while len(self.recording["devices"]) <= args[0]:
                self.recording["devices"].append({})
            return
        if name == "nvmlSystemGetDriverVersion":
            self.recording["driver_version"] = value if err else str(value)
            return
        dev = self._device(args[0]) if args else None
        if dev is None:
            return
        if name in _SIMPLE:
            dev[_SIMPLE[name]] = value if err else (value if isinstance(value, str) else int(value))
        elif name in _KEYED:
            dev.setdefault(_KEYED[name], {})[str(args[1])] = value if err else int(value)
        elif name == "nvmlDeviceGetUtilizationRates":
            dev["utilization"] = value if err else {"gpu": value.gpu, "memory": value.memory}
        elif name == "nvmlDeviceGetMemoryInfo":
            v2 = len(args) > 1 or bool(kwargs.get("version"))
            fields = ("total", "reserved", "free", "used") if v2 else ("total", "free", "used")
            dev["memory_v2" if v2 else "memory"] = value if err else {f: int(getattr(value, f)) for f in fields}
        elif name == "nvmlDeviceGetFieldValues":
            self._fields(dev, args[1], value)
        elif name == "nvmlDeviceGetComputeRunningProcesses":
            dev["processes"] = (
                value
                if err
                else [
                    {
                        k: getattr(p, k)
                        for k in ("pid", "usedGpuMemory", "gpuInstanceId", "computeInstanceId")
                        if getattr(p, k, None) is not None
                    }
                    for p in value
                ]
            )
        elif name == "nvmlDeviceGetMigMode":
            dev["mig_mode"] = value if err else list(value)
        elif name == "nvmlGpmQueryDeviceSupport":
            dev.setdefault("gpm", {"metrics": {}})["supported"] = 0 if err else int(value.isSupportedDevice)

    def _fields(self, dev: dict[str, Any], ids: list[Any], values: Any) -> None:
        out = dev.setdefault("fields", {})
        if isinstance(values, dict):
            return
        for fid, fv in zip(ids, values, strict=False):
            key = f"{fid[0]}:{fid[1]}" if isinstance(fid, tuple) else str(fid)
            out[key] = int(fv.value.ullVal) if fv.nvmlReturn == 0 else {"error": "NotSupported"}

    def keep_gpm(self, handle: Any, metrics: Any) -> None:
        """Record a GPM answer (nvmlGpmMetricsGet takes no handle: the caller says whose)."""
        dev = self._device(handle)
        if dev is not None:
            gpm = dev.setdefault("gpm", {"supported": 1, "metrics": {}})
            for m in metrics:
                if m.metricId and not m.nvmlReturn:
                    gpm["metrics"][str(m.metricId)] = float(m.value)


def record(out: Path, samples_out: Path | None, comment: str) -> int:
    """Two collections through the recorder; the recording and the second one's samples."""
    import pynvml

    from kvscope.agent.collectors.nvml import NvmlCollector

    rec = RecordingNvml(pynvml)
    watch_gpm(rec, pynvml)
    collector = NvmlCollector(nvml=rec)
    collector.collect_sync()
    time.sleep(1.0)
    got = collector.collect_sync()
    if not got.health[0].up:
        print(f"nvml_record: the collector is down: {got.health[0].reason}", file=sys.stderr)
        return 1
    out.write_text(json.dumps({"_comment": comment, **rec.recording}, indent=1) + "\n")
    if samples_out is not None:
        with samples_out.open("w", encoding="utf-8") as f:
            for s in got.samples:
                labels = {k: v for k, v in s.labels if k != "node"}
                f.write(json.dumps({"name": s.name, "labels": labels, "value": s.value}) + "\n")
    print(f"nvml_record: {len(rec.recording['devices'])} GPU(s), {len(got.samples)} samples -> {out}")
    return 0


def watch_gpm(rec: RecordingNvml, pynvml: Any) -> None:
    """Route GPM metric answers to the device whose samples they came from."""
    owner: dict[Any, Any] = {}
    sample_get, metrics_get = pynvml.nvmlGpmSampleGet, pynvml.nvmlGpmMetricsGet

    def gpm_sample_get(handle: Any, sample: Any) -> Any:
        owner[_address(sample)] = handle
        return sample_get(handle, sample)

    def gpm_metrics_get(request: Any) -> Any:
        answer = metrics_get(request)
        handle = owner.get(_address(request.sample2)) or owner.get(_address(request.sample1))
        rec.keep_gpm(handle, answer.metrics[: answer.numMetrics])
        return answer

    rec.__dict__["nvmlGpmSampleGet"] = gpm_sample_get
    rec.__dict__["nvmlGpmMetricsGet"] = gpm_metrics_get


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the FakeNvml recording to write (JSON)")
    ap.add_argument("--samples", type=Path, help="also write the collector's samples (JSON lines)")
    ap.add_argument("--comment", default="Recorded from real hardware by testbed/nvml_record.py.")
    args = ap.parse_args(argv)
    return record(args.out, args.samples, args.comment)


if __name__ == "__main__":
    sys.exit(main())
