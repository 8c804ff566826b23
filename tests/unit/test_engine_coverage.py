"""The names real fleets export (issue 16): every canonical signal kvscope's rules, dashboards and
Prometheus rules read maps from every engine release that exports it (tests/fixtures/engine_names/
holds the name lists, gathered from the engines' own sources), and docs/engine-coverage.md shows
the table per engine and version."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvscope.agent.normalize.coverage import (
    ABSENT,
    MAPS,
    MAPS_OFF,
    RENAMED,
    UNMAPPED,
    Allowed,
    Coverage,
    NameList,
    UpstreamName,
    load_allowed,
    load_meanings,
    load_name_lists,
    problems,
)
from kvscope.cli import main
from kvscope.commands._needed import needed_signals
from kvscope.core.signals import load_catalog, parse_catalog

ROOT = Path(__file__).resolve().parents[2]
NAMES = ROOT / "tests" / "fixtures" / "engine_names"
CATALOG = load_catalog()
LISTS = load_name_lists(NAMES)
MEANINGS = load_meanings(NAMES / "meanings.yaml")
SIGNALS = sorted(s for s in needed_signals(CATALOG) if CATALOG.signals[s].aliases)


def test_every_signal_kvscope_reads_maps_from_every_release_that_exports_it():
    cov = Coverage(CATALOG, LISTS, MEANINGS)
    bad, stale = problems(cov, SIGNALS, load_allowed(NAMES / "allow.yaml"))
    assert not bad, "signals an engine exports but the catalog cannot read:\n" + "\n".join(bad)
    assert not stale, f"allow.yaml entries that cover nothing any more (delete them): {stale}"


def test_the_engine_coverage_table_in_docs_is_fresh(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["rules", "coverage", "--check", "docs/engine-coverage.md"]) == 0


def test_name_lists_cite_their_source_and_cover_the_engines_the_issue_names():
    engines = {nl.engine for nl in LISTS}
    assert {"vllm", "vllm-v0", "sglang", "dcgm-exporter", "epp", "dynamo", "llamacpp", "sglang-router"} <= engines
    for nl in LISTS:
        assert nl.source.get("repo") and nl.source.get("ref"), nl.path
        assert nl.names, nl.path
    versions = {nl.version for nl in LISTS if nl.engine == "sglang"}
    assert {"0.4.6.post5", "0.5.5", "0.5.8", "0.5.23"} <= versions


def test_the_signals_checked_include_what_rules_and_dashboards_read():
    where = needed_signals(CATALOG)
    assert "rules" in where["engine_preemptions_total"] and "dashboards" in where["engine_kv_cache_usage_ratio"]
    assert "prometheus" in where["request_ttft_seconds"]


def test_real_statuses_of_known_versions():
    cov = Coverage(CATALOG, LISTS, MEANINGS)
    key = {nl.key: nl for nl in LISTS}
    assert cov.cell("request_itl_seconds", key["vllm 0.10.2"]).status == MAPS
    assert cov.cell("engine_prefix_cache_hits_tokens_total", key["sglang 0.5.8"]).status == MAPS
    assert cov.cell("engine_preemptions_total", key["sglang 0.5.5"]).status == MAPS
    assert cov.cell("engine_preemptions_total", key["sglang 0.4.6.post5"]).status == ABSENT
    assert cov.cell("gpu_sm_active_ratio", key["dcgm-exporter 4.5.3-4.8.2"]).status == MAPS_OFF
    cell = cov.cell("kv_transfer_seconds", key["sglang 0.5.8"])
    assert cell.status == UNMAPPED and "is a gauge" in cell.detail


def test_the_check_would_have_caught_the_sglang_cached_tokens_match():
    """Before issue 18 the alias matched cache_source in [device, total] only: every SGLang up to
    0.5.8 (no cache_source label) lost its prefix-hit signal. The check names it."""
    text = (ROOT / "core" / "catalog.yaml").read_text()
    old = text.replace('match: {cache_source: [total, ""]}', "match: {cache_source: [total]}")
    assert old != text
    cov = Coverage(parse_catalog(old), LISTS, MEANINGS)
    key = {nl.key: nl for nl in LISTS}
    for version in ("0.4.6.post5", "0.5.5", "0.5.8"):
        cell = cov.cell("engine_prefix_cache_hits_tokens_total", key[f"sglang {version}"])
        assert cell.status == UNMAPPED and "has no cache_source label" in cell.detail
    assert cov.cell("engine_prefix_cache_hits_tokens_total", key["sglang 0.5.23"]).status == MAPS


# ------------------------------------------------------------------ the statuses on small cases
TINY = """
dialects:
  x: {prefixes: ["x:"], detect: ["x:"], labels: {}}
signals:
  engine_requests_running:
    kind: gauge
    unit: count
    aliases:
      - {engine: x, name: "x:running"}
  engine_preemptions_total:
    kind: counter
    unit: count
    aliases:
      - {engine: x, name: "x:preempted", match: {reason: [kv]}}
"""


def release(version: str, **names: tuple[str, tuple[str, ...] | None]) -> NameList:
    out = NameList("x-engine", "x", version, {"repo": "r", "ref": version})
    for name, (kind, labels) in names.items():
        out.names["x:" + name] = UpstreamName("x:" + name, kind, labels)
    return out


def test_a_name_an_earlier_release_had_and_a_later_one_dropped_is_renamed():
    old = release("1.0", running=("gauge", ()))
    new = release("1.10", busy=("gauge", ()))  # 1.10 sorts after 1.9, not before 1.2
    cov = Coverage(parse_catalog(TINY), [new, old], {})
    assert cov.cell("engine_requests_running", old).status == MAPS
    cell = cov.cell("engine_requests_running", new)
    assert cell.status == RENAMED and "x:running" in cell.detail
    meant = Coverage(parse_catalog(TINY), [new, old], {"x-engine": {"x:busy": "engine_requests_running"}})
    assert meant.cell("engine_requests_running", new).status == UNMAPPED


def test_kind_and_match_label_mismatches_are_unmapped_and_absence_is_absent():
    cov = Coverage(parse_catalog(TINY), [], {})
    wrong_kind = release("1", running=("histogram", ()))
    assert "is a histogram" in cov.cell("engine_requests_running", wrong_kind).detail
    no_label = release("1", preempted=("counter", ("model",)))
    assert cov.cell("engine_preemptions_total", no_label).status == UNMAPPED
    unknown_labels = release("1", preempted=("counter", None))  # labels not known: benefit of the doubt
    assert cov.cell("engine_preemptions_total", unknown_labels).status == MAPS
    assert cov.cell("engine_preemptions_total", release("1")).status == ABSENT


def test_allow_entries_need_a_reason_and_stale_ones_are_reported(tmp_path):
    (tmp_path / "allow.yaml").write_text("- {engine: x-engine, status: unmapped}\n")
    with pytest.raises(ValueError, match="needs a reason"):
        load_allowed(tmp_path / "allow.yaml")
    cov = Coverage(parse_catalog(TINY), [release("1", running=("histogram", ()))], {})
    allowed = [
        Allowed("x-engine", "engine_requests_running", UNMAPPED, "because"),
        Allowed("x-engine", "engine_preemptions_total", UNMAPPED, "nothing to cover"),
    ]
    bad, stale = problems(cov, ["engine_requests_running", "engine_preemptions_total"], allowed)
    assert bad == [] and [a.signal for a in stale] == ["engine_preemptions_total"]


def test_the_cli_exits_1_on_an_unexplained_gap(tmp_path, capsys, monkeypatch):
    names = tmp_path / "names"
    names.mkdir()
    for src in NAMES.glob("*.yaml"):
        (names / src.name).write_text(src.read_text())
    (names / "allow.yaml").write_text("[]\n")
    monkeypatch.chdir(ROOT)
    assert main(["rules", "coverage", "--names", str(names)]) == 1
    err = capsys.readouterr().err
    assert "not allowed: sglang 0.5.8: kv_transfer_seconds unmapped" in err
