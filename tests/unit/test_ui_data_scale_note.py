"""The short-window note (issue 39): shown only where shortening the rules' durations to fit the
window changed a verdict, naming those rules in plain words; one wording (`scale_text`, from
`Diagnosis.scale_changes`) for `kvscope diagnose`'s header and the UI's note."""

from __future__ import annotations

from rich.console import Console

from kvscope.diagnoser.evaluate.evaluator import diagnose, sample_names
from kvscope.diagnoser.findings import ScaleChange
from kvscope.diagnoser.render import render_diagnosis, scale_note, scale_text
from kvscope.diagnoser.rulebook.rule import read_rules
from kvscope.diagnoser.sources.recording import RecordingSource
from tests.unit.test_diagnoser_render import RECORDINGS, _diagnose


def _text(d, verbose: bool = False) -> str:
    console = Console(record=True, width=2000, color_system=None)
    render_diagnosis(d, console=console, verbose=verbose)
    return console.export_text()


def _fired(d) -> set[tuple[str, str]]:
    return {(f.rule_id, repr(sorted(f.where.items()))) for f in d.findings}


def test_a_short_window_whose_verdicts_changed_says_which_in_both():
    d = _diagnose("kv-pressure-cascade")  # 2m12s held, rules scaled x0.15
    assert round(d.time_scale, 2) == 0.15
    eviction = ScaleChange(
        "eviction_rate_high", "Eviction (preemption) rate is a capacity signal", "fired", "did not fire"
    )
    assert eviction in d.scale_changes
    said = scale_text(d)
    assert said.startswith(
        "shorter than the 15 minutes the rules are written for, so rule durations and ranges were "
        "shortened to 15% of their usual length, which changed "
    )
    assert "Eviction (preemption) rate is a capacity signal fired (at the usual length it did not fire)" in said
    # fired either way, at the same instance, but reached the latency stage (critical) only shortened
    assert (
        "Memory-pressure cascade (KV full, then preemption, queueing, TTFT) fired as critical (at the usual length as warning)"
        in said
    )
    assert "eviction_rate_high" not in said  # titles, not rule ids
    assert scale_note(d) == f"This window is only 2m12s: {said}."
    assert _text(d).splitlines()[1] == scale_note(d)  # verbatim under diagnose's header


def test_the_changes_are_those_of_the_same_window_judged_unscaled():
    """Independent check: diagnose the recording again with --time-scale 1; every rule named as
    changed fires at other places there, and every rule not named fires at the same ones."""
    source = RecordingSource(RECORDINGS / "kv-pressure-cascade.om.gz")
    rules = read_rules()
    frame = source.read_frame(set().union(*(sample_names(r) for r in rules)), None, None, source.natural_step())
    scaled = diagnose(frame, rules, workers=1)
    full = diagnose(frame, rules, workers=1, time_scale=1.0)
    assert full.scale_changes is None  # not scaled: nothing compared
    changed = {c.rule_id for c in scaled.scale_changes}
    differ = {r for r, _ in _fired(scaled) ^ _fired(full)}
    assert "eviction_rate_high" in differ
    assert differ <= changed


def test_a_short_window_whose_verdicts_did_not_change_has_no_note():
    d = _diagnose("healthy-shared-prefix")  # scaled x0.11; no rule judges it otherwise unscaled
    assert d.time_scale < 0.2 and d.scale_changes == ()
    assert scale_text(d) == "" and scale_note(d) == ""
    assert "shortened" not in _text(d)
    verbose = _text(d, verbose=True)
    assert "shortened to 11% of their usual length" in verbose
    assert "judged at their usual length, every rule reached the same verdict" in verbose


def test_an_unscaled_window_has_no_note_in_either():
    d = _diagnose("blind-vllm-output-length-drift")  # 59m30s: not scaled
    assert d.time_scale == 1.0 and d.scale_changes is None
    assert scale_note(d) == "" and scale_text(d) == ""
    assert "shortened" not in _text(d, verbose=True)
