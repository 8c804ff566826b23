"""Confidence: a finding read from indirect evidence says so, and yields to direct evidence.

`confidence: moderate` rules (routing inferred from engine hit rates alone) name the rules that
read the same mechanism directly (`defers_to`). Where those could not look, the moderate finding
stands and says what would confirm it; where one fired at the same place, it folds in as
supporting evidence and ranks below; where one looked and did not fire, it is overruled.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from kvscope.diagnoser.evaluate.confidence import settle
from kvscope.diagnoser.evaluate.evaluator import diagnose, rank, sample_names
from kvscope.diagnoser.findings import (
    OVERRULED,
    Diagnosis,
    Finding,
    LeverAdvice,
    Skipped,
    not_evaluable,
    same_mechanism,
)
from kvscope.diagnoser.render import confidence_text, render_diagnosis, render_line, render_not_fired
from kvscope.diagnoser.rulebook.rule import read_rules, rules_dir
from kvscope.diagnoser.rulebook.validate import validate_rules
from kvscope.diagnoser.sources.recording import RecordingSource
from testbed.recording_variants import VARIANTS, write_variant

T0 = 1_700_000_000.0
LIBRARY = Path(__file__).resolve().parents[1] / "recordings"
DIRECT, INFERRED = "prefix_hits_diluted_across_replicas", "routing_ignores_cache_locality"
R1 = "router_gave_locality_away"


def _finding(rule_id: str, score: float, where: dict[str, str] | None = None, **kw) -> Finding:
    levers = (LeverAdvice("router.routing_policy", 1, "set"),)
    return Finding(
        rule_id=rule_id,
        levers_md="P2",
        title=f"title of {rule_id}",
        severity="warning",
        where=where if where is not None else {"model": "m"},
        since=T0,
        until=T0 + 60,
        active=True,
        window=(T0 - 60, T0 + 60),
        step_s=15.0,
        score=score,
        summary=f"summary of {rule_id}",
        levers=levers,
        **kw,
    )


def _inferred(score: float = 125.0, where: dict[str, str] | None = None) -> Finding:
    return _finding(
        INFERRED,
        score,
        where,
        specificity=2,
        confidence="moderate",
        confirm="the request tap would confirm it",
        defers_to=(DIRECT,),
    )


def test_stands_at_moderate_confidence_where_the_direct_rule_could_not_look():
    kept, skipped = settle(
        [_inferred()], [Skipped(DIRECT, "signal(s) absent: prefix_split_ratio")], [INFERRED], {INFERRED: False}
    )
    assert [f.rule_id for f in kept] == [INFERRED] and kept[0].confidence == "moderate"
    assert not_evaluable(skipped) == skipped


def test_folds_into_the_direct_finding_and_ranks_below_it_even_when_it_scored_higher():
    direct = _finding(DIRECT, 131.0, specificity=3)
    kept, skipped = settle([_inferred(score=134.9), direct], [], [INFERRED, DIRECT], {INFERRED: True})
    assert {f.rule_id for f in kept} == {INFERRED, DIRECT} and not skipped
    inferred = next(f for f in kept if f.rule_id == INFERRED)
    assert inferred.score <= direct.score - 10  # beyond the 0-5 earliness bonus of ranking
    d = rank(kept, (T0 - 60, T0 + 60), "t", skipped, 2)
    assert d.likely_cause.rule_id == DIRECT
    assert [f.rule_id for f in d.supporting] == [INFERRED] and d.hypotheses == ()
    assert same_mechanism(d.likely_cause, inferred)


def test_overruled_where_the_direct_rule_looked_at_its_evidence_and_did_not_fire():
    kept, skipped = settle([_inferred()], [], [INFERRED, DIRECT], {INFERRED: True})
    assert kept == []
    assert len(skipped) == 1 and skipped[0].rule_id == INFERRED and skipped[0].reason.startswith(OVERRULED)
    assert DIRECT in skipped[0].reason and not_evaluable(skipped) == []
    d = Diagnosis(window=(T0, T0 + 60), source="t", likely_cause=None, skipped=tuple(skipped), rules_evaluated=2)
    assert render_not_fired(d) == (
        "No rule fired among 2 evaluable rules (1 overruled by direct evidence): nothing to act on in this window."
    )


def test_a_direct_finding_elsewhere_does_not_hold_it_up():
    direct = _finding(DIRECT, 131.0, where={"model": "other"}, specificity=3)
    kept, skipped = settle([_inferred(), direct], [], [INFERRED, DIRECT], {INFERRED: True})
    assert [f.rule_id for f in kept] == [DIRECT] and skipped[0].rule_id == INFERRED


def test_stands_where_the_direct_rule_judged_without_the_direct_evidence():
    """The direct rule could run on another branch (a router's policy counters) while the tap,
    the evidence this inference yields to, was absent: its silence does not contradict it."""
    kept, skipped = settle([_inferred()], [], [INFERRED, DIRECT], {INFERRED: False})
    assert [f.rule_id for f in kept] == [INFERRED] and skipped == []


def test_the_card_and_the_line_say_how_sure_and_what_would_confirm():
    f = _inferred()
    assert confidence_text(f) == (
        "likely, moderate confidence (inferred from indirect evidence): the request tap would confirm it"
    )
    assert "[moderate confidence]" in render_line(f)
    console = Console(record=True, width=200, color_system=None)
    render_diagnosis(Diagnosis(window=f.window, source="t", likely_cause=f, rules_evaluated=1), console=console)
    assert "likely, moderate confidence" in console.export_text()
    assert confidence_text(_finding(DIRECT, 1.0)).startswith("measured, high confidence")
    assert "confidence" not in render_line(_finding(DIRECT, 1.0))


def test_confidence_is_in_the_json():
    d = Diagnosis(window=(T0, T0 + 60), source="t", likely_cause=_inferred(), rules_evaluated=1)
    cause = json.loads(d.to_json())["likely_cause"]
    assert cause["confidence"] == "moderate" and cause["defers_to"] == [DIRECT]


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("confidence: moderate\n", "confidence: unsure\n", "confidence 'unsure' is not one of"),
        ("confirm: the request tap", "confirmation: the request tap", "needs 'confirm'"),
        (
            "defers_to: [prefix_hits_diluted_across_replicas, router_gave_locality_away]",
            "defers_to: [no_such_rule, router_gave_locality_away]",
            "not another rule",
        ),
        (
            "defers_to: [prefix_hits_diluted_across_replicas, router_gave_locality_away]",
            "defers_to: [routing_ignores_cache_locality, router_gave_locality_away]",
            "not another rule",
        ),
        (
            "direct_evidence: [prefix_split_ratio, tenant_reusable_tokens_total, router_decisions_total, router_policy_branch_total, router_best_cached_prefix_tokens_total]",
            "direct_evidence: [split_ratio, router_decisions_total]",
            "unknown signal 'split_ratio'",
        ),
        (
            "direct_evidence: [prefix_split_ratio, tenant_reusable_tokens_total, router_decisions_total, router_policy_branch_total, router_best_cached_prefix_tokens_total]\n",
            "",
            "needs 'direct_evidence'",
        ),
        (
            "defers_to: [prefix_hits_diluted_across_replicas, router_gave_locality_away]",
            "defers_to: router_gave_locality_away",
            "defers_to must be a list of rule ids",
        ),
        (
            "direct_evidence: [prefix_split_ratio, tenant_reusable_tokens_total, router_decisions_total, router_policy_branch_total, router_best_cached_prefix_tokens_total]",
            "direct_evidence: []",
            "direct_evidence must be a non-empty list",
        ),
        ("confidence: moderate\n", "confidence: high\n", "belong to a rule with confidence below high"),
        (
            "defers_to: [prefix_hits_diluted_across_replicas, router_gave_locality_away]",
            "defers_to: [prefix_hit_low_shared_prefixes_seen, router_gave_locality_away]",
            "not a high-confidence rule",
        ),
    ],
)
def test_validation_of_confidence_fields(tmp_path, old, new, message):
    """Each bad value of a confidence field is one problem, at the line of its key."""
    for rid in (DIRECT, INFERRED, R1, "prefix_hit_low_shared_prefixes_seen", "prefix_hit_low_with_reuse"):
        for suffix in (".yaml", ".test.yaml"):
            text = (rules_dir() / f"{rid}{suffix}").read_text()
            if rid == INFERRED and suffix == ".yaml":
                assert old in text, old
                text = text.replace(old, new)
            (tmp_path / f"{rid}{suffix}").write_text(text)
    msgs = [str(i) for i in validate_rules(tmp_path)]
    assert len(msgs) == 1 and message in msgs[0], msgs
    path, line, _ = msgs[0].split(":", 2)
    assert path.endswith(f"{INFERRED}.yaml")
    lines = (tmp_path / f"{INFERRED}.yaml").read_text().splitlines()
    key = lines[int(line) - 1].split(":")[0]
    assert key in ("confidence", "confirm", "confirmation", "defers_to", "direct_evidence"), lines[int(line) - 1]


# ---------------------------------------------------------------------------- on a real recording
@pytest.fixture(scope="module")
def rules():
    return read_rules()


def _diagnose(path: Path, rules) -> Diagnosis:
    source = RecordingSource(path)
    frame = source.read_frame(set().union(*(sample_names(r) for r in rules)), None, None, source.natural_step())
    return diagnose(frame, rules, source=source.description)


def test_the_tap_reads_p2_directly_and_engine_metrics_alone_infer_it(rules, tmp_path):
    """round-robin-vs-sticky (real vLLM, tap in front): with the tap, the direct P2 rule leads and
    the inference from engine metrics folds into it or is overruled; with engine /metrics only
    (tap targets and spans dropped), the inference is the likely cause at moderate confidence."""
    meta = yaml.safe_load((LIBRARY / "round-robin-vs-sticky.yaml").read_text())
    src = LIBRARY / meta["recording"]
    full = _diagnose(src, rules)
    assert full.likely_cause.rule_id == DIRECT and full.likely_cause.confidence == "high"
    inferred = [f for f in full.findings if f.rule_id == INFERRED]
    assert all(f in full.supporting for f in inferred)
    assert inferred or any(s.rule_id == INFERRED and s.reason.startswith(OVERRULED) for s in full.skipped)
    only = _diagnose(write_variant(src, VARIANTS["metrics_only"], meta, tmp_path), rules)
    assert only.likely_cause.rule_id == INFERRED and only.likely_cause.confidence == "moderate"
    assert only.likely_cause.levers[0].id == "router.routing_policy"
    assert any(s.rule_id == DIRECT and "signal(s) absent" in s.reason for s in only.skipped)


def test_a_warning_folding_into_an_info_direct_finding_lifts_it_to_warning():
    """P2 (warning: hit rate at ~1/N) folding into R1 read from a load-only router policy (info):
    the direct finding leads and carries the warning, the inferred one stays below it."""
    r1 = replace(_finding(R1, 31.0, {"instance": "smg"}, specificity=3), severity="info")
    inferred = replace(_inferred(score=124.0), defers_to=(DIRECT, R1))
    kept, skipped = settle([inferred, r1], [], [INFERRED, R1], {INFERRED: True})
    lifted = next(f for f in kept if f.rule_id == R1)
    assert lifted.severity == "warning" and lifted.score == 131.0 and not skipped
    d = rank(kept, (T0 - 60, T0 + 60), "t", skipped, 2)
    assert d.likely_cause.rule_id == R1 and d.likely_cause.severity == "warning"
    assert [f.rule_id for f in d.supporting] == [INFERRED]
