"""The UI's note on a time-scaled window says what `kvscope diagnose`'s header says, from the
same function (`scale_text`): one wording for the scaling and the clipping to the data held."""

from __future__ import annotations

from rich.console import Console

from kvscope.diagnoser.render import render_diagnosis, scale_text
from kvscope.ui.data import scale_note
from tests.unit.test_diagnoser_render import _diagnose


def _header(d) -> str:
    console = Console(record=True, width=400, color_system=None)
    render_diagnosis(d, console=console)
    return console.export_text().splitlines()[0]


def test_a_short_recording_note_is_the_diagnose_header_wording():
    d = _diagnose("kv-pressure-cascade")  # 2m12s held, rules scaled x0.15
    note = scale_note(d)
    assert note.startswith("This window is only 2m12s: ") and note.endswith(".")
    said = note.removeprefix("This window is only 2m12s: ").removesuffix(".")
    assert said == scale_text(d)
    assert f"(2m12s); {said}; " in _header(d)  # verbatim in diagnose's header
    assert said == (
        "shorter than the 15 minutes the rules are written for, so every rule's durations and ranges "
        "were shortened to 15% of their usual length (the series shown are the ranges used)"
    )


def test_an_unscaled_window_has_no_note_in_either():
    d = _diagnose("blind-vllm-output-length-drift")  # 59m30s: not scaled
    assert d.time_scale == 1.0
    assert scale_note(d) == "" and scale_text(d) == ""
    assert "shortened" not in _header(d)
