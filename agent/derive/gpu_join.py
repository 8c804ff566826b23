"""Which engine runs on which GPU: join GPU series (dcgm-exporter or NVML) to engine instances.

Strongest first, a pair found by a stronger way not repeated by a weaker one: `config` (the
operator's `gpu_mapping: {"<gpu_uuid or index>": "<instance>" or [instances]}`), `kubernetes`
(dcgm-exporter's `pod`/`namespace`/`container` labels matched to an engine target's) and `pid`
(NVML's per-process GPU memory matched to the host collector's `engine_process_*{pid, instance}`).
The result renders as `engine_gpu_memory_used_bytes{instance, gpu, gpu_uuid, mig_instance, join}`
(docs/collectors.md). Pure functions over the latest samples: no I/O."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from operator import itemgetter
from typing import Any

from kvscope.agent.config import parse_gpu_mapping
from kvscope.core.signals import NameTest, Sample, make_labels

JOIN_NAME = "engine_gpu_memory_used_bytes"
PROCESS_MEMORY = "gpu_process_memory_used_bytes"
GPU_MEMORY = "gpu_memory_used_bytes"
ENGINE_PROCESS_PREFIX = "engine_process_"
_JOIN_PREFIXES = ("gpu_", ENGINE_PROCESS_PREFIX)  # every series the joins read, but the engines' pods


_joined_name = NameTest(lambda name: name.startswith(_JOIN_PREFIXES), 10_000)  # name -> the joins read it


@dataclass(frozen=True)
class GpuDevice:
    """One GPU, or one MIG instance of a GPU, as the GPU series describe it."""

    gpu: str | None
    gpu_uuid: str | None
    node: str | None = None
    mig_instance: str | None = None

    def key(self) -> tuple[str | None, ...]:
        return (self.gpu_uuid or f"{self.node}/{self.gpu}", self.mig_instance)


@dataclass(frozen=True)
class GpuAssignment:
    """Engine `instance` runs on `device`, established by `join`; `memory_bytes` is what it holds
    there (its processes' memory for a pid join, else the device's used memory; None if unknown)."""

    instance: str
    device: GpuDevice
    join: str
    memory_bytes: float | None = None


def _device(s: Sample) -> GpuDevice:
    return GpuDevice(s.label("gpu"), s.label("gpu_uuid"), s.label("node"), s.label("mig_instance"))


def _is_gpu(s: Sample) -> bool:
    return s.name.startswith("gpu_") and (s.label("gpu") is not None or s.label("gpu_uuid") is not None)


def _is_engine(s: Sample) -> bool:
    engine = s.label("engine")
    return s.label("instance") is not None and engine is not None and engine != "dcgm"


def join_engines_to_gpus(samples: Iterable[Sample], gpu_mapping: Any = None) -> list[GpuAssignment]:
    """Every (engine instance, GPU) pair the samples and the mapping establish, strongest join
    first, one assignment per pair. `samples` are the latest canonical samples of all sources."""
    samples = samples if isinstance(samples, list) else list(samples)
    joined = [s for s in samples if _joined_name[s.name]]
    devices = _devices(joined)
    used = _device_memory(joined)
    found = [
        *_by_config(parse_gpu_mapping(gpu_mapping), devices, used),
        *_by_kubernetes(joined, samples, used),
        *_by_pid(joined),
    ]
    out: dict[tuple[str, tuple[str | None, ...]], GpuAssignment] = {}
    for a in found:
        out.setdefault((a.instance, a.device.key()), a)
    return sorted(out.values(), key=lambda a: (a.instance, str(a.device.gpu), str(a.device.mig_instance)))


def _devices(samples: list[Sample]) -> dict[tuple[str | None, ...], GpuDevice]:
    return {_device(s).key(): _device(s) for s in samples if _is_gpu(s) and s.name != PROCESS_MEMORY}


def _device_memory(samples: list[Sample]) -> dict[tuple[str | None, ...], float]:
    return {_device(s).key(): s.value for s in samples if s.name == GPU_MEMORY and _is_gpu(s)}


def _by_config(
    mapping: dict[str, tuple[str, ...]],
    devices: dict[tuple[str | None, ...], GpuDevice],
    used: dict[tuple[str | None, ...], float],
) -> list[GpuAssignment]:
    out: list[GpuAssignment] = []
    whole_gpus = [d for d in devices.values() if d.mig_instance is None]
    for key, instances in mapping.items():
        dev = next((d for d in whole_gpus if key in (d.gpu_uuid, d.gpu)), None)
        if dev is None:  # not seen (yet): keep what the operator said
            dev = GpuDevice(gpu=None, gpu_uuid=key) if not key.isdigit() else GpuDevice(gpu=key, gpu_uuid=None)
        out.extend(GpuAssignment(i, dev, "config", used.get(dev.key())) for i in instances)
    return out


def _by_kubernetes(
    joined: list[Sample], samples: Iterable[Sample], used: dict[tuple[str | None, ...], float]
) -> list[GpuAssignment]:
    gpu_pods = [s for s in joined if _is_gpu(s) and s.label("pod") and s.label("namespace")]
    if not gpu_pods:  # dcgm-exporter outside Kubernetes mode: nothing to join, skip the engine scan
        return []
    pods: dict[tuple[str, str], list[tuple[str, str | None]]] = {}
    for s in samples:
        if s.name.startswith("gpu_") or not (_is_engine(s) and s.label("pod") and s.label("namespace")):
            continue
        entry = (s.label("instance") or "", s.label("container"))
        key = (s.label("namespace") or "", s.label("pod") or "")
        if entry not in pods.setdefault(key, []):
            pods[key].append(entry)
    out: list[GpuAssignment] = []  # repeats of a pair are dropped by join_engines_to_gpus
    for s in gpu_pods:
        dev = _device(s)
        for instance, container in pods.get((s.label("namespace") or "", s.label("pod") or ""), []):
            if not (container and s.label("container") and container != s.label("container")):
                out.append(GpuAssignment(instance, dev, "kubernetes", used.get(dev.key())))
    return out


def _by_pid(samples: list[Sample]) -> list[GpuAssignment]:
    engine_pids: dict[tuple[str | None, str], str] = {}
    for s in samples:
        if s.name.startswith(ENGINE_PROCESS_PREFIX) and s.label("pid") and s.label("instance"):
            engine_pids[(s.label("node"), s.label("pid") or "")] = s.label("instance") or ""
    memory: dict[tuple[str, tuple[str | None, ...]], tuple[GpuDevice, float]] = {}
    for s in samples:  # a sample without a pid finds no engine: engine_pids holds none
        instance = engine_pids.get((s.label("node"), s.label("pid") or "")) if s.name == PROCESS_MEMORY else None
        if instance is None:
            continue
        dev = _device(s)
        prev = memory.get((instance, dev.key()), (dev, 0.0))[1]
        memory[(instance, dev.key())] = (dev, prev + s.value)
    return [GpuAssignment(instance, dev, "pid", mem) for (instance, _), (dev, mem) in memory.items()]


def render_engine_gpu_samples(assignments: Iterable[GpuAssignment], timestamp: float | None = None) -> list[Sample]:
    """`engine_gpu_memory_used_bytes` per assignment whose memory is known."""
    out: list[Sample] = []
    for a in assignments:
        if a.memory_bytes is not None:
            labels = {
                k: v for k, v in {"instance": a.instance, "join": a.join, **asdict(a.device)}.items() if v is not None
            }
            out.append(Sample(JOIN_NAME, make_labels(labels), float(a.memory_bytes), timestamp))
    return out


def derive_engine_gpu(samples: Iterable[Sample], gpu_mapping: Any = None) -> list[Sample]:
    """The join over one collection cycle as samples, stamped with the newest sample time."""
    samples = samples if isinstance(samples, list) else list(samples)
    assignments = join_engines_to_gpus(samples, gpu_mapping)
    if not any(a.memory_bytes is not None for a in assignments):
        return []  # nothing to render: skip the pass over every sample's timestamp
    stamps = set(map(itemgetter(3), samples))  # C-level pass: timestamps are few (one per target)
    stamps.discard(None)
    return render_engine_gpu_samples(assignments, max(stamps, default=None))


def engine_gpu_hook(gpu_mapping: Any = None) -> Callable[[Iterable[Sample]], list[Sample]]:
    """A derive hook for the agent runtime (`AgentRuntime(derive=[engine_gpu_hook(cfg.gpu_mapping)])`).
    The mapping is validated here, so a bad one fails at start with a message naming the entry."""
    parse_gpu_mapping(gpu_mapping)

    def engine_gpu(cycle: Iterable[Sample]) -> list[Sample]:
        return derive_engine_gpu(cycle, gpu_mapping)

    return engine_gpu
