"""kvscope against a real VictoriaMetrics (Debian `victoria-metrics` 1.79): the diagnoser's two
Prometheus paths, the weekly report and the generated rules.

A real vLLM recording is imported through VictoriaMetrics' Prometheus import API; then
* the full fetch gives the same frame and diagnosis as the recording itself;
* the fleet path gives the full fetch's diagnosis, without candidate records and with them replayed
  by `vmalert -replay` (rule conditions as MetricsQL here);
* every expression `kvscope rules build` generates (recording rules, alerts) is accepted and
  evaluated by VictoriaMetrics;
* `report weekly` reads the engines' own series from it and counts the recording's tokens.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from kvscope.diagnoser.evaluate.evaluator import diagnose, sample_names
from kvscope.diagnoser.pushdown.candidates import describe
from kvscope.diagnoser.pushdown.run import diagnose_fleet
from kvscope.diagnoser.rulebook.rule import read_rules
from kvscope.diagnoser.sources.promapi import PromClient
from kvscope.diagnoser.sources.prometheus import fetch_frame
from kvscope.diagnoser.sources.recording import RecordingSource
from testbed.diagnoses import assert_same_diagnosis
from testbed.victoria import import_prometheus_text, replay_rules, running_victoria

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "recordings" / "kv-pressure-cascade.om.gz"
pytestmark = [pytest.mark.needs("victoria-metrics"), pytest.mark.servers]


@pytest.fixture(scope="module")
def victoria(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vm")
    # kvscope-candidates.yml's longest expression is 44 kB, over the default 16 kB (docs/fleet.md)
    with running_victoria(tmp / "data", "-search.maxQueryLen=131072", log_path=tmp / "vm.log") as vm:
        assert import_prometheus_text(vm.url, RECORDING) > 10_000
        yield vm.url


def _window():
    source = RecordingSource(RECORDING, spans=False)
    replay = source.replay()
    return source, float(math.ceil(replay.start)), float(math.floor(replay.end)), source.natural_step()


def test_full_fetch_and_pushdown_from_victoria_match_the_recording(victoria):
    source, start, end, step = _window()
    rules = read_rules()
    names = set().union(*(sample_names(r) for r in rules))
    rec = source.read_frame(names, start, end, step)
    vm = fetch_frame(PromClient(victoria), names, start, end, step)
    assert set(rec.blocks) == set(vm.blocks) and "request_ttft_seconds_bucket" in vm.blocks
    for name, block in rec.blocks.items():
        other = vm.blocks[name]
        ia = np.argsort([str(x) for x in block.labels])
        ib = np.argsort([str(x) for x in other.labels])
        assert [block.labels[i] for i in ia] == [other.labels[i] for i in ib], name
        np.testing.assert_allclose(block.values[ia], other.values[ib], rtol=1e-9, equal_nan=True, err_msg=name)
    full = diagnose(vm, rules, source="vm")
    assert full.to_json() == diagnose(rec, rules, source="vm").to_json()
    assert full.likely_cause is not None and full.likely_cause.rule_id == "kv_pressure_cascade"
    pushed, report = diagnose_fleet(PromClient(victoria), start, end, step, rules, source="vm")
    assert_same_diagnosis(pushed, full)
    assert not [r for r, h in report.hits.items() if "refused" in h.why], "VictoriaMetrics refused the candidates"
    assert PromClient(victoria).flavor() == "victoriametrics"  # off-lattice queries are sent nocache=1


@pytest.fixture(scope="module")
def cached_victoria(tmp_path_factory):
    """VictoriaMetrics as it ships: its rollup cache on."""
    tmp = tmp_path_factory.mktemp("vm-cache")
    with running_victoria(tmp / "data", log_path=tmp / "vm.log", cache=True) as vm:
        assert import_prometheus_text(vm.url, RECORDING) > 10_000
        yield vm.url


@pytest.mark.parametrize("shift_s", [0.0, 1.0])
def test_victoria_with_its_rollup_cache_answers_at_the_times_asked(cached_victoria, shift_s):
    """With its cache on, VictoriaMetrics moves the start of a range query of 50 steps or more to a
    multiple of the step (the recording's window is 66 steps of 2 s). Shifted by 1 s, the window
    starts between multiples: the client's queries must still be answered at the grid's times
    (full fetch equal to the recording's frame), and the fleet path gives the full fetch's diagnosis."""
    source, start, end, step = _window()
    start += shift_s
    rules = read_rules()
    names = set().union(*(sample_names(r) for r in rules))
    rec = source.read_frame(names, start, end, step)
    vm = fetch_frame(PromClient(cached_victoria), names, start, end, step)
    for name, block in rec.blocks.items():
        other = vm.blocks[name]
        ia = np.argsort([str(x) for x in block.labels])
        ib = np.argsort([str(x) for x in other.labels])
        np.testing.assert_allclose(block.values[ia], other.values[ib], rtol=1e-9, equal_nan=True, err_msg=name)
    full = diagnose(vm, rules, source="vm")
    assert full.to_json() == diagnose(rec, rules, source="vm").to_json()
    pushed, _ = diagnose_fleet(PromClient(cached_victoria), start, end, step, rules, source="vm")
    assert_same_diagnosis(pushed, full)


def test_candidates_replayed_by_vmalert_are_read_by_the_fleet_path(tmp_path):
    """`vmalert -replay` of kvscope-candidates.yml (the documented backfill for VictoriaMetrics):
    every candidate expression evaluates as MetricsQL, the records cover the window (no rule is
    sent to the full fetch for want of them), and the Diagnosis is the full fetch's."""
    source, start, end, step = _window()
    rules = read_rules()
    with running_victoria(tmp_path / "data", "-search.maxQueryLen=131072", log_path=tmp_path / "vm.log") as vm:
        assert import_prometheus_text(vm.url, RECORDING) > 10_000
        replay_rules(
            vm.url, ROOT / "rules" / "prometheus" / "kvscope-candidates.yml", start - 60, end, tmp_path / "r.log"
        )
        frame = fetch_frame(PromClient(vm.url), set().union(*(sample_names(r) for r in rules)), start, end, step)
        full = diagnose(frame, rules, source="vm", time_scale=1.0)
        pushed, report = diagnose_fleet(PromClient(vm.url), start, end, step, rules, source="vm", time_scale=1.0)
    assert not describe(report.hits), describe(report.hits)
    assert_same_diagnosis(pushed, full)


def test_every_generated_rule_expression_evaluates_on_victoria(victoria):
    _, start, end, _ = _window()
    client = PromClient(victoria)
    exprs = []
    for path in sorted((ROOT / "rules" / "prometheus").glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            exprs += [(path.name, r.get("record") or r.get("alert"), r["expr"]) for r in group["rules"]]
    assert len(exprs) > 50
    answered = 0
    for _file, _name, expr in exprs:
        client.query(str(expr), end)  # raises PromError with VictoriaMetrics' own message
        answered += 1
    assert answered == len(exprs)
    canonical = [e for f, n, e in exprs if f == "kvscope-canonical.yml" and n == "kvscope:engine_kv_cache_usage_ratio"]
    assert canonical and client.query(canonical[0], end), "the canonical KV usage rule read nothing"


def test_weekly_report_reads_the_engines_own_series_from_victoria(victoria):
    from kvscope.diagnoser.sources.prometheus import PrometheusSource
    from kvscope.diagnoser.sources.samples import SamplesSource
    from kvscope.report.weekly import build_report, report_window

    source, start, end, _ = _window()
    replay = source.replay()
    direct = build_report(report_window(SamplesSource(replay.samples, carry=False)), end + 1, 2.5, "recording").this
    via_vm = build_report(report_window(PrometheusSource(victoria), end + 1, start), end + 1, 2.5, "vm").this
    tokens = direct.fleet["output_tokens"]
    assert tokens and via_vm.fleet["output_tokens"] == pytest.approx(tokens, rel=0.1)
    assert re.match(r"^[\w.-]+ / \w+$", str(via_vm.pools.index[0]))


def test_weekly_report_says_which_rules_it_judged_on_every_engine(tmp_path, capsys):
    """`report weekly --prometheus` runs the week's diagnosis by the fleet path; with no candidate
    records in the TSDB every rule is judged on every engine's series, and the report says so with
    the backfill command, as `kvscope diagnose` does (at fleet size that read is most of its time).
    The fleet: 4 engines x 3 h of the real vLLM 0.32 capture at 60 s (testbed/fleetgen), ending an
    hour ago (the report's 15-minute grid needs more than the kv-pressure recording's minutes)."""
    import time

    from kvscope.cli import main
    from testbed.fleetgen.capture_fleet import import_capture_fleet

    end = math.floor(time.time() / 60) * 60 - 3600.0
    with running_victoria(tmp_path / "data", "-search.maxQueryLen=131072", log_path=tmp_path / "vm.log") as vm:
        assert import_capture_fleet(vm.url, 4, end - 3 * 3600, end, 60.0)["samples"] > 0
        out = tmp_path / "week.md"
        argv = ["report", "weekly", "--prometheus", vm.url, "--end", f"{end:.0f}", "--markdown", str(out)]
        assert main([*argv, "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "judged on every engine's series (exact full fetch)" in err
    assert "vmalert -rule=rules/prometheus/kvscope-candidates.yml -replay.timeFrom=" in err
    assert "## Top findings" in out.read_text()
