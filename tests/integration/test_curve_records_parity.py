"""What changed, judged from kvscope-curve.yml's records, against the same judged from every
engine's raw series, in one real TSDB.

tests/recordings/curve-vllm-config-changes (real vLLM on CPU, restarted between phases with
--num-gpu-blocks-override 256 -> 20 -> 256 -> 256, 2 s scrapes) imported into a real
VictoriaMetrics, the curve's records written by a real `vmalert -replay` of the generated rule file
at a 4 s interval (two scrapes; as tests/integration/test_curve_records.py does at 10 s). Expected before the run: `kvscope
curve --recorded` finds the same changes (kind, time within two records intervals) as `kvscope
curve` reading the raw series, the same KV capacity diff on the first two, and gives each the same
verdict: the KV cut a regression, its inverse an improvement, and the same-flags restart
not_comparable (the raw series read the machine slower at the same batch; the records keep no ITL,
and a change of no setting takes no regression or improvement where the machine's speed is unread).

Prometheus is not the TSDB here: `promtool tsdb create-blocks-from rules` evaluates a group's rules
one at a time against what the TSDB held before it started, so the records that read the group's
earlier records (`kvscope:curve_bucket:avg` and every sum) came out empty when tried in passes,
and a live Prometheus cannot evaluate rules over a recording's past.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvscope.agent.recording.omfile import read_recording_text
from kvscope.cli import main
from kvscope.core.signals import load_catalog
from kvscope.diagnoser.curve.records import curve_file
from kvscope.diagnoser.promql.rulefiles import render_rule_file
from testbed.victoria import import_prometheus_text, replay_in_order, running_victoria

RECORDING = Path(__file__).resolve().parents[1] / "recordings" / "curve-vllm-config-changes.om.gz"
INTERVAL_S = 4
"""Two of the recording's 2 s scrapes: the finest interval the rules read (each reads its last interval)."""
pytestmark = [pytest.mark.needs("victoria-metrics"), pytest.mark.needs("vmalert"), pytest.mark.servers]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("curve-parity")
    name, groups = curve_file(load_catalog(), f"{INTERVAL_S}s")
    rules = tmp / name
    rules.write_text(render_rule_file(groups, "# kvscope rules build --curve-interval 4s\n"))
    text = read_recording_text(RECORDING)
    times = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln and not ln.startswith("#")]
    start, end = (min(times) // INTERVAL_S + 1) * INTERVAL_S, (max(times) // INTERVAL_S + 1) * INTERVAL_S
    with running_victoria(tmp / "data", log_path=tmp / "vm.log") as vm:
        assert import_prometheus_text(vm.url, RECORDING) > 10_000
        replay_in_order(vm.url, rules, start, end, tmp)
        yield vm.url, start, end


def _changes(capsys, url: str, start: float, end: float, *extra: str) -> list[dict]:
    assert main(["curve", "--prometheus", url, "--start", str(start), "--end", str(end), "--json", *extra]) == 0
    (pool,) = json.loads(capsys.readouterr().out)["pools"]
    return pool["changes"]


def test_the_records_find_the_raw_series_changes_and_judge_the_first_alike(served, capsys):
    url, start, end = served
    raw = _changes(capsys, url, start, end)
    recorded = _changes(capsys, url, start, end, "--recorded")
    assert [c["kind"] for c in raw] == ["config", "config", "restart"], raw
    assert [c["kind"] for c in recorded] == [c["kind"] for c in raw], recorded
    for r, c in zip(raw, recorded, strict=True):
        assert abs(r["time"] - c["time"]) <= 2 * INTERVAL_S, (r["time"], c["time"])
    assert [c["diff"] for c in recorded[:2]] == [c["diff"] for c in raw[:2]]
    assert [c["instances"] for c in recorded[:2]] == [["replica-0"], ["replica-0"]]
    # the KV cut: a regression on both paths, TTFT p99 worse on both
    assert raw[0]["verdict"] == recorded[0]["verdict"] == "regression"
    assert "ttft_p99_s" in raw[0]["worse"] and "ttft_p99_s" in recorded[0]["worse"]


def test_the_records_judge_every_change_as_the_raw_series_do(served, capsys):
    url, start, end = served
    raw = _changes(capsys, url, start, end)
    recorded = _changes(capsys, url, start, end, "--recorded")
    assert [c["verdict"] for c in raw] == ["regression", "improvement", "not_comparable"], raw
    assert [c["verdict"] for c in recorded] == [c["verdict"] for c in raw], recorded
    assert "step time is not read" in recorded[2]["reason"], recorded[2]
