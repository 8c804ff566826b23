"""A matcher on a label a source term sets to a constant (the catalog's `set`, SGLang's cache_scope;
`engine`, the term's dialect) is no upstream label: an inline read (`InlineSignals`) decides it when
it writes the term, keeping the term where the constant matches and leaving it out where it does
not, as filtering the canonical series (`source_union`) would. A matcher on a label a term renames
into is matched on the upstream name. Checked on a real Prometheus evaluation (`promtool test
rules`)."""

from __future__ import annotations

import pytest

from kvscope.core.signals import load_catalog
from kvscope.diagnoser.promql.series import SeriesCompiler
from kvscope.diagnoser.promql.signals import InlineSignals, source_union
from kvscope.diagnoser.rulebook.rule import Rule, parse_yaml
from testbed.prometheus import promtool_test_rules

pytestmark = [pytest.mark.prometheus, pytest.mark.needs("promtool"), pytest.mark.servers]

HITS = "engine_prefix_cache_hits_tokens_total"
CANONICAL = "kvscope:" + HITS
SERIES = [
    # a:8000, vLLM (its own `engine` label is the data-parallel rank): 20 hits a minute, no cache_scope
    {
        "series": 'vllm:prefix_cache_hits_total{instance="a:8000",engine="0",job="vllm",model_name="m"}',
        "values": "0+20x10",
    },
    # c:30000, SGLang: device hits 30 a minute (cache_scope device), host 5 (read by no term), and
    # hits of requests without per-tier details 10 (cache_scope all_tiers)
    *(
        {
            "series": f'sglang:cached_tokens_total{{instance="c:30000",job="sglang",model_name="m",cache_source="{source}"}}',
            "values": f"0+{per_minute}x10",
        }
        for source, per_minute in (("device", 30), ("host", 5), ("total", 10))
    ),
    # e:30000, SGLang seen only through the agent, which writes cache_scope itself: 60 and 12 a minute
    *(
        {
            "series": f'kvscope_{HITS}{{instance="e:30000",engine="sglang",model="m",cache_scope="{scope}",job="kvscope"}}',
            "values": f"0+{per_minute}x10",
        }
        for scope, per_minute in (("device", 60), ("all_tiers", 12))
    ),
]
EVAL = "10m"


def _case(expr: str, samples: list[tuple[str, float]]) -> dict:
    return {
        "expr": str(expr),
        "eval_time": EVAL,
        "exp_samples": [{"labels": labels, "value": value} for labels, value in samples],
    }


def _compiled(by: str, series: str) -> str:
    """The series as the candidate records compile it (promql/quantiles.py, pushdown/candidates.py)."""
    rule = Rule("t", "", parse_yaml(f"by: {by}\nseries:\n  s: {series}\n"))
    return SeriesCompiler(rule, InlineSignals(load_catalog())).expr("s")


def test_a_matcher_on_a_label_a_term_sets_keeps_or_leaves_out_the_term(tmp_path):
    catalog = load_catalog()
    read = InlineSignals(catalog).read
    device, all_tiers = [("c:30000", 300), ("e:30000", 600)], [("c:30000", 100), ("e:30000", 120)]

    def by_instance(samples: list[tuple[str, float]]) -> list[tuple[str, float]]:
        return [(f'{{instance="{instance}"}}', value) for instance, value in samples]

    cases = [
        # the canonical series (the rule files' recording rule of source_union), filtered
        _case(f'sum by (instance) ({CANONICAL}{{cache_scope="device"}})', by_instance(device)),
        _case(f'sum by (instance) ({CANONICAL}{{cache_scope="all_tiers"}})', by_instance(all_tiers)),
        _case(f'sum by (instance) ({CANONICAL}{{engine="vllm"}})', by_instance([("a:8000", 200)])),
        # the inline reads, with every canonical label kept
        _case(f"sum by (instance) ({read(HITS, [('cache_scope', '=~', 'device')])})", by_instance(device)),
        _case(f"sum by (instance) ({read(HITS, [('cache_scope', '=~', 'all_tiers')])})", by_instance(all_tiers)),
        _case(
            f"sum by (instance) ({read(HITS, [('cache_scope', '!=', '')])})",
            by_instance([("c:30000", 400), ("e:30000", 720)]),
        ),
        _case(f"sum by (instance) ({read(HITS, [('cache_scope', '=~', 'host')])})", []),
        # `engine`: the dialect a term sets (vLLM's own `engine` is its dp rank) or the agent's label
        _case(f"sum by (instance) ({read(HITS, [('engine', '=~', 'vllm')])})", by_instance([("a:8000", 200)])),
        _case(
            f"sum by (instance) ({read(HITS, [('engine', '=~', 'sglang')])})",
            by_instance([("c:30000", 400), ("e:30000", 720)]),
        ),
        # a label a term renames into (model <- model_name) is matched upstream
        _case(
            f"sum by (instance) ({read(HITS, [('model', '=~', 'm')])})",
            by_instance([("a:8000", 200), ("c:30000", 400), ("e:30000", 720)]),
        ),
        # folded into a grouping without instance
        _case(
            f"sum by (model) ({read(HITS, [('cache_scope', '=~', 'device')], by=('model',), outer='sum')})",
            [('{model="m"}', 900)],
        ),
        # a candidate record's series (a rule's `match:`), per instance and by model
        _case(
            _compiled("[instance]", f"{{rate: {HITS}, range: 5m, match: {{cache_scope: device}}}}"),
            by_instance([("c:30000", 0.5), ("e:30000", 1)]),
        ),
        _case(
            _compiled("[model]", f"{{rate: {HITS}, range: 5m, match: {{cache_scope: device}}}}"), [('{model="m"}', 1.5)]
        ),
    ]
    rules = [
        {"name": "canonical", "rules": [{"record": CANONICAL, "expr": source_union(catalog.signals[HITS], catalog)}]}
    ]
    returncode, out = promtool_test_rules(
        tmp_path, [{"interval": "1m", "input_series": SERIES, "promql_expr_test": cases}], rules
    )
    assert returncode == 0, out
