"""The triage page's evidence table and header, as plain data (ui/data.py), and the Streamlit
command line the UI server runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvscope.diagnoser.findings import Diagnosis, Evidence, Finding, Skipped
from kvscope.ui.data import Source, SourceError, counts_caption, evidence_table, load_triage
from kvscope.ui.server import UiServer

T0 = 1_700_000_000.0
RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"


def _finding(*evidence: Evidence) -> Finding:
    return Finding(rule_id="kv_pressure_preemption", levers_md="K1", title="KV full", severity="warning",
                   where={"instance": "replica-0"}, since=T0, until=T0 + 60, active=True, window=(T0, T0 + 60),
                   step_s=15.0, score=1.0, summary="s", evidence=evidence)


def test_evidence_values_and_thresholds_carry_readable_units():
    table = evidence_table(_finding(
        Evidence("KV cache usage", 1.0, "ratio", "max(engine_kv_cache_usage_ratio)", threshold=0.9, op=">="),
        Evidence("preemptions", 7.25, "per_second", "rate(engine_preemptions_total[1m])", threshold=0.01, op=">"),
        Evidence("mean TTFT", 1.0706, "seconds", "ttft"),
        Evidence("bytes per transfer", None, "bytes", "kv_transfer_bytes")))
    assert list(table.columns) == ["evidence", "value", "threshold", "series"]
    assert table["value"].tolist() == ["100.0%", "7.25 /s", "1.07 s", "absent"]
    assert table["threshold"].tolist() == [">= 90.0%", "> 0.01 /s", "", ""]


def test_header_says_how_many_rules_could_not_be_evaluated():
    skipped = (Skipped("fleet_util_low", "signal(s) absent: gpu_utilization_ratio"),)
    d = Diagnosis(window=(T0, T0 + 60), source="s", likely_cause=None, skipped=skipped, rules_evaluated=45)
    assert counts_caption(d) == "45 rules evaluated, 0 fired, 1 not evaluable (missing signals; listed at the bottom)"
    assert counts_caption(Diagnosis(window=(T0, T0), source="s", likely_cause=None, rules_evaluated=3)) == \
        "3 rules evaluated, 0 fired"


def test_streamlit_runs_headless_on_loopback_without_the_developer_toolbar():
    cmd = UiServer(Source("recording", "/x.om"), 8599).command()
    flags = dict(zip(cmd[::1], cmd[1:], strict=False))
    assert flags["--server.address"] == "127.0.0.1" and flags["--server.port"] == "8599"
    assert flags["--client.toolbarMode"] == "minimal"          # no "Deploy" button on an on-call page
    assert flags["--browser.gatherUsageStats"] == "false"


def test_a_truncated_gzip_recording_is_a_source_error_not_a_traceback(tmp_path):
    whole = (RECORDINGS / "kv-pressure-cascade.om.gz").read_bytes()
    cut = tmp_path / "cut.om.gz"
    cut.write_bytes(whole[: len(whole) // 3])
    with pytest.raises(SourceError, match="truncated or corrupt"):
        load_triage(Source("recording", str(cut)))


def test_window_text_names_the_span_totals_are_over():
    from kvscope.ui.data import window_text

    assert window_text(T0, T0 + 132) == "2023-11-14 22:13:20 → 22:15:32 UTC (2m12s)"
    assert window_text(T0, T0 + 86_400) == "2023-11-14 22:13:20 → 2023-11-15 22:13:20 UTC (24h00m)"
