"""Same data, same frame, same diagnosis: a recording, a real Prometheus loaded from it, the agent API.

The recording is a real vLLM capture from the incident library. Prometheus is the Debian binary on
127.0.0.1, its TSDB built from the same file with `promtool tsdb create-blocks-from openmetrics`.
The agent is the real AgentServer serving an in-memory store filled from the same replay.
"""

from __future__ import annotations

import asyncio
import gzip
import re
import shutil
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

from kvscope.agent.recording.replay import replay_recording
from kvscope.agent.store.sqlite import MEMORY, SqliteStore
from kvscope.diagnoser.evaluate.evaluator import diagnose, sample_names
from kvscope.diagnoser.rulebook.rule import read_rules
from kvscope.diagnoser.sources.agent import AgentSource
from kvscope.diagnoser.sources.prometheus import PrometheusSource
from kvscope.diagnoser.sources.recording import RecordingSource
from testbed.procs import free_port
from testbed.prometheus import EMPTY_CONFIG, backfill_openmetrics, get_json, require_binaries, running_prometheus

RECORDING = Path(__file__).resolve().parent.parent / "recordings" / "healthy-shared-prefix.om.gz"
PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
STEP = 2.0
pytestmark = pytest.mark.servers


def _names() -> set[str]:
    return set().union(*(sample_names(r) for r in read_rules()))


def _window(replay) -> tuple[float, float]:
    return float(np.ceil(replay.start)), float(np.floor(replay.end))


def assert_same_frame(a, b):
    assert np.array_equal(a.ts, b.ts)
    assert set(a.blocks) == set(b.blocks), set(a.blocks) ^ set(b.blocks)
    for name, block in a.blocks.items():
        other = b.blocks[name]
        assert sorted(block.labels) == sorted(other.labels), name
        order_a = np.argsort([str(x) for x in block.labels])
        order_b = np.argsort([str(x) for x in other.labels])
        np.testing.assert_allclose(
            block.values[order_a], other.values[order_b], rtol=1e-9, equal_nan=True, err_msg=name
        )


@pytest.fixture(scope="module")
def plain_recording(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rec") / "rec.om"
    with gzip.open(RECORDING, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


@pytest.fixture(scope="module")
def prometheus_url(plain_recording, tmp_path_factory):
    require_binaries("prometheus", "promtool")
    tmp = tmp_path_factory.mktemp("prom")
    backfill_openmetrics(plain_recording, tmp / "data", timeout_s=300, binary=PROMTOOL)
    (tmp / "prometheus.yml").write_text(EMPTY_CONFIG)
    with running_prometheus(
        tmp / "prometheus.yml",
        tmp / "data",
        "--storage.tsdb.retention.time=100y",
        log_path=tmp / "prometheus.log",
        binary=PROMETHEUS,
    ) as prom:
        yield prom.url


@pytest.mark.prometheus
def test_recording_and_real_prometheus_give_the_same_frame_and_diagnosis(plain_recording, prometheus_url):
    rec = RecordingSource(plain_recording)
    start, end = _window(rec.replay())
    names = _names()
    a = rec.read_frame(names, start, end, STEP)
    b = PrometheusSource(prometheus_url).read_frame(names, start, end, STEP)
    assert "request_ttft_seconds_bucket" in a.blocks and "engine_kv_cache_usage_ratio" in a.blocks
    assert_same_frame(a, b)
    assert a.facts == b.facts and a.facts
    da = diagnose(a, source="x", time_scale=0.2)
    db = diagnose(b, source="x", time_scale=0.2)
    assert da.to_json() == db.to_json()


def test_recording_and_agent_api_give_the_same_frame(plain_recording):
    from agentharness import running_agent  # tests/integration is on sys.path under pytest

    replay = replay_recording(plain_recording)
    start, end = _window(replay)
    names = _names()
    rec_frame = RecordingSource(plain_recording).read_frame(names, start, end, STEP)
    store = SqliteStore(MEMORY, background=False)
    store.write([s for s in replay.samples if s.name in names])
    store.flush()

    async def run():
        async with running_agent({"targets": []}, store=store, collectors=[]) as (runtime, url):
            runtime.state.facts.update(replay.facts)
            runtime.state.engines.update(replay.engines)
            return await asyncio.to_thread(AgentSource(url).read_frame, names, start, end, STEP)

    agent_frame = asyncio.run(run())
    assert_same_frame(rec_frame, agent_frame)
    assert agent_frame.facts == rec_frame.facts


def test_prometheus_source_reports_a_clear_error_when_unreachable():
    from kvscope.diagnoser.sources import SourceError

    with pytest.raises(SourceError, match="prometheus http://127.0.0.1"):
        PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout_s=2).read_frame(
            {"engine_requests_waiting"}, 0, 60, 15
        )


@pytest.mark.prometheus
def test_the_operating_curve_is_the_same_from_the_recording_and_real_prometheus(plain_recording, prometheus_url):
    """`kvscope curve` reads its window through the same sources: same curve, knee, C_max, changes,
    at the same step: the step Prometheus' raw samples say the engines were scraped at is the
    recording's own scrape interval (curve.window.curve_step)."""
    from kvscope.diagnoser.curve.report import pool_curves, to_json
    from kvscope.diagnoser.curve.window import curve_step, read_window

    rec = RecordingSource(plain_recording)
    start, end = _window(rec.replay())
    prom = PrometheusSource(prometheus_url)
    # both the median gap between scrapes (2 s, give or take the recorder's millisecond jitter)
    assert curve_step(prom, start, end, 15.0) == pytest.approx(rec.natural_step(), abs=0.01)
    assert rec.natural_step() == pytest.approx(STEP, abs=0.01)
    a = pool_curves(read_window(rec, start, end, STEP))
    b = pool_curves(read_window(prom, start, end, STEP))
    assert a and a[0].points
    assert to_json(a, 1.0) == to_json(b, 1.0)


def test_the_curve_reads_the_agent_at_the_interval_it_scraped_its_targets():
    """`curve_step` on the agent's API: the agent stores each target's `kvscope_target_up` per
    scrape, so the interval is measured there as a recording's is (two targets scraped every 5 s,
    0.3 s apart); before, the agent source had no way to say and the caller's 15 s was used."""
    from agentharness import running_agent

    from kvscope.core.signals import Sample, make_labels
    from kvscope.diagnoser.curve.window import curve_step

    t0 = time.time() - 600
    store = SqliteStore(MEMORY, background=False)
    for k, instance in enumerate(("a:8000", "b:8000")):
        labels = make_labels({"job": "vllm", "instance": instance})
        store.write([Sample("kvscope_target_up", labels, 1.0, t0 + 0.3 * k + 5.0 * i) for i in range(100)])
        store.flush()

    async def run():
        async with running_agent({"targets": []}, store=store, collectors=[]) as (_, url):
            return await asyncio.to_thread(curve_step, AgentSource(url), t0, t0 + 500, 15.0)

    assert asyncio.run(run()) == pytest.approx(5.0)


@pytest.mark.prometheus
def test_the_scrape_interval_and_ranges_read_as_prometheus_writes_them(plain_recording, prometheus_url):
    """This recording's one engine was scraped every 2.001 s (median, the recorder's jitter): the
    recording and Prometheus' raw samples both read it as the 2 s it was configured at, and every
    range of the rules' evidence PromQL is written as the real Prometheus writes it
    (/api/v1/format_query), at the step read and at a step off the second (--step 2.5)."""
    from kvscope.diagnoser.promql.series import prom_duration

    rec = RecordingSource(plain_recording)
    start, end = _window(rec.replay())
    assert rec.natural_step() == 2.0
    assert PrometheusSource(prometheus_url).scrape_interval({"engine_requests_running"}, start, end) == 2.0
    # every rule's evidence as a diagnosis of this recording prints it, at the step read and at 2.5 s
    from kvscope.diagnoser.evaluate.expr import promql

    texts = [
        promql(rule, item.series, step)
        for rule in (r.scaled(0.2) for r in read_rules())
        for item in rule.tree.evidence
        for step in (rec.natural_step(), 2.5)
    ]
    texts = [t for t in texts if "no PromQL form" not in t and "[" in t]
    assert len(texts) > 50 and any(re.search(r"\[\d+s500ms", t) for t in texts)
    texts.append("rate(x[" + "]) + rate(x[".join(prom_duration(s) for s in (10.001, 7.5, 86400, 93784.005)) + "])")
    for text in texts:
        asked = urllib.parse.urlencode({"query": text})
        formatted = get_json(f"{prometheus_url}/api/v1/format_query?{asked}")["data"]
        assert re.findall(r"\[[^\]]*\]", formatted) == re.findall(r"\[[^\]]*\]", text), (text, formatted)


def test_the_ui_reads_what_changed_from_the_agent_as_from_the_recording(monkeypatch):
    """The UI's triage on an agent (`kvscope ui --agent`) carries what changed in its window, as
    `kvscope diagnose --agent` does: the real vLLM config-change recording (KV cut, its inverse,
    a restart) served by the real agent API gives the changes the recording itself gives. When the
    curve cannot be read (the agent went away after the findings' read), the findings stay and a
    note says what is missing."""
    from agentharness import running_agent

    from kvscope.diagnoser.curve import report as curve_report
    from kvscope.diagnoser.sources import SourceError
    from kvscope.ui import data as ui_data

    recording = RECORDING.with_name("curve-vllm-config-changes.om.gz")
    replay = replay_recording(recording)
    store = SqliteStore(MEMORY, background=False)
    store.write(list(replay.samples))
    store.flush()
    start, end = _window(replay)

    async def run():
        async with running_agent({"targets": []}, store=store, collectors=[]) as (runtime, url):
            runtime.state.facts.update(replay.facts)
            runtime.state.engines.update(replay.engines)
            spec = ui_data.SourceSpec("agent", url, end - start, end)
            whole = await asyncio.to_thread(ui_data.load_triage, spec, 2.0)

            def gone(*args, **kwargs):
                raise SourceError("connection refused")

            monkeypatch.setattr(curve_report, "window_curves", gone)
            return whole, await asyncio.to_thread(ui_data.load_triage, spec, 2.0)

    live, without = asyncio.run(run())
    monkeypatch.undo()
    kept = [f.rule_id for f in live.diagnosis.findings if f.rule_id != "regression_after_change"]
    assert [f.rule_id for f in without.diagnosis.findings] == kept
    assert without.diagnosis.likely_cause is not None and without.diagnosis.changes == ()
    assert without.notes == ["what changed in the window could not be read: connection refused"]
    rec = ui_data.load_triage(ui_data.SourceSpec("recording", str(recording)))
    assert [c["kind"] for c in rec.diagnosis.changes] == ["config", "config", "restart"]
    assert [(c["kind"], c["diff"]) for c in live.diagnosis.changes] == [
        (c["kind"], c["diff"]) for c in rec.diagnosis.changes
    ]
    for a, b in zip(live.diagnosis.changes, rec.diagnosis.changes, strict=True):  # on the agent's grid
        assert abs(a["time"] - b["time"]) <= 2.0
    assert [c["verdict"] for c in live.diagnosis.changes][:2] == ["regression", "improvement"]
    assert live.curves is not None and len(live.curves) == len(rec.curves or [])
