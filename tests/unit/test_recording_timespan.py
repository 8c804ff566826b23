"""One wrong timestamp in a real recording: dropped, counted and reported with its file:line, and
the evaluation stays within its bounds (it drove `kvscope diagnose --recording` to ~24 GB)."""

import gzip
import json
import os
import resource
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kvscope.agent.recording.replay import replay_recording
from kvscope.diagnoser.evaluate.frame import MAX_GRID_POINTS, make_grid

REC = Path(__file__).parents[1] / "recordings" / "blind-vllm-kv-too-small.om.gz"
KVSCOPE = str(Path(sys.executable).parent / "kvscope")
YEAR_S = 365.25 * 86400


def _copy(directory: Path, offset_s: float | None) -> tuple[Path, int]:
    """The recording as text, with one sample repeated `offset_s` earlier right after the first
    one of its series (its family stays contiguous). Returns (path, line of the injected sample)."""
    lines = gzip.decompress(REC.read_bytes()).decode().splitlines(keepends=True)
    i = next(n for n, line in enumerate(lines) if line.startswith("vllm:num_requests_running{"))
    if offset_s is not None:
        head, value, ts = lines[i].rsplit(" ", 2)
        lines.insert(i + 1, f"{head} {value} {float(ts) - offset_s:.3f}\n")
    directory.mkdir()
    path = directory / "rec.om"
    path.write_text("".join(lines))
    return path, i + 2


def _diagnose(path: Path, *flags: str) -> tuple[int, str, str, float]:
    """Run `kvscope diagnose` under a 4 GiB address-space limit; (rc, stdout, stderr, peak RSS MiB)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    proc = subprocess.Popen(
        [KVSCOPE, "diagnose", "--recording", str(path), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit,
    )
    with ThreadPoolExecutor(2) as pool, proc.stdout, proc.stderr:  # read both pipes, then reap the child
        got_out, got_err = pool.submit(proc.stdout.read), pool.submit(proc.stderr.read)
        out, err = got_out.result(timeout=300), got_err.result(timeout=300)
    # this child's own peak: RUSAGE_CHILDREN would be the peak of every child the session has had
    # (a streamlit run by another test reached 1.8 GiB)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, out, err, usage.ru_maxrss / 1024


def test_a_sample_28_years_early_is_dropped_and_reported_and_the_verdict_is_unchanged(tmp_path):
    clean, _ = _copy(tmp_path / "clean", None)
    bad, line = _copy(tmp_path / "bad", 28 * YEAR_S)
    rc_clean, out_clean, _, _ = _diagnose(clean, "--json")
    rc, out, err, peak_mib = _diagnose(bad, "--json")
    print(json.dumps({"peak_rss_mib": round(peak_mib), "stderr": err}))
    verdict, verdict_clean = json.loads(out), json.loads(out_clean)
    assert rc == rc_clean == 2 and verdict["window"] == verdict_clean["window"]
    assert [verdict[k] for k in ("likely_cause", "competing", "other")] == [
        verdict_clean[k] for k in ("likely_cause", "competing", "other")
    ]
    assert f"{bad}:{line}: dropped 1 sample(s) timestamped more than 31 days from the recording's median" in err
    assert "1998-" in err and peak_mib < 1024


def test_replay_carries_the_note_and_spans_only_the_bulk(tmp_path):
    bad, line = _copy(tmp_path / "bad", 28 * YEAR_S)
    replay = replay_recording(bad)
    assert replay.end - replay.start < 3600 and len(replay.notes) == 1 and f":{line}:" in replay.notes[0]
    from kvscope.diagnoser.sources.recording import RecordingSource
    from kvscope.ui.data import SourceSpec, triage_from_recording

    ui = triage_from_recording(SourceSpec("recording", str(bad)), RecordingSource(bad))
    assert ui.notes == replay.notes  # the UI warns


def test_a_window_past_the_grid_bound_is_refused_before_allocation_with_what_to_pass(tmp_path):
    bad, _ = _copy(tmp_path / "bad", 30 * 86400)  # within 31 days: kept, so the window is 30 days
    rc, _, err, peak_mib = _diagnose(bad, "--step", "1s")
    assert rc == 3 and "grid points" in err and "pass --start/--end" in err and "Traceback" not in err
    assert peak_mib < 1024
    with pytest.raises(ValueError, match=f"at most {MAX_GRID_POINTS:,}"):
        make_grid(0.0, 28 * YEAR_S, 1.0)
    assert os.path.getsize(bad) > 0
