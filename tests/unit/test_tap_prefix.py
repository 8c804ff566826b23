"""Prefix reuse potential, SSE splitting and tenant identity: the tap's pure parts."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.agent.tap.prefix import PrefixIndex, render_prompt
from kvscope.agent.tap.sse import classify_event, parse_usage, split_events
from kvscope.agent.tenants import OTHER, TenantLimiter, parse_tenant


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def test_block_hashes_are_chained_so_equal_hashes_mean_equal_prefixes():
    def hashes(prompt):
        return PrefixIndex(block_chars=64, block_tokens=16).observe(prompt, "r").hashes

    a = hashes("x" * 64 + "y" * 64 + "z" * 10)
    b = hashes("w" * 64 + "y" * 64 + "z" * 10)
    assert len(a) == 3 and all(isinstance(h, int) for h in a)
    assert a[1] != b[1]  # same second block, different prefix
    assert hashes("x" * 64 + "y" * 64 + "q")[:2] == a[:2]
    assert len(hashes(list(range(40)))) == 3


def test_reusable_ratio_counts_only_leading_blocks_seen_in_the_window():
    clock = Clock()
    idx = PrefixIndex(window_s=60, block_chars=64, clock=clock)
    system = "S" * 640  # 10 blocks shared
    first = idx.observe(system + "question one " * 10, "r0")
    assert first.matched == 0 and first.reusable_ratio == 0.0
    second = idx.observe(system + "another question " * 8, "r0")
    assert second.matched == 10
    assert second.reusable_ratio == pytest.approx(640 / len(system + "another question " * 8))
    clock.t = 61  # outside the window: nothing reusable
    assert idx.observe(system + "x", "r0").matched == 0


def test_split_ratio_sees_one_prefix_served_by_two_replicas():
    idx = PrefixIndex(block_chars=64, clock=Clock())
    p = "P" * 128
    idx.observe(p, "a")
    assert idx.split_ratio is None
    idx.observe(p, "a")
    assert idx.split_ratio == 0.0
    m = idx.observe(p, "b")
    assert idx.split_ratio == 1.0 and m.replicas == 2


def test_index_is_bounded_and_keeps_counts_consistent_on_eviction():
    idx = PrefixIndex(max_blocks=5, block_chars=8, clock=Clock())
    idx.observe("a" * 16, "r0")
    idx.observe("a" * 16, "r1")
    assert (idx.reseen, idx.split) == (2, 2)
    idx.observe("b" * 40, "r0")  # 5 new blocks push the old ones out
    assert len(idx) == 5 and (idx.reseen, idx.split) == (0, 0)


def test_render_prompt_covers_chat_completions_and_token_ids():
    chat = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ]
    }
    assert render_prompt(chat) == "system\x1fbe brief\x1euser\x1fhi\x1e"
    assert render_prompt({"prompt": "hello"}) == "hello"
    assert render_prompt({"prompt": [1, 2, 3]}) == [1, 2, 3]
    assert render_prompt({"model": "m"}) is None


def test_split_events_returns_complete_events_byte_for_byte():
    stream = (
        b'data: {"choices":[{"text":"a"}]}\n\ndata: {"choices":[],"usage":{"prompt_tokens":3}}\r\n\r\ndata: [DONE]\n\n'
    )
    got = split_events(stream)
    assert b"".join(got) == stream and len(got) == 3
    assert [classify_event(e).kind for e in got] == ["token", "usage_only", "done"]
    assert split_events(stream + b"data: x") == [*got, b"data: x"]  # a partial tail is kept, not lost


def test_usage_parsing_keeps_absent_cached_tokens_absent():
    assert parse_usage(
        {"prompt_tokens": 707, "completion_tokens": 8, "prompt_tokens_details": {"cached_tokens": 704}}
    ) == (707, 8, 704)
    assert parse_usage({"prompt_tokens": 9, "completion_tokens": 16, "prompt_tokens_details": None}) == (9, 16, None)
    assert parse_usage(None) == (None, None, None)
    assert classify_event(b'data: {"choices":[{"delta":{}}],"usage":null}\n\n').usage is None


def test_tenant_from_header_then_user_then_key_hash_never_the_key():
    key = "sk-secret-123"
    assert parse_tenant({"X-Tenant": "acme corp"}, {"user": "u1"}, "X-Tenant") == "acme_corp"
    assert parse_tenant({}, {"user": "u1"}, "X-Tenant") == "u1"
    t = parse_tenant({"Authorization": f"Bearer {key}"}, {}, "X-Tenant")
    assert t.startswith("key-") and len(t) == 16 and key not in t
    assert parse_tenant({}, None, None) == "unknown"


def test_tenant_labels_are_bounded_with_other():
    lim = TenantLimiter(max_tenants=2)
    assert [lim.label(t) for t in ("a", "b", "c", "a", "d")] == ["a", "b", OTHER, "a", OTHER]
    assert lim.folded == 2


def test_classify_fast_path_agrees_with_full_decoding():
    compact = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    spaced = b'data: {"id": "c", "choices": [{"index": 0, "text": "a"}]}\n\n'
    empty = b'data: {"id":"c","choices":[]}\n\n'
    assert [classify_event(e).kind for e in (compact, spaced, empty)] == ["token", "token", "other"]


class _ReferenceIndex:
    """The index's contract written plainly: two passes (match, then remember), LRU by list."""

    def __init__(self, window_s, max_blocks, block_chars):
        self.window_s, self.max_blocks, self.block_chars = window_s, max_blocks, block_chars
        self.blocks = {}  # hash -> [last_seen, hits, replicas]
        self.order = []  # least recently seen first

    def observe(self, prompt, replica, now):
        hashes = list(PrefixIndex(block_chars=self.block_chars).observe(prompt, "r").hashes)  # a fresh index: the chain
        live = [h in self.blocks and now - self.blocks[h][0] <= self.window_s for h in hashes]
        matched = live.index(False) if False in live else len(live)
        for h in hashes:
            if h in self.blocks and now - self.blocks[h][0] <= self.window_s:
                b = self.blocks[h]
                b[0], b[1] = now, b[1] + 1
                if len(b[2]) < 8:
                    b[2].add(replica)
                self.order.remove(h)
            else:
                if h in self.blocks:
                    self.order.remove(h)
                self.blocks[h] = [now, 1, {replica}]
            self.order.append(h)
            while len(self.order) > self.max_blocks:
                del self.blocks[self.order.pop(0)]
        replicas = len(self.blocks[hashes[matched - 1]][2]) if matched and hashes[matched - 1] in self.blocks else 0
        reseen = [b for b in self.blocks.values() if b[1] >= 2]
        split = sum(1 for b in reseen if len(b[2]) > 1) / len(reseen) if reseen else None
        return matched, replicas, split


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 6), st.sampled_from("ab"), st.integers(0, 50)),
        min_size=1,
        max_size=40,
    )
)
def test_one_pass_observe_agrees_with_the_plain_two_pass_contract(steps):
    """Prompts share prefixes (a stem, then a variable tail), come from two replicas, at moving times."""
    clock = Clock()
    idx = PrefixIndex(window_s=60, max_blocks=12, block_chars=8, clock=clock)
    ref = _ReferenceIndex(60, 12, 8)
    stems = ["s" * 24, "s" * 16 + "t" * 8, "u" * 32, ""]
    for stem, tail, replica, dt in steps:
        clock.t += dt
        prompt = stems[stem] + "x" * (8 * tail) + str(tail)
        m = idx.observe(prompt, replica)
        matched, replicas, split = ref.observe(prompt, replica, clock.t)
        assert (m.matched, m.replicas, idx.split_ratio) == (matched, replicas, split)
        assert len(idx) == len(ref.blocks)


def test_a_full_index_holds_nothing_the_garbage_collector_walks():
    """A full collection pauses the tap's event loop; 200k remembered blocks must not lengthen it."""
    import gc

    idx = PrefixIndex(max_blocks=2000, block_chars=8)
    for i in range(400):
        idx.observe(f"{i:08d}" * 8, "a" if i % 2 else "b")
    gc.collect()
    assert len(idx) == 2000 and not any(gc.is_tracked(v) for v in idx._blocks.values())
