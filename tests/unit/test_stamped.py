"""Block paths of a cycle (agent/scrape/stamped.py) equal the general paths on the flattened samples:
the change-point encoder's rows, the counter-reset counts and the GPU join's selection.

Cycles are made the way the agent makes them: real payloads (the vLLM and dcgm-exporter
fixtures) through a BlockCache per target, with values moving, counters going down, series
appearing, a target missing a cycle, and timestamps that collide."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kvscope.agent.derive.cascade import CascadeWindow
from kvscope.agent.derive.gpu_join import _joined_name, derive_engine_gpu
from kvscope.agent.normalize.blockcache import BlockCache
from kvscope.agent.runtime import CounterResets
from kvscope.agent.scrape.stamped import Parts, Stamped, pick
from kvscope.agent.signals import Sample, load_catalog
from kvscope.agent.store.changepoints import ChangeEncoder, Encoded

CATALOG = load_catalog()
VLLM = "scrapes/vllm-0.32.0-cpu-after-load.txt"
DCGM = "scrapes/dcgm-exporter-4.5.3-constructed-2gpu.txt"


def moved(lines: list[str], rng: random.Random, fraction: float, down: float) -> str:
    """Some sample values move up; with probability `down` a moved value goes down instead."""
    out = []
    for ln in lines:
        if ln and not ln.startswith("#") and rng.random() < fraction:
            key, value = ln.rsplit(" ", 1)
            step = rng.randint(1, 9) * (-1 if rng.random() < down else 1)
            ln = f"{key} {max(0.0, float(value) + step)}"
        out.append(ln)
    return "\n".join(out) + "\n"


def cycles(load_fixture, n: int = 14, seed: int = 5):
    """n cycles as Parts: 3 vLLM targets and 1 dcgm target, plus a list part per cycle."""
    rng = random.Random(seed)
    texts = {"v0": load_fixture(VLLM), "v1": load_fixture(VLLM), "v2": load_fixture(VLLM), "g": load_fixture(DCGM)}
    caches = {k: BlockCache(CATALOG) for k in texts}
    out = []
    for i in range(n):
        parts = Parts()
        for j, (k, base) in enumerate(texts.items()):
            if k == "v2" and i % 5 == 3:
                continue  # target down this cycle
            text = moved(base.splitlines(), rng, 0.03 if i % 4 else 0.5, 0.3)
            if k == "v1" and i in (6, 7):  # a new series in a family
                text += 'vllm:num_requests_running{engine="1",model_name="tiny-llama"} 2.0\n'
            ts = 100.0 + i + 0.01 * j
            if i == 11:
                ts = 100.0 + i  # all targets on one timestamp
            norm, _ = caches[k].normalize(text, "dcgm" if k == "g" else "vllm", {"job": k, "instance": k}, ts)
            parts.add(norm.samples, k)
        parts.add([Sample("kvscope_target_up", (("instance", k),), 1.0, 100.0 + i + 0.5) for k in texts])
        if i == 12:  # a list sample on a Stamped part's timestamp
            parts.add([Sample("host_cpu_seconds_total", (("instance", "v0"),), float(i), 100.0 + i + 0.01)])
        out.append(parts)
    return out


def test_cycles_are_mostly_stamped_blocks(load_fixture):
    cs = cycles(load_fixture)
    assert all(sum(isinstance(p, Stamped) for p in c.parts) >= 3 for c in cs)


def rows(enc: Encoded):
    return enc.points, enc.marks, enc.stamps, enc.accepted, enc.dropped


def test_encoder_rows_from_blocks_equal_the_flat_rows(load_fixture):
    ids: dict = {}
    block_enc = ChangeEncoder(lambda n, lab: ids.setdefault((n, lab), len(ids) + 1))
    flat_enc = ChangeEncoder(lambda n, lab: ids.setdefault((n, lab), len(ids) + 1))
    for i, c in enumerate(cycles(load_fixture)):
        got = block_enc.encode(c, 200.0 + i)
        want = flat_enc.encode(list(c), 200.0 + i)
        assert rows(got) == rows(want), f"cycle {i}"
    assert block_enc.block_cohorts > 20  # the block path was taken most of the time


def test_encoder_block_guards_take_the_general_path():
    """Values a block path must not skip: NaN (dropped), an int (converted), a changed series."""
    lab = (("instance", "a"),)
    a = [("x_total", lab, 1.0), ("y", lab, 2.0)]
    b = [("z", lab, 3.0)]
    seq = [
        [a, b],
        [a, [("z", lab, 4.0)]],
        [a, [("z", lab, float("nan"))]],
        [a, [("z", lab, 5)]],
        [a, [("z", lab, 5)]],
        [a, [("w", lab, 5.0)]],
        [a, [("w", (("instance", "b"),), 6.0)]],
        [a],
        [a, b, b],
        [[("x_total", lab, 0.5), ("y", lab, 2.0)], b],
    ]
    ids: dict = {}
    block_enc = ChangeEncoder(lambda n, lab: ids.setdefault((n, lab), len(ids) + 1))
    flat_enc = ChangeEncoder(lambda n, lab: ids.setdefault((n, lab), len(ids) + 1))
    for i, blocks in enumerate(seq):
        part = Stamped(blocks, 10.0 + i)
        assert rows(block_enc.encode(Parts([part]), 0.0)) == rows(flat_enc.encode(list(part), 0.0)), i


def test_counter_resets_from_blocks_equal_the_flat_definition(load_fixture):
    block, flat = CounterResets(), CounterResets()
    got: Counter[str] = Counter()
    want: Counter[str] = Counter()
    for c in cycles(load_fixture, n=20, seed=9):
        block.observe(c, got)
        flat.observe(list(c), want)
    assert got == want
    assert sum(got.values()) >= 5  # counters did go down


def test_counter_resets_compare_a_target_with_its_own_previous_part():
    lab = (("instance", "a"),)
    one = [("x_total", lab, 5.0)]
    resets: Counter[str] = Counter()
    cr = CounterResets()
    for value, present in ((5.0, True), (3.0, True), (4.0, False), (1.0, True), (0.5, True)):
        parts = Parts()
        if present:
            parts.add(Stamped([one, [("x_total", lab, value)]], 1.0), "a")
        cr.observe(parts, resets)
    # 5 -> 3 is a reset; the target is absent once, so 1.0 is not compared; 1 -> 0.5 is one
    assert resets == Counter({"a": 2})


def test_gpu_join_selects_the_same_samples_from_blocks(load_fixture):
    for c in cycles(load_fixture, n=3):
        assert pick(c, _joined_name.__getitem__) == pick(list(c), _joined_name.__getitem__)
        assert derive_engine_gpu(c) == derive_engine_gpu(list(c))


def test_cascade_hook_reads_the_same_samples_from_blocks(load_fixture):
    blocks, flat = CascadeWindow(), CascadeWindow()
    for c in cycles(load_fixture):
        out = blocks(c)
        assert out == flat(list(c)) and {s.label("instance") for s in out} >= {"v0", "v1"}


def test_stamped_and_parts_read_as_their_samples():
    lab = (("instance", "a"),)
    s = Stamped([[("a", lab, 1.0)], [], [("b", lab, 2.0), ("c", lab, 3.0)]], 7.0)
    flat = [Sample("a", lab, 1.0, 7.0), Sample("b", lab, 2.0, 7.0), Sample("c", lab, 3.0, 7.0)]
    assert list(s) == flat and len(s) == 3 and s[1] == flat[1] and s[1:] == flat[1:] and s == flat
    p = Parts([s, [], [Sample("d", lab, 4.0, 8.0)]])
    assert len(p) == 4 and list(p) == [*flat, Sample("d", lab, 4.0, 8.0)] and len(p.parts) == 2
    p.add(Parts([[Sample("e", lab, 5.0, 9.0)]]))
    assert [x.name for x in p] == ["a", "b", "c", "d", "e"] and p.sources == ["", "", ""]
    with pytest.raises(TypeError):
        hash(p)


def test_counter_resets_of_a_block_whose_series_changed_go_by_series():
    """Same positions, other series: a lower value of another series is no reset."""
    a, b = (("instance", "a"), ("k", "1")), (("instance", "a"), ("k", "2"))
    seq = [
        [("x_total", a, 5.0)],
        [("x_total", b, 3.0)],
        [("x_total", b, 2.0), ("x_total", a, 6.0)],
        [("x_total", a, 1.0), ("x_total", b, 2.5)],
    ]
    block, flat = CounterResets(), CounterResets()
    got: Counter[str] = Counter()
    want: Counter[str] = Counter()
    for i, heads in enumerate(seq):
        part = Stamped([heads], float(i))
        block.observe(_sourced(part), got)
        flat.observe(list(part), want)
    assert got == want == Counter({"a": 2})  # b: 3 -> 2, a: 6 -> 1


def _sourced(part: Stamped) -> Parts:
    parts = Parts()
    parts.add(part, "a")
    return parts


def test_a_store_given_parts_reads_back_what_it_reads_back_given_flat_samples(load_fixture, tmp_path):
    """End to end through SqliteStore: every stored point, queried back, is the same."""
    from kvscope.agent.store.sqlite import SqliteStore

    a = SqliteStore(tmp_path / "parts.db", background=False)
    b = SqliteStore(tmp_path / "flat.db", background=False)
    try:
        for c in cycles(load_fixture, n=10, seed=2):
            a.write(c)
            b.write(list(c))
            a.flush()
            b.flush()
        names = a.names()
        assert names == b.names() and len(names) > 50
        for name in names:
            assert a.query(name, 0, 1e12) == b.query(name, 0, 1e12), name
        assert a.stats().written == b.stats().written == sum(len(c) for c in cycles(load_fixture, n=10, seed=2))
        assert a._encoder.block_cohorts > 10 and b._encoder.block_cohorts == 0
    finally:
        a.close()
        b.close()
