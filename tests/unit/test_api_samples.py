"""/api/v1/samples answers at most MAX_POINTS points and says when it stopped (agent/api.py)."""

import pytest

from kvscope.agent import api
from kvscope.agent.namematch import compile_pattern
from kvscope.agent.store.sqlite import MEMORY, SqliteStore
from kvscope.core.signals import Sample


@pytest.mark.parametrize(
    ("limit", "lengths", "truncated"),
    [(4, [3, 1], True), (6, [3, 3], True), (7, [3, 3], False)],
)
def test_samples_answer_is_bounded(monkeypatch, limit, lengths, truncated):
    store = SqliteStore(MEMORY, background=False)
    store.write([Sample("x", (("i", i),), float(t), 1000.0 + t) for i in ("a", "b") for t in range(3)])
    store.flush()
    monkeypatch.setattr(api, "MAX_POINTS", limit)
    data = api._query_store(store, compile_pattern("x"), 0.0, 2000.0)
    assert [len(s["points"]) for s in data["series"]] == lengths
    assert data["truncated"] is truncated
