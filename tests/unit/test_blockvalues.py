"""Value templates (agent/normalize/blockvalues.py) give exactly what parse + normalize give, or step aside.

Each case feeds a sequence of payloads through a BlockCache and compares every scrape with the
whole-payload general path; the `values` counter says whether the template path was taken."""

from __future__ import annotations

import random

import pytest

from kvscope.agent.normalize.blockcache import BlockCache
from kvscope.agent.normalize.blockvalues import ValueTemplate
from kvscope.agent.normalize.dialect import MappingMemo, normalize
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.agent.signals import load_catalog
from tests.unit.test_blockcache import split_blocks

CATALOG = load_catalog()
LABELS = {"job": "x", "instance": "a:1"}
VLLM = "scrapes/vllm-0.32.0-cpu-after-load.txt"
DCGM = "scrapes/dcgm-exporter-4.5.3-constructed-2gpu.txt"
RUN = (
    "# HELP vllm:num_requests_running r\n# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0",model_name="m"} %s\n'
)
UTIL = (
    "# HELP DCGM_FI_DEV_GPU_UTIL u\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
    'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",modelName="H100"} %s\n'
)


def whole(text: str, engine: str, ts: float):
    expo = parse_exposition(text)
    norm = normalize(expo, engine, LABELS, ts, CATALOG)
    return norm.samples, norm.facts, norm.dropped, sorted(i.reason for i in expo.issues), norm.unmapped


def run(cache: BlockCache, texts: list[str], engine: str = "vllm") -> None:
    for i, text in enumerate(texts):
        norm, issues = cache.normalize(text, engine, LABELS, 10.0 + i)
        got = norm.samples, norm.facts, norm.dropped, sorted(i.reason for i in issues), norm.unmapped
        want = whole(text, engine, 10.0 + i)
        assert sorted(got[0]) == sorted(want[0]), f"scrape {i}"
        assert got[1:] == want[1:], f"scrape {i}"


def with_rest(fixture: str, family: str, *blocks: str) -> list[str]:
    """Each block text followed by the fixture's other families (so the block path is taken)."""
    rest = "".join(b for b in split_blocks(fixture) if family not in b)
    return [b + rest for b in blocks]


@pytest.mark.parametrize(("fixture", "engine"), [(VLLM, "vllm"), (DCGM, "dcgm")])
def test_random_value_moves_are_re_read_exactly(load_fixture, fixture, engine):
    """Every value moves (dcgm: scaled units, so a dropped factor shows), spellings included."""
    lines = load_fixture(fixture).splitlines()
    rng = random.Random(3)
    spell = [
        lambda v: repr(v),
        lambda v: f"{v:.3e}",
        lambda v: str(int(v)),
        lambda v: f"{v:.6E}",
        lambda v: f"+{v}",
        lambda v: f"{v}\r",
    ]
    texts = []
    for _ in range(8):
        out = []
        for ln in lines:
            if ln and not ln.startswith("#"):
                key, _ = ln.rsplit(" ", 1)
                ln = f"{key} {rng.choice(spell)(rng.uniform(0, 1e6))}"
            out.append(ln)
        texts.append("\n".join(out) + "\n")
    cache = BlockCache(CATALOG)
    run(cache, texts, engine)
    assert cache.values > 5 * len(split_blocks(texts[0]))
    assert cache.whole == 0


@pytest.mark.parametrize(
    "value",
    [
        "NaN",
        "+Inf",
        "-Inf",
        "1e400",
        "0x10",
        "",
        "1.5.2",
        "\t7",
        "7\t",
        "7\t8",
        "-0.0",
        "1_0",
        "7 1700000000000",
        '7 # {a="b"} 1',
    ],
)
def test_odd_new_values_match_the_general_path(load_fixture, value):
    texts = with_rest(load_fixture(VLLM), "num_requests_running", RUN % 1, RUN % 2, RUN % value, RUN % 3)
    run(BlockCache(CATALOG), texts)


def test_an_overflowing_scale_factor_steps_aside(load_fixture):
    texts = with_rest(load_fixture(DCGM), "DCGM_FI_DEV_GPU_UTIL", UTIL % 50, UTIL % 1e308, UTIL % 60)
    texts[1] = texts[1].replace("1e+308", "1e308")
    run(BlockCache(CATALOG), texts, "dcgm")


@pytest.mark.parametrize(
    "edit",
    [
        lambda b: b.replace("# TYPE", " # TYPE"),  # a comment becomes a bad sample line
        lambda b: b.replace("gauge", "gauges"),  # bad_type
        lambda b: "#c\n" + b,
        lambda b: b.replace("# HELP vllm:num_requests_running r", "# HELP vllm:num_requests_running s"),
        lambda b: b.replace('model_name="m"', 'model_name="n"'),
        lambda b: b.replace('engine="0"', 'engine="0" '),
        lambda b: b + "\n",
        lambda b: b + "  \n",
        lambda b: b.replace("\nvllm:", "\n\nvllm:"),
        lambda b: b + 'vllm:num_requests_running{engine="1",model_name="m"} 2\n',
        lambda b: b + 'vllm:num_requests_running{engine="0",model_name="m"} 2\n',  # a duplicate
        lambda b: b.replace("running{", "running {"),
        lambda b: b.replace("} ", "}\t"),
    ],
)
def test_any_other_edit_matches_the_general_path(load_fixture, edit):
    texts = with_rest(load_fixture(VLLM), "num_requests_running", RUN % 1, RUN % 2, edit(RUN % 3), RUN % 4)
    cache = BlockCache(CATALOG)
    run(cache, texts)
    assert cache.values >= 1  # scrape 1 was re-read by the template


def test_a_comment_without_spaces_must_stay_a_comment(load_fixture):
    texts = with_rest(
        load_fixture(VLLM),
        "num_requests_running",
        "#c\n" + RUN % 1,
        "#c\n" + RUN % 2,
        " #c\n" + RUN % 3,
        "#c\n" + RUN % 4,
    )
    run(BlockCache(CATALOG), texts)


def test_values_only_blocks_use_the_template(load_fixture):
    texts = with_rest(load_fixture(VLLM), "num_requests_running", RUN % 1, RUN % 2, RUN % 3.5, RUN % 0)
    cache = BlockCache(CATALOG)
    run(cache, texts)
    assert (cache.values, cache.whole) == (3, 0)


def templates_of(text: str, engine: str = "vllm") -> list[ValueTemplate | None]:
    memo = MappingMemo()
    out = []
    for block in split_blocks(text):
        expo = parse_exposition(block, openmetrics=False)
        norm = normalize(expo, engine, LABELS, None, CATALOG, memo)
        plan = memo.mapper(CATALOG, engine, LABELS).linear_plan(expo.samples)
        out.append(ValueTemplate.build(block, expo, plan, [(s[0], s[1], s[2]) for s in norm.samples]))
    return out


def test_blocks_that_do_not_qualify_get_no_template(load_fixture):
    collapse = (
        "# HELP vllm:num_requests_running r\n"  # two series that differ only in a dropped label
        'vllm:num_requests_running{engine="0",model_name="m",x="1"} 1\n'
        'vllm:num_requests_running{engine="0",model_name="m",x="2"} 2\n'
    )
    exemplar = '# HELP vllm:num_requests_running r\nvllm:num_requests_running{engine="0"} 1 # {a="b"} 1\n'
    stamped = '# HELP vllm:num_requests_running r\nvllm:num_requests_running{engine="0"} 1 1700000000000\n'
    bad = '# HELP vllm:num_requests_running r\nvllm:num_requests_running{engine="0"} x\n'
    for text in (collapse, exemplar, stamped, bad):
        assert templates_of(text) == [None], text
    assert templates_of(RUN % 1)[0] is not None
    # the capture's config info gauge makes facts: no template; most other families have one
    tpls = templates_of(load_fixture(VLLM))
    assert sum(t is None for t in tpls) >= 1
    assert sum(t is not None for t in tpls) > 0.8 * len(tpls)


def test_a_template_reads_exactly_what_it_was_built_from(load_fixture):
    for fixture, engine in ((VLLM, "vllm"), (DCGM, "dcgm")):
        text = load_fixture(fixture)
        for block, tpl in zip(split_blocks(text), templates_of(text, engine), strict=True):
            if tpl is not None:
                expo = parse_exposition(block, openmetrics=False)
                norm = normalize(expo, engine, LABELS, None, CATALOG)
                assert tpl.apply(block) == [(s[0], s[1], s[2]) for s in norm.samples]
