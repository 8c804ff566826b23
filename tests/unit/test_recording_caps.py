"""Issue 57 S3: a recording is bounded in series, targets and text as well as in grid cells. A
recording of one gauge from 1,000,000 instances (6.5 MB gzipped) took 3.7 GB and ended in a
MemoryError; 100,000 instances ran past 200 s. Past a cap the read stops with one line naming
the cap and the flag that raises it (small caps here: the defaults are checked on real data by
the recordings under tests/recordings, which all read)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from kvscope.agent.recording.omfile import RecordingLimits, read_recording
from kvscope.agent.scrape.exposition import Limits, parse_exposition
from kvscope.cli import main
from kvscope.diagnoser.sources import SourceError
from kvscope.diagnoser.sources.recording import RecordingSource

T = 1_795_300_000


def _bomb(path: Path, instances: int, pad: int = 0) -> Path:
    """card_bomb's `instances` shape: one vLLM gauge from `instances` targets, two scrapes each."""
    lines = ["# TYPE vllm:num_requests_running gauge\n"]
    for t in (T, T + 30):
        for i in range(instances):
            extra = f',pad="{"x" * pad}"' if pad else ""
            lines.append(
                f'vllm:num_requests_running{{instance="10.0.{i >> 8}.{i & 255}:8000",job="vllm"{extra}}} 3.0 {t}.0\n'
            )
    lines.append("# EOF\n")
    with gzip.open(path, "wt") as f:
        f.write("".join(lines))
    return path


def test_the_parser_counts_series_not_samples_against_its_series_limit():
    text = "".join(f'a{{i="{i}"}} 1 {t}\n' for t in (1, 2, 3) for i in range(3)) + "# EOF\n"
    assert not parse_exposition(text, openmetrics=True, limits=Limits(series_limit=3)).issues
    capped = parse_exposition(text, openmetrics=True, limits=Limits(series_limit=2))
    # the parse stops at the first sample of a series past the cap, 3 lines in, not after the 9
    assert [i.reason for i in capped.issues] == ["series_limit_exceeded"] and len(capped.samples) == 3


def test_a_recording_past_the_series_cap_is_refused_before_it_is_normalized(tmp_path):
    path = _bomb(tmp_path / "bomb.om.gz", 50)
    with pytest.raises(ValueError, match=r"holds more than 20 series .* raise the cap with --max-series"):
        read_recording(path, RecordingLimits(max_series=20))
    source = RecordingSource(path, limits=RecordingLimits(max_series=20))
    with pytest.raises(SourceError, match=r"^recording .*bomb.om.gz holds more than 20 series"):
        source.replay()
    assert len(read_recording(path, RecordingLimits(max_series=50, max_targets=50))[0]) == 100


@pytest.mark.parametrize(
    "flag, value, said",
    [
        ("--max-series", "20", "holds more than 20 series"),
        ("--max-targets", "10", "holds more than 10 targets (job, instance)"),
        ("--max-recording-mib", "1", "holds more than 1 MiB of text (decompressed)"),
    ],
)
def test_diagnose_refuses_a_recording_past_a_cap_naming_the_flag(tmp_path, capsys, flag, value, said):
    path = _bomb(tmp_path / "bomb.om.gz", 50, pad=12_000 if flag == "--max-recording-mib" else 0)
    code = main(["diagnose", "--recording", str(path), flag, value, "-q"])
    err = capsys.readouterr().err
    assert code == 4, err
    assert said in err and f"raise the cap with {flag}" in err and "Traceback" not in err, err


def test_a_cap_flag_takes_whole_numbers_from_one(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["diagnose", "--recording", "x.om", "--max-series", "0"])
    assert exc.value.code == 2 and "not a whole number from 1" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["curve"], ["report", "weekly"]])
def test_every_command_that_reads_a_recording_takes_the_flag_its_error_names(tmp_path, capsys, command):
    path = _bomb(tmp_path / "bomb.om.gz", 20)
    code = main([*command, "--recording", str(path), "--max-targets", "5"])
    err = capsys.readouterr().err
    assert code == 4, err
    assert "holds more than 5 targets" in err and "raise the cap with --max-targets" in err, err
    assert "Traceback" not in err
