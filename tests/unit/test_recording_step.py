"""`RecordingSource.natural_step()`: a recording's scrape interval is taken per target, so the
scrape times of several targets interleaving do not shorten it (the demo's two engines, scraped
a few milliseconds apart every 2 s, read 1.997 s; a fleet scraped every 5 s read 1 s)."""

from __future__ import annotations

from kvscope.agent.recording.omfile import RecordingWriter
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.diagnoser.sources.recording import RecordingSource

T0 = 1_800_000_000.0
BODY = 'vllm:num_requests_running{model_name="m"} 1\n'


def _record(tmp_path, targets: list[tuple[str, str, float, float, int]], name: str = "r") -> RecordingSource:
    """A recording of `targets` (job, instance, first scrape, interval, scrapes), written in time order."""
    scrapes = sorted(
        (start + interval * i, job, instance) for job, instance, start, interval, n in targets for i in range(n)
    )
    writer = RecordingWriter(tmp_path / f"{name}.om.gz")
    for ts, job, instance in scrapes:
        writer.add_scrape(job, instance, ts, parse_exposition(BODY))
    return RecordingSource(writer.close())


def test_interleaved_targets_keep_their_own_interval(tmp_path):
    # two engines scraped every 2 s, 3 ms apart: the gaps between all scrape times are 3 ms and 1.997 s
    source = _record(tmp_path, [("vllm", "a:8000", T0, 2.0, 40), ("vllm", "b:8000", T0 + 0.003, 2.0, 40)])
    assert source.natural_step() == 2.0


def test_evenly_offset_targets_are_not_read_as_a_faster_scrape(tmp_path):
    # four targets every 5 s, 1.25 s apart: every gap between scrape times is 1.25 s
    targets = [("dynamo", f"w{k}:9090", T0 + 1.25 * k, 5.0, 30) for k in range(4)]
    assert _record(tmp_path, targets).natural_step() == 5.0


def test_one_instance_under_two_jobs_is_two_targets(tmp_path):
    targets = [("vllm", "a:8000", T0, 10.0, 20), ("engine-debug", "a:8000", T0 + 4.0, 10.0, 20)]
    assert _record(tmp_path, targets).natural_step() == 10.0


def test_targets_at_different_intervals_give_the_lower_median(tmp_path):
    # two engines every 2 s and a GPU exporter every 10 s: the engines' interval
    targets = [
        ("vllm", "a:8000", T0, 2.0, 100),
        ("vllm", "b:8000", T0 + 0.5, 2.0, 100),
        ("dcgm", "gpu:9400", T0 + 0.7, 10.0, 20),
    ]
    assert _record(tmp_path, targets).natural_step() == 2.0
    # one of each: the finer of the two, an interval some target has (never their mean, 6 s)
    pair = [("vllm", "a:8000", T0, 2.0, 100), ("dcgm", "gpu:9400", T0 + 0.7, 10.0, 20)]
    assert _record(tmp_path, pair, "pair").natural_step() == 2.0


def test_at_least_one_second_and_fifteen_when_unknown(tmp_path):
    assert _record(tmp_path, [("vllm", "a:8000", T0, 0.25, 40)]).natural_step() == 1.0
    # no target scraped twice: no interval to measure
    single = [("vllm", "a:8000", T0, 2.0, 1), ("vllm", "b:8000", T0 + 1.0, 2.0, 1)]
    assert _record(tmp_path, single, "single").natural_step() == 15.0
