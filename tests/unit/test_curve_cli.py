"""`kvscope curve` on recordings of the incident library, and `kvscope diagnose`'s change section."""

from __future__ import annotations

import json
from pathlib import Path

from kvscope.cli import main

LIB = Path(__file__).resolve().parents[1] / "recordings"


def _json(capsys, *argv: str) -> dict:
    assert main(["curve", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_shape_on_a_real_vllm_recording(capsys):
    doc = _json(capsys, "--recording", str(LIB / "kv-pressure-cascade.om.gz"), "--slo-ttft-p99", "2.5")
    assert doc["slo_ttft_p99_s"] == 2.5
    (pool,) = doc["pools"]
    assert pool["labels"] == {"model": "tiny-llama", "engine": "vllm"}
    assert pool["concurrency_signal"] == "engine_requests_running + engine_requests_waiting"
    for key in ("knee_concurrency", "c_max", "usable_rps", "changes"):
        assert key in pool
    pts = pool["points"]
    assert pts and all(
        set(p) >= {"concurrency", "ttft_p50_s", "ttft_p99_s", "rps", "output_tokens_per_s", "intervals"} for p in pts
    )
    assert [p["concurrency"] for p in pts] == sorted(p["concurrency"] for p in pts)
    assert any(p["sparse"] for p in pts) and any(not p["sparse"] for p in pts)
    # KV pressure: requests wait and are preempted in the busy buckets
    busy = [p for p in pts if not p["sparse"] and p["concurrency"] > 4]
    assert busy and all(p["waiting"] > 0.5 and p["preemptions_per_s"] > 0 for p in busy)


def test_text_table_and_changes(capsys):
    assert main(["curve", "--recording", str(LIB / "replica-restart-cold-cache.om.gz")]) == 0
    out = capsys.readouterr().out
    # the operating point in the UI's words (curve/report.py knee_text, c_max_text, headroom_text)
    assert "ttft p99" in out and "Knee: " in out and "C_max at TTFT p99 ≤ 1 s" in out and "The window's peak" in out
    assert "replicas 2 -> 1" in out and "replicas 1 -> 2" in out


def test_diagnose_says_what_changed(capsys):
    main(["diagnose", "--recording", str(LIB / "replica-restart-cold-cache.om.gz"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert [(c["kind"], c["diff"]) for c in doc["changes"]] == [
        ("replicas", {"replicas": [2, 1]}),
        ("replicas", {"replicas": [1, 2]}),
    ]
    assert all(c["verdict"] in ("not_comparable", "no_change", "improvement", "regression") for c in doc["changes"])


def test_bad_usage_and_unreadable_sources(capsys, tmp_path):
    assert main(["curve"]) == 3
    assert main(["curve", "--recording", str(LIB / "kv-pressure-cascade.om.gz"), "--slo-ttft-p99", "0"]) == 3
    assert main(["curve", "--recording", str(tmp_path / "missing.om.gz")]) == 4
    assert main(["curve", "--recording", str(LIB / "kv-pressure-cascade.om.gz"), "--recorded"]) == 3
    err = capsys.readouterr().err
    assert "pick a source" in err and "--slo-ttft: must be a positive duration" in err
    assert "--recorded reads a TSDB's curve records: use it with --prometheus URL" in err


def test_an_engine_log_gives_a_pool_without_latency_it_never_printed(capsys):
    fixture = LIB.parent / "fixtures" / "logs" / "vllm-0.32-cpu-kv-pressure.log"
    doc = _json(capsys, "--log", str(fixture), "--date", "2026-11-20")
    (pool,) = doc["pools"]
    assert pool["labels"] == {"engine": "vllm"} and pool["operating"]["peak_concurrency"] > 0
    assert all(p["ttft_p99_s"] is None for p in pool["points"])  # vLLM's stats lines carry no TTFT


def test_c_max_judges_every_objective_the_engines_measure(capsys):
    """On the staircase, e2e p99 crosses 5 s between the 5.8 and 8.3 buckets, before TTFT p99
    crosses 2.5 s: C_max and the usable RPS move down to it, and the note says what was judged."""
    rec = str(LIB / "curve-vllm-staircase.om.gz")
    (ttft_only,) = _json(capsys, "--recording", rec, "--slo-ttft-p99", "2.5")["pools"]
    (every,) = _json(capsys, "--recording", rec, "--slo-ttft", "2.5s", "--slo-e2e", "5s")["pools"]
    assert 5.807 < every["operating"]["c_max"] < ttft_only["operating"]["c_max"]
    assert every["operating"]["usable_rps"] < ttft_only["operating"]["usable_rps"]
    assert "(the p99 of TTFT, E2E)" in every["operating"]["c_max_note"]
    assert all(p["e2e_p99_s"] is not None and p["tpot_p99_s"] is not None for p in every["points"])
