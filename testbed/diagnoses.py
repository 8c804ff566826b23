"""How the tests hold the fleet path (diagnoser/pushdown) to the full fetch's Diagnosis."""

from __future__ import annotations

import json


def assert_same_diagnosis(fleet, full) -> None:
    """The fleet path's Diagnosis is the full fetch's, byte for byte, except `scale_changes`: which
    verdicts the short-window scaling changed is worked out by judging the scaled rules again over
    the whole frame, which only the full fetch holds (the fleet path says null and its note keeps
    the plain scaling sentence: docs/rules.md)."""
    a, b = json.loads(fleet.to_json()), json.loads(full.to_json())
    assert a.pop("scale_changes") is None
    b.pop("scale_changes")
    assert a == b
