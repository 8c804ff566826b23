"""`kvscope report weekly` on a real vLLM recording with real config changes (issue 36): the section
"What changed this week and its effect at matched load" lists the changes `kvscope curve --json`
finds in the same recording, with the same kinds, diffs and verdicts, and deltas that agree with
the curve's within the report's reading (its grid holds only the sample taken in the step before
each point, never one carried on: an interval whose scrape jittered past a grid point is left
out, so a bucket may hold an interval fewer). Expected verdicts: the YAML's `expected_curve`,
written before kvscope read the recording."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest
import yaml

from kvscope.cli import main
from kvscope.diagnoser.curve.changes import Change
from kvscope.diagnoser.curve.report import JudgedChange
from kvscope.diagnoser.sources.recording import RecordingSource
from kvscope.diagnoser.sources.samples import SamplesSource
from kvscope.report.render import CHANGES_TITLE, render_html, render_markdown
from kvscope.report.weekly import WeekChange, WeekChanges, build_report, report_window

HERE = Path(__file__).resolve().parent
NAME = "curve-vllm-config-changes"
PATH = HERE / f"{NAME}.om.gz"


def _section(markdown: str) -> list[str]:
    lines = markdown.splitlines()
    start = lines.index(f"## {CHANGES_TITLE}")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    return [ln for ln in lines[start + 1 : end] if ln.strip()]


def test_the_weekly_report_says_what_changed_as_kvscope_curve_does(tmp_path, capsys):
    main(["curve", "--recording", str(PATH), "--json"])
    (pool,) = json.loads(capsys.readouterr().out)["pools"]
    curve = pool["changes"]
    md, page = tmp_path / "week.md", tmp_path / "week.html"
    assert main(["report", "weekly", "--recording", str(PATH), "--markdown", str(md), "--html", str(page)]) == 0

    # the report's changes, read as the command reads them (report_window over the replayed samples)
    replay = RecordingSource(PATH, spans=False).replay()
    report = build_report(report_window(SamplesSource(replay.samples, carry=False)), replay.end, 2.5, "r")
    assert report.changes is not None and len(report.changes.changes) == len(curve)
    step = 2.0  # the recording's scrape interval
    for got, want in zip(report.changes.changes, curve, strict=True):
        j = got.judged
        assert (j.change.kind, j.change.diff, j.change.instances) == (want["kind"], want["diff"], want["instances"])
        assert abs(j.change.time - want["time"]) <= step
        assert j.verdict == want["verdict"]
        assert set(j.deltas) == set(want["deltas"])
        for metric, d in j.deltas.items():
            for side in ("before", "after"):
                assert d[side] == pytest.approx(want["deltas"][metric][side], rel=0.05), (metric, side)
    # the verdicts written before the recording was read (the third, a restart with the same flags on a
    # shared box, is the curve test's documented miss, not this report's concern)
    expected = yaml.safe_load((HERE / f"{NAME}.yaml").read_text())["expected_curve"]["changes"]
    assert [c.judged.verdict for c in report.changes.changes][:2] == [c["verdict"] for c in expected][:2]

    rows = _section(md.read_text())
    assert len(rows) == 2 + len(curve)  # header, rule, one row per change
    assert "Verdict" in rows[0] and "TTFT p99" in rows[0]
    assert "config: kv_capacity_tokens 8192 → 640" in rows[2] and "regression: worse at matched load" in rows[2]
    assert "config: kv_capacity_tokens 640 → 8192" in rows[3] and "improvement: better at matched load" in rows[3]
    for row, c in zip(rows[2:], report.changes.changes, strict=True):
        ttft = c.judged.deltas["ttft_p99_s"]
        assert f"{ttft['before']:.3g} → {ttft['after']:.3g} s ({ttft['relative']:+.0%})" in row
    body = page.read_text()
    assert f"<h2>{html.escape(CHANGES_TITLE)}</h2>" in body
    assert html.escape("kv_capacity_tokens 8192 → 640") in body


def _judged(verdict: str, deltas: dict) -> WeekChange:
    change = Change(1795600400.0, "config", {"kv_capacity_tokens": [8192.0, 640.0]}, ["replica-0"])
    return WeekChange({"model": "m", "engine": "vllm"}, JudgedChange(change, verdict, deltas, [], [], []))


def test_not_comparable_is_said_as_such_and_no_curve_is_not_no_change():
    replay = RecordingSource(PATH, spans=False).replay()
    report = build_report(report_window(SamplesSource(replay.samples, carry=False)), replay.end, 2.5, "r")
    report.changes = WeekChanges([_judged("not_comparable", {})], 2.0, 169)
    (row,) = _section(render_markdown(report))[2:]
    assert "not comparable: no verdict (the load before and after did not overlap" in row
    assert "regression" not in row and "| - | - | - | - |" in row
    report.changes = None
    assert _section(render_markdown(report)) == [
        "Not measured: no engine in this source reports requests running (the operating curve's concurrency), "
        "so changes cannot be judged at matched load."
    ]
    report.changes = WeekChanges([], 900.0, 1)
    assert (
        "No config, version, restart or replica-count change this week, and no shift of the curve "
        "(read from 1 scrape interval on a 15m00s grid)" in render_html(report)
    )
