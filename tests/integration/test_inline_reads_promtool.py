"""How every PromQL reader of a catalog signal reads its sources, on a real Prometheus evaluation
(`promtool test rules`): the rule files' `source_union` and the inline reads (`InlineSignals`) of
the candidate records, the fleet pushdown and the curve records.

* A catalog `fallback` name (an engine's old metric name) is read only for instances without the
  current one, also where a read folds its sources into a caller's grouping without `instance`.
  Such a folded read keeps every engine of the fleet (vLLM and SGLang serving one model, a
  replica only the agent relays) and every term of one instance that a label the catalog sets
  tells apart.
* A matcher on a label a source term sets to a constant (the catalog's `set`, SGLang's
  cache_scope; `engine`, the term's dialect) is no upstream label: an inline read decides it when
  it writes the term, keeping the term where the constant matches and leaving it out where it
  does not, as filtering the canonical series would. A matcher on a label a term renames into is
  matched on the upstream name, on the spelling the canonical label comes from (DCGM's `UUID` and
  `uuid`, `Hostname` and `hostname`, `pod` and `pod_name`: the later present), and one on
  `instance` on a router's worker label where the series has one."""

from __future__ import annotations

import pytest

from kvscope.core.signals import load_catalog
from kvscope.diagnoser.promql.series import SeriesCompiler
from kvscope.diagnoser.promql.signals import InlineSignals, source_union
from kvscope.diagnoser.rulebook.rule import Rule, parse_yaml
from testbed.prometheus import promtool_test_rules

pytestmark = [pytest.mark.prometheus, pytest.mark.needs("promtool"), pytest.mark.servers]

QUERIES = "engine_prefix_cache_queries_tokens_total"
USAGE = "engine_kv_cache_usage_ratio"
# vLLM 0.10.2 exports the renamed counters under both names, same labels, same values
# (tests/fixtures/scrapes/vllm-0.10.2-rendered.txt); older versions only the old name
LABELS = 'engine="0",job="vllm",model_name="m"'
SERIES = [
    # a:8000, vLLM 0.10 (both names): 60 prompt tokens a minute, 1/s; KV 25 % used
    {"series": f'vllm:prefix_cache_queries_total{{instance="a:8000",{LABELS}}}', "values": "0+60x10"},
    {"series": f'vllm:gpu_prefix_cache_queries_total{{instance="a:8000",{LABELS}}}', "values": "0+60x10"},
    {"series": f'vllm:kv_cache_usage_perc{{instance="a:8000",{LABELS}}}', "values": "0.25x10"},
    {"series": f'vllm:gpu_cache_usage_perc{{instance="a:8000",{LABELS}}}', "values": "0.25x10"},
    # b:8000, an older vLLM (old names only): 120 a minute, 2/s; KV 50 % used
    {"series": f'vllm:gpu_prefix_cache_queries_total{{instance="b:8000",{LABELS}}}', "values": "0+120x10"},
    {"series": f'vllm:gpu_cache_usage_perc{{instance="b:8000",{LABELS}}}', "values": "0.5x10"},
]
HITS = "engine_prefix_cache_hits_tokens_total"
CANONICAL = "kvscope:" + HITS
SET_SERIES = [
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


def _promtool(tmp_path, series: list[dict], cases: list[dict], canonical: tuple[str, ...] = ()) -> None:
    """`cases` on `series` under promtool, with the rule files' recording rule of each signal in
    `canonical` (source_union) as `kvscope:<signal>`."""
    catalog = load_catalog()
    records = [{"record": "kvscope:" + s, "expr": source_union(catalog.signals[s], catalog)} for s in canonical]
    tests = [{"interval": "1m", "input_series": series, "promql_expr_test": cases}]
    returncode, out = promtool_test_rules(
        tmp_path, tests, [{"name": "canonical", "rules": records}] if records else None
    )
    assert returncode == 0, out


def test_an_old_name_counts_only_where_the_instance_has_no_current_one(tmp_path):
    catalog = load_catalog()
    read = InlineSignals(catalog).read
    queries, usage = catalog.signals[QUERIES], catalog.signals[USAGE]
    cases = [
        # the rule files' canonical series: a once (current name), b from its old name
        _case(f"sum by (model) ({source_union(queries, catalog)})", [('{model="m"}', 600 + 1200)]),
        _case(
            f"sum by (instance) ({source_union(queries, catalog)})",
            [('{instance="a:8000"}', 600), ('{instance="b:8000"}', 1200)],
        ),
        _case(
            f"max by (instance) ({source_union(usage, catalog)})",
            [('{instance="a:8000"}', 0.25), ('{instance="b:8000"}', 0.5)],
        ),
        # the inline reads: with every canonical label kept
        _case(
            f"sum by (instance) ({read(QUERIES, [], 'rate', '5m')})",
            [('{instance="a:8000"}', 1), ('{instance="b:8000"}', 2)],
        ),
        # folded into the caller's grouping by instance (curve records, pushdown presence)
        _case(
            f"sum by (instance) ({read(QUERIES, [], 'rate', '5m', by=('instance',), outer='sum')})",
            [('{instance="a:8000"}', 1), ('{instance="b:8000"}', 2)],
        ),
        # folded into a grouping without instance (pushdown's summed buckets, fleet rules by model)
        _case(f"sum by (model) ({read(QUERIES, [], by=('model',), outer='sum')})", [('{model="m"}', 600 + 1200)]),
        _case(f"sum ({read(QUERIES, [], by=(), outer='sum')})", [("{}", 600 + 1200)]),
        _case(f"max ({read(USAGE, [], by=(), outer='max')})", [("{}", 0.5)]),
        # a candidate record's series of a fleet rule (by model) and of a per-instance one
        _case(_compiled("[model]", f"{{rate: {QUERIES}, range: 5m}}"), [('{model="m"}', 3)]),
        _case(_compiled("[]", f"{{rate: {QUERIES}, range: 5m}}"), [("{}", 3)]),
        _case(
            _compiled("[instance]", f"{{rate: {QUERIES}, range: 5m}}"),
            [('{instance="a:8000"}', 1), ('{instance="b:8000"}', 2)],
        ),
        _case(_compiled("[model]", f"{{gauge: {USAGE}, agg: max}}"), [('{model="m"}', 0.5)]),
        _case(_compiled("[model]", f"{{gauge: {USAGE}, agg: sum}}"), [('{model="m"}', 0.75)]),
    ]
    _promtool(tmp_path, SERIES, cases)


PROMPT = "engine_prompt_tokens_total"
PD_WAITING = "engine_pd_requests_waiting"
MIXED = [
    # a:8000, vLLM: 60 prompt tokens a minute (1/s), 20 prefix-cache hits a minute; also relayed
    # by the agent (the same engine, the same values: counted once)
    {"series": f'vllm:prompt_tokens_total{{instance="a:8000",{LABELS}}}', "values": "0+60x10"},
    {"series": f'vllm:prefix_cache_hits_total{{instance="a:8000",{LABELS}}}', "values": "0+20x10"},
    {
        "series": 'kvscope_engine_prompt_tokens_total{instance="a:8000",engine="vllm",model="m",dp_rank="0",job="kvscope"}',
        "values": "0+60x10",
    },
    # c:30000, SGLang serving the same model: 120 a minute (2/s); hits of requests with per-tier
    # details (device 30 a minute, host 5) and of requests without (cache_source="total", 10)
    {"series": 'sglang:prompt_tokens_total{instance="c:30000",job="sglang",model_name="m"}', "values": "0+120x10"},
    {
        "series": 'sglang:cached_tokens_total{instance="c:30000",job="sglang",model_name="m",cache_source="device"}',
        "values": "0+30x10",
    },
    {
        "series": 'sglang:cached_tokens_total{instance="c:30000",job="sglang",model_name="m",cache_source="host"}',
        "values": "0+5x10",
    },
    {
        "series": 'sglang:cached_tokens_total{instance="c:30000",job="sglang",model_name="m",cache_source="total"}',
        "values": "0+10x10",
    },
    {"series": 'sglang:num_prefill_bootstrap_queue_reqs{instance="c:30000",model_name="m"}', "values": "3x10"},
    {"series": 'sglang:num_prefill_inflight_queue_reqs{instance="c:30000",model_name="m"}', "values": "7x10"},
    # d:8000, seen only through the agent: 30 a minute (0.5/s)
    {
        "series": 'kvscope_engine_prompt_tokens_total{instance="d:8000",engine="vllm",model="m",job="kvscope"}',
        "values": "0+30x10",
    },
]


def test_a_folded_read_keeps_every_engine_and_every_term_of_one(tmp_path):
    """A read folded into a fleet grouping (by model, by ()) sums what `source_union` does: each
    source term's engines (vLLM and SGLang serving one model, a replica only the agent relays),
    and each of one instance's terms that the catalog tells apart by a label it sets (SGLang's
    cache_scope, the P/D queue)."""
    catalog = load_catalog()
    read = InlineSignals(catalog).read
    prompt, hits, waiting = (catalog.signals[s] for s in (PROMPT, HITS, PD_WAITING))
    total, hit_total = 600 + 1200 + 300, 200 + 300 + 100
    cases = [
        # the rule files' canonical series
        _case(f"sum by (model) ({source_union(prompt, catalog)})", [('{model="m"}', total)]),
        _case(f"sum by (model) ({source_union(hits, catalog)})", [('{model="m"}', hit_total)]),
        _case(f"max by (model) ({source_union(waiting, catalog)})", [('{model="m"}', 7)]),
        # the inline reads folded into a grouping without instance
        _case(f"sum by (model) ({read(PROMPT, [], by=('model',), outer='sum')})", [('{model="m"}', total)]),
        _case(f"sum ({read(PROMPT, [], by=(), outer='sum')})", [("{}", total)]),
        _case(f"sum ({read(PROMPT, [], 'rate', '5m', by=(), outer='sum')})", [("{}", 3.5)]),
        _case(f"sum by (model) ({read(HITS, [], by=('model',), outer='sum')})", [('{model="m"}', hit_total)]),
        _case(f"max by (model) ({read(PD_WAITING, [], by=('model',), outer='max')})", [('{model="m"}', 7)]),
        # ... and per instance (every canonical label kept, or folded by instance)
        _case(
            f"sum by (instance) ({read(PROMPT, [], 'rate', '5m', by=('instance',), outer='sum')})",
            [('{instance="a:8000"}', 1), ('{instance="c:30000"}', 2), ('{instance="d:8000"}', 0.5)],
        ),
        # a candidate record's series of a fleet rule (by model, by ()) and of a per-instance one
        _case(_compiled("[model]", f"{{rate: {PROMPT}, range: 5m}}"), [('{model="m"}', 3.5)]),
        _case(_compiled("[]", f"{{rate: {PROMPT}, range: 5m}}"), [("{}", 3.5)]),
        _case(
            _compiled("[instance]", f"{{rate: {PROMPT}, range: 5m}}"),
            [('{instance="a:8000"}', 1), ('{instance="c:30000"}', 2), ('{instance="d:8000"}', 0.5)],
        ),
        _case(_compiled("[model]", f"{{rate: {HITS}, range: 5m}}"), [('{model="m"}', hit_total / 600)]),
        _case(_compiled("[model]", f"{{gauge: {PD_WAITING}, agg: max}}"), [('{model="m"}', 7)]),
    ]
    _promtool(tmp_path, MIXED, cases)


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
    _promtool(tmp_path, SET_SERIES, cases, (HITS,))


UTIL = "gpu_utilization_ratio"
DCGM = 'gpu="0",job="dcgm",modelName="H100"'
SPELLING_SERIES = [
    # dcgm-exporter's default labels (UUID, Hostname, pod), 50 %
    {
        "series": f'DCGM_FI_DEV_GPU_UTIL{{instance="d:9400",UUID="GPU-1",Hostname="n1",pod="p1",{DCGM}}}',
        "values": "50x10",
    },
    # --use-old-namespace and after 4.5.3 (uuid, hostname, pod_name), 25 %
    {
        "series": f'DCGM_FI_DEV_GPU_UTIL{{instance="e:9400",uuid="GPU-2",hostname="n2",pod_name="p2",{DCGM}}}',
        "values": "25x10",
    },
    # both spellings on one series (one GPU), 75 %
    {"series": f'DCGM_FI_DEV_GPU_UTIL{{instance="f:9400",UUID="GPU-3",uuid="GPU-3",{DCGM}}}', "values": "75x10"},
]


def test_a_matcher_on_a_label_with_two_upstream_spellings_reads_both(tmp_path):
    catalog = load_catalog()
    reader = InlineSignals(catalog)
    canonical = "kvscope:" + UTIL
    every = [('{gpu_uuid="GPU-1"}', 0.5), ('{gpu_uuid="GPU-2"}', 0.25), ('{gpu_uuid="GPU-3"}', 0.75)]
    uuids = [("gpu_uuid", "=~", "GPU-.*")]
    cases = [
        # the canonical series (the rule files' recording rule of source_union), filtered
        _case(f'sum by (gpu_uuid) ({canonical}{{gpu_uuid=~"GPU-.*"}})', every),
        _case(f'sum by (gpu_uuid) ({canonical}{{gpu_uuid!="GPU-1"}})', every[1:]),
        # the inline reads: a series with either spelling, once where it has both
        _case(f"sum by (gpu_uuid) ({reader.read(UTIL, uuids)})", every),
        _case(f"sum by (gpu_uuid) ({reader.read(UTIL, [('gpu_uuid', '=~', 'GPU-1|GPU-2')])})", every[:2]),
        _case(f"sum by (gpu_uuid) ({reader.read(UTIL, [('gpu_uuid', '!=', 'GPU-1')])})", every[1:]),
        _case(f"sum by (gpu_uuid) ({reader.read(UTIL, [('gpu_uuid', '!~', 'GPU-1|GPU-2')])})", every[2:]),
        _case(
            f"sum by (node) ({reader.read(UTIL, [('node', '=~', 'n1|n2')])})",
            [('{node="n1"}', 0.5), ('{node="n2"}', 0.25)],
        ),
        _case(
            f"sum by (pod) ({reader.read(UTIL, [('pod', '=~', 'p1|p2')])})", [('{pod="p1"}', 0.5), ('{pod="p2"}', 0.25)]
        ),
        _case(
            f"sum by (gpu_uuid) ({reader.read(UTIL, [('gpu_uuid', '=~', 'GPU-2'), ('node', '=~', 'n2')])})", every[1:2]
        ),
        _case(
            f"sum by (gpu_uuid) ({reader.read(UTIL, uuids, 'max_over_time', '5m', by=('gpu_uuid',), outer='max')})",
            every,
        ),
        # the evidence reads (pushdown/evidence.py): as on the wire, each series once
        _case(f"count({reader.raw_reads(UTIL, uuids)[0]})", [("{}", 3)]),
        _case(f"sum({reader.raw_reads(UTIL, uuids)[0]})", [("{}", 150)]),
        _case(f"count({reader.raw_reads(UTIL, uuids, 'last_over_time', '5m')[0]})", [("{}", 3)]),
        _case(
            f"count({reader.raw_reads(UTIL, [('gpu_uuid', '=~', 'GPU-1|GPU-2')], 'last_over_time', '5m')[0]})",
            [("{}", 2)],
        ),
    ]
    _promtool(tmp_path, SPELLING_SERIES, cases, (UTIL,))


ROUTED = 'job="router",model_name="m",engine="0"'
SOURCE_SERIES = [
    # vLLM workers through sglang-router's /engine_metrics: the worker's URL names the instance
    {
        "series": f'vllm:prefix_cache_hits_total{{instance="r:30000",worker_addr="http://w1:8000",{ROUTED}}}',
        "values": "0+30x10",
    },
    {
        "series": f'vllm:prefix_cache_hits_total{{instance="r:30000",worker_addr="http://w2:8000/",{ROUTED}}}',
        "values": "0+90x10",
    },
    # a vLLM scraped directly
    {
        "series": 'vllm:prefix_cache_hits_total{instance="w3:8000",job="vllm",model_name="m",engine="0"}',
        "values": "0+60x10",
    },
    # a GPU whose series carries both spellings with different values: the later (uuid, pod_name) names it
    {
        "series": f'DCGM_FI_DEV_GPU_UTIL{{instance="g:9400",UUID="GPU-4",uuid="GPU-5",pod="p3",pod_name="p4",{DCGM}}}',
        "values": "10x10",
    },
    {"series": f'DCGM_FI_DEV_GPU_UTIL{{instance="h:9400",UUID="GPU-6",pod="p5",{DCGM}}}', "values": "20x10"},
]


def test_a_matcher_reads_the_upstream_label_the_canonical_one_comes_from(tmp_path):
    """A router's worker label names the instance, and of two spellings on one series the later
    names the canonical label: an inline read matches there, as filtering the canonical series."""
    catalog = load_catalog()
    reader = InlineSignals(catalog)
    hits, util = "kvscope:" + HITS, "kvscope:" + UTIL
    w1, w2, w3 = ('{instance="w1:8000"}', 0.5), ('{instance="w2:8000"}', 1.5), ('{instance="w3:8000"}', 1.0)
    gpu5, gpu6 = ('{gpu_uuid="GPU-5"}', 0.1), ('{gpu_uuid="GPU-6"}', 0.2)

    def rate(matchers: list) -> str:
        return f"sum by (instance) ({reader.read(HITS, matchers, 'rate', '5m', by=('instance',), outer='sum')})"

    def gpus(matchers: list, by: str = "gpu_uuid") -> str:
        return f"sum by ({by}) ({reader.read(UTIL, matchers)})"

    cases = [
        # the canonical series (the rule files' recording rules of source_union), filtered
        _case(f'sum by (instance) (rate({hits}{{instance=~"w1:8000|r:30000"}}[5m]))', [w1]),
        _case(f'sum by (instance) (rate({hits}{{instance!="w1:8000"}}[5m]))', [w2, w3]),
        _case(f'sum by (gpu_uuid) ({util}{{gpu_uuid=~"GPU-4|GPU-5"}})', [gpu5]),
        _case(f'sum by (gpu_uuid) ({util}{{gpu_uuid!="GPU-5"}})', [gpu6]),
        _case(f'sum by (pod) ({util}{{pod=~"p3|p4"}})', [('{pod="p4"}', 0.1)]),
        # the inline reads
        _case(rate([("instance", "=~", "w1:8000|r:30000")]), [w1]),
        _case(rate([("instance", "=", "w2:8000")]), [w2]),
        _case(rate([("instance", "!=", "w1:8000")]), [w2, w3]),
        _case(rate([("instance", "!~", "w.:8000")]), []),
        _case(gpus([("gpu_uuid", "=~", "GPU-4|GPU-5")]), [gpu5]),
        _case(gpus([("gpu_uuid", "!=", "GPU-5")]), [gpu6]),
        _case(gpus([("gpu_uuid", "!~", "GPU-4")]), [gpu5, gpu6]),
        _case(gpus([("pod", "=~", "p3|p4")], "pod"), [('{pod="p4"}', 0.1)]),
        _case(gpus([("pod", "=~", "p3|p5")], "pod"), [('{pod="p5"}', 0.2)]),
        # the evidence reads: as on the wire
        _case(f"count({reader.raw_reads(HITS, [('instance', '=~', 'w1:8000|w3:8000')])[0]})", [("{}", 2)]),
        _case(f"count({reader.raw_reads(UTIL, [('gpu_uuid', '=~', 'GPU-4')])[0]})", []),
    ]
    _promtool(tmp_path, SOURCE_SERIES, cases, (HITS, UTIL))
