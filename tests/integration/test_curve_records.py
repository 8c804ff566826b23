"""The operating curve read back from kvscope-curve.yml's records (diagnoser/curve/records.py), on
a real vLLM recording (curve-vllm-staircase: one engine, closed-loop levels of 1 to 16 streams,
2 s scrapes) in a real VictoriaMetrics, the records written by a real `vmalert -replay` of the
generated rule file at a 10 s interval.

The truth is computed here from the recording's raw samples with plain Python, at the times the
TSDB evaluated the rules: per interval (t - 10 s, t], the requests in the engine (Little's law:
the increase of vLLM's queue plus inference time sums over the interval's seconds, where a
request finished in it; else the mean of its running gauge plus the mean of its waiting gauge),
its concurrency bucket, and each TTFT bucket's increase (the last sample at or before t less the
last at or before t - 10 s, as VictoriaMetrics' `increase` reads a counter without resets).
Expected before the run: every bucket's interval count and TTFT requests equal the truth's, its
p50/p99 equal the quantiles of the truth's merged buckets, its RPS and 95 % interval the mean and
normal interval of the truth's finished requests per interval, and `kvscope curve --recorded`
prints those points.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from kvscope.cli import main
from kvscope.core.signals import load_catalog
from kvscope.diagnoser.curve.points import EDGES, quantile_ci
from kvscope.diagnoser.curve.records import curve_file
from kvscope.diagnoser.promql.rulefiles import render_rule_file
from kvscope.diagnoser.sources.promapi import PromClient, as_points
from testbed.victoria import import_prometheus_text, replay_in_order, running_victoria

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "recordings" / "curve-vllm-staircase.om.gz"
INTERVAL_S = 10
pytestmark = [pytest.mark.needs("victoria-metrics"), pytest.mark.needs("vmalert"), pytest.mark.servers]
LITTLE = (
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_inference_time_seconds_sum",
    "vllm:request_inference_time_seconds_count",
)
SAMPLE = re.compile(r"^([a-z_:]+)(\{[^}]*\})? (\S+) (\S+)$")


def _raw() -> dict[str, list[tuple[float, float]]]:
    """(time, value) of the recording's running, waiting, finished-request (by reason) and TTFT
    bucket (by le) series, and the queue and inference time sums and the inference count."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with gzip.open(RECORDING, "rt") as fh:
        for line in fh:
            m = SAMPLE.match(line.strip())
            if not m:
                continue
            name, labels, value, ts = m.groups()
            if name in ("vllm:num_requests_running", "vllm:num_requests_waiting", *LITTLE):
                out[name].append((float(ts), float(value)))
            elif name == "vllm:request_success_total":
                reason = re.search(r'finished_reason="([^"]+)"', labels or "").group(1)
                out[f"finished={reason}"].append((float(ts), float(value)))
            elif name == "vllm:time_to_first_token_seconds_bucket":
                le = re.search(r'le="([^"]+)"', labels or "").group(1)
                out[f"le={float(le)}"].append((float(ts), float(value)))
    return {k: sorted(v) for k, v in out.items()}


def _increase(series: list[tuple[float, float]], t: float) -> float:
    """The counter's increase over (t - INTERVAL_S, t]: its last sample at or before t less its last
    at or before the interval's start (no resets in this recording)."""
    now = [v for ts, v in series if ts <= t]
    before = [v for ts, v in series if ts <= t - INTERVAL_S]
    return now[-1] - before[-1] if now and before else 0.0


def _truth(raw: dict, times: list[float]) -> dict[float, dict]:
    """Per concurrency bucket (its lower edge; 0: idle): intervals, merged TTFT buckets, finished
    requests and the waiting per interval."""
    les = sorted(float(k[3:]) for k in raw if k.startswith("le="))
    out: dict[float, dict] = {}
    for t in times:
        means = []
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            inside = [v for ts, v in raw[name] if t - INTERVAL_S < ts <= t]
            means.append(sum(inside) / len(inside) if inside else None)
        if means[0] is None:
            continue
        conc, waiting = means[0] + (means[1] or 0.0), means[1]
        if _increase(raw[LITTLE[2]], t) > 0:  # Little's law where a request finished in the interval
            conc = (_increase(raw[LITTLE[0]], t) + _increase(raw[LITTLE[1]], t)) / INTERVAL_S
            waiting = _increase(raw[LITTLE[0]], t) / INTERVAL_S
        edges = [0.0, *EDGES.tolist()]
        k = max(i for i, e in enumerate(edges) if conc >= e)
        if k == len(edges) - 1:
            continue
        incs = [_increase(raw[f"le={le}"], t) for le in les]
        finished = sum(_increase(series, t) for key, series in raw.items() if key.startswith("finished="))
        got = out.setdefault(
            edges[k],
            {"intervals": 0, "merged": np.zeros(len(les)), "les": np.array(les), "finished": [], "waiting": []},
        )
        got["intervals"] += 1
        got["merged"] += incs
        got["finished"].append(finished)
        got["waiting"].append(waiting)
    return out


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """(VictoriaMetrics URL, window start, end, evaluation times) with the records replayed."""
    tmp = tmp_path_factory.mktemp("curve-records")
    name, groups = curve_file(load_catalog(), f"{INTERVAL_S}s")
    rules = tmp / name
    rules.write_text(render_rule_file(groups, "# kvscope rules build --curve-interval 10s\n"))
    raw = _raw()
    times = [t for t, _ in raw["vllm:num_requests_running"]]
    start, end = min(times), max(times)
    with running_victoria(tmp / "data", log_path=tmp / "vm.log") as vm:
        assert import_prometheus_text(vm.url, RECORDING) > 10_000
        lattice = (int(start) // INTERVAL_S + 1) * INTERVAL_S  # the first interval with a sample before it
        replay_in_order(vm.url, rules, lattice, end + INTERVAL_S, tmp)
        evals = PromClient(vm.url).raw_samples("kvscope:curve_concurrency:avg", end + 2 * INTERVAL_S - start, end + 10)
        assert len(evals) == 1, "one engine"
        yield vm.url, lattice, end + INTERVAL_S, as_points(evals[0]["values"])[:, 0].tolist(), raw


def test_the_records_hold_the_truths_intervals_requests_and_quantiles_per_bucket(replayed, capsys):
    url, start, end, evals, raw = replayed
    truth = _truth(raw, [t for t in evals if t - INTERVAL_S >= start])
    busy = {lo: v for lo, v in truth.items() if lo > 0}
    assert len(busy) >= 5, f"the staircase spans at least five buckets: {sorted(busy)}"
    code = main(["curve", "--prometheus", url, "--start", str(start), "--end", str(end), "--recorded", "--json"])
    assert code == 0
    (pool,) = json.loads(capsys.readouterr().out)["pools"]
    assert pool["labels"] == {"model": "tiny-llama", "engine": "vllm"}
    assert pool["changes"] == [] and pool["coarse_share"] is None
    assert pool["concurrency_estimator"]["method"] == "littles_law|gauges"
    assert any("curve records" in n for n in pool["operating"]["notes"])
    points = {p["bucket"][0]: p for p in pool["points"]}
    assert sorted(points) == sorted(busy)
    for lo, want in busy.items():
        p = points[lo]
        assert p["intervals"] == want["intervals"], lo
        assert lo <= p["concurrency"] < p["bucket"][1], lo
        merged = np.maximum.accumulate(want["merged"])
        assert p["requests"] == pytest.approx(merged[-1], abs=1e-9), lo
        assert p["ttft_p50_s"] == pytest.approx(quantile_ci(0.5, want["les"], merged)[0], rel=1e-9), lo
        assert p["ttft_p99_s"] == pytest.approx(quantile_ci(0.99, want["les"], merged)[0], rel=1e-9), lo
        # the rule's rate() divides by its samples' own span (their scrape times jitter), the truth by
        # the interval: within 1 %
        assert p["waiting"] == pytest.approx(np.mean(want["waiting"]), rel=1e-2, abs=1e-9), lo
        rates = np.array(want["finished"]) / INTERVAL_S  # finished requests per second, per interval
        assert p["rps"] == pytest.approx(rates.mean(), rel=1e-9), lo
        if len(rates) > 1:
            half = 1.96 * rates.std(ddof=1) / np.sqrt(len(rates))
            assert p["rps_ci"] == pytest.approx([max(0.0, rates.mean() - half), rates.mean() + half], rel=1e-6), lo
    assert pool["intervals"] == sum(v["intervals"] for v in truth.values())


def test_no_records_in_the_window_says_what_to_load(replayed, capsys):
    url, start, _, _, _ = replayed
    code = main(["curve", "--prometheus", url, "--start", str(start - 7200), "--end", str(start - 3600), "--recorded"])
    assert code == 4
    assert "load kvscope-curve.yml" in capsys.readouterr().err


def test_the_ui_operating_page_reads_the_records_as_the_cli_does(replayed, monkeypatch, capsys):
    """Streamlit's AppTest of the real page over the same VictoriaMetrics: with the sidebar's
    records toggle on, the page shows the pool and the records' note; its curves are the CLI's."""
    from streamlit.testing.v1 import AppTest

    from kvscope.diagnoser.curve.report import pool_name
    from kvscope.ui import data as ui_data

    url, start, end, _, _ = replayed
    spec = ui_data.SourceSpec("prometheus", url, end - start, end)
    (pc,) = ui_data.live_curves(spec, recorded=True)
    assert main(["curve", "--prometheus", url, "--start", str(start), "--end", str(end), "--recorded", "--json"]) == 0
    (cli,) = json.loads(capsys.readouterr().out)["pools"]
    assert [p.to_dict() for p in pc.points] == cli["points"]
    for var in ui_data.ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(ui_data.ENV["prometheus"], url)
    monkeypatch.setenv(ui_data.ENV_SINCE, str(end - start))
    monkeypatch.setenv(ui_data.ENV_END, str(end))
    at = AppTest.from_file(str(Path(ui_data.__file__).with_name("app.py")), default_timeout=300).run()
    at.sidebar.radio[0].set_value("Operating point").run()
    at.sidebar.toggle(key="curve_recorded").set_value(True).run()
    assert not at.exception
    assert at.header[0].value == f"Pool {pool_name(pc)}"
    assert any("curve records" in c.value for c in at.caption)


def test_a_long_full_read_says_when_the_records_would_do(replayed, capsys):
    """Over six hours or more, the full read says on stderr that --recorded reads the records (when
    the window holds them) or how to get them (when it does not); the full read still runs."""
    url, _, end, _, _ = replayed
    assert main(["curve", "--prometheus", url, "--start", str(end - 7 * 3600), "--end", str(end), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["pools"], "the full read still reads the staircase"
    assert "keeps kvscope's curve records: --recorded reads the points and judges the changes" in captured.err
    before = end - 8 * 3600
    assert main(["curve", "--prometheus", url, "--start", str(before - 7 * 3600), "--end", str(before)]) == 4
    assert "load kvscope-curve.yml (kvscope rules build) into the TSDB" in capsys.readouterr().err


def test_records_that_begin_after_the_windows_start_say_so(replayed, capsys):
    """A window reaching an hour before the records began: the curve is read from what there is,
    and a note says from when, so that "no change" is not read into the part without records."""
    url, start, end, _, _ = replayed
    code = main(["curve", "--prometheus", url, "--start", str(start - 3600), "--end", str(end), "--recorded", "--json"])
    assert code == 0
    (pool,) = json.loads(capsys.readouterr().out)["pools"]
    assert any("records of this pool begin at" in n for n in pool["operating"]["notes"]), pool["operating"]["notes"]
