"""Streamlit AppTest of the UI logic: every page renders, the triage card names the likely cause.

The recording here is synthetic (a unit test of our own logic): vLLM-named series of a KV-pressure
incident, written with the real recording writer and read back through the real replay path.
The browser test (tests/e2e/test_ui_browser.py) uses a real vLLM recording.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from kvscope.agent.recording.omfile import RecordingWriter
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.diagnoser.actions import change_text, lever_heading, plan
from kvscope.ui import data as ui_data

APP = str(Path(ui_data.__file__).with_name("app.py"))
T0 = 1_790_000_000.0


def _scrape(t: float, kv: float, preempted: float, waiting: int, ttft_count: float) -> str:
    model = 'model_name="tiny",engine="0"'
    return (
        f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{{model}}} {kv}\n"
        f"# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total{{{model}}} {preempted}\n"
        f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{model}}} 8\n"
        f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{{model}}} {waiting}\n"
        f"# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total{{{model}}} {40 * (t - T0)}\n"
        f"# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total{{{model}}} {200 * (t - T0)}\n"
        f"# TYPE vllm:time_to_first_token_seconds histogram\n"
        f'vllm:time_to_first_token_seconds_bucket{{{model},le="0.5"}} {ttft_count / 2}\n'
        f'vllm:time_to_first_token_seconds_bucket{{{model},le="+Inf"}} {ttft_count}\n'
        f"vllm:time_to_first_token_seconds_sum{{{model}}} {ttft_count * 0.6}\n"
        f"vllm:time_to_first_token_seconds_count{{{model}}} {ttft_count}\n"
    )


def write_kv_incident(path: Path) -> Path:
    """10 minutes at 5 s: healthy for 3 minutes, then KV at 97 % with 0.5 preemptions/s."""
    writer = RecordingWriter(path)
    preempted = 0.0
    for i in range(121):
        t = T0 + 5 * i
        hot = i >= 36
        preempted += 2.5 if hot else 0.0
        writer.add_scrape(
            "vllm",
            "127.0.0.1:8000",
            t,
            parse_exposition(_scrape(t, 0.97 if hot else 0.4, preempted, 6 if hot else 0, 2.0 * i), openmetrics=False),
        )
    return writer.close()


@pytest.fixture(scope="module")
def kv_incident(tmp_path_factory) -> Path:
    return write_kv_incident(tmp_path_factory.mktemp("rec") / "kv-incident.om")


def _app(monkeypatch, recording: Path | None) -> AppTest:
    for var in ui_data.ENV.values():
        monkeypatch.delenv(var, raising=False)
    if recording is not None:
        monkeypatch.setenv(ui_data.ENV["recording"], str(recording))
    return AppTest.from_file(APP, default_timeout=300)  # a hang guard only (slow on a loaded 2-core box)


def test_triage_shows_the_likely_cause_with_evidence_and_levers(monkeypatch, kv_incident):
    at = _app(monkeypatch, kv_incident).run()
    assert not at.exception
    assert "Likely cause" in [h.value for h in at.header]
    likely = ui_data.load_triage(ui_data.SourceSpec("recording", str(kv_incident))).diagnosis.likely_cause
    assert likely is not None and likely.levers_md.startswith("K")  # a KV-memory row of LEVERS.md
    assert likely.title in at.subheader[0].value
    text = " ".join(m.value for m in at.markdown)
    assert "127.0.0.1:8000" in text and "When:" in text
    assert "Sizing LLM Inference for Production §7.4" in text
    assert "**Confidence:** measured, high confidence" in text  # how sure, in the CLI's words
    now, fix = plan(likely)
    assert now and fix, "a KV-memory cause has both a mitigation and a fix"
    boxes = [b.value for b in (*at.warning, *at.info)]
    do_now = next(b for b in boxes if b.startswith("**Do now**"))
    for_good = next(b for b in boxes if b.startswith("**Fix for good**"))
    assert boxes.index(do_now) < len(at.warning) <= boxes.index(for_good)  # do now (warning) before fix (info)
    for lv in now:
        assert lever_heading(lv) in do_now and lever_heading(lv) not in for_good
        assert all(change_text(c, "`") in do_now for c in lv.changes)  # the exact setting per system
    for lv in fix:
        assert lever_heading(lv) in for_good
    assert any("Timeline" == h.value for h in at.header)


def test_evidence_charts_have_units_utc_time_and_the_period_shaded(monkeypatch, kv_incident):
    """One chart per evidence signal of the likely cause (K1 since it leads a cascade whose
    latency stage it precedes: KV, preemptions, running, waiting, running growth); each says its
    unit, reads time in UTC and shades the finding's period."""
    import json

    at = _app(monkeypatch, kv_incident).run()
    specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    evidence = [s for s in specs if "layer" in s]
    assert [s["layer"][1]["encoding"]["y"]["title"] for s in evidence] == [
        "ratio (0-1)",
        "per second",
        "count",
        "count",
        "per second",
    ]
    for s in evidence:
        band, lines = s["layer"]
        assert band["mark"]["type"] == "rect" and lines["encoding"]["x"]["scale"]["type"] == "utc"
    domains = {tuple(s["layer"][1]["encoding"]["x"]["scale"]["domain"]) for s in evidence}
    assert len(domains) == 1, "the stacked charts must share one time axis (the whole window)"
    assert any("shaded: the finding's period" in m.value for m in at.markdown)


def test_every_data_page_renders(monkeypatch, kv_incident):
    at = _app(monkeypatch, kv_incident).run()
    at.sidebar.radio[0].set_value("Tenants & fairness").run()
    assert not at.exception
    assert any("No per-tenant series" in i.value for i in at.info)
    at.sidebar.radio[0].set_value("Cascades").run()
    assert not at.exception and at.title[0].value == "Memory-pressure cascades"
    assert at.dataframe[0].value["deepest stage reached"].iloc[0] != "0 healthy"
    assert sum("layer" in c.proto.spec for c in at.get("vega_lite_chart")) >= 3  # charts with the period shaded
    at.sidebar.radio[0].set_value("Efficiency").run()
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Output tokens / GPU-hour"] == "absent"  # no GPU in the recording: absent, not zero
    assert any("absent, not zero" in i.value for i in at.info)
    assert any("NVML collector" in i.value and "dcgm-exporter" in i.value for i in at.info)  # how to get them
    assert not at.get("vega_lite_chart")  # no empty charts


def test_tenants_page_shows_the_adapter_table_of_the_lora_recording(monkeypatch):
    """Real vLLM serving two LoRA adapters behind the tap: the Tenants page has the tenant table
    and below it one row per requested model, with the GPU-time share."""
    rec = Path(__file__).resolve().parents[1] / "recordings" / "lora-two-adapters.om.gz"
    at = _app(monkeypatch, rec).run()
    at.sidebar.radio[0].set_value("Tenants & fairness").run()
    assert not at.exception
    tenants, adapters = at.dataframe[0].value, at.dataframe[1].value
    assert set(tenants["tenant"]) == {"tenant-0", "tenant-1"}
    assert set(adapters["adapter"]) == {"a", "b", "tiny-llama"}
    assert adapters["GPU-time share"].sum() == pytest.approx(1.0)
    metrics = {m.label: m.value for m in at.metric}  # vLLM's lora_requests_info: --max-loras 2
    assert metrics["Adapter slots per batch (engine, max)"] == "2"
    # a and b were in flight together between scrapes ("a,b" series exist), but at every scrape of
    # this take the newest series (the one the value's update time marks) names one adapter at most
    assert metrics["Adapters in flight at once (engine, max)"] == "1"


def test_sizing_calculator_computes_the_002_examples(monkeypatch):
    at = _app(monkeypatch, None).run()
    at.sidebar.radio[0].set_value("Sizing calculator").run()
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["KV bytes / token"] == "327,680"
    assert (metrics["Instances"], metrics["GPUs"]) == ("10", "52")
    assert metrics["Maximum safe queue depth"] == "100"
    at.number_input(key="kv_heads").set_value(64).run()
    assert {m.label: m.value for m in at.metric}["KV bytes / token"] == "2,621,440"


def test_rule_and_lever_catalog(monkeypatch):
    at = _app(monkeypatch, None).run()
    at.sidebar.radio[0].set_value("Rules & levers").run()
    assert not at.exception
    rules = at.dataframe[0].value
    assert "kv_pressure_preemption" in set(rules["rule"])


def test_missing_recording_is_a_clear_error(monkeypatch, tmp_path):
    at = _app(monkeypatch, tmp_path / "nope.om").run()
    assert not at.exception
    assert "does not exist" in at.error[0].value


def test_an_unreachable_prometheus_reads_not_diagnosed(monkeypatch):
    """Issue 57: the triage page of a Prometheus nothing listens at says "Not diagnosed: <reason>"."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    at = _app(monkeypatch, None)
    monkeypatch.setenv(ui_data.ENV["prometheus"], dead)
    at = at.run()
    assert not at.exception and not at.success
    assert at.error[0].value.startswith("Not diagnosed: ") and "cannot connect" in at.error[0].value


def test_no_source_explains_how_to_start(monkeypatch):
    at = _app(monkeypatch, None).run()
    assert "kvscope ui --recording" in at.error[0].value


def test_tenant_table_from_kvscope_tenant_series():
    from kvscope.core.signals import Sample, make_labels
    from kvscope.diagnoser.evaluate.frame import frame_from_samples

    samples = []
    for i in range(61):
        t = T0 + 10 * i
        for tenant, rps, hit in (("acme", 2.0, 0.7), ("tail", 0.5, 0.05)):
            lab = make_labels({"tenant": tenant})
            samples += [
                Sample("tenant_requests_total", lab, rps * 10 * i, t),
                Sample("tenant_prompt_tokens_total", lab, 500 * rps * 10 * i, t),
                Sample("tenant_cached_tokens_total", lab, hit * 500 * rps * 10 * i, t),
                Sample("tenant_prefix_hit_ratio", lab, hit, t),
            ]
        judged = make_labels({"tenant": "acme", "model": "m"})  # the tap judged acme's requests only
        samples += [
            Sample("goodput_requests_total", judged, 2.0 * 10 * i, t),
            Sample("goodput_good_requests_total", judged, 1.5 * 10 * i, t),
        ]
    table = ui_data.group_table(frame_from_samples(samples, T0, T0 + 600, 10), "tenant")
    rows = table.set_index("tenant")
    assert rows.loc["acme", "goodput (exact)"] == pytest.approx(0.75)
    assert pd.isna(rows.loc["tail", "goodput (exact)"])  # not judged: absent, not 0
    assert rows.loc["acme", "requests/s"] == pytest.approx(2.0)
    assert rows.loc["tail", "hit ratio (latest)"] == pytest.approx(0.05)
    assert rows.loc["tail", "cached tok/s"] == pytest.approx(0.05 * 500 * 0.5)
    assert ui_data.group_table(frame_from_samples(samples[:0], T0, T0 + 600, 10), "tenant").empty


def test_tenant_ttft_mean_and_p95_over_the_window():
    """acme: 10 requests/10 s, 9 of them under 0.1 s and 1 in (0.5, 1]: p95 interpolates inside
    (0.5, 1] at rank 9.5 of 10 (0.75 s), the mean is sum / count (0.2 s). A tenant without
    TTFT series has neither column (absent, not 0)."""
    from kvscope.core.signals import Sample, make_labels
    from kvscope.diagnoser.evaluate.frame import frame_from_samples

    samples = []
    for i in range(61):
        t = T0 + 10 * i
        for le, per_step in (("0.1", 9), ("0.5", 9), ("1.0", 10), ("+Inf", 10)):
            samples.append(
                Sample("tenant_ttft_seconds_bucket", make_labels({"tenant": "acme", "le": le}), per_step * i, t)
            )
        acme = make_labels({"tenant": "acme"})
        samples += [
            Sample("tenant_ttft_seconds_sum", acme, 2.0 * i, t),
            Sample("tenant_ttft_seconds_count", acme, 10.0 * i, t),
            Sample("tenant_requests_total", acme, 10.0 * i, t),
            Sample("tenant_requests_total", make_labels({"tenant": "quiet"}), 1.0 * i, t),
        ]
    rows = ui_data.group_table(frame_from_samples(samples, T0, T0 + 600, 10), "tenant").set_index("tenant")
    assert rows.loc["acme", "mean TTFT (s)"] == pytest.approx(0.2)
    assert rows.loc["acme", "TTFT p95 (s)"] == pytest.approx(0.75)
    assert pd.isna(rows.loc["quiet", "mean TTFT (s)"]) and pd.isna(rows.loc["quiet", "TTFT p95 (s)"])


def test_tenant_rate_counts_a_counter_reset():
    """A tap restart halfway resets tenant_requests_total (600 -> 20) at 2 requests/s throughout:
    the mean rate is 2.0 (last minus first, 600 - 0 over 600 s, said 1.0)."""
    from kvscope.core.signals import Sample, make_labels
    from kvscope.diagnoser.evaluate.frame import frame_from_samples

    lab = make_labels({"tenant": "acme"})
    samples = [Sample("tenant_requests_total", lab, 20.0 * (i if i <= 30 else i - 30), T0 + 10 * i) for i in range(61)]
    table = ui_data.group_table(frame_from_samples(samples, T0, T0 + 600, 10), "tenant")
    assert table.set_index("tenant").loc["acme", "requests/s"] == pytest.approx(2.0, rel=0.05)


def test_tenant_ratios_of_two_instances_are_not_added_up():
    """Real recording: two taps (round robin and sticky) each report tenant-0's hit ratio
    (0.69 and 0.76 at the end); the table has a row per instance and no ratio above 1."""
    rec = Path(__file__).resolve().parents[1] / "recordings" / "round-robin-vs-sticky.om.gz"
    table = ui_data.load_triage(ui_data.SourceSpec("recording", str(rec))).frame
    rows = ui_data.group_table(table, "tenant")
    assert list(rows.columns[:2]) == ["tenant", "instance"]
    assert rows["hit ratio (latest)"].max() <= 1.0 and rows["lost reuse (latest)"].max() <= 1.0
    t0 = rows[rows["tenant"] == "tenant-0"].set_index("instance")["hit ratio (latest)"]
    assert t0.to_dict() == pytest.approx({"tap-0": 0.687, "tap-1": 0.756}, abs=0.001)
    assert rows["tenant"].tolist()[:6] == ["tenant-0", "tenant-0", "tenant-1", "tenant-1", "tenant-2", "tenant-2"]


def test_nothing_fired_but_signals_missing_is_not_shown_as_all_clear(monkeypatch, tmp_path):
    """A source none of whose series any rule reads: the page says the rules could not be
    evaluated instead of a green 'no rule fired'."""
    writer = RecordingWriter(tmp_path / "node.om")
    for i in range(10):
        writer.add_scrape(
            "node",
            "127.0.0.1:9100",
            T0 + 15 * i,
            parse_exposition("# TYPE node_load1 gauge\nnode_load1 0.5\n", openmetrics=False),
        )
    at = _app(monkeypatch, writer.close())
    at.run()
    assert not at.exception
    assert not at.success
    assert any("could not be evaluated" in i.value and "unknown, not healthy" in i.value for i in at.info)
    assert any("not evaluable" in c.value for c in at.caption)


def test_efficiency_page_says_which_gpu_utilisation_it_uses(monkeypatch):
    """Real DCGM recording of an idle decode fleet: GPU_UTIL reads ~94 %, engine activity ~22 %.
    The page must say it uses engine activity, and flag the utilisation trap."""
    rec = Path(__file__).resolve().parents[1] / "recordings" / "fleet-dcgm-utilization-trap.om.gz"
    at = _app(monkeypatch, rec).run()
    at.sidebar.radio[0].set_value("Efficiency").run()
    assert not at.exception
    assert {m.label: m.value for m in at.metric}["Mean GPU utilisation"] == "21.8%"
    assert any("DCGM graphics-engine activity" in c.value for c in at.caption)
    assert any("utilisation trap" in w.value for w in at.warning)


MODERATE = Path(__file__).resolve().parents[1] / "recordings" / "metrics-only-round-robin-2-steady.om.gz"


def test_an_inferred_cause_says_how_sure_and_what_would_confirm_it(monkeypatch):
    """Engine metrics only: routing is inferred, not seen; the card says so in the CLI's words,
    in a warning box under its What: line."""
    from kvscope.diagnoser.render import confidence_text, what_text

    likely = ui_data.load_triage(ui_data.SourceSpec("recording", str(MODERATE))).diagnosis.likely_cause
    assert likely is not None and likely.confidence == "moderate" and likely.confirm
    at = _app(monkeypatch, MODERATE).run()
    assert not at.exception
    assert f"**What:** {what_text(likely)}" in [m.value for m in at.markdown]
    assert f"**Confidence:** {confidence_text(likely)}" in [w.value for w in at.warning]
    assert likely.confirm in confidence_text(likely)


def test_a_triage_link_from_an_alert_shows_the_alert_and_the_findings_at_its_labels(monkeypatch, kv_incident):
    """What a generated alert's runbook_url opens (diagnoser/promql/runbooklinks.py)."""
    monkeypatch.delenv(ui_data.ENV_SERVE, raising=False)
    at = _app(monkeypatch, kv_incident)
    at.query_params["page"] = "Triage"
    at.query_params["alertname"] = "LlmKvPressurePreemption"
    at.query_params["window"] = "1h"
    at.query_params["label.instance"] = "127.0.0.1:8000"
    at.query_params["label.bad name"] = "dropped"
    at.run()
    assert not at.exception
    assert "Alert LlmKvPressurePreemption" in [h.value for h in at.header]
    text = " ".join(m.value for m in at.markdown)
    assert "**Labels:** instance=127.0.0.1:8000" in text and "**Window:** last 1h" in text
    assert "Findings at these labels:" in text and "dropped" not in text
    assert any("--serve-url" in c.value for c in at.caption)
    assert "Likely cause" in [h.value for h in at.header]  # the triage of the source follows


def _triage(data):
    from kvscope.ui import triage_page

    triage_page.render(data)


def _changes(data):
    from kvscope.ui import triage_page

    triage_page.render_changes(data)


def test_a_fleet_of_findings_shows_the_first_as_cards_and_the_rest_as_a_table_with_a_picker(kv_incident):
    """Hundreds of findings (a fleet's window): ranked cards for the first CARDS_SHOWN, then one
    table of the rest, and a picker that opens any of them as a card."""
    from dataclasses import replace

    from kvscope.diagnoser.findings import Diagnosis
    from kvscope.ui.triage_page import CARDS_SHOWN

    data = ui_data.load_triage(ui_data.SourceSpec("recording", str(kv_incident)))
    head = data.diagnosis.likely_cause
    assert head is not None
    other = tuple(
        replace(head, rule_id=f"rule_{i}", where={"instance": f"10.0.{i}.1:8000"}) for i in range(CARDS_SHOWN + 7)
    )
    d = Diagnosis(data.diagnosis.window, data.diagnosis.source, head, other=other)
    at = AppTest.from_function(_triage, args=(replace(data, diagnosis=d),), default_timeout=300).run()
    assert not at.exception
    assert "Other findings" in [h.value for h in at.header]
    shown = [e.label for e in at.expander if "10.0." in e.label]
    assert len(shown) == CARDS_SHOWN and shown[0].endswith("instance=10.0.0.1:8000")
    (table,) = [df.value for df in at.dataframe if "finding" in df.value.columns]
    assert len(table) == 7 and table["where"].iloc[0] == f"instance=10.0.{CARDS_SHOWN}.1:8000"
    assert list(table["rule"]) == [f"rule_{i}" for i in range(CARDS_SHOWN, CARDS_SHOWN + 7)]
    before = len(at.subheader)
    at.selectbox[0].set_value(6).run()
    assert len(at.subheader) == before + 1  # the picked finding's card
    assert any(f"instance=10.0.{CARDS_SHOWN + 6}.1:8000" in m.value for m in at.markdown)


def test_one_finding_on_many_instances_is_one_card_naming_them(kv_incident):
    """The same rule at 30 instances (repeats per replica) is one card of the worst, as the CLI
    lists it, with the instances named under it."""
    from dataclasses import replace

    from kvscope.diagnoser.findings import Diagnosis

    data = ui_data.load_triage(ui_data.SourceSpec("recording", str(kv_incident)))
    head = data.diagnosis.likely_cause
    assert head is not None
    other = tuple(replace(head, where={"instance": f"10.0.{i}.1:8000"}) for i in range(30))
    d = Diagnosis(data.diagnosis.window, data.diagnosis.source, head, other=other)
    at = AppTest.from_function(_triage, args=(replace(data, diagnosis=d),), default_timeout=300).run()
    assert not at.exception
    (label,) = [e.label for e in at.expander if "10.0." in e.label]
    assert label.endswith("30 instances, worst instance=10.0.0.1:8000")
    (names,) = [c.value for c in at.caption if c.value.startswith("The same finding on 30 instances")]
    assert "10.0.0.1:8000, 10.0.1.1:8000" in names and "10.0.29.1:8000" in names
    assert not [df for df in at.dataframe if "finding" in df.value.columns] and not at.selectbox


def test_the_triage_page_says_what_changed_with_the_verdicts_the_library_expects(monkeypatch):
    """A real vLLM recording with a KV cut and its inverse (engine restarted between phases): the
    triage page lists what changed, as `kvscope diagnose` does, with the verdicts at matched load
    written in the recording's YAML before it was diagnosed, and the lever follow-up."""
    import yaml

    library = Path(__file__).resolve().parents[1] / "recordings"
    expected = yaml.safe_load((library / "curve-vllm-config-changes.yaml").read_text())["expected_curve"]["changes"]
    at = _app(monkeypatch, library / "curve-vllm-config-changes.om.gz").run()
    assert not at.exception
    headers = [h.value for h in at.header]
    assert headers.index("Likely cause") < headers.index("What changed in this window")
    (table,) = [df.value for df in at.dataframe if "verdict" in df.value.columns]
    for want, (_, row) in list(zip(expected, table.iterrows(), strict=False))[:2]:  # the third: docs/curve.md
        assert (row["kind"], row["verdict"]) == (want["kind"], want["verdict"].replace("_", " "))
    assert "kv_capacity_tokens 8192 -> 640" in table["change"].iloc[0]
    assert table["lever follow-up"].iloc[1].startswith("lever follow-up:")

    # the fleet path reads no changes, and says where they are
    data = ui_data.load_triage(ui_data.SourceSpec("recording", str(library / "curve-vllm-config-changes.om.gz")))
    from dataclasses import replace

    live = replace(data, source=ui_data.SourceSpec("prometheus", "http://prom:9090", 3600.0))
    live = replace(live, diagnosis=replace(data.diagnosis, changes=()))
    at = AppTest.from_function(_changes, args=(live,), default_timeout=300).run()
    assert not at.exception and not at.header
    assert "the Operating point page reads each pool's curve and its changes" in at.caption[0].value
