"""Progress on stderr (issue 39 item 9): where stderr is a log file or a pipe, `kvscope report`
writes one line per stage and no carriage-return redraws; on a terminal it draws the tqdm bar."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

RECORDING = Path(__file__).resolve().parents[1] / "recordings" / "kv-pressure-cascade.om.gz"
REPORT = [sys.executable, "-m", "kvscope", "report", "weekly", "--recording", str(RECORDING), "--no-diagnose"]


def test_a_piped_stderr_gets_one_line_per_stage_and_no_carriage_returns(tmp_path):
    out = subprocess.run(REPORT, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "\r" not in out.stderr
    lines = out.stderr.splitlines()
    stages = [x for x in lines if x.startswith("weekly report: ")]
    assert stages == [f"weekly report: {s}" for s in ("reading", "computing", "rendering", "writing")]


def test_no_progress_writes_no_stage_lines(tmp_path):
    out = subprocess.run([*REPORT, "--no-progress"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "weekly report" not in out.stderr


def test_a_terminal_gets_the_bar(tmp_path):
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    try:
        proc = subprocess.run(REPORT, stdout=subprocess.DEVNULL, stderr=child, timeout=300, cwd=tmp_path)
        os.close(child)
        child = -1
        drawn = b""
        while True:
            try:
                chunk = os.read(parent, 65536)
            except OSError:  # EIO: the terminal's other end is closed and drained
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        if child >= 0:
            os.close(child)
        os.close(parent)
    assert proc.returncode == 0
    assert b"\r" in drawn and b"4/4" in drawn  # tqdm redraws in place, to the last stage
    assert b"weekly report: reading\n" not in drawn.replace(b"\r\n", b"\n")
