"""Every case of every rules/diagnosis/<rule_id>.test.yaml: must-fire and must-not-fire."""

from __future__ import annotations

import pytest

from kvscope.diagnoser.rulebook.levers import load_levers
from kvscope.diagnoser.rulebook.rule import read_rule, rule_paths, rules_dir
from testbed.rulecases import check_case, read_test_file


def _cases():
    out = []
    for path in rule_paths():
        test_path = path.with_name(path.stem + ".test.yaml")
        if not test_path.exists():
            out.append(pytest.param(path, None, None, id=f"{path.stem}::missing-test-file"))
            continue
        tf = read_test_file(test_path)
        for case in tf.cases:
            out.append(pytest.param(path, tf, case, id=f"{path.stem}::{case.name}"))
    return out


@pytest.mark.parametrize(("rule_path", "test_file", "case"), _cases())
def test_rule_case(rule_path, test_file, case):
    assert test_file is not None, f"{rule_path.name} has no {rule_path.stem}.test.yaml"
    rule = read_rule(rule_path)
    assert test_file.rule == rule.id
    problems = check_case(rule, case, test_file.interval, load_levers())
    assert not problems, f"{test_file.path}:{case.line}: " + "; ".join(problems)


def test_every_rule_has_a_firing_and_a_quiet_case():
    for path in rule_paths():
        tf = read_test_file(path.with_name(path.stem + ".test.yaml"))
        assert any(c.expect for c in tf.cases), f"{path.name}: no must-fire case"
        assert any(not c.expect for c in tf.cases), f"{path.name}: no must-not-fire case"


def test_rules_dir_is_the_shipped_one():
    assert rules_dir().name == "diagnosis"


def test_stale_marker_ends_the_lookback():
    """`stale` (promtool's staleness marker) makes a series absent from there on; `_` leaves the
    last value carried by the lookback."""
    import math

    from testbed.rulecases import parse_values

    vals = parse_values("1x1 stale _x1 2")
    assert vals[:2] == [1.0, 1.0] and math.isnan(vals[2]) and vals[3:] == [None, None, 2.0]
