"""The rule validators: shipped rules are clean, broken rules point at file:line."""

from __future__ import annotations

import shutil
from pathlib import Path

from kvscope.cli import main
from kvscope.diagnoser.rulebook.rule import rules_dir
from kvscope.diagnoser.rulebook.validate import LEVERS_MD_ROWS, validate_rules

GOOD = rules_dir() / "kv_pressure_preemption.yaml"


def _copy_with(tmp_path: Path, old: str, new: str) -> Path:
    text = GOOD.read_text(encoding="utf-8")
    assert old in text, old
    (tmp_path / GOOD.name).write_text(text.replace(old, new), encoding="utf-8")
    shutil.copy(GOOD.with_name("kv_pressure_preemption.test.yaml"), tmp_path)
    return tmp_path


def _messages(tmp_path: Path) -> list[str]:
    return [str(i) for i in validate_rules(tmp_path)]


def test_shipped_rules_are_clean_and_cover_every_levers_md_row():
    assert validate_rules() == []
    rows = {Path(p).stem for p in rules_dir().glob("*.yaml")}
    assert len(rows) >= len(LEVERS_MD_ROWS)


def test_unknown_operator_points_at_its_line(tmp_path):
    msgs = _messages(_copy_with(tmp_path, 'op: ">=", value: $kv_full', 'op: "=>", value: $kv_full'))
    assert len(msgs) == 1
    path, line, message = msgs[0].split(":", 2)
    assert path.endswith("kv_pressure_preemption.yaml")
    assert "unknown operator '=>'" in message
    text = (tmp_path / GOOD.name).read_text().splitlines()
    assert "=>" in text[int(line) - 1]


def test_unknown_signal_is_reported(tmp_path):
    msgs = _messages(_copy_with(tmp_path, "rate: engine_preemptions_total", "rate: vllm:num_preemptions"))
    assert any("unknown signal 'vllm:num_preemptions'" in m for m in msgs)


def test_unknown_lever_and_direction_are_reported(tmp_path):
    msgs = _messages(
        _copy_with(tmp_path, "{id: vllm.kv_cache_dtype, direction: set}", "{id: vllm.kv_dtype, direction: sideways}")
    )
    assert any("unknown lever 'vllm.kv_dtype'" in m for m in msgs)
    assert any("direction 'sideways'" in m for m in msgs)


def test_a_bare_lever_id_is_reported_not_a_crash(tmp_path):
    msgs = _messages(_copy_with(tmp_path, "{id: vllm.kv_cache_dtype, direction: set}", "vllm.kv_cache_dtype"))
    assert any("a lever entry is {id: ..., direction: ...}, got 'vllm.kv_cache_dtype'" in m for m in msgs)


def test_undeclared_parameter_and_bad_duration_are_reported(tmp_path):
    msgs = _messages(_copy_with(tmp_path, "min_den: $min_preempt_rate", "min_den: $min_rate"))
    assert any("unknown parameter $min_rate" in m for m in msgs)
    msgs = _messages(_copy_with(tmp_path, "default: 1m, unit: duration", "default: 1 minute, unit: duration"))
    assert any("not a duration" in m for m in msgs)


def test_unknown_series_reference_and_summary_field(tmp_path):
    msgs = _messages(_copy_with(tmp_path, "{series: kv_gate, op:", "{series: kv_gates, op:"))
    assert any("unknown series 'kv_gates'" in m for m in msgs)


def test_yaml_syntax_error_has_a_line(tmp_path):
    _copy_with(tmp_path, "title: KV cache full", "title: [KV cache full")
    msgs = _messages(tmp_path)
    assert msgs and "YAML error" in msgs[0] and msgs[0].split(":")[1].isdigit()


def test_cli_rules_check_exit_status(tmp_path, capsys):
    assert main(["rules", "check"]) == 0
    _copy_with(tmp_path, 'op: ">=", value: $kv_full', 'op: "=>", value: $kv_full')
    assert main(["rules", "check", "--rules-dir", str(tmp_path)]) == 1
    assert "unknown operator" in capsys.readouterr().out


def test_a_part_only_the_typed_tree_reads_is_checked_at_its_line(tmp_path):
    """`times` is not among the mapping checks; parsing the rule into its tree (what every backend
    reads) reports it at the condition's line instead of failing at evaluation."""
    msgs = _messages(_copy_with(tmp_path, 'op: ">=", value: $kv_full', 'op: ">=", value: $kv_full, times: lots'))
    assert len(msgs) == 1, msgs
    path, line, message = msgs[0].split(":", 2)
    assert path.endswith("kv_pressure_preemption.yaml") and "times: not a number: 'lots'" in message
    assert "times: lots" in (tmp_path / GOOD.name).read_text().splitlines()[int(line) - 1]
