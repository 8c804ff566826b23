"""Every generated Prometheus rule file passes `promtool check rules`, and every unit-test file
in rules/tests/ passes `promtool test rules` (real promtool from Debian's prometheus package)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((ROOT / "rules" / "prometheus").glob("*.yml"))
TEST_FILES = sorted((ROOT / "rules" / "tests").glob("*.test.yml"))

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.needs("promtool"),
    pytest.mark.servers,
]


# Only a guard against a hung promtool: `test rules candidates.test.yml` alone took 154 s on a
# loaded 2-core CI box, so the ceiling is generous; a normal run returns as soon as promtool exits.
PROMTOOL_TIMEOUT_S = 900


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *map(str, args)], capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT_S, cwd=ROOT
    )


def test_generated_rule_files_exist():
    names = {p.name for p in RULE_FILES}
    assert {
        "kvscope-canonical.yml",
        "kvscope-derived.yml",
        "kvscope-slo.yml",
        "kvscope-absent.yml",
        "kvscope-alerts.yml",
        "kvscope-quantiles.yml",
        "kvscope-candidates.yml",
        "kvscope-goodput.yml",
    } <= names


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(path: Path):
    result = _promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_promtool_test_rules(path: Path):
    result = _promtool("test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules_fails_on_a_wrong_expectation(tmp_path: Path):
    """The harness can fail: the must-not-fire SLO case fed 15 % errors instead of 5 % is red."""
    text = (ROOT / "rules" / "tests" / "slo.test.yml").read_text()
    broken = text.replace("  - ../prometheus/", f"  - {ROOT}/rules/prometheus/")
    assert "values: '0+95x45'" in broken
    broken = broken.replace("values: '0+95x45'", "values: '0+85x45'")
    path = tmp_path / "broken.test.yml"
    path.write_text(broken)
    result = _promtool("test", "rules", path)
    assert result.returncode == 1
    assert "LlmTtftSloBurnRate" in result.stdout + result.stderr
