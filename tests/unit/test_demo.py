"""kvscope demo: --check prints the diagnosis and exits; the foreground mode serves the UI and
stops cleanly on Ctrl-C (SIGINT), leaving no process behind."""

from __future__ import annotations

import os
import re
import signal
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from test_ui_apptest import write_kv_incident

from kvscope.cli import main
from kvscope.commands.demo import DEMO, default_recording
from kvscope.diagnoser.rulebook.rule import read_rules
from testbed.procs import free_port, http_get, start_reporting_port, stop_process, wait_until

REPO = Path(__file__).resolve().parents[2]


def test_check_prints_the_likely_cause_and_exits(tmp_path, capsys, monkeypatch):
    """The diagnosis is the diagnoser's card: the lever table's first row and the citations."""
    monkeypatch.setenv("COLUMNS", "200")
    rec = write_kv_incident(tmp_path / "kv-incident.om")
    assert main(["demo", "--check", "--recording", str(rec)]) == 0
    out = capsys.readouterr().out
    assert "LIKELY CAUSE" in out
    assert re.search(r"^│ (DO NOW|FIX FOR GOOD): ", out, re.M) and re.search(r"^│   1\. \w", out, re.M)
    assert "sources: Sizing LLM Inference for Production §7.4" in out


def test_check_with_a_missing_recording_is_a_clear_error(tmp_path, capsys):
    assert main(["demo", "--check", "--recording", str(tmp_path / "none.om")]) == 4
    assert "does not exist" in capsys.readouterr().err


def test_default_recording_prefers_a_library_kv_incident_over_the_bundled_one(tmp_path):
    bundled = tmp_path / "bundled.om.gz"
    bundled.write_text("# EOF\n")
    for name in ("healthy-kv.om.gz", "a-other.om", "b-kv-pressure.om.gz"):
        (tmp_path / name).write_text("# EOF\n")
    assert default_recording(tmp_path, bundled).name == "b-kv-pressure.om.gz"
    (tmp_path / f"{DEMO}.om.gz").write_text("# EOF\n")  # the demo's own incident comes first
    assert default_recording(tmp_path, bundled).name == f"{DEMO}.om.gz"
    (tmp_path / f"{DEMO}.om.gz").unlink()
    (tmp_path / "b-kv-pressure.om.gz").unlink()
    assert default_recording(tmp_path, bundled) == bundled  # never the healthy baseline
    assert default_recording(tmp_path / "missing", tmp_path / "none.om") is None


def test_check_on_the_default_real_incident(capsys, monkeypatch):
    """The demo's default recording is a real vLLM incident and the diagnoser finds its cause:
    one of the LEVERS rows the incident library's YAML expects, when the recording has one."""
    monkeypatch.setenv("COLUMNS", "200")
    path = default_recording()
    assert path is not None
    assert main(["demo", "--check"]) == 0
    out = capsys.readouterr().out
    assert "LIKELY CAUSE" in out
    rule_id = re.search(r"\(rule ([a-z_]+)\)", out).group(1)  # the card's title: (rule kv_pressure_cascade)
    row = next(r.doc.get("levers_md") for r in read_rules() if r.id == rule_id)
    meta = path.parent / (path.name.split(".")[0] + ".yaml")
    expected = (
        {lv for e in yaml.safe_load(meta.read_text())["expected"] for lv in e.get("levers", [])}
        if meta.is_file()
        else {"K1", "K2", "K3"}
    )  # the bundled incident is KV pressure
    assert row in expected


@pytest.mark.parametrize("inherited_sigint", ["default", "ignored"])
def test_foreground_demo_serves_the_ui_and_stops_on_ctrl_c(tmp_path, inherited_sigint):
    """Also when started with SIGINT ignored, as a shell starts background jobs (a CI runner's
    `make test &`): the demo says 'Ctrl-C to stop', so it must restore the handler."""
    rec = write_kv_incident(tmp_path / "kv-incident.om")
    port = free_port()
    sigint = signal.SIG_IGN if inherited_sigint == "ignored" else signal.SIG_DFL
    proc, printed = _start_ui("demo", rec, port, preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    try:
        assert printed == port
        url = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=60) as resp:
            assert resp.read() == b"ok"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=300) == 0  # ceilings here are hang guards only (loaded 2-core CI box)
        proc.reader.join(60)
        assert "stopped" in "".join(proc.output_lines)
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{url}/_stcore/health", timeout=2)
    finally:
        stop_process(proc, signal.SIGKILL)


def _start_ui(command: str, rec: Path, port: int, **popen_kw):
    """`kvscope <command>` on `port`, and the port of the URL it printed ("kvscope UI: <url>")."""
    return start_reporting_port(
        [sys.executable, "-m", "kvscope", command, "--recording", str(rec), "--port", str(port)],
        r"^kvscope UI: http://127\.0\.0\.1:(\d+)\s",
        timeout_s=90,
        stream="stdout",
        cwd=REPO,
        **popen_kw,
    )


def test_demo_script_exists_and_is_executable():
    script = REPO / "scripts" / "demo.sh"
    assert os.access(script, os.X_OK)
    assert 'demo "$@"' in script.read_text()


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_ui_command_leaves_no_streamlit_behind(tmp_path, how):
    """`kvscope ui` stopped by SIGTERM shuts Streamlit down cleanly; killed by SIGKILL, Linux's
    parent-death signal still takes Streamlit with it (no orphan on 127.0.0.1)."""
    rec = write_kv_incident(tmp_path / "kv-incident.om")
    port = free_port()
    proc, printed = _start_ui("ui", rec, port)
    try:
        health = f"http://127.0.0.1:{printed}/_stcore/health"
        proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        code = proc.wait(timeout=300)  # a hang guard only
        assert code == (0 if how == "sigterm" else -signal.SIGKILL)
        wait_until(
            lambda: http_get(health, timeout_s=1)[0] == 0, 120, "Streamlit to stop answering after kvscope ui ended"
        )
    finally:
        stop_process(proc, signal.SIGKILL)
