"""Traffic-ranked tenant labels: late heavy tenants get a slot, random ids do not, memory is bounded."""

import random

from kvscope.agent.tenants import OTHER, TenantLimiter


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_late_heavy_tenant_is_promoted_and_smallest_is_demoted():
    clock = Clock()
    lim = TenantLimiter(max_tenants=3, clock=clock)
    for t in ("a", "b", "c"):  # slots taken by light, early tenants
        for _ in range(3):
            assert lim.label(t) == t
            clock.t += 1
    got = []
    for _ in range(10):  # a heavy tenant arrives after every slot is taken
        got.append(lim.label("big"))
        clock.t += 0.1
    assert got[0] == OTHER  # one request is no evidence
    assert "big" in got and got[-1] == "big"
    first = got.index("big")
    assert got[first:] == ["big"] * (len(got) - first)  # once promoted it keeps its label
    assert set(lim.tracked()) == {"big", "b", "c"}  # the least busy (oldest, equal counts) left
    assert lim.stats["promoted"] == 1 and lim.stats["demoted"] == 1
    assert lim.folded == first


def test_promotion_needs_to_outrank_the_smallest_tracked_tenant():
    clock = Clock()
    lim = TenantLimiter(max_tenants=2, clock=clock)
    for _ in range(50):
        lim.label("a")
        lim.label("b")
    for _ in range(30):  # busy, but less than either tracked tenant
        assert lim.label("c") == OTHER
    assert set(lim.tracked()) == {"a", "b"} and lim.stats["promoted"] == 0


def test_decay_lets_recent_traffic_outrank_stale_traffic():
    clock = Clock()
    lim = TenantLimiter(max_tenants=1, half_life_s=60.0, clock=clock)
    for _ in range(100):
        lim.label("old")  # 100 requests, then silence
    clock.t += 600  # ten half-lives: ~0.1 decayed requests left
    assert lim.label("new") == OTHER
    assert lim.label("new") == "new"  # two recent requests outrank it
    assert list(lim.tracked()) == ["new"]


def test_first_tenants_fill_free_slots_immediately():
    lim = TenantLimiter(max_tenants=2)
    assert [lim.label(t) for t in ("a", "b", "c", "a", "d")] == ["a", "b", OTHER, "a", OTHER]


def test_memory_bound_holds_under_a_million_random_tenant_ids():
    clock = Clock()
    lim = TenantLimiter(max_tenants=50, clock=clock)
    rng = random.Random(7)
    heavy_labels = []
    for i in range(1_000_000):
        if i % 10 == 0:
            heavy_labels.append(lim.label("heavy"))  # 10% of the traffic, arriving after the slots filled
        else:
            lim.label(f"r{rng.getrandbits(48):x}")
        if i % 1000 == 0:
            clock.t += 0.05
            assert len(lim) <= lim.max_tenants + lim.sketch_size
    assert len(lim) <= lim.max_tenants + lim.sketch_size
    assert len(lim._labelled) <= lim.max_labels
    assert heavy_labels[-1] == "heavy"  # the heavy hitter holds a slot in the flood
    assert heavy_labels.count(OTHER) < 10
    assert lim.stats["promoted"] <= lim.max_labels


def test_label_budget_caps_distinct_series():
    clock = Clock()
    lim = TenantLimiter(max_tenants=1, max_labels=2, half_life_s=1.0, clock=clock)
    lim.label("a")
    clock.t += 20
    lim.label("b"), lim.label("b")  # promoted: 2 labels handed out
    clock.t += 20
    assert [lim.label("c") for _ in range(5)] == [OTHER] * 5  # budget spent: no third series
    assert lim.stats["label_budget_spent"] > 0
    assert lim.label("a") == OTHER and lim.label("a") == "a"  # a labelled tenant can come back
