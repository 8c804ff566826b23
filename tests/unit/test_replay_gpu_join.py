"""Replay runs the live agent's engine<->GPU join: a recording whose vLLM target carries its
Kubernetes pod labels (as Prometheus' service discovery records them) next to a dcgm-exporter in
Kubernetes mode yields `engine_gpu_memory_used_bytes` per scrape round, for `kvscope diagnose`
and the UI (through RecordingSource) as on a live agent."""

from __future__ import annotations

import re

import pytest

from kvscope.agent.derive.gpu_join import JOIN_NAME
from kvscope.agent.recording.omfile import RecordingWriter
from kvscope.agent.recording.replay import parse_target_labels, replay_recording
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.diagnoser.sources.recording import RecordingSource

UUID0 = "GPU-2b4c8f1e-9d3a-4c57-b1e2-7f0a5d6c3e91"  # gpu 0 of the dcgm fixture
POD = 'container="vllm",namespace="llm",pod="llama-0"'
T0 = 1_800_000_000.0
FB_MIB = [70000, 71000, 72000, 73000, 74000, 75000]  # gpu 0's used memory, one value per round


def _dcgm(text: str, fb_mib: int, pods: bool) -> str:
    """The fixture with gpu 0 in use by the pod (Kubernetes mode labels it) and its FB_USED set."""
    out = []
    for line in text.splitlines():
        if line.startswith("DCGM_") and 'gpu="0"' in line:
            if pods:
                line = line.replace("}", f",{POD}}}", 1)
            if line.startswith("DCGM_FI_DEV_FB_USED{"):
                line = line.rsplit(" ", 1)[0] + f" {fb_mib}"
        out.append(line)
    return "\n".join(out) + "\n"


def _vllm(text: str, pods: bool) -> str:
    """The fixture with the target's pod labels on every sample, as a Prometheus recording keeps them."""
    if not pods:
        return text
    text = re.sub(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{", r"\1{" + POD + ",", text, flags=re.M)
    return re.sub(r"^([A-Za-z_:][A-Za-z0-9_:]*) ", r"\1{" + POD + "} ", text, flags=re.M)


def _record(tmp_path, load_fixture, pods: bool):
    dcgm, vllm = (
        load_fixture("scrapes/dcgm-exporter-4.5.3-constructed-2gpu.txt"),
        load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt"),
    )
    writer = RecordingWriter(tmp_path / "k8s.om.gz")
    for i, fb in enumerate(FB_MIB):
        t = T0 + 10 * i
        writer.add_scrape("vllm", "10.0.0.5:8000", t, parse_exposition(_vllm(vllm, pods)))
        writer.add_scrape("dcgm", "gpu-node-1:9400", t + 0.4, parse_exposition(_dcgm(dcgm, fb, pods)))
    return writer.close()


def test_replay_joins_engines_to_gpus_on_pod_labels(tmp_path, load_fixture):
    replay = replay_recording(_record(tmp_path, load_fixture, pods=True))
    joined = sorted((s for s in replay.samples if s.name == JOIN_NAME), key=lambda s: s.timestamp)
    assert [s.value for s in joined] == [mib * 1048576 for mib in FB_MIB]  # one per scrape round
    assert [s.timestamp for s in joined] == [T0 + 10 * i + 0.4 for i in range(len(FB_MIB))]
    assert {(s.label("instance"), s.label("gpu_uuid"), s.label("join")) for s in joined} == {
        ("10.0.0.5:8000", UUID0, "kubernetes")
    }
    engine = next(s for s in replay.samples if s.name == "engine_requests_running")
    assert (engine.label("pod"), engine.label("namespace"), engine.label("container")) == ("llama-0", "llm", "vllm")


def test_diagnose_and_the_ui_read_the_join_from_a_recording(tmp_path, load_fixture):
    source = RecordingSource(_record(tmp_path, load_fixture, pods=True))
    frame = source.read_frame({JOIN_NAME, "gpu_memory_used_bytes"}, None, None, source.natural_step())
    block = frame.block(JOIN_NAME)
    assert block is not None and block.values.shape[0] == 1
    held = [v for v in block.values[0] if v == v]
    assert len(held) >= len(FB_MIB) - 1 and set(held) <= {mib * 1048576 for mib in FB_MIB}
    assert held == sorted(held)  # the rounds' values in time order


def test_without_pod_labels_the_join_is_absent_not_zero(tmp_path, load_fixture):
    replay = replay_recording(_record(tmp_path, load_fixture, pods=False))
    assert any(s.name == "gpu_memory_used_bytes" for s in replay.samples)
    assert not any(s.name == JOIN_NAME for s in replay.samples)


def test_a_configured_gpu_mapping_joins_without_pod_labels(tmp_path, load_fixture):
    replay = replay_recording(_record(tmp_path, load_fixture, pods=False), gpu_mapping={UUID0: "10.0.0.5:8000"})
    joined = [s for s in replay.samples if s.name == JOIN_NAME]
    assert len(joined) == len(FB_MIB) and {s.label("join") for s in joined} == {"config"}
    with pytest.raises(ValueError):
        replay_recording(_record(tmp_path, load_fixture, pods=False), gpu_mapping={UUID0: 5})


def test_target_labels_are_the_pod_labels_every_sample_carries():
    both = parse_exposition(f'a{{{POD}}} 1\nb{{{POD},x="1"}} 2\n').samples
    assert parse_target_labels(both) == {"pod": "llama-0", "namespace": "llm", "container": "vllm"}
    mixed = parse_exposition(f'a{{{POD}}} 1\nb{{pod="other",namespace="llm"}} 2\n').samples
    assert parse_target_labels(mixed) == {"namespace": "llm"}  # one pod per target, or none
    assert parse_target_labels([]) == {}
