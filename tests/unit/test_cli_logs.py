"""`kvscope diagnose --log` and `kvscope record --log` end to end (the real CLI entry point, in-process):
a log diagnoses as the recording `record --log` wrote of it, KV-pressure logs name KV pressure,
healthy logs stay quiet, and a log that holds no stats lines is an error, not an all-clear."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvscope.cli import main

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
KV_PRESSURE = ("kv_pressure_preemption", "kv_pressure_cascade", "eviction_rate_high")  # K1-K3: one mechanism
EXIT = {"warning": 1, "critical": 2}


def diagnose(capsys, *argv: str) -> tuple[int, dict, str]:
    code = main(["diagnose", *argv, "--json"])
    out = capsys.readouterr()
    return code, json.loads(out.out) if out.out.strip() else {}, out.err


def findings(result: dict) -> list[tuple[str, str]]:
    lc = [result["likely_cause"]] if result.get("likely_cause") else []
    return [(f["rule_id"], f["severity"]) for f in lc + result.get("competing", []) + result.get("other", [])]


@pytest.mark.parametrize(
    "name", ["vllm-0.6-v0-kv-pressure.log", "sglang-0.4-kv-pressure.log", "vllm-0.10-v1-kv-pressure.kubectl.log"]
)
def test_diagnose_log_equals_diagnose_recording_of_record_log(capsys, tmp_path: Path, name: str):
    out = tmp_path / "rec.om.gz"
    assert main(["record", "--log", str(LOGS / name), "-o", str(out), "--date", "2026-11-24"]) == 0
    assert "wrote" in capsys.readouterr().err
    code_log, from_log, err = diagnose(capsys, "--log", str(LOGS / name), "--date", "2026-11-24")
    assert "lines read; recognised:" in err
    code_rec, from_rec, _ = diagnose(capsys, "--recording", str(out))
    from_log.pop("source"), from_rec.pop("source")
    assert (code_log, from_log) == (code_rec, from_rec)
    assert findings(from_log)  # the comparison is not of two empty results


@pytest.mark.parametrize("name", ["vllm-0.6-v0-kv-pressure.log", "sglang-0.4-kv-pressure.log"])
def test_kv_pressure_log_with_preemptions_names_kv_pressure_first(capsys, name: str):
    code, result, _ = diagnose(capsys, "--log", str(LOGS / name), "--date", "2026-11-24")
    assert result["likely_cause"]["rule_id"] in KV_PRESSURE, findings(result)
    assert code == EXIT[result["likely_cause"]["severity"]]


def test_a_v0_preemption_counter_read_at_its_own_lines_gives_the_eviction_band(capsys):
    """vLLM 0.6's preemption warning carries the cumulative count (1, 51, 101 ten seconds apart)
    and nothing else does: a rate needs two of those samples, which the 40 s window's shortened
    1m range now keeps (two steps). 50 preemptions in 10 s over ~18 running requests is ~27 %
    of active requests per second, past 002 §7.4's 20 % band: degraded, critical."""
    code, result, _ = diagnose(capsys, "--log", str(LOGS / "vllm-0.6-v0-kv-pressure.log"), "--date", "2026-11-24")
    lc = result["likely_cause"]
    assert (lc["rule_id"], lc["severity"], code) == ("eviction_rate_high", "critical", 2), findings(result)
    preemptions = next(e for e in lc["evidence"] if e["name"] == "preemptions")
    assert preemptions["value"] == pytest.approx(5.0)


def test_kv_pressure_log_without_a_preemption_counter_names_kv_pressure_first(capsys):
    code, result, _ = diagnose(capsys, "--log", str(LOGS / "vllm-0.10-v1-kv-pressure.kubectl.log"))
    assert result["likely_cause"]["rule_id"] in (*KV_PRESSURE, "kv_pressure_no_preemption_counter"), findings(result)


@pytest.mark.parametrize("name", ["vllm-0.8-v1-healthy.log", "sglang-0.5-dp-healthy.log", "vllm-0.32-cpu-testbed.log"])
def test_healthy_log_stays_quiet(capsys, name: str):
    code, result, _ = diagnose(capsys, "--log", str(LOGS / name), "--date", "2026-11-24")
    assert code == 0 and not [f for f in findings(result) if f[1] != "info"], findings(result)


def test_stdin_and_labels(capsys, monkeypatch):
    data = (LOGS / "vllm-0.6-v0-kv-pressure.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, result, err = diagnose(
        capsys, "--log", "-", "--instance", "vllm-7", "--model", "llama", "--date", "2026-11-24"
    )
    assert code == 2 and result["likely_cause"]["where"]["instance"] == "vllm-7", result["likely_cause"]["where"]
    assert "9 vLLM V0 stats lines" in err


def test_a_log_without_stats_lines_is_an_error(capsys, tmp_path: Path):
    path = tmp_path / "server.log"
    path.write_text("INFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.9.0\n")
    assert main(["diagnose", "--log", str(path)]) == 4
    err = capsys.readouterr().err
    assert "holds no vLLM or SGLang stats lines" in err and "1 other lines" in err
    assert main(["diagnose", "--log", str(tmp_path / "missing.log")]) == 4
    assert "cannot read log" in capsys.readouterr().err
    assert main(["record", "--log", str(path), "-o", str(tmp_path / "x.om.gz")]) == 2
    assert not (tmp_path / "x.om.gz").exists()
    capsys.readouterr()
    assert main(["record", "--target", "http://127.0.0.1:1/metrics", "-o", str(tmp_path / "y.om")]) == 2
    assert "--duration is required (or give --log FILE)" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_record_log_output_loads_into_prometheus_tsdb(capsys, tmp_path: Path):
    out = tmp_path / "rec.om"
    assert main(["record", "--log", str(LOGS / "sglang-0.4-kv-pressure.log"), "-o", str(out)]) == 0
    made = subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(out), str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr[-2000:]


def test_vllm_v0_preemption_warnings_alone_without_headers_name_kv_pressure_at_moderate_confidence(capsys, tmp_path):
    """Issue 38: the V0 warning pasted without its log header, several times (GAIR-NLP/LIMO#29's line,
    its cumulative count rising): no KV gauge, no stats line, times unknown; a preemption happens
    only when KV blocks run out, so K1 is named, moderate."""
    line = Path(__file__).resolve().parents[1] / "outside" / "logs" / "vllm-v0-preempt-warning-alone-limo-29.log"
    text = line.read_text().strip().rpartition("=")[0]
    path = tmp_path / "warnings.log"
    path.write_text("".join(f"{text}={n}\n" for n in (101, 104, 108, 111, 115, 120, 124, 129)))
    code, result, err = diagnose(capsys, "--log", str(path))
    assert "times unknown" in err
    cause = result["likely_cause"]
    assert cause["rule_id"] == "kv_pressure_preemption" and cause["confidence"] == "moderate", findings(result)
    one = tmp_path / "one.log"
    one.write_text(f"{text}=101\n")  # one cumulative count: no rate, nothing named
    code, result, _ = diagnose(capsys, "--log", str(one))
    assert code == 0 and result["likely_cause"] is None
