"""rules/levers.yaml as actions: each lever's kind, costs, direction-specific instructions and
exact settings per system and product; the old string form still loads."""

from __future__ import annotations

import pytest

from kvscope.diagnoser.actions import change_text, lever_heading, split
from kvscope.diagnoser.rulebook.levers import KINDS, load_levers, parse_levers
from kvscope.diagnoser.rulebook.rule import RuleError


def test_every_shipped_lever_says_its_kind_and_exact_settings():
    for lid, lever in load_levers().items():
        assert lever.kind in KINDS, lid
        assert lever.how and all(c.change for c in lever.how), lid
        for direction, variant in lever.directions.items():
            assert variant.kind in ("", *KINDS) and all(c.change for c in variant.how), (lid, direction)


def test_replicas_down_is_a_fix_with_its_own_instructions():
    """fleet_oversized ranks 'Replica count (decrease)': the text must lower, not raise, the floor."""
    replicas = load_levers()["k8s.replicas"]
    down, up = replicas.advice(1, "decrease"), replicas.advice(1, "increase")
    down_text = " ".join(change_text(c) for c in down.changes)
    up_text = " ".join(change_text(c) for c in up.changes)
    assert "lower spec.minReplicas" in down_text and "raise" not in down_text
    assert "raise spec.minReplicas" in up_text
    assert (down.kind, up.kind) == ("fix", "mitigate")
    assert "less headroom" in lever_heading(down) and "more GPUs" in lever_heading(up)


def test_several_products_of_one_system_are_separate_entries():
    routing = load_levers()["router.routing_policy"].how
    products = [(c.system, c.product) for c in routing if c.system == "router"]
    assert products == [("router", "SGLang Model Gateway"), ("router", "llm-d EPP")]
    smg = routing[0]
    assert (smg.change, smg.note) == ("--policy cache_aware", "tune --cache-threshold")
    assert change_text(smg, "`") == "router (SGLang Model Gateway): `--policy cache_aware` (tune --cache-threshold)"


def test_fp8_kv_is_a_fix_that_restarts_and_risks_quality():
    fp8 = load_levers()["vllm.kv_cache_dtype"].advice(1, "set")
    cap = load_levers()["vllm.max_num_seqs"].advice(2, "decrease")
    assert split([fp8, cap]) == ([cap], [fp8])
    assert "needs an engine restart" in lever_heading(fp8) and "quality risk" in lever_heading(fp8)


OLD_FORM = """
levers:
  vllm.max_num_seqs:
    title: Concurrency limit per engine
    cost: less throughput
    how:
      vllm: "--max-num-seqs N"
    citations: ["002 §7.4"]
"""


def test_the_old_form_still_loads_as_a_fix_with_the_string_as_setting():
    lever = parse_levers(OLD_FORM)["vllm.max_num_seqs"]
    assert lever.kind == "fix" and not lever.restart and not lever.directions
    assert [(c.system, c.change, c.note, c.product) for c in lever.how] == [("vllm", "--max-num-seqs N", "", "")]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("    title:", "    kind: soon\n    title:"), "kind 'soon'"),
        (('      vllm: "--max-num-seqs N"', "      vllm: {note: only a note}"), "needs 'set'"),
        (("    citations:", "    directions: {sideways: {}}\n    citations:"), "directions.sideways"),
    ],
)
def test_bad_lever_entries_say_what_is_wrong(edit, message):
    with pytest.raises(RuleError, match=message):
        parse_levers(OLD_FORM.replace(*edit))


def test_docs_levers_md_is_generated_from_the_yaml():
    """docs/levers.md is the lever table users read; scripts/gen-levers-doc.py regenerates it."""
    from pathlib import Path

    from kvscope.diagnoser.actions import levers_markdown

    doc = Path(__file__).resolve().parents[2] / "docs" / "levers.md"
    assert doc.read_text(encoding="utf-8") == levers_markdown(load_levers()), "run scripts/gen-levers-doc.py"


def test_cite_text_names_bare_sources_and_drops_checklist_rows():
    from kvscope.diagnoser.citations import cite_text

    assert cite_text("R8. An engine hangs (000).") == "An engine hangs (Why more GPUs is not enough for LLM inference)."
    assert cite_text("about 1/N (003, option 2)") == "about 1/N (Welcome to the Disaggregation Cliff, option 2)"
    assert cite_text("a ratio of 0.003) and 1000) stays") == "a ratio of 0.003) and 1000) stays"
