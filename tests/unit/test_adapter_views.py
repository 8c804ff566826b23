"""Per-adapter views on the real recording of vLLM serving two LoRA adapters behind the request
tap (tests/recordings/lora-two-adapters.*, testbed/lora_record.py): the UI's table, the weekly
report's, the GPU-time share and the engine's adapter series."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from kvscope.diagnoser.sources.recording import RecordingSource
from kvscope.report.render import render_markdown
from kvscope.report.weekly.build import build_report
from kvscope.report.weekly.groups import gpu_time_share, group_week
from kvscope.report.weekly.series import columns, report_window
from kvscope.ui import data as ui_data

LIBRARY = Path(__file__).resolve().parents[1] / "recordings"
META = yaml.safe_load((LIBRARY / "lora-two-adapters.yaml").read_text())
SENT = {model: c["requests"] for model, c in META["phases"][0]["client"].items()}
MAX_TOKENS = {t["model"]: t["max_tokens"] for t in META["phases"][0]["traffic"]}


@cache
def _frame():
    return report_window(RecordingSource(LIBRARY / META["recording"]))


@cache
def _ui_frame():
    return ui_data.load_triage(ui_data.SourceSpec("recording", str(LIBRARY / META["recording"]))).frame


def test_ui_adapter_table_has_a_row_per_requested_model_with_latency_and_share():
    frame = _ui_frame()
    rows = ui_data.group_table(frame, "adapter").set_index("adapter")
    assert set(rows.index) == set(SENT) == {"a", "b", "tiny-llama"}
    span = float(frame.ts[-1] - frame.ts[0])
    for model, n in SENT.items():  # a counter's first scrape is its start: at most a request or two short
        assert n - 3 <= rows.loc[model, "requests/s"] * span <= n
    for col in ("TTFT p50 (s)", "TTFT p95 (s)", "ITL p50 (s)", "ITL p95 (s)"):
        assert (rows[col] > 0).all(), col
    assert rows["GPU-time share"].sum() == pytest.approx(1.0)
    # b's answers are 6x a's (96 against 16 tokens, ignore_eos): its requests hold the engine longest
    assert rows.loc["b", "GPU-time share"] > rows.loc["a", "GPU-time share"]
    assert "hit ratio (latest)" not in rows  # a tenant-only signal: no adapter column, not a column of Nones


def test_weekly_report_adapters_tokens_quantiles_and_cost_absent_without_gpus():
    ss = columns(_frame())
    start, end = float(_frame().ts[0]) - 1, float(_frame().ts[-1])
    week = group_week(ss, start, end, "adapter", None)
    assert set(week.index) == set(SENT)
    for model in SENT:  # every answer ran to max_tokens
        assert week.loc[model, "completion_tokens"] == MAX_TOKENS[model] * week.loc[model, "requests"]
    assert (week["ttft_p95_s"] >= week["ttft_p50_s"]).all() and (week["itl_p95_s"] > 0).all()
    assert "cost_usd" not in week  # no GPU series in this source: no cost, never $0
    priced = group_week(ss, start, end, "adapter", 100.0)
    assert priced["cost_usd"].to_dict() == pytest.approx((priced["gpu_time_share"] * 100.0).to_dict())
    tenants = group_week(ss, start, end, "tenant", 100.0)
    assert tenants["cost_usd"].sum() == pytest.approx(priced["cost_usd"].sum()) == pytest.approx(100.0)


def test_weekly_report_renders_an_adapters_section():
    report = build_report(_frame(), float(_frame().ts[-1]), 2.5, "lora-two-adapters")
    md = render_markdown(report)
    section = md.split("## Adapters", 1)[1].split("\n## ", 1)[0]
    assert "| a |" in section and "| b |" in section and "GPU-time share" in section


def test_gpu_time_share_is_absent_without_in_flight_time():
    assert gpu_time_share(pd.Series({"a": 3.0, "b": 1.0})).to_dict() == {"a": 0.75, "b": 0.25}
    assert gpu_time_share(pd.Series({"a": 0.0})).isna().all()


def test_engine_adapter_series_from_vllms_lora_requests_info():
    frame = _ui_frame()
    slots, in_flight = frame.block("engine_lora_max_adapters"), frame.block("engine_lora_in_flight_adapters")
    assert np.nanmax(slots.values) == 2  # --max-loras 2
    # a and b ran together between scrapes, but at every scrape of this take the newest series
    # names at most one adapter (the first take caught both at once)
    assert np.nanmax(in_flight.values) == 1
