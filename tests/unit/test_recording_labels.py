"""Target labels in recordings: written on every sample (and `up`) as Prometheus stores them,
a scraped label they also name kept as `exported_<name>`, and both undone on reading."""

from __future__ import annotations

from kvscope.agent.recording.omfile import (
    RecordingWriter,
    export_conflicts,
    read_recording,
    read_recording_text,
    restore_exported,
)
from kvscope.agent.recording.replay import replay_recording
from kvscope.agent.scrape.exposition import parse_exposition

T0 = 1_800_000_000.0
DCGM = (
    "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
    'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",pod="llama-0",namespace="llm"} 70000\n'
    'DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b"} 10\n'
)
EXPORTER = {"pod": "dcgm-exporter-1", "namespace": "gpu-operator"}


def _write(path, text, labels, times=(T0, T0 + 10), failed=()):
    writer = RecordingWriter(path)
    for t in times:
        writer.add_scrape("dcgm", "node-1:9400", t, None if t in failed else parse_exposition(text), 0.02, labels)
    return writer.close()


def test_target_labels_go_on_every_sample_and_conflicts_become_exported(tmp_path):
    body = read_recording_text(_write(tmp_path / "r.om", DCGM, EXPORTER))
    assert (
        f'up{{instance="node-1:9400",job="dcgm",namespace="gpu-operator",pod="dcgm-exporter-1"}} 1.0 {T0:.1f}'
    ) in body
    assert 'scrape_duration_seconds{instance="node-1:9400",job="dcgm",namespace="gpu-operator",' in body
    assert (
        'DCGM_FI_DEV_FB_USED{UUID="GPU-a",exported_namespace="llm",exported_pod="llama-0",gpu="0",'
        'instance="node-1:9400",job="dcgm",namespace="gpu-operator",pod="dcgm-exporter-1"} 70000.0'
    ) in body
    assert (
        'DCGM_FI_DEV_FB_USED{UUID="GPU-b",gpu="1",instance="node-1:9400",job="dcgm",'
        'namespace="gpu-operator",pod="dcgm-exporter-1"} 10.0'
    ) in body


def test_reading_gives_back_the_scraped_labels_and_the_target_labels(tmp_path):
    scrapes, expo = read_recording(_write(tmp_path / "r.om.gz", DCGM, EXPORTER, failed=(T0 + 10,)))
    assert not expo.issues
    assert [(s.up, s.labels, s.duration_s) for s in scrapes] == [(True, EXPORTER, 0.02), (False, EXPORTER, 0.02)]
    assert sorted((r.name, r.labels, r.value) for r in scrapes[0].samples) == sorted(
        (r.name, r.labels, r.value) for r in parse_exposition(DCGM).samples
    )
    assert scrapes[1].samples == []


def test_without_target_labels_a_recording_reads_as_before(tmp_path):
    path = _write(tmp_path / "r.om", DCGM, None)
    assert "exported_" not in read_recording_text(path)
    scrapes, _ = read_recording(path)
    assert [s.labels for s in scrapes] == [{}, {}]
    assert sorted(r[:3] for r in scrapes[0].samples) == sorted(r[:3] for r in parse_exposition(DCGM).samples)


def test_replay_normalizes_with_the_target_labels_like_the_live_agent(tmp_path):
    """The GPU's own pod wins over the exporter's (the dcgm dialect maps it), gpu 1 keeps the
    exporter's target labels, as the live agent's normalize does with the configured labels."""
    replay = replay_recording(_write(tmp_path / "r.om", DCGM, EXPORTER | {"cluster": "eu-1"}))
    used = {s.label("gpu"): s for s in replay.samples if s.name == "gpu_memory_used_bytes"}
    assert (used["0"].label("pod"), used["0"].label("namespace")) == ("llama-0", "llm")
    assert (used["1"].label("pod"), used["1"].label("namespace")) == ("dcgm-exporter-1", "gpu-operator")
    assert used["0"].label("cluster") == used["1"].label("cluster") == "eu-1"


def test_job_and_instance_labels_are_the_targets_not_configured_ones():
    assert export_conflicts((("instance", "x"), ("job", "y"), ("pod", "p")), {"pod": "q"}) == (("exported_pod", "p"),)


def test_exported_names_taken_by_the_scrape_are_not_overwritten():
    written = export_conflicts((("exported_pod", "a"), ("pod", "b")), {"pod": "t"})
    assert dict(written) == {"exported_pod": "a", "exported_exported_pod": "b"}


def test_restore_is_the_inverse_for_a_conflict():
    target = {"pod": "t", "namespace": "n"}
    raw = (("gpu", "0"), ("namespace", "llm"), ("pod", "llama-0"))
    written = tuple(sorted(export_conflicts(raw, target) + tuple(target.items())))
    assert restore_exported(written, target) == raw


def test_a_rewritten_recording_keeps_its_target_labels(tmp_path):
    from testbed.recording_variants import read_variant_source, write_recording

    src = _write(tmp_path / "r.om", DCGM, EXPORTER)
    out = write_recording(read_variant_source(src), tmp_path / "copy.om")
    assert read_recording_text(out) == read_recording_text(src)
