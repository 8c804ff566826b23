import gzip

from kvscope.agent.recording.omfile import RecordingWriter, read_recording
from kvscope.agent.recording.replay import replay_recording
from kvscope.agent.scrape.exposition import parse_exposition


def write_three_scrapes(path, text):
    expo = parse_exposition(text)
    w = RecordingWriter(path)
    for i in range(3):
        w.add_scrape("vllm", "127.0.0.1:8000", 1_700_000_000 + 15 * i, expo if i != 1 else None, 0.01)
    return w.close()


def test_recording_round_trip_keeps_native_names_and_targets(tmp_path, load_fixture):
    text = load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt")
    path = write_three_scrapes(tmp_path / "r.om", text)
    body = path.read_text()
    assert body.endswith("# EOF\n")
    assert "# TYPE vllm:num_preemptions counter" in body
    assert "_created" not in body
    scrapes, _ = read_recording(path)
    assert [s.up for s in scrapes] == [True, False, True]
    assert scrapes[1].samples == []
    first = {(s.name, s.labels): s.value for s in scrapes[0].samples}
    assert first[("vllm:num_preemptions_total", (("engine", "0"), ("model_name", "tiny-llama")))] == 47.0


def test_each_family_is_contiguous(tmp_path, load_fixture):
    path = write_three_scrapes(tmp_path / "r.om", load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt"))
    families, current = [], None
    for line in path.read_text().splitlines():
        if line.startswith("# TYPE "):
            current = line.split()[2]
            assert current not in families, f"family {current} split"
            families.append(current)


def test_gzip_recordings_replay_to_canonical_samples(tmp_path, load_fixture):
    path = write_three_scrapes(tmp_path / "r.om.gz", load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt"))
    with gzip.open(path, "rt") as f:
        assert f.read().endswith("# EOF\n")
    replay = replay_recording(path)
    assert replay.engines == {"127.0.0.1:8000": "vllm"}
    up = [s.value for s in replay.samples if s.name == "kvscope_target_up"]
    assert up == [1.0, 0.0, 1.0]
    pre = [s for s in replay.samples if s.name == "engine_preemptions_total"]
    assert [s.timestamp for s in pre] == [1_700_000_000.0, 1_700_000_030.0]
    assert replay.facts["127.0.0.1:8000"]["0"]["block_size"] == "32"


UTF8_SCRAPE = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m","gen_ai.pool"="p1"} 3
# TYPE "gen_ai.probe.ttft" gauge
{"gen_ai.probe.ttft",model_name="m","say \\"hi\\""="x"} 1.5
"""


def test_utf8_metric_and_label_names_survive_a_recording(tmp_path):
    """A scrape with Prometheus 3's quoted UTF-8 names parses, and the recording writes them quoted
    (unquoted, `gen_ai.pool="p1"` would be a line no parser reads: the sample lost)."""
    expo = parse_exposition(UTF8_SCRAPE)
    assert not expo.issues
    got = {(s.name, s.labels): s.value for s in expo.samples}
    assert got[("gen_ai.probe.ttft", (("model_name", "m"), ('say "hi"', "x")))] == 1.5
    path = write_three_scrapes(tmp_path / "r.om", UTF8_SCRAPE)
    body = path.read_text()
    assert '# TYPE "gen_ai.probe.ttft" gauge' in body
    assert '{"gen_ai.probe.ttft",' in body and '"gen_ai.pool"="p1"' in body
    scrapes, expo = read_recording(path)
    assert not expo.issues
    first = {(s.name, s.labels): s.value for s in scrapes[0].samples}
    assert first[("gen_ai.probe.ttft", (("model_name", "m"), ('say "hi"', "x")))] == 1.5
    assert first[("vllm:num_requests_running", (("gen_ai.pool", "p1"), ("model_name", "m")))] == 3.0
