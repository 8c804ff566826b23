"""Weekly report maths on a small fleet whose right answers are known by construction."""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvscope.core.signals import Sample, make_labels
from kvscope.diagnoser.sources.samples import SamplesSource
from kvscope.report.render import md_escape, render_html, render_markdown
from kvscope.report.weekly import (
    WEEK_S,
    build_report,
    columns,
    counter_increments,
    report_window,
)


def report_frame(samples):
    """The report's window of canonical samples, read as `kvscope report weekly --recording` reads."""
    return report_window(SamplesSource(list(samples), carry=False))


STEP = 900.0  # 15 min
END = 1_800_000_000.0  # a Saturday-ish epoch, any value works
T0 = END - 2 * WEEK_S


def _fleet(gpus: bool = True, tenants: bool = True, reset: bool = False) -> list[Sample]:
    """Two pools: m1 on node n1 (2 GPUs at 30 %), m2 on node n2 (1 GPU at 80 %).

    m1 generates 10 tok/s in week 1 and 20 tok/s in week 2; m2 5 tok/s throughout.
    """
    out = []
    ts = np.arange(T0, END + 1, STEP)
    gen = {"m1": 0.0, "m2": 0.0}
    for t in ts:
        for model, inst, node in (("m1", "a:8000", "n1"), ("m2", "b:8000", "n2")):
            rate = 5.0 if model == "m2" else (10.0 if t <= END - WEEK_S else 20.0)
            if t > T0:
                gen[model] += rate * STEP
            value = gen[model]
            if reset and model == "m2" and t >= END - WEEK_S / 2:
                value = gen[model] - gen_at_reset[0]
            labels = make_labels({"instance": inst, "model": model, "node": node, "job": "engines"})
            out.append(Sample("engine_generation_tokens_total", labels, value, t))
            out.append(Sample("engine_prompt_tokens_total", labels, 4 * value, t))
            out.append(Sample("engine_prefix_cache_queries_tokens_total", labels, 4 * value, t))
            out.append(Sample("engine_prefix_cache_hits_tokens_total", labels, value, t))
            if reset and model == "m2" and abs(t - (END - WEEK_S / 2) + STEP) < 1e-6:
                gen_at_reset[0] = gen[model] + 5.0 * STEP
        if gpus:
            for node, gpu, util in (("n1", "0", 0.3), ("n1", "1", 0.3), ("n2", "0", 0.8)):
                out.append(Sample("gpu_utilization_ratio", make_labels({"node": node, "gpu": gpu}), util, t))
        if tenants:
            for tenant, share, hit in (("acme", 0.75, 0.6), ("tail", 0.25, 0.05)):
                n = (t - T0) / STEP
                labels = make_labels({"tenant": tenant})
                out.append(Sample("tenant_requests_total", labels, 4 * share * n, t))
                out.append(Sample("tenant_prompt_tokens_total", labels, 1000 * share * n, t))
                out.append(Sample("tenant_cached_tokens_total", labels, 1000 * share * hit * n, t))
    return out


gen_at_reset = [0.0]


def test_tokens_gpu_hours_cost_and_trap_per_pool():
    report = build_report(report_frame(_fleet()), END, gpu_hour_cost=2.0, source="test")
    pools = report.this.pools
    assert pools.loc["m1 / unified", "output_tokens"] == pytest.approx(20.0 * WEEK_S)
    assert pools.loc["m2 / unified", "output_tokens"] == pytest.approx(5.0 * WEEK_S)
    assert pools.loc["m1 / unified", "gpu_hours"] == pytest.approx(2 * 7 * 24)
    assert pools.loc["m1 / unified", "gpu_util"] == pytest.approx(0.3)
    assert pools.loc["m1 / unified", "tokens_per_gpu_hour"] == pytest.approx(20.0 * 3600 / 2)
    assert bool(pools.loc["m1 / unified", "utilisation_trap"]) and not bool(
        pools.loc["m2 / unified", "utilisation_trap"]
    )
    assert pools.loc["m2 / unified", "usd_per_1m_tokens"] == pytest.approx(2.0 * 168 / (5.0 * WEEK_S) * 1e6)
    fleet = report.this.fleet
    assert fleet["gpu_hours"] == pytest.approx(3 * 168)
    assert fleet["gpu_util"] == pytest.approx((0.3 * 2 + 0.8) / 3)
    assert fleet["hit_ratio"] == pytest.approx(0.25)
    assert fleet["prefill_tokens_saved"] == pytest.approx(25.0 * WEEK_S)


def test_week_over_week_deltas():
    report = build_report(report_frame(_fleet()), END, gpu_hour_cost=2.0, source="test")
    d = report.deltas()
    assert d["output_tokens"] == pytest.approx(25 / 15 - 1)
    assert d["gpu_hours"] == pytest.approx(0.0, abs=1e-9)


def test_counter_reset_is_not_a_negative_increase():
    samples = _fleet(gpus=False, tenants=False, reset=True)
    ss = report_frame(samples)
    _, inc = counter_increments(columns(ss), "engine_generation_tokens_total")
    assert (inc >= 0).all() and inc.sum() > 0
    report = build_report(ss, END, 2.0, "test")
    assert report.this.pools.loc["m2 / unified", "output_tokens"] == pytest.approx(5.0 * WEEK_S, rel=0.01)


def test_absent_gpus_stay_absent_not_zero():
    report = build_report(report_frame(_fleet(gpus=False)), END, 2.0, "test")
    assert report.this.fleet["gpu_hours"] is None
    assert report.this.fleet["tokens_per_gpu_hour"] is None
    md = render_markdown(report)
    assert "| Output tokens / GPU-hour | absent |" in md
    assert "cannot be computed" in md


def test_tenants_usage_and_hit_ratio():
    tenants = build_report(report_frame(_fleet()), END, 2.0, "test").this.tenants
    assert list(tenants.index) == ["acme", "tail"]
    assert tenants.loc["tail", "hit_ratio"] == pytest.approx(0.05)
    assert tenants.loc["acme", "requests"] == pytest.approx(4 * 0.75 * WEEK_S / STEP)


def test_tenants_slo_attainment_from_ttft_buckets_and_upstream_errors():
    samples = _fleet()
    n_points = {s.timestamp for s in samples}
    for t in sorted(n_points):
        n = (t - (END - 2 * WEEK_S)) / STEP
        for tenant, slow, failed in (("acme", 0.02, 0.001), ("tail", 0.5, 0.0)):
            lab = {"tenant": tenant}
            total = 4 * n
            samples.append(
                Sample("tenant_ttft_seconds_bucket", make_labels({**lab, "le": "1.0"}), total * (1 - slow), t)
            )
            samples.append(Sample("tenant_ttft_seconds_bucket", make_labels({**lab, "le": "2.5"}), total, t))
            samples.append(Sample("tenant_ttft_seconds_bucket", make_labels({**lab, "le": "+Inf"}), total, t))
            if tenant == "acme":  # the tail tenant is seen through traces only: no error counter
                samples.append(Sample("tenant_request_errors_total", make_labels(lab), 4 * 0.75 * n * failed, t))
    report = build_report(report_frame(samples), END, 2.0, "test")
    tenants = report.this.tenants
    assert tenants.loc["acme", "ttft_slo"] == pytest.approx(0.98)
    assert tenants.loc["tail", "ttft_slo"] == pytest.approx(0.5)
    assert tenants.loc["acme", "error_slo"] == pytest.approx(0.999)
    assert pd.isna(tenants.loc["tail", "error_slo"])  # absent, not 100 %
    md = render_markdown(report)
    assert "TTFT within 1s (SLO 0.99)" in md and "No upstream error (SLO 0.999)" in md
    assert "| tail |" in md and "| absent |" in md


def test_tenants_goodput_is_the_taps_exact_share_and_absent_without_its_counts():
    samples = _fleet()
    for t in sorted({s.timestamp for s in samples}):
        n = (t - (END - 2 * WEEK_S)) / STEP
        lab = make_labels({"tenant": "acme", "model": "m1"})
        samples.append(Sample("goodput_requests_total", lab, 3 * n, t))
        samples.append(Sample("goodput_good_requests_total", lab, 2.7 * n, t))
    report = build_report(report_frame(samples), END, 2.0, "test")
    assert report.this.tenants.loc["acme", "goodput"] == pytest.approx(0.9)
    assert pd.isna(report.this.tenants.loc["tail", "goodput"])  # no tap count: absent, not 0
    assert "Goodput, exact (tap)" in render_markdown(report)


def test_no_previous_week_gives_no_deltas():
    late = [s for s in _fleet() if s.timestamp > END - WEEK_S]
    report = build_report(report_frame(late), END, 2.0, "test")
    assert report.previous is None
    assert all(v is None for v in report.deltas().values())


def test_html_embeds_plots_and_markdown_has_sections():
    report = build_report(report_frame(_fleet()), END, 2.0, "test")
    page = render_html(report)
    assert page.count("data:image/png;base64,") == 4
    assert "utilisation trap" in page
    md = render_markdown(report)
    for section in ("## Fleet", "## Utilisation", "## Per model / pool", "## Tenants", "## Top findings"):
        assert section in md


def test_report_from_the_agent_sqlite_store_matches_the_samples(tmp_path):
    from kvscope.agent.store.sqlite import SqliteStore
    from kvscope.diagnoser.sources.samples import StoreSource

    samples = [s for s in _fleet() if s.timestamp > END - WEEK_S - STEP]
    store = SqliteStore(tmp_path / "kvscope.sqlite", retention_s=10 * 365 * 86400, background=False)
    store.write(samples)
    store.flush()
    store.close()
    via_store = build_report(report_window(StoreSource(tmp_path / "kvscope.sqlite", carry=False), END), END, 2.0, "s")
    direct = build_report(report_frame(samples), END, 2.0, "direct")
    assert via_store.this.fleet["output_tokens"] == pytest.approx(direct.this.fleet["output_tokens"])
    assert via_store.this.fleet["gpu_hours"] == pytest.approx(direct.this.fleet["gpu_hours"])
    assert list(via_store.this.tenants.index) == list(direct.this.tenants.index)


def test_cli_writes_html_and_markdown_from_a_recording(tmp_path, capsys):
    from test_ui_apptest import write_kv_incident

    from kvscope.cli import main

    rec = write_kv_incident(tmp_path / "kv.om")
    assert (
        main(
            [
                "report",
                "weekly",
                "--recording",
                str(rec),
                "--html",
                str(tmp_path / "w.html"),
                "--markdown",
                str(tmp_path / "w.md"),
                "--no-progress",
            ]
        )
        == 0
    )
    md = (tmp_path / "w.md").read_text()
    assert "## Top findings" in md and "LEVERS" not in md
    assert "kv_pressure" in md or "eviction_rate" in md  # the week's findings come from the diagnoser
    assert "| Output tokens / GPU-hour | absent |" in md
    assert (tmp_path / "w.html").read_text().startswith("<!doctype html>")


def test_utilisation_prefers_graphics_engine_activity_over_gpu_util():
    """GPU_UTIL says a kernel ran; where DCGM profiling reports engine activity, the report uses it."""
    samples = _fleet(tenants=False)
    samples += [
        Sample("gpu_graphics_engine_active_ratio", s.labels, 0.1, s.timestamp)
        for s in samples
        if s.name == "gpu_utilization_ratio"
    ]
    report = build_report(report_frame(samples), END, 2.0, "test")
    assert report.this.utilisation_signal == "gpu_graphics_engine_active_ratio"
    assert report.this.fleet["gpu_util"] == pytest.approx(0.1)
    assert "graphics-engine activity" in render_markdown(report)


LIBRARY_TRAP = Path(__file__).resolve().parents[1] / "recordings" / "fleet-dcgm-utilization-trap.om.gz"


def test_real_dcgm_fleet_recording_is_in_the_utilisation_trap():
    """On the library's DCGM fleet (GPU_UTIL ~94 %, engine activity ~22 %), the numbers come from
    the recorded series: GPU-hours = GPUs x covered time, utilisation = engine activity."""
    from kvscope.agent.recording.replay import replay_recording

    replay = replay_recording(LIBRARY_TRAP)
    engine_active = [s for s in replay.samples if s.name == "gpu_graphics_engine_active_ratio"]
    gpus = {s.label("gpu_uuid") for s in engine_active}
    report = build_report(report_frame(replay.samples), replay.end + 1, 2.5, "library")
    fleet = report.this.fleet
    assert fleet["gpu_util"] == pytest.approx(np.mean([s.value for s in engine_active]), abs=0.02)
    assert fleet["gpu_util"] < 0.4
    assert fleet["gpu_hours"] == pytest.approx(len(gpus) * (replay.end - replay.start) / 3600, rel=0.05)
    assert "utilisation trap" in render_markdown(report)


LIBRARY_CASCADE = Path(__file__).resolve().parents[1] / "recordings" / "kv-pressure-cascade.om.gz"


def test_a_real_incident_is_one_top_finding_with_its_supporting_findings(tmp_path):
    """On the library's KV-pressure recording the diagnoser's likely cause has supporting
    findings; the report lists them under it, not as top findings of their own."""
    from kvscope.cli import main
    from kvscope.diagnoser.sources.recording import RecordingSource
    from kvscope.ui.data import SourceSpec, triage_from_recording

    source = RecordingSource(LIBRARY_CASCADE, spans=False)  # as the report reads it
    diagnosis = triage_from_recording(SourceSpec("recording", str(LIBRARY_CASCADE)), source).diagnosis
    assert diagnosis.likely_cause is not None and diagnosis.supporting
    assert (
        main(
            [
                "report",
                "weekly",
                "--recording",
                str(LIBRARY_CASCADE),
                "--markdown",
                str(tmp_path / "w.md"),
                "--no-progress",
            ]
        )
        == 0
    )
    md = (tmp_path / "w.md").read_text()
    rows = [line for line in md.split("## Top findings")[1].splitlines() if line.startswith("| ")][1:]
    head = next(r for r in rows if f"({diagnosis.likely_cause.rule_id})" in r)
    for f in diagnosis.supporting:
        assert f"({f.rule_id})" in head.split("supported by:")[1]
        assert sum(f"({f.rule_id})" in r for r in rows) == 1
    # the likely cause's levers by title, what to do now before what fixes it for good
    from kvscope.diagnoser.actions import plan

    now, fix = plan(diagnosis.likely_cause)
    header = next(line for line in md.split("## Top findings")[1].splitlines() if line.startswith("| "))
    assert header.index("Do now") < header.index("Fix for good")
    assert now[0].title in head and fix[0].title in head and head.index(now[0].title) < head.index(fix[0].title)
    assert now[0].id not in head


def test_unattributed_gpus_say_why_and_a_gpu_mapping_attributes_them(tmp_path, capsys):
    """The library's DCGM fleet has GPU series without pod labels and engine series without a node:
    no join can place its GPUs, and the report says which labels are missing and what fixes it;
    the same recording with --gpu-mapping splits the GPU-hours onto the model's pool."""
    from kvscope.agent.recording.replay import replay_recording
    from kvscope.cli import main

    assert build_report(report_frame(_fleet()), END, 2.0, "test").attribution == ""  # node join
    replay = replay_recording(LIBRARY_TRAP)
    report = build_report(report_frame(replay.samples), replay.end + 1, 2.5, "library")
    assert "8 GPU(s) on node-0, node-1 are not attributed" in report.attribution
    assert "no pod/namespace labels" in report.attribution and "no node label" in report.attribution
    assert "gpu_mapping" in report.attribution
    assert md_escape(report.attribution) in render_markdown(report)

    uuids = sorted({s.label("gpu_uuid") for s in replay.samples if s.name == "gpu_utilization_ratio"})
    mapping = tmp_path / "gpus.yaml"
    mapping.write_text("".join(f"{u}: replica-{i}\n" for i, u in enumerate(uuids)))
    md_path = tmp_path / "w.md"
    assert (
        main(
            [
                "report",
                "weekly",
                "--recording",
                str(LIBRARY_TRAP),
                "--gpu-mapping",
                str(mapping),
                "--markdown",
                str(md_path),
                "--no-progress",
            ]
        )
        == 0
    )
    md = md_path.read_text()
    assert "unattributed" not in md and "not attributed" not in md
    head = next(line for line in md.splitlines() if line.startswith("| Pool |"))
    row = next(line for line in md.splitlines() if line.startswith("| meta-llama/Llama-3.1-8B-Instruct / unified"))
    gpu_hours = float(row.split("|")[[c.strip() for c in head.split("|")].index("GPU-hours")])
    assert gpu_hours == pytest.approx(report.this.fleet["gpu_hours"], abs=0.05)

    mapping.write_text("- not a mapping\n")
    assert (
        main(["report", "weekly", "--recording", str(LIBRARY_TRAP), "--gpu-mapping", str(mapping), "--no-progress"])
        == 3
    )
    assert "--gpu-mapping" in capsys.readouterr().err


def test_a_node_shared_by_two_pools_is_named_as_the_reason():
    """Both engines on n1: its GPUs cannot be split by node, and the note does not ask for node labels."""
    samples = [
        s._replace(labels=make_labels({**dict(s.labels), "node": "n1"})) if s.name.startswith("engine_") else s
        for s in _fleet(tenants=False)
    ]
    report = build_report(report_frame(samples), END, 2.0, "test")
    assert "3 GPU(s) on n1, n2 are not attributed" in report.attribution
    assert "n1 run engines of more than one pool" in report.attribution
    assert "labels: {node:" not in report.attribution
    assert report.this.fleet["gpu_hours"] == pytest.approx(3 * 7 * 24, rel=0.01)  # fleet totals count them


def test_a_llamacpp_fleet_gets_its_tokens_and_cache_and_says_what_it_lacks(tmp_path):
    """The real llama.cpp recording: tokens and the prompt cache come from llama.cpp's own
    counters; it exports no GPU series, so GPU-hours and cost are absent, never 0."""
    from kvscope.cli import main

    rec = LIBRARY_CASCADE.parent / "llamacpp-saturated.om.gz"
    assert (
        main(["report", "weekly", "--recording", str(rec), "--markdown", str(tmp_path / "w.md"), "--no-progress"]) == 0
    )
    md = (tmp_path / "w.md").read_text()
    fleet = {
        row.split("|")[1].strip(): row.split("|")[2].strip()
        for row in md.split("## Fleet")[1].split("##")[0].splitlines()
        if row.startswith("| ")
    }
    assert int(fleet["Output tokens"].replace(",", "")) > 0
    assert fleet["GPU-hours"] == "absent" and fleet["GPU cost"] == "absent"
    assert "GPU utilisation is absent from this source" in md


HOSTILE_MODEL = "evil|model`code` [x](http://e.example) <img src=x onerror=alert(1)>\n# Owned *bold* _it_"
HOSTILE_TENANT = "t|en`ant[1]<b>\r\n| injected | row |"


def _relabel(samples: list[Sample], key: str, old: str, new: str) -> list[Sample]:
    return [
        Sample(s.name, make_labels({**dict(s.labels), key: new}), s.value, s.timestamp)
        if dict(s.labels).get(key) == old
        else s
        for s in samples
    ]


def test_markdown_escapes_hostile_model_and_tenant_labels():
    samples = _relabel(_relabel(_fleet(), "model", "m1", HOSTILE_MODEL), "tenant", "acme", HOSTILE_TENANT)
    md = render_markdown(build_report(report_frame(samples), END, 2.0, "test|`src`"))
    lines = md.splitlines()

    def cells(line: str) -> int:  # table cells: pipes not escaped by a backslash
        return len([i for i, c in enumerate(line) if c == "|" and (i == 0 or line[i - 1] != "\\")]) - 1

    for table in ("| Pool |", "| Tenant |"):
        head = lines.index(next(ln for ln in lines if ln.startswith(table)))
        body = lines[head + 2 : lines.index("", head)]
        assert body and all(cells(row) == cells(lines[head]) for row in body), body
    assert not re.search(r"(?<!\\)<(img|b>)", md) and "[x](" not in md  # every < is escaped: no tag
    assert "# Owned" not in lines and not any(ln.startswith("| injected") for ln in lines)
    assert r"evil\|model\`code\` \[x\](http://e.example) \<img src=x onerror=alert(1)\> # Owned *bold* _it_" in md
    assert r"t\|en\`ant\[1\]\<b\> \| injected \| row \|" in md
    assert "&lt;" not in md and "&gt;" not in md and "&amp;" not in md  # no HTML entities in the Markdown
    assert r"test\|\`src\`" in md


def _efficiency_samples() -> list[Sample]:
    """m1 (vLLM): the MFU estimate at 1 TFLOP/s and 2 + 0.5 GB/s per GPU, 0.01 preemptions/s with
    400-token prompts (no recomputed count), the device cache serving 1 token/s, a host source
    pre-created at 0; m2 (SGLang): 5 % of its 40 prompt tokens/s recomputed after retractions,
    LMCache retrieving 2 tokens/s. The flat estimate of a third engine (flag off) adds nothing."""
    out = []
    for k, t in enumerate(np.arange(T0, END + 1, STEP)):
        s = k * STEP
        m1 = make_labels({"instance": "a:8000", "model": "m1", "node": "n1"})
        m2 = make_labels({"instance": "b:8000", "model": "m2", "node": "n2"})
        off = make_labels({"instance": "c:8000", "model": "m1", "node": "n1"})
        out += [
            Sample("engine_estimated_flops_per_gpu_total", m1, 1e12 * s, t),
            Sample("engine_estimated_read_bytes_per_gpu_total", m1, 2e9 * s, t),
            Sample("engine_estimated_write_bytes_per_gpu_total", m1, 0.5e9 * s, t),
            Sample("engine_estimated_flops_per_gpu_total", off, 0.0, t),
            Sample("engine_preemptions_total", m1, 0.01 * s, t),
            Sample("engine_requests_finished_total", m1, 0.1 * s, t),
            Sample("engine_prompt_tokens_total", m1, 40 * s, t),
            Sample("engine_preemptions_total", m2, 0.02 * s, t),
            Sample("engine_preempted_prompt_tokens_total", m2, 2 * s, t),
            Sample("engine_prompt_tokens_total", m2, 40 * s, t),
            Sample("engine_prompt_tokens_cached_total", make_labels({**dict(m1), "source": "device"}), 1 * s, t),
            Sample("engine_prompt_tokens_cached_total", make_labels({**dict(m1), "source": "host"}), 0.0, t),
            Sample("kv_tier_loaded_tokens_total", make_labels({**dict(m2), "tier": "lmcache"}), 2 * s, t),
        ]
    return out


def test_efficiency_compute_per_gpu_recompute_tax_and_tier_savings():
    eff = build_report(report_frame(_efficiency_samples()), END, 2.0, "test").this.efficiency
    assert eff.compute.loc["m1 / unified", "tflops_per_gpu"] == pytest.approx(1.0)
    assert eff.compute.loc["m1 / unified", "gb_per_s_per_gpu"] == pytest.approx(2.5)
    assert "m2 / unified" not in eff.compute.index  # no estimate there: absent, not 0
    assert eff.compute.loc["fleet", "tflops_per_gpu"] == pytest.approx(1.0)  # the flat engine counts nothing
    rec = eff.recompute
    assert (
        rec.loc["m2 / unified", "recompute_share"] == pytest.approx(0.05) and not rec.loc["m2 / unified", "estimated"]
    )
    # vLLM: 0.01 preemptions/s x 400 prompt tokens per request = 4 of 40 tokens/s, estimated
    assert rec.loc["m1 / unified", "recompute_share"] == pytest.approx(0.1) and rec.loc["m1 / unified", "estimated"]
    assert eff.tiers["device (engine cache)"] == pytest.approx(WEEK_S)
    assert eff.tiers["lmcache tier (loaded)"] == pytest.approx(2 * WEEK_S)
    assert "host (engine cache)" not in eff.tiers  # pre-created at 0: no tier that served anything


def test_efficiency_sections_say_not_exported_instead_of_zero():
    md = render_markdown(build_report(report_frame(_fleet()), END, 2.0, "test"))
    for title in ("Compute per GPU", "Preemption recompute tax"):
        section = md.split(f"## {title}")[1].split("##")[0]
        assert "not exported by these engines" in section and "| 0" not in section
    tiers = md.split("## Cache savings per tier")[1].split("##")[0]
    assert "device (GPU prefix cache)" in tiers  # the fleet's prefix-cache hits, with no per-source split
    full = render_markdown(build_report(report_frame(_efficiency_samples()), END, 2.0, "test"))
    assert "| m1 / unified | 1.0 | 2.5 |" in full and "(est.)" in full and "lmcache tier (loaded)" in full


def test_top_findings_say_not_diagnosed_when_no_diagnosis_looked():
    """Issue 57: a --store report (no diagnosis run) or one whose rules could not look at the week
    printed "No findings this week." - an all-clear where nothing was judged."""
    from kvscope.diagnoser.findings import Diagnosis, Skipped

    frame = report_frame(_fleet())
    blind = Diagnosis(
        window=(0.0, 1.0),
        source="s",
        likely_cause=None,
        skipped=(Skipped("a", "signal(s) absent: x"),),
        rules_evaluated=1,
    )
    looked = Diagnosis(window=(0.0, 1.0), source="s", likely_cause=None, rules_evaluated=1)
    unread = render_markdown(build_report(frame, END, 2.0, "store s"))
    assert "Not diagnosed: no diagnosis was run over this source" in unread and "No findings this week" not in unread
    none_looked = render_markdown(build_report(frame, END, 2.0, "s", diagnoses=[blind]))
    assert "Not diagnosed: none of the rules could look at the week" in none_looked
    assert "No findings this week." in render_markdown(build_report(frame, END, 2.0, "s", diagnoses=[looked]))
