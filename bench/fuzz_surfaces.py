"""Fuzz targets for the agent's request and message surfaces of issue 41 (bench/fuzz.py runs them).

* api-query: the query string of `GET /api/v1/samples` as the agent's server takes it (the 2048-
  character bound, aiohttp's query parsing, `match`/`start`/`end` validation, the name pattern
  matched against a store of realistic 40-70 character names, the bounded answer); clean error
  ValueError (the 400). A backtracking engine would hang on `([a-z_]+)+Z`-like inputs; the fuzz
  time bound (1 s per input) catches one.
* kv-events-size: one ZMQ multipart KV-event message through `KvEventSubscriber.parse` and the
  tracker, its size drawn log-uniformly up to 4 x the subscriber's `max_message_bytes` (64 KiB
  here) from the mutated bytes; a message over the cap must come back empty and counted
  `too_large`, one under it is decoded and applied `APPLY_CHUNK` events at a time. Bad messages
  are counted, never raised; an AssertionError (a broken invariant) counts as a crash.

Seeds: the agent client's own query (diagnoser/sources/agent.py `_patterns` of the catalog's
names), README's example, the issue's hostile pattern; the vLLM 0.32 KV event capture that
bench/fuzz_inputs.py uses.
"""

from __future__ import annotations

import importlib.util
import logging
from collections import Counter
from pathlib import Path

import zmq.asyncio
from yarl import URL

from kvscope.agent import api
from kvscope.agent.kvevents.subscriber import APPLY_CHUNK, KvEventSource, KvEventSubscriber
from kvscope.agent.store.sqlite import MEMORY, SqliteStore
from kvscope.core.signals import Sample, load_catalog
from kvscope.diagnoser.sources.agent import _patterns

_STORE: SqliteStore | None = None


def _store() -> SqliteStore:
    """Canonical names as the agent stores them (the catalog's, 40-70 characters with the
    histogram suffixes), 3 series each, 5 points each."""
    global _STORE
    if _STORE is None:
        _STORE = SqliteStore(MEMORY, background=False)
        names = sorted(load_catalog().signals)[:60]
        _STORE.write(
            [
                Sample(f"{n}_bucket" if i % 2 else n, (("instance", f"e{i}:8000"),), float(t), 1000.0 + t)
                for n in names
                for i in range(3)
                for t in range(5)
            ]
        )
        _STORE.flush()
    return _STORE


# ------------------------------------------------------------------------------------ API query
def parse_api_query(data: bytes) -> object:
    text = data.decode("utf-8", "replace")
    if len(text) > api.MAX_QUERY_CHARS:  # the middleware's 414, before any handler
        return None
    try:
        query = URL.build(path="/api/v1/samples", query_string=text).query
    except ValueError:
        return None  # aiohttp answers 400 for a target it cannot parse
    try:
        pattern, start, end = api._samples_params(query)
    except ValueError:
        return None
    return api._query_store(_store(), pattern, start, end)


def seeds_api_query() -> list[bytes]:
    names = sorted(load_catalog().signals)[:40]
    queries = [URL.build(query={"match": f"({p})", "start": "900", "end": "1100"}) for p in _patterns(names)]
    client = [q.raw_query_string for q in queries]
    return [q.encode() for q in client] + [
        b"match=engine_kv_.*&start=900&end=1100",
        b"match=engine_kv_cache_usage_ratio|kvscope_target_up",
        b"match=([a-z_]%2B)%2BZ&start=0&end=2000",
        b"match=.*_bucket&end=1100",
        b"match=.%2Bkv.%2B_total",
        b"match=x&start=20&end=10",
        b"match=x&start=0&end=1e10",
        b"match=x&end=nan",
    ]


API_TOKENS = [b".*", b".+", b"|", b"(", b")", b"%2B", b"%7C", b"\\", b"&match=", b"&start=", b"&end=", b"[a-z]", b"+"]


# ------------------------------------------------------------------------------------ KV-event sizes
CAP = 64 << 10
_CTX: list[zmq.asyncio.Context] = []  # one per worker process (made after the fork); no socket is ever made
logging.getLogger("kvscope.kvevents").setLevel(logging.ERROR)  # bad messages are the point here


def parse_kv_message(data: bytes) -> object:
    """data[0:2] choose the size (log-uniform, 16 B .. 4 x CAP), the rest is the payload's bytes,
    repeated to that size; then [topic, seq, payload] through the subscriber's path."""
    head, body = data[:2], data[2:] or b"\x90"
    exp = 4 + (int.from_bytes(head.ljust(2, b"\0"), "big") % 15)  # 2^4 .. 2^18 = 4 x 64 KiB
    size = min(1 << exp, 4 * CAP)
    payload = (body * (size // len(body) + 1))[:size] if len(body) < size else body
    if not _CTX:
        _CTX.append(zmq.asyncio.Context())
    sub = KvEventSubscriber(KvEventSource("inproc://fuzz", "e0", "kv", max_message_bytes=CAP), context=_CTX[0])
    sub.tracker.max_blocks = 1000
    frames = [b"kv", (7).to_bytes(8, "big"), payload]
    before = Counter(sub.errors)
    events = sub.parse(frames)
    if sum(map(len, frames)) > CAP:
        assert events == [] and sub.errors["too_large"] == before["too_large"] + 1, "over the cap, not refused"
    for i in range(0, len(events), APPLY_CHUNK):
        sub.tracker.apply(events[i : i + APPLY_CHUNK])
    return sub.tracker.render_samples(1e9), sub.errors


def seeds_kv_message() -> list[bytes]:
    spec = importlib.util.spec_from_file_location("fuzz_inputs", Path(__file__).with_name("fuzz_inputs.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [
        size + seed for seed in module.seeds_kv_events_msgpack() for size in (b"\x00\x00", b"\x00\x0c", b"\x00\x0e")
    ]


TARGETS = {
    "api-query": (parse_api_query, seeds_api_query, API_TOKENS),
    "kv-events-size": (parse_kv_message, seeds_kv_message),
}
