"""Weekly report rendering: where fleet-wide findings are, and how HTML table cells align."""

from __future__ import annotations

import re
from dataclasses import replace

from kvscope.diagnoser.findings import Finding
from kvscope.diagnoser.report import build_report, series_set_from_samples
from kvscope.diagnoser.report_render import finding_where, is_numeric_cell, render_html, render_markdown

from tests.unit.test_report import END, _fleet


def _finding(where: dict[str, str]) -> Finding:
    return Finding(rule_id="fleet_util_low", levers_md="U1", title="Fleet GPU utilisation is low",
                   severity="warning", where=where, since=END - 3600, until=END, active=True,
                   window=(END - 7200, END), step_s=900.0, score=1.0, summary="s")


def test_a_fleet_wide_finding_says_fleet_and_a_placed_one_its_labels():
    assert finding_where({}) == "fleet"
    assert finding_where({"model": "m1", "instance": "a"}) == "instance=a, model=m1"
    report = replace(build_report(series_set_from_samples(_fleet()), END, 2.0, "test"),
                     findings=[_finding({}), _finding({"model": "m1"})])
    md = render_markdown(report)
    rows = [line for line in md.splitlines() if "fleet_util_low" in line]
    assert "| fleet |" in rows[0] and "| model=m1 |" in rows[1]


def test_html_right_aligns_numbers_only():
    for text in ("1,234", "12.5%", "$3.10", "+4.0%", "absent", "n/a", "0.5"):
        assert is_numeric_cell(text), text
    for text in ("warning", "Fleet GPU utilisation is low (fleet_util_low)", "model=m1", "2026-11-22 07:00 UTC",
                 "k8s.colocation, k8s.replicas", "fleet"):
        assert not is_numeric_cell(text), text
    report = replace(build_report(series_set_from_samples(_fleet()), END, 2.0, "test"), findings=[_finding({})])
    page = render_html(report)
    assert "td.num{text-align:right}" in page and "text-align:left" in page
    assert re.search(r'<td class="num">[\d,]+</td>', page)
    assert "<td>fleet</td>" in page and "<td>warning</td>" in page
