"""BlockCache gives exactly what parse_exposition + normalize give on the whole payload."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kvscope.agent.normalize.blockcache import BlockCache, block_keys, block_text
from kvscope.agent.normalize.dialect import normalize
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.agent.signals import load_catalog

CATALOG = load_catalog()
LABELS = {"job": "vllm", "instance": "a:1"}


def split_blocks(text: str) -> list[str]:
    """The payload cut into chunks, each starting at a `# HELP` line (the blocks the memo keys
    stand for), by a plain split: the oracle for block_keys/block_text."""
    parts = text.split("\n# HELP ")
    if len(parts) == 1:
        return [text] if text else []
    return [parts[0] + "\n", *("# HELP " + p + "\n" for p in parts[1:-1]), "# HELP " + parts[-1]]


def whole(text: str, ts: float):
    expo = parse_exposition(text)
    return normalize(expo, "vllm", LABELS, ts, CATALOG), expo.issues


def assert_same(got, want):
    (gn, gi), (wn, wi) = got, want
    assert sorted(gn.samples) == sorted(wn.samples)
    assert gn.facts == wn.facts
    assert gn.dropped == wn.dropped
    assert Counter(i.reason for i in gi) == Counter(i.reason for i in wi)


def perturb(lines: list[str], rng: random.Random, fraction: float) -> str:
    out = []
    for ln in lines:
        if ln and not ln.startswith("#") and rng.random() < fraction:
            key, value = ln.rsplit(" ", 1)
            ln = f"{key} {float(value) + rng.randint(1, 50)}"
        out.append(ln)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("fraction", [0.0, 0.02, 0.2, 1.0])
def test_block_path_equals_whole_path_over_many_scrapes(load_fixture, fraction):
    lines = load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt").splitlines()
    rng = random.Random(7)
    cache = BlockCache(CATALOG)
    for i in range(12):
        text = perturb(lines, rng, fraction)
        assert_same(cache.normalize(text, "vllm", LABELS, 100.0 + i), whole(text, 100.0 + i))
    if fraction == 0.0:
        assert cache.misses == len(split_blocks(text))  # only the first scrape parsed anything
    elif fraction == 0.02:
        assert cache.hits > 2 * cache.misses  # unchanged families were not parsed again


def test_heavy_value_churn_is_re_read_by_the_value_templates(load_fixture):
    lines = load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt").splitlines()
    rng = random.Random(1)
    cache = BlockCache(CATALOG, refresh_every=4)
    for i in range(11):
        text = perturb(lines, rng, 1.0)
        assert_same(cache.normalize(text, "vllm", LABELS, float(i)), whole(text, float(i)))
    assert cache.whole == 0
    assert cache.values > 5 * len(split_blocks(text))  # nearly every family, every scrape after the first


def test_heavy_label_churn_takes_the_whole_path_and_refreshes_the_memo_now_and_then(load_fixture):
    text = load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt")
    cache = BlockCache(CATALOG, refresh_every=4)
    for i in range(11):  # every series gets a new model name: no block and no template matches
        cache.normalize(text.replace('model_name="', f'model_name="m{i}-'), "vllm", LABELS, float(i))
    # first scrape fills the memo; then 4 whole, 1 block refresh, 4 whole, 1 refresh
    assert cache.whole == 8
    assert cache.values == 0


def test_samples_are_stamped_with_the_new_scrape_time(load_fixture):
    text = load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt")
    cache = BlockCache(CATALOG)
    cache.normalize(text, "vllm", LABELS, 1.0)
    norm, _ = cache.normalize(text, "vllm", LABELS, 2.0)
    assert {s.timestamp for s in norm.samples} == {2.0}
    assert cache.misses == len(split_blocks(text))  # second scrape: all hits


def test_a_series_repeated_in_another_family_is_reported_as_duplicate(load_fixture):
    text = load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt")
    dup = text + 'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 5.0\n'
    cache = BlockCache(CATALOG)
    for ts in (1.0, 2.0):
        got = cache.normalize(dup, "vllm", LABELS, ts)
        assert_same(got, whole(dup, ts))
        assert [i.reason for i in got[1]] == ["duplicate_series"]


def test_a_layout_change_between_scrapes_is_checked_again(load_fixture):
    """The cross-block checks are memoized by layout: a scrape whose blocks change which series
    they hold (a duplicate appears, a second name of one signal appears) must be checked anew."""
    head = "# HELP vllm:num_requests_running r\n# TYPE vllm:num_requests_running gauge\n"
    run = 'vllm:num_requests_running{engine="0",model_name="m"} %s\n'
    kv = (
        "# HELP vllm:kv_cache_usage_perc k\n# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} %s\n'
    )
    old = (
        "# HELP vllm:gpu_cache_usage_perc old\n# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} %s\n'
    )
    # many unchanged families around them, so that the block path (not the whole one) is taken
    rest = "".join(
        b
        for b in split_blocks(load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt"))
        if "num_requests_running" not in b and "cache_usage_perc" not in b
    )
    scrapes = [
        head + run % 1 + kv % 0.1 + old % 0.2,
        head + run % 2 + kv % 0.3 + old % 0.2,  # values move
        head + run % 3 + kv % 0.3 + old.replace("gpu_cache_usage_perc{", "num_requests_running{") % 4,
        head + run % 4 + kv % 0.6 + old % 0.5,  # clean again
        head + run % 4 + kv % 0.6 + (old % 0.5).replace('model_name="m"', 'model_name="n"'),
    ]
    cache = BlockCache(CATALOG)
    for i, text in enumerate(scrapes):
        text += rest
        assert_same(cache.normalize(text, "vllm", LABELS, float(i)), whole(text, float(i)))
    assert cache.whole == 1  # the scrape with the duplicate only


def test_old_and_new_names_of_one_gauge_in_two_families_keep_the_new_name():
    """vLLM <= 0.11 exports gpu_cache_usage_perc beside kv_cache_usage_perc: the old name is a
    `fallback` alias, so the new one wins (it once took the max of the two)."""
    text = (
        "# HELP vllm:kv_cache_usage_perc new name\n# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        "# HELP vllm:gpu_cache_usage_perc old name\n# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
    )
    cache = BlockCache(CATALOG)
    for ts in (1.0, 2.0):
        got = cache.normalize(text, "vllm", LABELS, ts)
        assert_same(got, whole(text, ts))
        assert [s.value for s in got[0].samples] == [0.25]


@pytest.mark.parametrize(
    "text",
    [
        '# HELP vllm:num_requests_running x\nvllm:num_requests_running{engine="0"} 3 1700000000000\n',
        '# HELP vllm:num_requests_running x\nvllm:num_requests_running{engine="0"} NaN\n',
        '# HELP vllm:num_requests_running x\nvllm:num_requests_running{engine="0"} 3',  # truncated
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 3\n# EOF\n',
    ],
)
def test_edge_payloads_match_the_whole_path(text):
    cache = BlockCache(CATALOG)
    for ts in (1.0, 2.0):
        expo = parse_exposition(text)
        want = normalize(expo, "vllm", LABELS, ts, CATALOG), expo.issues
        assert_same(cache.normalize(text, "vllm", LABELS, ts), want)


def test_split_blocks_keeps_every_line_once(load_fixture):
    text = load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt")
    blocks = split_blocks(text)
    assert "".join(blocks) == text
    assert all(b.startswith("# HELP ") for b in blocks[1:])
    assert len(blocks) > 50


@pytest.mark.parametrize(
    "text",
    [
        "",
        "a 1\n",
        "# HELP a x\na 1\n",
        "# HELP a x\na 1\n\n# HELP b y\nb 2\n",
        "x 1\n# HELP # HELP a\n# HELP a x\na 1\n",
        "# HELP a\n# HELP a\n# HELP a\n",
    ],
)
def test_block_keys_stand_for_the_split_blocks(text, load_fixture):
    """Memo keys (no copy of the payload for middle blocks) give back exactly split_blocks' texts,
    and a key never stands for two different texts (first/last/whole blocks are tagged)."""
    for t in (text, load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt")):
        keys = block_keys(t)
        assert [block_text(k) for k in keys] == split_blocks(t)
        texts = {}
        for k in keys:
            assert texts.setdefault(k, block_text(k)) == block_text(k)
