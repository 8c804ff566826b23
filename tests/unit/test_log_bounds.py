"""Issue 41 N4 and N11: a log's frame is sized from instances x steps before it is allocated
(stepped coarser and said so, or refused), and a log whose time runs backwards beyond a small
tolerance is reported, not read as a day or year roll."""

from __future__ import annotations

import datetime
import io
import json
import subprocess
import sys

import pytest

from kvscope.agent.logs.series import read_log
from kvscope.diagnoser.sources import SourceError
from kvscope.diagnoser.sources.logs import LogSource

DAY = datetime.date(2026, 5, 1)


def _line(pod: int, second: int, kv: float = 95.0) -> str:
    return (
        f"[pod/vllm-{pod}/vllm] INFO 05-01 10:{second // 60:02d}:{second % 60:02d} [loggers.py:335] Engine 000: "
        "Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 50.0 tokens/s, Running: 3 reqs, "
        f"Waiting: 1 reqs, GPU KV cache usage: {kv}%, Prefix cache hit rate: 10.0%\n"
    )


_PODS = """
import datetime, io, json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from kvscope.agent.logs.series import read_log
from kvscope.diagnoser.evaluate.evaluator import sample_names
from kvscope.diagnoser.rulebook.rule import read_rules
from kvscope.diagnoser.sources.logs import LogSource
text = sys.stdin.read()
read = read_log(io.BytesIO(text.encode()), "log", day=datetime.date(2026, 5, 1))
source = LogSource(read, "pods.log")
names = set().union(*(sample_names(r) for r in read_rules()))
frame = source.read_frame(names, None, None, source.natural_step())
cells = sum(b.values.size for b in frame.blocks.values())
print(json.dumps({"cells": cells, "steps": len(frame.ts), "notes": source.notes}))
"""


def test_a_log_from_5000_pods_is_stepped_coarser_before_the_grid_is_allocated_and_says_so():
    """5000 pods over an hour, each logging twice a second apart (a 1 s interval per pod): 25,000
    series x 3,600 one-second steps (90M values, 5 GB and minutes before) is read on a coarser
    grid under an address-space limit of 2 GiB."""
    text = "".join(_line(pod, pod % 3599 + t) for pod in range(5000) for t in (0, 1))
    out = subprocess.run(
        [sys.executable, "-c", _PODS], input=text, capture_output=True, text=True, timeout=900, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["cells"] <= 12_000_000 and got["steps"] >= 60
    assert any("5,000 instances" in n and "stepped coarser" in n for n in got["notes"]), got["notes"]


def test_more_series_than_any_grid_holds_are_refused_naming_the_count(monkeypatch):
    import kvscope.diagnoser.sources.recording as recording

    monkeypatch.setattr(recording, "GRID_CELLS", 6_000)
    text = "".join(_line(pod, pod) for pod in range(40))  # 40 pods x 5 series x 60 steps > 6,000
    source = LogSource(read_log(io.BytesIO(text.encode()), "log", day=DAY), "pods.log")
    with pytest.raises(SourceError, match=r"200 series from 40 instances .* split the input by instance"):
        source.read_frame(
            {
                "engine_kv_cache_usage_ratio",
                "engine_requests_running",
                "engine_requests_waiting",
                "engine_prompt_tokens_total",
                "engine_generation_tokens_total",
            },
            None,
            None,
            1.0,
        )


def _vllm(month_day: str, hms: str, kv: float = 95.0) -> str:
    return (
        f"INFO {month_day} {hms} [loggers.py:335] Engine 000: Avg prompt throughput: 100.0 tokens/s, "
        f"Avg generation throughput: 50.0 tokens/s, Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: {kv}%, "
        "Prefix cache hit rate: 10.0%\n"
    )


def test_lines_out_of_order_by_months_are_reported_not_read_as_year_rolls():
    """November and May lines alternating (two runs' logs shuffled together): each May line more than
    half a year before the newest was a new year, so 200 lines spanned a century."""
    text = "".join(_vllm("11-20" if i % 2 else "05-01", f"10:{i // 60:02d}:{i % 60:02d}") for i in range(200))
    read = read_log(io.BytesIO(text.encode()), "vllm-0", day=datetime.date(2026, 5, 1))
    times = [ts for _, ts, _ in read.scrapes]
    # May 1 to Nov 20 (the first line, then the forward jump): not a century
    assert max(times) - min(times) < 210 * 86400, (min(times), max(times))
    assert read.summary.skipped["time_backwards"] == 99
    (warning,) = read.summary.warnings()
    assert "99 log line(s) went back in time" in warning and "days" in warning


def test_a_real_year_roll_and_a_dormant_gap_still_roll_and_small_jitter_is_kept():
    text = _vllm("12-31", "23:59:50") + _vllm("01-01", "00:00:00") + _vllm("01-01", "00:00:10")
    text += _vllm("01-01", "00:00:05")  # 5 s back: jitter, kept as it was
    read = read_log(io.BytesIO(text.encode()), "vllm-0", day=datetime.date(2026, 12, 31))
    times = [ts for _, ts, _ in read.scrapes]
    assert max(times) - min(times) == 20 and not read.summary.warnings()


def test_diagnose_says_a_log_ran_backwards_even_when_quiet(tmp_path, capsys):
    from kvscope.cli import main

    path = tmp_path / "shuffled.log"
    path.write_text("".join(_vllm("11-20" if i % 2 else "05-01", f"10:{i // 60:02d}:{i % 60:02d}") for i in range(200)))
    main(["diagnose", "--log", str(path), "--date", "2026-05-01", "-q"])
    err = capsys.readouterr().err
    assert "went back in time" in err and "not read as a new day or year" in err, err


# --- issue 57 N11: times that only move forward, but by years -------------------------------------


def _dated(year: int, second: int) -> str:
    """A `kubectl logs --timestamps` line: its RFC 3339 time (with the year) is the line's time."""
    return f"{year}-05-01T10:00:{second:02d}.000000000Z " + _vllm("05-01", f"10:00:{second:02d}")


def test_lines_that_jump_ahead_by_years_are_counted_and_refused():
    text = "".join(_dated(2026 + i, i % 60) for i in range(100))
    read = read_log(io.BytesIO(text.encode()), "vllm-0", day=DAY)
    assert read.summary.jumps == 99
    said = read.summary.jump_error()
    assert said is not None and "99 line(s) jump ahead by more than 31 days (up to 1.0 years)" in said


def test_a_dormant_week_is_no_jump():
    text = _dated(2026, 0) + _dated(2026, 10) + "2026-05-08T10:00:20.000000000Z " + _vllm("05-08", "10:00:20")
    read = read_log(io.BytesIO(text.encode()), "vllm-0", day=DAY)
    assert read.summary.jumps == 0 and read.summary.jump_error() is None and len(read.scrapes) == 3


@pytest.mark.parametrize("command", ["diagnose", "record", "curve"])
def test_a_log_spanning_two_thousand_years_is_not_diagnosed_healthy(tmp_path, capsys, command):
    """It read as a 2026 -> 4026 window, exit 0, "No rule fired", and no warning (curve: exit 0 and a
    curve of that window)."""
    from kvscope.cli import main

    path = tmp_path / "years.log"
    path.write_text("".join(_dated(2026 + 20 * i, i % 60) for i in range(100)))
    extra = {"diagnose": ["-q"], "record": ["-o", str(tmp_path / "out.om")]}.get(command, [])
    code = main([command, "--log", str(path), *extra])
    out = capsys.readouterr()
    assert code == (2 if command == "record" else 4), out
    assert "jump ahead by more than 31 days" in out.err and "Traceback" not in out.err, out.err
    assert "No rule fired" not in out.out
