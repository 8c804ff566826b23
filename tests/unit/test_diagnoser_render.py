"""How `kvscope diagnose` presents a Diagnosis to an on-call SRE: grouping by mechanism, how each
evidence value was taken, the windows actually used, why nothing fired, repeats per replica."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from kvscope.diagnoser.evaluate.expr import promql
from kvscope.diagnoser.findings import Diagnosis, Evidence, Finding, LeverAdvice, Skipped, same_mechanism
from kvscope.diagnoser.promql.series import SeriesCompiler, prom_duration
from kvscope.diagnoser.render import (
    baseline_lines,
    fact_rows,
    group_repeats,
    render_diagnosis,
    render_not_fired,
    render_taken,
    shown_evidence,
)
from kvscope.diagnoser.rulebook.rule import parse_yaml, rule_from_doc
from kvscope.diagnoser.values import fill_summary, fmt_number, fmt_value

T0 = 1_700_000_000.0
RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"


def _levers(*ids: str) -> tuple[LeverAdvice, ...]:
    return tuple(LeverAdvice(id=x, rank=i, direction="set", title=x) for i, x in enumerate(ids, 1))


def _finding(
    rule_id: str,
    row: str,
    levers: tuple[str, ...],
    where: dict[str, str] | None = None,
    summary: str = "something measured",
    evidence: tuple[Evidence, ...] = (),
) -> Finding:
    return Finding(
        rule_id=rule_id,
        levers_md=row,
        title=f"title of {rule_id}",
        severity="warning",
        where=where if where is not None else {"instance": "replica-0"},
        since=T0,
        until=T0 + 60,
        active=False,
        window=(T0 - 60, T0 + 120),
        step_s=15.0,
        score=1.0,
        summary=summary,
        evidence=evidence,
        levers=_levers(*levers),
    )


def _text(d: Diagnosis, verbose: bool = False) -> str:
    console = Console(record=True, width=220, color_system=None)
    render_diagnosis(d, console=console, verbose=verbose)
    return console.export_text()


KV_LEVERS = ("vllm.kv_cache_dtype", "vllm.gpu_memory_utilization", "vllm.max_num_seqs", "gateway.admission_control")


def test_same_mechanism_is_supporting_evidence_not_a_competing_hypothesis():
    head = _finding("kv_pressure_cascade", "K2", KV_LEVERS)
    k3 = _finding("eviction_rate_high", "K3", KV_LEVERS[:3])
    other_mech = _finding("itl_tail_prefill_interference", "L4", ("vllm.enable_chunked_prefill",))
    d = Diagnosis(window=head.window, source="t", likely_cause=head, competing=(k3, other_mech), rules_evaluated=3)
    assert same_mechanism(head, k3) and not same_mechanism(head, other_mech)
    assert d.supporting == (k3,) and d.hypotheses == (other_mech,)
    text = _text(d)
    assert text.count("COMPETING HYPOTHESIS") == 1
    assert "also fired (supporting evidence" in text
    supporting_line = next(line for line in text.splitlines() if "title of eviction_rate_high" in line)
    assert "warning  title of eviction_rate_high: something measured" in supporting_line
    assert text.count("vllm.max_num_seqs: ") == 1  # the supporting finding is a line, not a card with levers


def test_evidence_has_readable_units_and_thresholds_and_a_competing_card_shows_labels():
    """Ratios as %, rates as /s, seconds as ms, counts bare; the competing card's place is labels."""
    evidence = (
        Evidence("KV cache usage", 0.987, "ratio", "max(engine_kv_cache_usage_ratio)", threshold=0.9, op=">="),
        Evidence("preemptions", 4.42, "per_second", "rate(engine_preemptions_total[1m])"),
        Evidence("mean TTFT", 0.25, "seconds", "ttft_mean"),
        Evidence("waiting requests", 6.0, "count", "engine_requests_waiting"),
    )
    head = replace(_finding("kv_pressure_preemption", "K1", KV_LEVERS, evidence=evidence), until=T0 + 90)
    other = _finding("itl_tail_prefill_interference", "L4", ("vllm.enable_chunked_prefill",))
    text = _text(Diagnosis(window=head.window, source="t", likely_cause=head, competing=(other,), rules_evaluated=2))
    for row in (
        r"KV cache usage +98\.7% +>= 90\.0% ",
        r"preemptions +4\.42 /s ",
        r"mean TTFT +250\.0 ms ",
        r"waiting requests +6 ",
    ):
        assert re.search(row, text), row
    assert "(until 2023-11-14 22:14:50 UTC, 1m30s)" in text and "2 fired, 0 not evaluable" in text
    card = text[text.index("COMPETING HYPOTHESIS") :]
    assert "(rule itl_tail_prefill_interference)" in card and "where: instance=replica-0" in card
    assert "{'instance'" not in text


def test_same_family_and_lead_lever_is_the_same_mechanism_but_a_shared_lever_alone_is_not():
    head = _finding("fleet_util_low", "U1", ("k8s.colocation", "k8s.hpa_behavior"))
    assert same_mechanism(head, _finding("x", "U3", ("k8s.colocation", "k8s.replicas")))
    assert not same_mechanism(head, _finding("fleet_oversized", "U6", ("k8s.replicas", "k8s.hpa_behavior")))
    assert not same_mechanism(head, _finding("x", "U2", ()))


def test_supporting_needs_the_same_place():
    head = _finding("kv_pressure_cascade", "K2", KV_LEVERS)
    elsewhere = _finding("eviction_rate_high", "K3", KV_LEVERS[:3], where={"instance": "replica-9"})
    d = Diagnosis(window=head.window, source="t", likely_cause=head, other=(elsewhere,), rules_evaluated=2)
    assert d.supporting == ()
    assert "Other findings" in _text(d)


def test_each_value_says_how_it_was_taken():
    ev_peak = Evidence("preemptions", 7.25, "per_second", "s", at=T0 + 42, stat="max")
    ev_mean = Evidence("preemptions", 4.42, "per_second", "s", at=None, stat="mean")
    ev_first = Evidence("hit", 0.3, "ratio", "s", at=T0, stat="first")
    f = _finding("r", "K1", ("a",), evidence=(ev_peak, ev_mean, ev_first))
    assert render_taken(f, ev_peak) == "peak at 22:14:02"
    assert render_taken(f, ev_mean) == "mean 22:13:20-22:14:20"
    assert render_taken(f, ev_first) == "at onset 22:13:20"
    assert render_taken(f, replace(ev_peak, value=None)) == ""


def _rule(time_scale: float):
    doc = parse_yaml(
        "id: r\nby: [instance]\nseries:\n  u: {gauge: gpu_utilization_ratio, agg: avg}\n"
        "  u_avg: {over_time: avg, of: u, range: 1h}\n  p: {rate: engine_preemptions_total, range: 5m}\n"
    )
    return rule_from_doc(doc, "r.yaml").scaled(time_scale)


def test_promql_prints_the_scaled_range_actually_evaluated():
    assert "[5m]" in promql(_rule(1.0), "p") and "[1h:15s]" in promql(_rule(1.0), "u_avg")
    assert "rate(engine_preemptions_total[27s])" in promql(_rule(0.09), "p")
    assert "[39m19s800ms:15s]" in promql(_rule(0.6555), "u_avg")  # no grid: exact, as scaled


def test_promql_with_the_grid_step_prints_the_whole_steps_the_evaluator_uses():
    assert "[5m]" in promql(_rule(1.0), "p", step=15.0)  # 20 steps: as written
    assert "rate(engine_preemptions_total[30s])" in promql(_rule(0.09), "p", step=10.0)  # 27 s -> 3 steps
    assert "rate(engine_preemptions_total[5m1s])" in promql(_rule(1.0), "p", step=7.0)  # 42.9 -> 43 steps = 301 s
    assert "rate(engine_preemptions_total[4s])" in promql(_rule(0.0001), "p", step=2.0)  # a rate: two steps at least
    assert "[2s:2s]" in promql(_rule(0.0001), "u_avg", step=2.0)  # any other range: never below one step


def test_evidence_promql_is_the_rule_compilers_text_over_canonical_names():
    """One writer: the evidence text is what promql/series.py writes for the alert files, with
    the canonical names in place of the recorded `kvscope:` series, on one line, and its ranges
    as the rule wrote them (the alert files' are one millisecond longer, promql/ranges.py)."""
    rule = _rule(1.0)
    recorded = " ".join(SeriesCompiler(rule).expr("u_avg").split())
    assert "[1h1ms:15s]" in recorded
    assert promql(rule, "u_avg") == recorded.replace("kvscope:", "").replace("[1h1ms:", "[1h:")
    assert promql(rule, "u_avg") == "avg_over_time((avg by (instance) (gpu_utilization_ratio))[1h:15s])"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(81, "1m21s"), (3600, "1h"), (0.2, "200ms"), (2359.8, "39m19s800ms"), (10.001, "10s1ms"), (120, "2m")],
)
def test_durations_are_exact(seconds, text):
    assert prom_duration(seconds) == text


def test_nothing_fired_says_how_many_rules_could_look_and_what_was_missing():
    skipped = (
        Skipped("a", "signal(s) absent: gpu_utilization_ratio, x_total"),
        Skipped("b", "signal(s) absent: gpu_utilization_ratio"),
        Skipped("c", "parameter(s) not set: benchmark_ttft_p99_s"),
    )
    d = Diagnosis(window=(T0, T0 + 60), source="t", likely_cause=None, skipped=skipped, rules_evaluated=10)
    line = render_not_fired(d)
    assert "No rule fired among 7 evaluable; 3 could not be evaluated" in line
    assert "gpu_utilization_ratio (2 rules)" in line and "x_total (1 rules)" in line
    assert "nothing to act on" not in _text(d)
    clean = Diagnosis(window=(T0, T0 + 60), source="t", likely_cause=None, rules_evaluated=10)
    assert "among 10 evaluable rules" in render_not_fired(clean)


def test_one_symptom_on_several_replicas_is_one_line_with_the_worst_first():
    head = _finding("prefix_hits_diluted_across_replicas", "P2", ("router.routing_policy",), where={"model": "m"})
    reps = tuple(
        _finding(
            "ttft_both_degraded",
            "L2",
            ("ops.rebenchmark",),
            where={"instance": f"replica-{i}"},
            summary=f"TTFT p50 0.{i}s",
        )
        for i in (5, 7, 1)
    )
    groups = group_repeats(reps)
    assert len(groups) == 1 and groups[0][0] is reps[0] and len(groups[0][1]) == 3
    d = Diagnosis(window=head.window, source="t", likely_cause=head, other=reps, rules_evaluated=4)
    lines = [x for x in _text(d).splitlines() if "ttft_both_degraded" in x or "title of ttft" in x]
    assert len(lines) == 1
    assert "3 instances: replica-5, replica-7, replica-1" in lines[0] and "worst (instance=replica-5)" in lines[0]


def test_summary_that_repeats_the_title_is_not_printed_twice_and_absent_alternatives_are_hidden():
    evidence = (
        Evidence("draft acceptance", 0.2, "ratio", "s"),
        Evidence("draft acceptance (SGLang)", None, "ratio", "s"),
        Evidence("hit rate (tap)", None, "ratio", "s"),
    )
    f = replace(_finding("spec", "L10", ("vllm.speculative_config",), evidence=evidence), summary="title of spec")
    assert [e.name for e in shown_evidence(f)] == ["draft acceptance", "hit rate (tap)"]
    text = _text(Diagnosis(window=f.window, source="t", likely_cause=f, rules_evaluated=1))
    assert text.count("title of spec") == 1
    assert "(SGLang)" not in text
    only_sglang = replace(
        f,
        evidence=(
            Evidence("draft acceptance", None, "ratio", "s"),
            Evidence("draft acceptance (SGLang)", None, "ratio", "s"),
        ),
    )
    assert len(shown_evidence(only_sglang)) == 2  # nothing present: both stay, absent is information


def test_engine_facts_the_rule_conditions_on_are_shown():
    f = _finding("prefix_caching_disabled", "P1", ("vllm.enable_prefix_caching",))
    assert fact_rows(f) == [("engine fact enable_prefix_caching", "False", "from the engine's startup config")]
    assert "engine fact enable_prefix_caching" in _text(
        Diagnosis(window=f.window, source="t", likely_cause=f, rules_evaluated=1)
    )


def _diagnose(name: str) -> Diagnosis:
    from kvscope.diagnoser.evaluate.evaluator import diagnose, sample_names
    from kvscope.diagnoser.rulebook.rule import read_rules
    from kvscope.diagnoser.sources.recording import RecordingSource

    source = RecordingSource(RECORDINGS / f"{name}.om.gz")
    rules = read_rules()
    frame = source.read_frame(set().union(*(sample_names(r) for r in rules)), None, None, source.natural_step())
    return diagnose(frame, rules, source=source.description, workers=1)


def test_kv_pressure_cascade_recording_reads_as_one_cause_with_supporting_evidence():
    d = _diagnose("kv-pressure-cascade")
    assert d.likely_cause is not None and d.likely_cause.levers_md == "K2"
    assert {f.levers_md for f in d.supporting} == {"K1", "K3"} and d.hypotheses == ()
    text = _text(d)
    assert "COMPETING HYPOTHESIS" not in text
    assert "were shortened to 15% of their usual length" in text
    # the ranges used, not the rule's 1m: 1m x0.15 = 9 s, evaluated as 4 whole steps of the 2 s grid
    assert "[1m]" not in text and "[9s]" not in text and "[8s]" in text
    evidence = [ev for f in (d.likely_cause, *d.supporting) for ev in f.evidence]
    assert {ev.stat for ev in evidence} >= {"max", "mean"} and None not in {ev.stat for ev in evidence}
    k2_preempt = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("preemptions"))
    assert "peak at" in k2_preempt


def test_a_baseline_comparison_says_what_earlier_level_it_was_measured_against():
    f = replace(
        _finding("hit_collapse_after_scaling", "P3", ("router.consistent_hashing",), where={"model": "m"}),
        params={"baseline_range": "10m", "baseline_offset": "2m", "drop_factor": 0.7},
        step_s=10.0,
        window=(T0 - 3600, T0 + 120),
    )  # an hour held: the whole baseline window exists
    assert baseline_lines(f) == ["fleet hit rate < 0.7 x its avg over the 10m00s ending 2m00s earlier"]
    # scaled x0.79 on a 10 s grid: 474 s -> 47 steps, 94.8 s -> 9 steps, as the evaluator rounds them
    assert baseline_lines(f, 0.79) == ["fleet hit rate < 0.7 x its avg over the 7m50s ending 1m30s earlier"]
    text = _text(Diagnosis(window=f.window, source="t", likely_cause=f, rules_evaluated=1, time_scale=0.79))
    assert "compared with its earlier level: fleet hit rate < 0.7 x its avg over the 7m50s" in text
    assert baseline_lines(_finding("kv_pressure_preemption", "K1", KV_LEVERS)) == []


def test_ui_triage_lists_supporting_findings_under_the_cause_not_as_competing(monkeypatch):
    from streamlit.testing.v1 import AppTest

    from kvscope.ui import data as ui_data

    for var in ui_data.ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(ui_data.ENV["recording"], str(RECORDINGS / "kv-pressure-cascade.om.gz"))
    at = AppTest.from_file(
        str(Path(ui_data.__file__).with_name("app.py")), default_timeout=300
    ).run()  # a hang guard only (slow on a loaded 2-core box)
    assert not at.exception
    assert "Competing hypotheses" not in [h.value for h in at.header]
    text = " ".join(m.value for m in at.markdown)
    assert "Also fired (supporting evidence" in text
    assert "Eviction (preemption) rate is a capacity signal" in text and "KV cache full and requests are" in text


def test_summary_and_table_write_durations_with_one_formatter():
    ev = (
        Evidence("mean KV transfer (engine)", 0.226, "seconds", "s"),
        Evidence("mean kv_transfer phase (traces)", None, "seconds", "s"),
    )
    template = "KV transfers are slower than before (mean {transfer_mean:.3f}s)"
    assert (
        fill_summary(template, ["transfer_mean", "phase"], ev) == "KV transfers are slower than before (mean 226.0 ms)"
    )
    f = replace(
        _finding("kv_transfer_slowing", "L7", ("ops.interconnect_check",), evidence=ev),
        summary="KV transfers are slower than before (mean 226.0 ms)",
    )
    assert "226.0 ms" in _text(Diagnosis(window=f.window, source="t", likely_cause=f, rules_evaluated=1))
    cascade = (
        Evidence("KV cache usage", 1.0, "ratio", "s"),
        Evidence("preemptions", 7.25, "per_second", "s"),
        Evidence("waiting requests", 5.8, "count", "s"),
        Evidence("mean TTFT", 1.0706, "seconds", "s"),
    )
    template = "KV {kv:.0%} -> {preempt_rate:.2f} preemptions/s -> {waiting:.0f} waiting -> TTFT {ttft_mean:.2f}s"
    # every number as its row in the table reads (issue 39 item 5: "6 waiting" beside a row reading 5.8)
    filled = fill_summary(template, ["kv", "preempt_rate", "waiting", "ttft_mean"], cascade)
    assert filled == "KV 100.0% -> 7.25 preemptions/s -> 5.8 waiting -> TTFT 1.07 s"
    # a value the template names is absent: no summary (the evaluator then says the title)
    assert fill_summary(template, ["kv", "preempt_rate", "waiting", "ttft_mean"], cascade[:3]) is None
    absent = (*cascade[:3], Evidence("mean TTFT", None, "seconds", "s"))
    assert fill_summary(template, ["kv", "preempt_rate", "waiting", "ttft_mean"], absent) is None


def test_the_library_cascade_says_the_numbers_its_table_shows():
    """kv-pressure-cascade's card said "6 waiting" above a row reading 5.8 (issue 39 item 5), and
    the JSON (webhook, --json) still said "6 waiting" once the card did not: the evaluator now
    writes the summary the way the table writes its values, so every reader gets the same words."""
    d = _diagnose("kv-pressure-cascade")
    likely = d.likely_cause
    assert likely is not None and likely.rule_id == "kv_pressure_cascade"
    summary = likely.summary
    rows = {e.key: e for e in likely.evidence}
    assert f"{fmt_number(rows['waiting'].value, 'count')} waiting" in summary
    assert f"KV {fmt_value(rows['kv'])} -> " in summary and fmt_value(rows["preempt_rate"]).split()[0] in summary
    assert json.loads(d.to_json())["likely_cause"]["summary"] == summary
    assert summary in _text(d)


def test_a_long_promql_is_a_note_under_the_table_not_a_twelve_line_row():
    """Issue 39 item 9: at 80 columns a query folded into the series column made one evidence row
    twelve lines tall. Each row is now one line; each long query is written whole under the table
    (and in --json), so nothing is cut."""
    d = _diagnose("kv-pressure-cascade")
    console = Console(record=True, width=80, color_system=None)
    render_diagnosis(d, console=console)
    lines = [line.strip("│ ") for line in console.export_text().splitlines()]
    card = lines[lines.index(next(x for x in lines if x.startswith("evidence "))) :]
    for ev, number in zip(d.likely_cause.evidence, ("[1]", "[2]", "[3]", "[4]"), strict=True):
        assert len(ev.series) > 30
        row = next(x for x in card if x.startswith(ev.name.split(" (")[0]))
        assert row.endswith(number) and ev.value is not None
        note = next(i for i, x in enumerate(card) if x.startswith(f"{number} "))
        # the note, rejoined from its wrapped lines, is the query whole
        text = " ".join(card[note : note + 3]).removeprefix(f"{number} ")
        assert ev.series in text or ev.series.replace(" ", "") in text.replace(" ", "")
