"""bench/diagnose_golden.py: the comparison of two diagnosis dumps and the package layout of a
revision (the pure parts; the child process is exercised by running the script)."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "diagnose_golden.py"
_spec = importlib.util.spec_from_file_location("diagnose_golden", SCRIPT)
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)

T0 = 1_795_000_000.0


def finding(rule_id: str, row: str, since: float, **extra) -> dict:
    f = {
        "rule_id": rule_id,
        "levers_md": row,
        "title": rule_id,
        "severity": "warning",
        "where": {"model": "m"},
        "since": T0 + since,
        "until": T0 + 300.0,
        "active": True,
        "window": [T0, T0 + 300.0],
        "step_s": 5.0,
        "score": 1.5,
        "summary": f"{rule_id} fired",
        "evidence": [
            {"name": "fleet hit rate", "value": 0.48, "unit": "ratio", "series": "hits/queries", "at": T0 + since}
        ],
        "levers": [],
        "citations": [],
        "false_positives": [],
        "params": {},
        "specificity": 2,
    }
    f.update(extra)
    return f


def diagnosis(likely: dict | None, other: list[dict] = (), skipped: list[dict] = ()) -> dict:
    return {
        "schema_version": 1,
        "window": [T0, T0 + 300.0],
        "source": "recording:x",
        "likely_cause": likely,
        "competing": [],
        "other": list(other),
        "skipped": list(skipped),
        "rules_evaluated": 30,
        "time_scale": 1.0,
    }


def test_identical_inputs_have_no_differences():
    d = diagnosis(finding("prefix_hits_diluted_across_replicas", "P2", 107.7))
    result = golden.compare({"a": d}, {"a": copy.deepcopy(d)})
    assert result == {"a": []}
    text = golden.render_comparison(result, "old", "new")
    assert "a: identical" in text and "all IDENTICAL" in text


def test_onset_and_evidence_change_told_as_seconds_into_the_window():
    old = diagnosis(finding("prefix_hits_diluted_across_replicas", "P2", 107.7))
    new = copy.deepcopy(old)
    new["likely_cause"]["since"] = T0 + 87.7
    new["likely_cause"]["evidence"][0].update(value=0.5047, at=T0 + 87.7)
    new["likely_cause"]["summary"] = "other words"
    lines = golden.compare_diagnosis(old, new)
    assert lines == [
        "~ P2 prefix_hits_diluted_across_replicas {model=m}:",
        "    since +107.7 s -> +87.7 s",
        "    evidence fleet hit rate: value 0.48 -> 0.5047, at +107.7 s -> +87.7 s",
        "text only, 1 finding(s): summary x1 (--verbose lists them)",
    ]
    assert "    also changed: summary" in golden.compare_diagnosis(old, new, verbose=True)
    result = golden.compare({"rr": old}, {"rr": new})
    assert "rr: differs\n" in golden.render_comparison(result, "o", "n")


def test_changes_to_descriptive_fields_only_are_counted_not_listed():
    old = diagnosis(finding("kv_pressure_cascade", "K2", 50.0), [finding("queue_growing", "L12", 60.0)])
    new = copy.deepcopy(old)
    for f in (new["likely_cause"], new["other"][0]):
        f["evidence"][0]["series"] = "hits/queries scaled"
        f["evidence"][0]["stat"] = None
    new["other"][0]["levers"] = [{"id": "kv-cache-dtype", "rank": 1, "direction": "set"}]
    lines = golden.compare_diagnosis(old, new)
    assert lines == ["text only, 2 finding(s): evidence series x2, evidence stat x2, levers x1 (--verbose lists them)"]
    verbose = "\n".join(golden.compare_diagnosis(old, new, verbose=True))
    assert "evidence fleet hit rate: series hits/queries -> hits/queries scaled, stat (absent) -> None" in verbose
    text = golden.render_comparison({"a": lines, "b": []}, "o", "n")
    assert "a: differs in text only" in text
    assert text.endswith("2 inputs: 0 DIFFER in findings, 1 in text only, 1 identical")


def test_cascade_changes_are_part_of_the_verdict():
    old = diagnosis(finding("kv_pressure_cascade", "K2", 50.0, cascade={"stage": 2, "lead_time_s": None}))
    new = copy.deepcopy(old)
    new["likely_cause"]["cascade"].update(stage=3, lead_time_s=42.0)
    assert golden.compare_diagnosis(old, new)[1] == "    cascade: lead_time_s None -> 42, stage 2 -> 3"


def test_added_removed_and_reranked_findings():
    p2 = finding("prefix_hits_diluted_across_replicas", "P2", 100.0)
    k2 = finding("kv_pressure_cascade", "K2", 50.0)
    p3 = finding("hit_collapse_after_scaling", "P3", 10.0)
    old = diagnosis(p2, [k2])
    new = diagnosis(copy.deepcopy(k2), [p3])
    text = "\n".join(golden.compare_diagnosis(old, new))
    assert "- only in old: P2 prefix_hits_diluted_across_replicas {model=m} (likely_cause, since +100.0 s)" in text
    assert "+ only in new: P3 hit_collapse_after_scaling {model=m} (other, since +10.0 s)" in text
    assert "~ K2 kv_pressure_cascade {model=m}:\n    ranked other -> likely_cause" in text


def test_same_rule_at_two_places_and_twice_at_one_place_are_told_apart():
    a = finding("r", "X1", 1.0, where={"instance": "a"})
    b = finding("r", "X1", 2.0, where={"instance": "b"})
    again = finding("r", "X1", 3.0, where={"instance": "a"})
    keys = golden.parse_findings(diagnosis(a, [b, again]))
    assert set(keys) == {("r", (("instance", "a"),), 0), ("r", (("instance", "b"),), 0), ("r", (("instance", "a"),), 1)}
    assert keys["r", (("instance", "a"),), 1][0] == "other"


def test_skipped_rules_and_diagnosis_fields():
    old = diagnosis(None, skipped=[{"rule_id": "s1", "reason": "absent: x"}])
    new = diagnosis(None, skipped=[{"rule_id": "s2", "reason": "absent: y"}])
    new["rules_evaluated"] = 31
    lines = golden.compare_diagnosis(old, new)
    assert "- skipped only in old: s1 (absent: x)" in lines
    assert "+ skipped only in new: s2 (absent: y)" in lines
    assert "rules_evaluated: 30 -> 31" in lines


def test_an_evidence_field_the_comparison_does_not_know_is_still_counted_and_told():
    old = [{"name": "kv", "value": 0.9, "unit": "ratio", "series": "s"}]
    new = [dict(old[0], stat="max")]
    assert golden.compare_evidence(old, new, verbose=True)[0] == ["evidence kv: stat (absent) -> max"]
    assert golden.compare_evidence(old, new) == ([], {"evidence stat": 1})
    added_null = [dict(old[0], stat=None)]
    assert golden.compare_evidence(old, added_null, verbose=True)[0] == ["evidence kv: stat (absent) -> None"]


def test_long_series_are_cut_to_the_part_that_changed():
    old = (
        "(sum by (model) (rate(engine_prefix_cache_hits_tokens_total[2m]))) / "
        "(sum by (model) (rate(engine_prefix_cache_queries_tokens_total[2m])))"
    )
    new = old.replace("[2m]", "[1m]")
    text = golden.describe_change(old, new, keep=5)
    # from 5 characters before the first change to the end (the last change is 5 from the end)
    assert (
        text == "...otal[2m]))) / (sum by (model) (rate(engine_prefix_cache_queries_tokens_total[2m]))) -> "
        "...otal[1m]))) / (sum by (model) (rate(engine_prefix_cache_queries_tokens_total[1m])))"
    )
    mid = golden.describe_change("x" * 50 + "[5m]" + "y" * 50, "x" * 50 + "[27s]" + "y" * 50, keep=3)
    assert mid == "...xx[5m]yy... -> ...xx[27s]yy..."  # "[" and "]" are common context
    assert golden.describe_change("a", "b") == "a -> b"
    assert golden.describe_change(0.25, 0.5) == "0.25 -> 0.5"


def test_evidence_changes_are_capped():
    many = [{"name": f"e{i}", "value": float(i), "unit": "", "series": "s"} for i in range(10)]
    moved = [dict(e, value=e["value"] + 1) for e in many]
    lines, _ = golden.compare_evidence(many, moved)
    assert len(lines) == golden.EVIDENCE_SHOWN + 1
    assert lines[-1] == f"... and {10 - golden.EVIDENCE_SHOWN} more evidence changes"


def test_reordering_alone_is_reported_not_hidden():
    x, y = finding("x", "X1", 1.0), finding("y", "Y1", 2.0)
    assert golden.compare_diagnosis(diagnosis(None, [x, y]), diagnosis(None, [y, x])) == [
        "findings reordered within competing/other"
    ]


def test_inputs_on_one_side_only_and_the_total():
    d = diagnosis(None)
    result = golden.compare({"a": d, "b": d}, {"a": d, "c": d})
    assert result == {"a": [], "b": ["input only in the old dump"], "c": ["input only in the new dump"]}
    assert golden.render_comparison(result, "o", "n").endswith(
        "3 inputs: 2 DIFFER in findings, 0 in text only, 1 identical"
    )


def test_package_layout_follows_package_dir(tmp_path):
    pyproject = (
        '[tool.setuptools]\npackage-dir = {"kvscope" = "kvscope", "kvscope.agent" = "agent", '
        '"kvscope.diagnoser" = "diagnoser"}\n'
    )
    dirs = golden.parse_package_dirs(pyproject)
    assert dirs == {"kvscope": "kvscope", "kvscope.agent": "agent", "kvscope.diagnoser": "diagnoser"}
    tree, overlay = tmp_path / "tree", tmp_path / "overlay"
    for d in ("kvscope", "core", "agent", "diagnoser"):
        (tree / d).mkdir(parents=True)
        (tree / d / "__init__.py").write_text(f"NAME = {d!r}\n")
    overlay.mkdir()
    golden.link_packages(tree, dirs, overlay)
    assert (overlay / "kvscope" / "diagnoser" / "__init__.py").read_text() == "NAME = 'diagnoser'\n"
    assert (overlay / "kvscope" / "agent").resolve() == (tree / "agent").resolve()


def test_package_dir_naming_a_missing_directory_is_an_error(tmp_path):
    (tmp_path / "kvscope").mkdir()
    (tmp_path / "o").mkdir()
    with pytest.raises(RuntimeError, match="kvscope.ui"):
        golden.link_packages(tmp_path, {"kvscope": "kvscope", "kvscope.ui": "ui"}, tmp_path / "o")
