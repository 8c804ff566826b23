"""The curve's change verdicts on real vLLM under the load shapes production has (issue 55).

Each `curve-shape-*` recording (testbed/curve_record.py) is one engine through four phases that
replay the same load shape (the same seeds), restarted on the same port between them: roomy ->
roomy (same flags) -> tiny KV (`--num-gpu-blocks-override 20`) -> roomy. The expected verdicts
(`expected_curve`) were written into the YAML before kvscope read the recording, with the
engine's own truths per phase and per segment. Here, at the recordings' native 2 s scrapes, the
cells of bench/curve_robustness.py (which also resamples to 15 and 30 s; docs/curve.md "Robustness
bench"): no change verdict may be wrong, and the first phase alone judges nothing an engine change.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from kvscope.diagnoser.curve.compare import Thresholds
from kvscope.diagnoser.sources.recording import RecordingSource

HERE = Path(__file__).resolve().parent
SHAPES = sorted(p.stem for p in HERE.glob("curve-shape-*.yaml"))
PHASES = ["roomy", "same-restart", "tiny-kv", "roomy-again"]
CELLS = ["same-restart", "regression", "improvement", "control"]
TRUTHS = (
    "requests",
    "engine_requests",
    "engine_ttft_p50_s",
    "engine_ttft_p99_s",
    "engine_in_flight_mean",
    "engine_running_mean",
    "engine_waiting_mean",
    "host_cpu_busy_pct_mean",
)


WRONG_AT_2S = {  # cells the current code gets wrong: the reason names what goes wrong
    ("curve-shape-poisson-bursts", "control"): "the first phase alone (one engine, no restart) reads a `curve` "
    "shift judged improvement: ITL p99 0.024 -> 0.010 s between its halves over one matched bucket (0.7 in "
    "flight), where the engine did not change; the shared box's CPU busy share moved 100 % -> 95 % between the "
    "halves (the YAML's host_cpu_busy_pct_mean per segment), the noisy neighbour of docs/curve.md",
    ("curve-shape-ramp", "improvement"): "no_change where the engine's own TTFT p99 fell 76 % (-0.17 s) at the "
    "same streams: the tiny-KV side's slow buckets (4-9 in flight at 12-16 streams) have no match on the roomy "
    "side, which serves the same streams with 0.2-3 in flight; over the 3 matched buckets (1.1, 2.1, 4.3 in "
    "flight) TTFT p99's fall has the interval [-0.147, -0.060] s, not wholly past 0.1 s, and tokens/s' relative "
    "interval [+8 %, +77 %] not wholly past 10 %",
    ("curve-shape-stairs-60", "improvement"): "no_change where the engine's own TTFT p99 fell 45 % (-0.10 s) at the "
    "same streams: over the 3 matched buckets (1.0, 1.9, 8.7 in flight) TTFT p99's fall has the interval "
    "[-0.123, -0.009] s and tokens/s' relative interval [+5 %, +34 %], neither wholly past its threshold",
    ("curve-shape-stairs-60", "control"): "the first phase alone (one engine, no restart) reads a `curve` shift "
    "judged improvement: output tokens/s +77 % (interval +51..+122 %) over one matched bucket at 1.3 in flight "
    "between the phase's halves, which carry different stairs (1 and 4 streams, then 4 and 16); the host CPU "
    "stayed at 100 % busy",
    ("curve-shape-poisson-heavy", "regression"): "no_change where the engine's own TTFT p99 rose 334 % (+0.36 s; "
    "2.37 s in the tiny-KV side's first 32/s burst, 9 waiting): the bursts' buckets (4-10 in flight, 10 s each) "
    "are sparse, and the one matched bucket (0.57 in flight, the 8/s base) shows TTFT p99 0.068 -> 0.034 s",
}


def _bench():
    path = HERE.parents[1] / "bench" / "curve_robustness.py"
    spec = importlib.util.spec_from_file_location("curve_robustness", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench = _bench()


def _meta(name: str) -> dict:
    return yaml.safe_load((HERE / f"{name}.yaml").read_text())


def _flag(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


@cache
def _cells(name: str) -> dict:
    meta = _meta(name)
    cells = bench.change_cells(name, meta, RecordingSource(HERE / f"{name}.om.gz"), 2.0, Thresholds())
    return {c.change: c for c in cells}


@pytest.mark.parametrize("name", SHAPES)
def test_shape_provenance(name):
    """Four phases with the flags the scenario says, each with the truths the recorder computed
    (the engine's histogram, the poller's means, the host's CPU) for it and for every segment,
    the same load in every phase (or, where the restarts cut a ramp, some load on both sides)."""
    meta = _meta(name)
    phases = meta["phases"]
    assert [p["name"] for p in phases] == PHASES
    blocks = [_flag(p["flags"], "--num-gpu-blocks-override") for p in phases]
    assert blocks == ["256", "256", "20", "256"]
    assert phases[0]["flags"] == phases[1]["flags"] == phases[3]["flags"]
    assert [c["after_phase"] for c in meta["expected_curve"]["changes"]] == PHASES[1:]
    assert [c["verdict"] for c in meta["expected_curve"]["changes"]] == ["no_change", "regression", "improvement"]
    assert meta["expected_curve"]["control"]["phase"] == "roomy"
    loads = []
    for p in phases:
        assert p["errors"] == 0 and p["requests"] > 0, p["name"]
        assert p["segments"], p["name"]
        for seg in [p, *p["segments"]]:
            assert all(seg.get(k) is not None for k in TRUTHS), (p["name"], seg.get("name"))
            assert p["start_s"] <= seg["start_s"] < seg["end_s"] <= p["end_s"]
        loads.append({bench.load_key(s) for s in p["segments"]})
    for a, b in zip(loads, loads[1:], strict=False):
        assert len(a & b) >= 2, (a, b)


@pytest.mark.parametrize(
    ("name", "cell"),
    [
        pytest.param(n, c, marks=pytest.mark.xfail(strict=True, reason=WRONG_AT_2S[n, c]))
        if (n, c) in WRONG_AT_2S
        else (n, c)
        for n in SHAPES
        for c in CELLS
    ],
)
def test_no_wrong_verdict_at_the_native_scrape(name, cell):
    """right, abstained (not_comparable) or unheld (the engine's own truth moved where a restart
    with the same flags should have changed nothing, and kvscope read the engine): never wrong."""
    c = _cells(name)[cell]
    assert c.outcome != "wrong", c
