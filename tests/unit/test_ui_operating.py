"""The Operating point page's logic (ui/operating.py) and charts on synthetic curves (the curve's own
synthetic pools from test_curve.py), and the page in Streamlit's AppTest on a real vLLM recording.

The browser test on real recordings against `kvscope curve --json`: tests/e2e/test_operating_point_browser.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvscope.diagnoser.curve.operating import DEFAULT_SLO_TTFT_P99_S
from kvscope.diagnoser.curve.report import c_max_text, headroom_text, knee_text, pool_curves, pool_name, to_json
from kvscope.ui import data as ui_data
from kvscope.ui.charts import render_change_chart, render_curve_chart
from kvscope.ui.operating import at_slo, change_view, curve_rows, measured_sizing
from tests.unit.test_curve import STAIRS, _two_phases, hump, synth

APP = str(Path(ui_data.__file__).with_name("app.py"))
CONFIG_CHANGES = Path(__file__).resolve().parents[1] / "recordings" / "curve-vllm-config-changes.om.gz"


@pytest.fixture(scope="module")
def stairs():
    (pc,) = pool_curves(synth(STAIRS))
    return pc


def test_statements_read_the_curves_own_knee_c_max_and_headroom(stairs):
    op = stairs.operating
    assert op.knee_concurrency is not None and op.c_max is not None  # the staircase has both
    assert knee_text(op) == f"Knee: at {op.knee_concurrency:g} requests in the engine per instance " + (
        f"(placed by {op.knee_sign}; signs: {', '.join(op.knee_signs)})."
    )
    assert f"C_max at TTFT p99 ≤ 1 s: {op.c_max:g} ({op.c_max_note})" in c_max_text(op, 1.0)
    words = headroom_text(op)
    assert f"The window's peak is {op.peak_concurrency:g}" in words
    # the staircase's peak (16) is past both the knee and C_max: no headroom, said as such
    assert op.headroom_to_knee < 1 and f"past the knee ({op.knee_concurrency:g})" in words
    assert f"past C_max ({op.c_max:g})" in words and "no headroom" in words


def test_headroom_below_the_knee_is_said_as_headroom(stairs):
    op = stairs.operating
    from dataclasses import replace

    roomy = replace(op, peak_concurrency=2.0, headroom_to_knee=op.knee_concurrency / 2.0, c_max=None)
    words = headroom_text(roomy)
    assert f"below the knee ({op.knee_concurrency:g}): {op.knee_concurrency / 2.0:g}x headroom" in words
    assert "Against C_max: none measured" in words


def test_a_curve_without_knee_or_c_max_says_why_and_invents_nothing():
    (pc,) = pool_curves(synth([c for c in (1, 2, 3) for _ in range(8)], tail=lambda c, i=0: 1))
    op = pc.operating
    assert op.knee_concurrency is None and op.c_max is None
    assert knee_text(op).startswith("Knee: none in the measured range")
    assert c_max_text(op, 1.0) == f"C_max at TTFT p99 ≤ 1 s: none ({op.c_max_note})."
    assert "stays under the SLO" in op.c_max_note


def test_another_slo_is_the_cli_s_c_max_at_that_slo():
    frame = synth(STAIRS)
    (pc,) = pool_curves(frame)
    assert at_slo(pc, DEFAULT_SLO_TTFT_P99_S) is pc.operating
    for slo in (0.5, 2.0, 3.0):
        (cli,) = to_json(pool_curves(frame, slo_s=slo), slo)["pools"]  # what `kvscope curve --slo-ttft-p99` prints
        op = at_slo(pc, slo)
        assert (op.c_max, op.usable_rps, op.c_max_note) == (
            cli["c_max"],
            cli["usable_rps"],
            cli["operating"]["c_max_note"],
        )


def test_sparse_buckets_are_points_never_lines(stairs):
    rows = curve_rows(stairs.points)
    sparse = [p for p in stairs.points if p.sparse]
    assert sparse, "the staircase's between-levels bucket is sparse"
    assert set(rows[rows["data"] == "sparse (not used)"]["concurrency"]) == {p.concurrency for p in sparse}
    assert len(rows) == 2 * len(stairs.points)  # p50 and p99 per bucket, as measured
    spec = render_curve_chart(rows, 1.0, 4.2, 5.0, 16.0).to_dict()
    layers = spec["layer"]
    line = next(layer for layer in layers if layer["mark"] == "line" or layer["mark"].get("type") == "line")
    drawn = spec["datasets"][line["data"]["name"]]
    assert all(r["data"] == "enough data" for r in drawn), "a line through a sparse bucket smooths it"
    text = json.dumps(spec, ensure_ascii=False)
    for mark in ("knee 4.2", "C_max 5", "window peak 16", "SLO: TTFT p99 ≤ 1 s"):
        assert mark in text


def test_a_missing_ttft_is_absent_not_zero(stairs):
    from dataclasses import replace

    points = [replace(p, ttft_p99_s=None, ttft_p99_ci=None) for p in stairs.points]
    rows = curve_rows(points)
    assert set(rows["statistic"]) == {"TTFT p50"} and (rows["seconds"] > 0).all()


def test_a_change_shows_its_verdict_deltas_and_both_curves():
    (pc,) = pool_curves(_two_phases(lambda c: 5, 200.0), settle_s=0.0)
    (j,) = pc.changes
    view = change_view(j)
    assert view.verdict == "regression" and view.heading.endswith("— regression")
    assert (
        view.heading.startswith("config change at 1970-01-01 00:30:40 UTC on a:")
        and "kv_capacity_tokens 1000 -> 200" in view.heading
    )
    assert set(view.rows["side"]) == {"before", "after"}
    assert len(view.rows[view.rows["side"] == "before"]) == 2 * len(j.before)
    row = view.deltas.set_index("metric").loc["TTFT p99"]
    assert row["relative"] == f"{100 * j.deltas['ttft_p99_s']['relative']:+.0f}%"
    spec = json.dumps(render_change_chart(view.rows, view.verdict, j.matched_concurrency).to_dict())
    assert "compared here" in spec and "#d62728" in spec  # the matched buckets, the regression's colour
    # the before/after points stay out of the JSON `kvscope curve --json` prints
    assert "before" not in to_json([pc], 1.0)["pools"][0]["changes"][0]


def test_not_comparable_is_said_as_no_verdict():
    (pc,) = pool_curves(_two_phases(hump, 200.0, conc_after=[40.0] * 20), settle_s=0.0)
    view = change_view(pc.changes[0])
    assert view.verdict == "not_comparable" and "no verdict" in view.verdict_words and view.deltas.empty
    # and what would decide it, in the words `kvscope curve` prints (change_notes)
    assert view.notes.startswith("to decide it:") and "more intervals" in view.notes, view.notes


def test_measured_sizing_says_where_the_numbers_come_from(stairs):
    found = measured_sizing(stairs, 1.0, "recording: x.om")
    op = stairs.operating
    assert (found.c_max, found.usable_rps) == (op.c_max, op.usable_rps)
    assert pool_name(stairs) in found.provenance and "recording: x.om" in found.provenance
    assert "override" in found.provenance
    none = measured_sizing(stairs, 100.0, "recording: x.om")  # p99 never reaches a 100 s SLO
    assert none.c_max is None and "typed values used" in none.provenance


def _app(monkeypatch, recording: Path) -> AppTest:
    for var in ui_data.ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(ui_data.ENV["recording"], str(recording))
    monkeypatch.delenv(ui_data.ENV_OBJECTIVES, raising=False)
    return AppTest.from_file(APP, default_timeout=300)  # a hang guard only (slow on a loaded 2-core box)


def test_operating_and_sizing_pages_on_a_real_vllm_recording(monkeypatch):
    """The real vLLM config-change recording: the page shows the pool, the statements and every
    change's verdict; the sizing page takes C_max and usable RPS from the curve at the chosen SLO."""
    at = _app(monkeypatch, CONFIG_CHANGES).run()
    at.sidebar.radio[0].set_value("Operating point").run()
    assert not at.exception
    (pc,) = ui_data.load_triage(ui_data.SourceSpec("recording", str(CONFIG_CHANGES))).curves
    assert at.header[0].value == f"Pool {pool_name(pc)}"
    text = " ".join(m.value for m in at.markdown)
    assert knee_text(pc.operating) in text and c_max_text(pc.operating, 1.0) in text
    boxes = " ".join(b.value for b in [*at.error, *at.success, *at.info, *at.warning])
    for j in pc.changes:
        assert change_view(j).heading in boxes
    assert len(at.get("vega_lite_chart")) == 1 + len(pc.changes)
    at.number_input(key="curve_slo").set_value(3.5).run()
    assert c_max_text(at_slo(pc, 3.5), 3.5) in " ".join(m.value for m in at.markdown)

    at.sidebar.radio[0].set_value("Sizing calculator").run()
    assert not at.exception
    assert any("typed values used" in i.value for i in at.info)  # no C_max at 1 s on this recording
    at.number_input(key="sizing_slo").set_value(3.5).run()
    found = measured_sizing(pc, 3.5, "")
    key = f"{pool_name(pc)}@3.5"
    assert at.number_input(key=f"c_max{key}").value == pytest.approx(found.c_max)
    assert at.number_input(key=f"usable{key}").value == pytest.approx(found.usable_rps)
    assert any(f"C_max {found.c_max:g} and usable RPS" in i.value for i in at.info)
    at.number_input(key=f"c_max{key}").set_value(3.0).run()
    assert any("Overridden: typed C_max 3" in c.value for c in at.caption)


def test_the_pages_judge_c_max_and_goodput_at_kvscope_ui_s_objectives(monkeypatch, tmp_path):
    """`kvscope ui --objectives FILE --slo-*`: the Operating point and Sizing pages judge each
    pool's C_max at its own objectives (here its TTFT and the fleet's e2e, which these engines
    measure), the TTFT input an override; the Efficiency page's goodput is judged against them."""
    from kvscope.cli import build_parser, main
    from kvscope.commands.ui import objectives_spec
    from kvscope.core.objectives import Objectives
    from kvscope.ui.server import UiServer

    conf = tmp_path / "agent.yaml"
    conf.write_text("objectives:\n  e2e: 6s\n  pools: {tiny-llama: {ttft: 3.5s}}\n")
    args = build_parser().parse_args(["ui", "--recording", str(CONFIG_CHANGES), "--objectives", str(conf)])
    at = _app(monkeypatch, CONFIG_CHANGES)
    spec = UiServer(None, objectives=objectives_spec(args)).environment()[ui_data.ENV_OBJECTIVES]  # what it passes
    monkeypatch.setenv(ui_data.ENV_OBJECTIVES, spec)
    at.run()
    at.sidebar.radio[0].set_value("Operating point").run()
    assert not at.exception
    (pc,) = ui_data.load_triage(ui_data.SourceSpec("recording", str(CONFIG_CHANGES))).curves
    own = Objectives(ttft=3.5, e2e=6.0)
    op = at_slo(pc, 3.5, own)
    assert op.c_max is not None and op.c_max < at_slo(pc, 3.5).c_max  # e2e crosses 6 s before TTFT crosses 3.5 s
    assert at.number_input(key="curve_slo").value == 1.0  # the fleet's TTFT; the pool has its own
    text = " ".join(m.value for m in at.markdown)
    assert c_max_text(op, 3.5) in text and "E2E" in op.c_max_note
    at.number_input(key="curve_slo").set_value(4.0).run()  # the input overrides every pool's TTFT
    assert c_max_text(at_slo(pc, 4.0, Objectives(ttft=4.0, e2e=6.0)), 4.0) in " ".join(m.value for m in at.markdown)

    at.sidebar.radio[0].set_value("Sizing calculator").run()
    assert not at.exception
    found = measured_sizing(pc, 3.5, "", own)
    assert found.c_max == op.c_max
    assert at.number_input(key=f"c_max{pool_name(pc)}@1").value == pytest.approx(found.c_max)
    assert any("E2E p99 ≤ 6 s" in i.value for i in at.info)

    at.sidebar.radio[0].set_value("Efficiency").run()
    assert not at.exception
    assert "Goodput (TTFT <= 1s, E2E <= 6s for 0.99 of requests)" in at.dataframe[0].value.columns
    assert main(["ui", "--recording", str(CONFIG_CHANGES), "--objectives", str(conf), "--slo-e2e", "0"]) == 3


def test_a_live_source_that_cannot_be_read_says_so():
    """Prometheus' curves are read through the reader `kvscope curve --prometheus` uses (its
    recording-vs-real-Prometheus equality: tests/integration/test_diagnose_sources.py), and an
    agent's with its diagnosis; a source that does not answer is a readable error, not an empty page."""
    from kvscope.ui.server import free_port

    with pytest.raises(ui_data.SourceError, match="could not be read for the curve"):
        ui_data.live_curves(ui_data.SourceSpec("prometheus", f"http://127.0.0.1:{free_port()}", 600.0))
    with pytest.raises(ui_data.SourceError, match="could not be read"):
        ui_data.load_triage(ui_data.SourceSpec("agent", f"http://127.0.0.1:{free_port()}", 600.0))
