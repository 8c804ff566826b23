"""`RecordingSource.natural_step()`: a recording's scrape interval is taken per target, so the
scrape times of several targets interleaving do not shorten it (the demo's two engines, scraped
a few milliseconds apart every 2 s, read 1.997 s; a fleet scraped every 5 s read 1 s), and the
interval measured is read as the whole second it was configured at (2.001 s is 2 s)."""

from __future__ import annotations

import pytest

from kvscope.agent.recording.omfile import RecordingWriter
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.core.rates import configured_interval
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


@pytest.mark.parametrize("interval", [2.001, 1.998, 2.0025, 0.999, 15.1, 29.8])
def test_a_jittery_interval_is_the_whole_second_it_was_configured_at(tmp_path, interval):
    # one target: no interleaving, the measured median is the scraper's own period
    source = _record(tmp_path, [("vllm", "a:8000", T0, interval, 40)])
    assert source.natural_step() == round(interval)


@pytest.mark.parametrize(
    ("measured", "configured"),
    [
        (2.001, 2.0),
        (1.98, 2.0),  # 1 % of 2 s
        (2.05, 2.05),  # 2.5 %: no 2 s scraper's jitter, kept
        (1.5, 1.5),
        (2.5, 2.5),
        (0.25, 0.25),  # sub-second: as measured
        (0.2504, 0.25),  # to the millisecond
        (0.995, 1.0),
        (2.0009999275, 2.0),
        (30.2, 30.0),
        (60.5, 60.0),
        (61.0, 61.0),
    ],
)
def test_configured_interval(measured, configured):
    assert configured_interval(measured) == configured


@pytest.mark.parametrize(
    "name",
    [
        "healthy-shared-prefix",  # 2.001 s measured
        "llamacpp-healthy",  # 2.001 s
        "noisy-tenant-long-prompts",  # 2.001 s
        "metrics-only-round-robin-2-skewed",  # 1.999 s
        "metrics-only-sticky-2-poisson",  # 1.998 s
        "spec-decode-poor-acceptance",  # 2.0025 s
    ],
)
def test_library_recordings_read_at_the_interval_they_were_configured_at(name):
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "recordings" / f"{name}.om.gz"
    assert RecordingSource(path).natural_step() == 2.0
