"""A KV cut judged from the curve's records and from the raw series on a generated fleet (issue
55, item 5): 16 engines x 6 h of the real vLLM 0.32 capture at 15 s scrapes (testbed/fleetgen,
four models), model-1's four engines restarted halfway with half their KV cache and pressured from
then on at the same arrival rate (`CaptureFleet` `cut`: KV near full, preemptions, requests
waiting, latencies 3x), in a real VictoriaMetrics, kvscope-curve.yml replayed by a real vmalert.

Each engine takes about 0.4 requests a second, each lasting many seconds, so about 8 are in
flight before the cut and 24 after: the two sides share no concurrency bucket, and only the
arrival rate can match them (below 0.5 a second, where the concurrency edges would call it idle).
Expected before the run, on both paths: model-1's one change is its KV capacity 4096 -> 2048
tokens at the cut, a regression of TTFT p99 judged at the arrival rate; no other pool changes."""

from __future__ import annotations

import json
import math
import time

import pytest

from kvscope.cli import main
from kvscope.core.signals import load_catalog
from kvscope.diagnoser.curve.records import curve_file
from kvscope.diagnoser.promql.rulefiles import render_rule_file
from testbed.fleetgen.capture_fleet import import_capture_fleet
from testbed.victoria import replay_in_order, running_victoria

pytestmark = [pytest.mark.needs("victoria-metrics"), pytest.mark.needs("vmalert"), pytest.mark.servers]
HOURS, SCRAPE_S, RECORDS = 6, 15.0, "60s"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cutfleet")
    end = math.floor(time.time() / 60) * 60 - 3600.0
    start = end - HOURS * 3600
    name, groups = curve_file(load_catalog(), RECORDS)
    rules = tmp / f"{name}.yml"
    rules.write_text(render_rule_file(groups, f"# kvscope rules build --curve-interval {RECORDS}\n"))
    with running_victoria(tmp / "data", "-search.maxQueryLen=131072", log_path=tmp / "vm.log") as vm:
        info = import_capture_fleet(vm.url, 16, start - SCRAPE_S, end, SCRAPE_S, cut=0.5)
        replay_in_order(vm.url, rules, start - 60, end, tmp)
        yield vm.url, start, end, info["cut"]["at"]


@pytest.mark.parametrize("path", ["records", "raw"])
def test_the_kv_cut_is_a_regression_at_the_arrival_rate(fleet, path, capsys):
    url, start, end, cut_at = fleet
    argv = ["curve", "--prometheus", url, "--start", f"{start:.0f}", "--end", f"{end:.0f}", "--json"]
    assert main(argv + (["--recorded"] if path == "records" else [])) == 0
    pools = {p["labels"]["model"]: p for p in json.loads(capsys.readouterr().out)["pools"]}
    assert set(pools) == {f"model-{i}" for i in range(4)}
    assert all(not pools[m]["changes"] for m in pools if m != "model-1"), {m: p["changes"] for m, p in pools.items()}
    (change,) = pools["model-1"]["changes"]
    assert change["kind"] == "config" and change["diff"] == {"kv_capacity_tokens": [4096.0, 2048.0]}
    assert abs(change["time"] - cut_at) <= 3 * 60, (change["time"], cut_at)
    assert change["verdict"] == "regression" and change["worse"] == ["ttft_p99_s"], change.get("reason")
    assert change["matched_concurrency"] == [] and change["by_arrival_rate"]
    assert change["by_arrival_rate"]["method"] == "matched"
