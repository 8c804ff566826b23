"""A real H100's NVML answers, replayed: tests/fixtures/nvml/h100-real.json was recorded by
testbed/nvml_record.py on an NVIDIA H100 80GB HBM3 (driver 580.159.04) while a bf16 matmul loop
ran on it, and h100-real.samples.jsonl holds what the collector produced there from those same
answers. Replaying the recording through FakeNvml must give exactly those samples: the fake and
the collector's reading of real hardware agree (tests/integration/test_nvml_gpu.py is the check
on the hardware itself)."""

from __future__ import annotations

import json
from pathlib import Path

from kvscope.agent.collectors.nvml import NvmlCollector
from testbed.nvml_fake import FakeNvml
from testbed.nvml_record import RecordingNvml, watch_gpm

NVML = Path(__file__).parent.parent / "fixtures" / "nvml"


def _collect(nvml) -> list:
    collector = NvmlCollector(nvml=nvml)
    collector.collect_sync()  # GPM needs two samples
    got = collector.collect_sync()
    assert got.health[0].up, got.health[0]
    return got.samples


def _plain(samples) -> list[tuple[str, dict[str, str], float]]:
    return sorted(
        ((s.name, {k: v for k, v in s.labels if k != "node"}, s.value) for s in samples),
        key=lambda x: (x[0], sorted(x[1].items())),
    )


def test_replaying_the_real_h100_gives_what_the_collector_read_on_it():
    expected = [json.loads(line) for line in (NVML / "h100-real.samples.jsonl").read_text().splitlines()]
    got = _plain(_collect(FakeNvml.from_file(NVML / "h100-real.json")))
    assert got == sorted(
        ((e["name"], e["labels"], e["value"]) for e in expected), key=lambda x: (x[0], sorted(x[1].items()))
    )
    by_name = {name: value for name, labels, value in got if "reason" not in labels}
    assert by_name["gpu_power_watts"] > 0.99 * by_name["gpu_power_limit_watts"]  # at its power cap ...
    assert [lab["reason"] for name, lab, v in got if name == "gpu_clock_event_active_by_reason" and v] == [
        "sw_power_cap"
    ]  # ... and throttled by it
    assert by_name["gpu_tensor_active_ratio"] > 0.9 and by_name["gpu_sm_active_ratio"] > 0.9
    assert "gpu_nvlink_transmit_bytes_per_second" not in by_name  # one GPU: absent, not 0


def test_the_recorder_keeps_what_the_collector_reads():
    # FakeNvml stands in for the driver here: what the recorder keeps must replay to the same
    # samples (MIG instances are not recorded: their memory series are the only difference).
    fake = FakeNvml.from_file(NVML / "h100-2gpu.json")
    rec = RecordingNvml(fake)
    watch_gpm(rec, fake)
    first = _plain(_collect(rec))
    again = _plain(_collect(FakeNvml(rec.recording)))
    assert all(s in first for s in again) and len(again) > 40
    lost = {(name, labels.get("mig_instance")) for name, labels, value in first if (name, labels, value) not in again}
    assert lost == {
        (m, i) for m in ("gpu_memory_used_bytes", "gpu_memory_free_bytes", "gpu_memory_total_bytes") for i in ("1", "2")
    } | {("gpu_memory_reserved_bytes", "1")}
