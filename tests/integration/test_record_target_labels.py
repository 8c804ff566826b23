"""`kvscope record` keeps a target's configured labels, so its recording joins engines to GPUs.

Real processes end to end: two `python -m http.server` processes serve the vLLM 0.32 capture
and the dcgm-exporter fixture (gpu 0 labelled with the pod using it, as dcgm-exporter does in
Kubernetes mode); `kvscope record` runs as a subprocess with a config that gives the vLLM target
its pod/namespace/container and the dcgm-exporter target its own pod; the file is replayed and
diagnosed, and loaded into a Prometheus TSDB with promtool. The live agent's collector scrapes
the same servers in-process for comparison.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from agentharness import start_target_process

from kvscope.agent.collectors.engine import HEALTH_SIGNAL, EngineCollector
from kvscope.agent.config import build_config, read_config_file
from kvscope.agent.derive.gpu_join import JOIN_NAME, derive_engine_gpu
from kvscope.agent.recording.omfile import read_recording
from kvscope.agent.recording.replay import replay_recording
from kvscope.diagnoser.sources.recording import RecordingSource
from testbed.procs import stop_process

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "scrapes"
UUID0 = "GPU-2b4c8f1e-9d3a-4c57-b1e2-7f0a5d6c3e91"  # gpu 0 of the dcgm fixture
ENGINE_POD = {"pod": "llama-0", "namespace": "llm", "container": "vllm"}
EXPORTER_POD = {"pod": "dcgm-exporter-x7k2p", "namespace": "gpu-operator"}
PROMTOOL = shutil.which("promtool")


def _kubernetes_dcgm(text: str) -> str:
    """The dcgm fixture with gpu 0 labelled with the engine's pod (dcgm-exporter --kubernetes)."""
    pod = ",".join(f'{k}="{v}"' for k, v in ENGINE_POD.items())
    return (
        "\n".join(
            line.replace("}", f",{pod}}}", 1) if line.startswith("DCGM_") and 'gpu="0"' in line else line
            for line in text.splitlines()
        )
        + "\n"
    )


@pytest.fixture
def targets(tmp_path):
    """(vLLM URL, dcgm-exporter URL), each served by its own process."""
    procs, urls = [], []
    for name, body in (
        ("vllm", (FIXTURES / "vllm-0.32.0-cpu-after-load.txt").read_text()),
        ("dcgm", _kubernetes_dcgm((FIXTURES / "dcgm-exporter-4.5.3-constructed-2gpu.txt").read_text())),
    ):
        root = tmp_path / name
        root.mkdir()
        (root / "metrics").write_text(body)
        try:
            proc, base = start_target_process(root)
        except BaseException:
            for p in procs:
                stop_process(p)
            raise
        procs.append(proc)
        urls.append(base + "/metrics")
    try:
        yield tuple(urls)
    finally:
        for p in procs:
            stop_process(p)


def _config(tmp_path: Path, vllm: str, dcgm: str) -> Path:
    path = tmp_path / "kvscope.yaml"
    path.write_text(
        json.dumps(
            {
                "targets": [  # JSON is YAML
                    {"url": vllm, "job": "vllm", "labels": ENGINE_POD},
                    {"url": dcgm, "job": "dcgm", "engine": "dcgm", "labels": EXPORTER_POD},
                ]
            }
        )
    )
    return path


def _record(config: Path, out: Path) -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvscope",
            "record",
            "--config",
            str(config),
            "--duration",
            "4s",
            "--interval",
            "1s",
            "--no-progress",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]


def test_record_keeps_target_labels_and_replay_joins_engine_to_gpu(targets, tmp_path):
    vllm, dcgm = targets
    config = _config(tmp_path, vllm, dcgm)
    out = tmp_path / "k8s.om.gz"
    _record(config, out)

    scrapes, expo = read_recording(out)
    assert not expo.issues
    by_job = {s.job: s for s in scrapes if s.up}
    assert by_job["vllm"].labels == ENGINE_POD and by_job["dcgm"].labels == EXPORTER_POD
    gpu0 = next(r for r in by_job["dcgm"].samples if r.name == "DCGM_FI_DEV_FB_USED" and dict(r.labels)["gpu"] == "0")
    assert {k: dict(gpu0.labels)[k] for k in ENGINE_POD} == ENGINE_POD  # the GPU's own pod read back

    replay = replay_recording(out)
    joined = [s for s in replay.samples if s.name == JOIN_NAME]
    ups = {job: [s.up for s in scrapes if s.job == job] for job in ("vllm", "dcgm")}  # one scrape each a round
    both_up = sum(a and b for a, b in zip(ups["vllm"], ups["dcgm"], strict=False))
    assert both_up >= 1 and len(joined) == both_up  # one per round both targets answered
    fb_used_mib = float(
        dict((dict(r.labels)["gpu"], r.value) for r in by_job["dcgm"].samples if r.name == "DCGM_FI_DEV_FB_USED")["0"]
    )
    assert {(s.label("instance"), s.label("gpu_uuid"), s.label("join"), s.value) for s in joined} == {
        (vllm.split("/")[2], UUID0, "kubernetes", fb_used_mib * 1048576)
    }

    live = _collect_live(config)  # what the live agent makes of the same targets
    assert _label_sets(replay.samples) == _label_sets(live)
    assert [(s.label("instance"), s.label("gpu_uuid"), s.value) for s in derive_engine_gpu(live)] == [
        (s.label("instance"), s.label("gpu_uuid"), s.value) for s in joined[:1]
    ]

    source = RecordingSource(out)  # what diagnose and the UI read from the file
    block = source.read_frame({JOIN_NAME}, None, None, source.natural_step()).block(JOIN_NAME)
    assert block is not None and block.values.shape[0] == 1
    assert {v for v in block.values[0] if v == v} == {fb_used_mib * 1048576}
    diag = subprocess.run(
        [sys.executable, "-m", "kvscope", "diagnose", "--recording", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert diag.returncode in (0, 1, 2), diag.stderr[-2000:]
    assert json.loads(diag.stdout)["source"] == f"recording:{out.name}"


def _collect_live(config: Path) -> list:
    async def once():
        collector = EngineCollector(build_config(read_config_file(config)))
        try:
            return list((await collector.collect()).samples)
        finally:
            await collector.close()

    return asyncio.run(once())


def _label_sets(samples) -> set:
    """(name, labels) of the engine and GPU series, timestamps and values aside. The live agent's
    own /health probe (`engine_health_probe_up`) is left out: it is the agent's observation beside
    the scrape, not part of the /metrics bodies a recording holds, so a replay has none."""
    return {
        (s.name, s.labels)
        for s in samples
        if s.name.startswith(("engine_", "gpu_")) and s.name not in (JOIN_NAME, HEALTH_SIGNAL)
    }


def test_old_record_output_has_no_target_labels_and_no_join(targets, tmp_path):
    """A recording of the same targets without their configured labels (what `kvscope record`
    wrote before it kept them) replays without the join: absent, not zero."""
    vllm, dcgm = targets
    out = tmp_path / "plain.om.gz"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvscope",
            "record",
            "--target",
            vllm,
            "--target",
            dcgm,
            "--duration",
            "2s",
            "--interval",
            "1s",
            "--no-progress",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    scrapes, _ = read_recording(out)
    assert scrapes and all(s.labels == {} for s in scrapes)
    replay = replay_recording(out)
    assert any(s.name == "gpu_memory_used_bytes" for s in replay.samples)
    assert not any(s.name == JOIN_NAME for s in replay.samples)


@pytest.mark.prometheus
@pytest.mark.needs("promtool")
def test_recording_with_target_labels_loads_into_prometheus(targets, tmp_path):
    vllm, dcgm = targets
    out = tmp_path / "k8s.om"
    _record(_config(tmp_path, vllm, dcgm), out)
    data = tmp_path / "data"
    made = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(out), str(data)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    (data / "wal").mkdir(exist_ok=True)  # dump opens the TSDB, which wants a WAL directory
    dump = subprocess.run([PROMTOOL, "tsdb", "dump", str(data)], capture_output=True, text=True, timeout=300)
    assert dump.returncode == 0, dump.stderr[-2000:]
    series = {line.rsplit(" ", 2)[0] for line in dump.stdout.splitlines()}
    up = {s for s in series if s.startswith('{__name__="up"')}
    assert any('job="vllm"' in s and 'pod="llama-0"' in s and 'namespace="llm"' in s for s in up), up
    gpu0 = [s for s in series if "DCGM_FI_DEV_FB_USED" in s and 'gpu="0"' in s]
    assert gpu0 and all('exported_pod="llama-0"' in s and 'pod="dcgm-exporter-x7k2p"' in s for s in gpu0), gpu0
    assert not any(re.search(r"exported_exported_", s) for s in series)
