"""The triage page's evidence table and header, as plain data (ui/data.py), and the Streamlit
command line the UI server runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvscope.diagnoser.findings import Diagnosis, Evidence, Finding, Skipped
from kvscope.ui.data import SourceError, SourceSpec, counts_caption, evidence_table, load_triage
from kvscope.ui.server import UiServer

T0 = 1_700_000_000.0
RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"


def _finding(*evidence: Evidence) -> Finding:
    return Finding(
        rule_id="kv_pressure_preemption",
        levers_md="K1",
        title="KV full",
        severity="warning",
        where={"instance": "replica-0"},
        since=T0,
        until=T0 + 60,
        active=True,
        window=(T0, T0 + 60),
        step_s=15.0,
        score=1.0,
        summary="s",
        evidence=evidence,
    )


def test_evidence_values_and_thresholds_carry_readable_units():
    table = evidence_table(
        _finding(
            Evidence("KV cache usage", 1.0, "ratio", "max(engine_kv_cache_usage_ratio)", threshold=0.9, op=">="),
            Evidence("preemptions", 7.25, "per_second", "rate(engine_preemptions_total[1m])", threshold=0.01, op=">"),
            Evidence("mean TTFT", 1.0706, "seconds", "ttft"),
            Evidence("bytes per transfer", None, "bytes", "kv_transfer_bytes"),
        )
    )
    assert list(table.columns) == ["evidence", "value", "threshold", "taken (UTC)", "series"]
    assert table["value"].tolist() == ["100.0%", "7.25 /s", "1.07 s", "absent"]
    assert table["threshold"].tolist() == [">= 90.0%", "> 0.01 /s", "", ""]


def test_evidence_says_when_and_how_each_value_was_taken():
    """The same 'taken' column `kvscope diagnose` prints: a peak has its time, a mean its span."""
    table = evidence_table(
        _finding(
            Evidence("KV cache usage", 1.0, "ratio", "kv", at=T0 + 20, stat="max"),
            Evidence("mean TTFT", 1.07, "seconds", "ttft", stat="mean"),
            Evidence("bytes per transfer", None, "bytes", "kv_transfer_bytes"),
        )
    )
    assert table["taken (UTC)"].tolist() == ["peak at 22:13:40", "mean 22:13:20-22:14:20", ""]


def test_header_says_how_many_rules_could_not_be_evaluated():
    skipped = (Skipped("fleet_util_low", "signal(s) absent: gpu_utilization_ratio"),)
    d = Diagnosis(window=(T0, T0 + 60), source="s", likely_cause=None, skipped=skipped, rules_evaluated=45)
    assert counts_caption(d) == "45 rules, 0 fired, 1 not evaluable (every skipped rule and why: at the bottom)"
    off = (*skipped, Skipped("spec_decode_poor_acceptance", "mechanism off: speculative decoding is not configured"))
    d = Diagnosis(window=(T0, T0 + 60), source="s", likely_cause=None, skipped=off, rules_evaluated=45)
    assert counts_caption(d).startswith("45 rules, 0 fired, 1 not evaluable, 1 with the mechanism off")
    assert (
        counts_caption(Diagnosis(window=(T0, T0), source="s", likely_cause=None, rules_evaluated=3))
        == "3 rules, 0 fired, 0 not evaluable"
    )


def test_streamlit_runs_headless_on_loopback_without_the_developer_toolbar():
    cmd = UiServer(SourceSpec("recording", "/x.om"), 8599).command()
    flags = dict(zip(cmd[::1], cmd[1:], strict=False))
    assert flags["--server.address"] == "127.0.0.1" and flags["--server.port"] == "8599"
    assert flags["--client.toolbarMode"] == "minimal"  # no "Deploy" button on an on-call page
    assert flags["--browser.gatherUsageStats"] == "false"
    assert cmd[1:4] == ["-m", "kvscope.ui.launch", "run"]  # preloads the recording, then Streamlit's CLI


def test_a_preloaded_recording_is_handed_over_once(tmp_path):
    from kvscope.ui.data import start_preload, take_preloaded

    path = str(RECORDINGS / "kv-pressure-cascade.om.gz")
    start_preload(SourceSpec("recording", path, since_s=600))  # a recording is read whole: since_s does not apply
    data = take_preloaded(SourceSpec("recording", path))
    assert data is not None and data.diagnosis.likely_cause.rule_id == "kv_pressure_cascade"
    assert take_preloaded(SourceSpec("recording", path)) is None  # once; the page cache keeps it
    bad = tmp_path / "empty.om"
    bad.write_text("")
    start_preload(SourceSpec("recording", str(bad)))
    with pytest.raises(SourceError):  # the page shows it as st.error
        take_preloaded(SourceSpec("recording", str(bad)))


def test_a_live_preload_is_taken_only_while_young_and_for_the_same_window(monkeypatch):
    from kvscope.ui import data as ui_data

    read: list[SourceSpec] = []
    monkeypatch.setattr(ui_data, "load_triage", lambda source: read.append(source) or source)
    now = SourceSpec("prometheus", "http://127.0.0.1:9", since_s=3600)
    ui_data.start_preload(now)
    assert ui_data.take_preloaded(SourceSpec("prometheus", "http://127.0.0.1:9", since_s=600)) is None  # another window
    assert ui_data.take_preloaded(now) is now and read == [now]
    ui_data.start_preload(now)
    started, future = ui_data._PRELOADED[now]
    ui_data._PRELOADED[now] = (started - ui_data.LIVE_TTL_S - 1, future)
    assert ui_data.take_preloaded(now) is None  # a minute old: the page reads the window ending now
    fixed = SourceSpec("prometheus", "http://127.0.0.1:9", since_s=3600, end=started)
    ui_data.start_preload(fixed)
    assert ui_data.take_preloaded(fixed) is fixed  # a fixed window does not age


def test_a_live_preload_that_failed_raises_for_the_page():
    from kvscope.ui.data import start_preload, take_preloaded
    from kvscope.ui.server import free_port

    dead = SourceSpec("prometheus", f"http://127.0.0.1:{free_port()}", since_s=60)  # nothing listens there
    start_preload(dead)
    with pytest.raises(SourceError, match="could not be read"):
        take_preloaded(dead)


def test_a_truncated_gzip_recording_is_a_source_error_not_a_traceback(tmp_path):
    whole = (RECORDINGS / "kv-pressure-cascade.om.gz").read_bytes()
    cut = tmp_path / "cut.om.gz"
    cut.write_bytes(whole[: len(whole) // 3])
    with pytest.raises(SourceError, match="truncated or corrupt"):
        load_triage(SourceSpec("recording", str(cut)))


def test_window_text_names_the_span_totals_are_over():
    from kvscope.ui.data import window_text

    assert window_text(T0, T0 + 132) == "2023-11-14 22:13:20 → 22:15:32 UTC (2m12s)"
    assert window_text(T0, T0 + 86_400) == "2023-11-14 22:13:20 → 2023-11-15 22:13:20 UTC (24h00m)"


def test_a_card_says_the_date_a_finding_ends_on_after_midnight():
    """Regression: the card's When dropped the end's date, so a finding from 22:13 to 00:13 the
    next day read as ending before it began."""
    from kvscope.ui.data import when_text

    f = replace(_finding(), until=T0 + 7200, active=False)
    assert when_text(f) == "2023-11-14 22:13:20 → 2023-11-15 00:13:20 UTC (2h00m), ended"


def test_every_evidence_series_gets_its_chart_with_the_rules_unit():
    """Evidence that reads a histogram (TTFT mean, the symptom), a counter rate and a gauge: each
    gets a chart titled by the evidence name, in the rule's unit."""
    from kvscope.ui.data import evidence_charts

    data = load_triage(SourceSpec("recording", str(RECORDINGS / "kv-pressure-cascade.om.gz")))
    likely = data.diagnosis.likely_cause
    charts = {name: unit for name, unit, _ in evidence_charts(data, likely)}
    keyed = {e.name: e.unit for e in likely.evidence if e.value is not None}
    assert set(charts) == set(keyed) and len(charts) >= 3, (charts, keyed)
    assert "per second" in charts.values() and "ratio (0-1)" in charts.values()


def test_cascade_table_shows_how_far_it_went_and_whether_it_is_over():
    from kvscope.agent.derive.cascade import CascadeReport
    from kvscope.ui.data import cascade_rows

    over = CascadeReport("replica-0", stage=0, onsets={1: T0, 2: T0 + 2, 3: T0 + 6, 4: T0 + 12}, evicting_from="queues")
    rising = CascadeReport(
        "replica-1", stage=1, onsets={1: T0}, signals_missing=["gpu_utilization_ratio"], not_evaluable=["latency"]
    )
    rows = cascade_rows({"replica-1": rising, "replica-0": over}).set_index("instance")
    assert rows.loc["replica-0", "deepest stage reached"] == "4 latency"
    assert rows.loc["replica-0", "stage at end of window"] == "0 healthy"
    assert rows.loc["replica-0", "root led latency by"] == "12 s"
    assert rows.loc["replica-0", "onsets (UTC)"].startswith("kv_high 22:13:20 · evicting (from queues) 22:13:22")
    assert rows.loc["replica-1", "root led latency by"] == "not reached"
    assert rows.loc["replica-1", "signals missing"] == "gpu_utilization_ratio"
    assert rows.loc["replica-1", "stages not evaluable"] == "latency"
    assert rows.loc["replica-0", "stages not evaluable"] == "none"
    assert cascade_rows({}).empty


def test_short_windows_say_their_rule_durations_were_scaled_where_it_was_not_compared():
    """The fleet path does not judge twice (`scale_changes` None): the shortening is said alone."""
    from kvscope.diagnoser.render import scale_note

    d = Diagnosis(window=(T0, T0 + 132), source="s", likely_cause=None, time_scale=0.1467)
    assert scale_note(d) == (
        "This window is only 2m12s: shorter than the 15 minutes the rules are written for, so rule "
        "durations and ranges were shortened to 15% of their usual length (the series shown are the ranges used)."
    )
    assert scale_note(replace(d, scale_changes=())) == ""  # compared, and no verdict changed
    assert scale_note(Diagnosis(window=(T0, T0 + 3600), source="s", likely_cause=None)) == ""


def test_charts_are_in_utc_with_the_unit_and_the_finding_period_marked():
    import pandas as pd

    from kvscope.ui.charts import incident_label, render_series_chart

    df = pd.DataFrame({"value": [0.1, 0.9, 0.2]}, index=pd.to_datetime([T0, T0 + 30, T0 + 60], unit="s", utc=True))
    spec = render_series_chart(df, "ratio (0-1)", T0 + 10, T0 + 40).to_dict()
    band, lines = spec["layer"]
    assert band["mark"]["type"] == "rect" and lines["encoding"]["y"]["title"] == "ratio (0-1)"
    assert lines["encoding"]["x"]["scale"] == {"type": "utc"} and band["encoding"]["x"]["scale"] == {"type": "utc"}
    assert incident_label(T0 + 10, T0 + 40, active=False) == "22:13:30 → 22:14:00 UTC"
    assert "layer" not in render_series_chart(df, "ratio (0-1)").to_dict()
    fixed = render_series_chart(df, "ratio (0-1)", T0 + 10, T0 + 40, window=(T0 - 60, T0 + 120)).to_dict()
    assert fixed["layer"][1]["encoding"]["x"]["scale"]["domain"] == [(T0 - 60) * 1000, (T0 + 120) * 1000]


def test_a_fleet_wide_chart_shows_min_mean_max_over_every_series():
    import numpy as np
    import pandas as pd

    from kvscope.ui.data import spread

    index = pd.to_datetime([T0, T0 + 15], unit="s", utc=True)
    many = pd.DataFrame({f"gpu={i}": [i / 10, np.nan if i == 0 else 0.5] for i in range(10)}, index=index)
    out = spread(many)
    assert list(out.columns) == ["max of 10 series", "mean of 10 series", "min of 10 series"]
    assert out["mean of 10 series"].tolist() == pytest.approx([0.45, 0.5])
    assert out["max of 10 series"].iloc[0] == pytest.approx(0.9) and out["min of 10 series"].iloc[0] == 0.0
    few = many.iloc[:, :3]
    assert spread(few) is few


def test_a_fleet_finding_charts_the_fleet_value_the_rule_read():
    from kvscope.ui.data import evidence_charts

    data = load_triage(SourceSpec("recording", str(RECORDINGS / "fleet-dcgm-utilization-trap.om.gz")))
    likely = data.diagnosis.likely_cause
    assert likely.rule_id == "fleet_util_low" and likely.where == {}
    charts = {name: df for name, _, df in evidence_charts(data, likely)}
    shown = next(e for e in likely.evidence if e.name == "average GPU utilisation")
    line = charts["average GPU utilisation"]
    assert list(line.columns) == ["value"]  # one fleet-wide series, as the rule grouped it
    period = slice(pd.to_datetime(likely.since, unit="s", utc=True), pd.to_datetime(likely.until, unit="s", utc=True))
    assert line.loc[period].iloc[:, 0].mean() == pytest.approx(shown.value, rel=1e-6)


@pytest.mark.parametrize(
    "recording",
    ["noisy-tenant-long-prompts", "kv-pressure-cascade", "round-robin-vs-sticky", "replica-restart-cold-cache"],
)
def test_the_evidence_numbers_can_be_read_off_the_charts(recording):
    """Real vLLM recordings: each chart is the series the rule evaluated, so over the finding's
    period its max / min / mean / first / last is the evidence value, for every evidence item."""
    from kvscope.ui.data import evidence_charts

    data = load_triage(SourceSpec("recording", str(RECORDINGS / f"{recording}.om.gz")))
    checked = 0
    for f in data.diagnosis.findings:
        charts = {name: df for name, _, df in evidence_charts(data, f)}
        period = slice(pd.to_datetime(f.since, unit="s", utc=True), pd.to_datetime(f.until, unit="s", utc=True))
        for ev in f.evidence:
            if ev.value is None or ev.name not in charts:
                continue
            line = charts[ev.name].loc[period].iloc[:, 0].dropna()
            read = {
                "max": line.max,
                "min": line.min,
                "mean": line.mean,
                "first": lambda s=line: s.iloc[0],
                "last": lambda s=line: s.iloc[-1],
            }[ev.stat or "last"]()
            assert read == pytest.approx(ev.value, rel=1e-5, abs=1e-6), (f.rule_id, ev.name, ev.stat)
            checked += 1
    assert checked >= 3


def test_the_ui_diagnoses_a_recording_exactly_as_kvscope_diagnose_does(capsys):
    """Same step, same failed-scrape / vanished / removed-target marking, same findings: the UI
    reads a recording through RecordingSource as the CLI does (a router drain removes a replica)."""
    import json

    from kvscope.cli import main

    rec = RECORDINGS / "router-drain-restart-rejoin.om.gz"
    main(["diagnose", "--recording", str(rec), "--json"])
    cli = json.loads(capsys.readouterr().out)
    assert cli["likely_cause"] or cli["other"]  # it finds something to agree on
    assert json.loads(load_triage(SourceSpec("recording", str(rec))).diagnosis.to_json()) == cli


@pytest.mark.parametrize(
    ("recording", "narrows"),
    [
        ("fleet-8-replicas-round-robin", True),
        ("blind-sglang-hot-prefix-replica", True),
        ("blind-vllm-replica-flapping", True),
        ("fleet-scale-out-hash-mod", False),
        ("fleet-pd-kv-transfer-rising", False),
        ("round-robin-vs-sticky", False),
    ],
)
def test_a_findings_charts_read_its_places_rows_with_the_whole_frames_values(recording, narrows, monkeypatch):
    """The charts evaluate the rule over the rows the finding's place reads (`place_frame`), not
    the fleet's: the same series as over the whole frame (to rounding: sums over fewer rows), on
    fewer rows wherever the rule keeps a label of the place (`narrows`: some finding of the
    recording does; the others' findings are fleet-wide or the fleet is one replica)."""
    from kvscope.diagnoser.pushdown import evidence
    from kvscope.diagnoser.rulebook.rule import shipped_rules
    from kvscope.ui.data import evidence_charts

    data = load_triage(SourceSpec("recording", str(RECORDINGS / f"{recording}.om.gz")))
    fewer = 0
    for f in data.diagnosis.findings:
        placed = evidence_charts(data, f)
        rule = shipped_rules()[f.rule_id]
        rows = sum(len(b.labels) for b in evidence.place_frame(rule, data.frame, f.where).blocks.values())
        fewer += rows < sum(len(b.labels) for b in data.frame.blocks.values())
        with monkeypatch.context() as m:
            m.setattr(evidence, "place_frame", lambda rule, frame, where: frame)
            whole = evidence_charts(data, f)
        assert [(n, u, list(df.columns)) for n, u, df in placed] == [(n, u, list(df.columns)) for n, u, df in whole]
        for (name, _, a), (_, _, b) in zip(placed, whole, strict=True):
            assert a.index.equals(b.index)
            np.testing.assert_allclose(a.to_numpy(), b.to_numpy(), rtol=1e-9, atol=1e-12, err_msg=f"{f.rule_id} {name}")
    assert bool(fewer) == narrows, f"{fewer} finding(s) read fewer rows than the whole frame"
