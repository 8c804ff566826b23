"""Issue 41 (agent and server side): every input surface bounded in time, memory and connections.
Real servers on ephemeral ports, real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re

import aiohttp
import pytest

from kvscope.agent.api import AgentServer
from kvscope.agent.config import build_config
from kvscope.agent.runtime import AgentRuntime
from kvscope.agent.store.sqlite import MEMORY, SqliteStore
from kvscope.core.signals import Sample


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as resp:
        return resp.status, await resp.text()


def _agent(store=None, doc=None) -> AgentServer:
    return AgentServer(AgentRuntime(build_config(doc or {}, environ={}, flags=[]), [], store))


# ------------------------------------------------------------------------- N1: linear name patterns


def test_hostile_match_pattern_is_refused_while_metrics_keeps_answering():
    """`([a-z_]+)+Z` backtracks exponentially in `re` on a name of [a-z_] without a Z: the API
    must refuse it (400 naming `match`) and /metrics must answer meanwhile."""
    store = SqliteStore(MEMORY, background=False)
    store.write([Sample("engine_kv_cache_usage_rat", (("instance", "a"),), 0.5, 1000.0)])  # 25 chars
    store.flush()

    async def main():
        server = _agent(store)
        port = await server.start("127.0.0.1", 0)
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as s:
                hostile = asyncio.ensure_future(
                    _get(s, base + "/api/v1/samples?match=([a-z_]%2B)%2BZ&start=0&end=2000")
                )
                metrics = await _get(s, base + "/metrics")
                good = await _get(s, base + "/api/v1/samples?match=engine_kv_.*&start=0&end=2000")
                return await hostile, metrics, good
        finally:
            await server.stop()

    hostile, metrics, good = asyncio.run(main())
    assert hostile[0] == 400, hostile
    assert json.loads(hostile[1])["error"].startswith("match: not a supported pattern")
    assert metrics[0] == 200 and "kvscope_cycles_total" in metrics[1]
    assert good[0] == 200 and [s["name"] for s in json.loads(good[1])["data"]["series"]] == [
        "engine_kv_cache_usage_rat"
    ]


NAMES = ["engine_kv_cache_usage_ratio", "engine_kv", "kvscope_target_up", "a:b", "aa", "a", "", "abcabc", "x_y_x_y"]
PATTERNS = [
    "engine_kv_.*",
    "engine_kv_.+",
    "engine_kv.*",
    ".*",
    ".+",
    "a",
    "a.*a",
    "a.+a",
    ".*a.*",
    "x_.*_y",
    "x_.+_y.*",
    "engine_kv_cache_usage_ratio|kvscope_target_up",
    "(engine_kv|a\\:b|aa)",
    ".*b.*c",
    "abc.*abc",
    "a.*b.*c.*",
    ".*target.+",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_name_patterns_match_exactly_as_the_anchored_regex_would(pattern):
    from kvscope.agent.namematch import compile_pattern

    matcher = compile_pattern(pattern)
    assert [n for n in NAMES if matcher.matches(n)] == [n for n in NAMES if re.fullmatch(pattern, n)]


@pytest.mark.parametrize("pattern", ["([a-z_]+)+Z", "(a|aa)+", "[a-z]*", "a{1,3}", "a||b", "(", "a\\d", "x?"])
def test_name_patterns_outside_the_linear_subset_are_refused(pattern):
    from kvscope.agent.namematch import compile_pattern

    with pytest.raises(ValueError, match="supported"):
        compile_pattern(pattern)


def test_name_pattern_scan_agrees_with_re_on_generated_inputs():
    """Every pattern of up to 4 tokens over {a, b, .*, .+} against every name over {a, b} up to 5."""
    from kvscope.agent.namematch import compile_pattern

    names = ["".join(p) for n in range(6) for p in itertools.product("ab", repeat=n)]
    for n in range(1, 5):
        for toks in itertools.product(["a", "b", ".*", ".+"], repeat=n):
            pattern = "".join(toks)
            m = compile_pattern(pattern)
            assert [x for x in names if m.matches(x)] == [x for x in names if re.fullmatch(pattern, x)], pattern


# ---------------------------------------------------------------- N6: server limits on every listener

HALF_OPEN = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"  # never finished


async def _read_http(reader: asyncio.StreamReader) -> bytes:
    """One response (head and Content-Length body) without waiting for the connection's end."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    return head + await reader.readexactly(length)


def test_half_open_connections_do_not_stop_metrics_and_are_closed():
    """300 connections that never finish a request head: /metrics still answers, and the server
    closes every one of them (displaced at the cap or past the head timeout), counted in /metrics."""
    doc = {"server": {"header_timeout_s": "1s", "idle_timeout_s": "2s", "max_connections": 100}}

    async def main():
        server = _agent(None, doc)
        port = await server.start("127.0.0.1", 0)
        base = f"http://127.0.0.1:{port}"
        try:
            conns = []
            for _ in range(300):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(HALF_OPEN)
                conns.append((reader, writer))
            async with aiohttp.ClientSession() as s:
                during = await _get(s, base + "/metrics")
            # the server ends every one of them (the bound only turns a hang into a failure)
            ends = await asyncio.wait_for(asyncio.gather(*(r.read() for r, _ in conns)), 120)
            for _, w in conns:
                w.close()
            # a keep-alive connection that went idle after its request is closed too
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
            first = await _read_http(reader)
            rest = await asyncio.wait_for(reader.read(), 120)
            writer.close()
            async with aiohttp.ClientSession() as s:
                after = await _get(s, base + "/metrics")
            return during, ends, first, rest, after
        finally:
            await server.stop()

    during, ends, first, rest, after = asyncio.run(main())
    assert during[0] == 200 and "kvscope_cycles_total" in during[1]
    assert ends == [b""] * 300
    assert first.startswith(b"HTTP/1.1 200") and rest == b""
    closed = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'kvscope_connections_closed_total\{collector="agent",.*reason="(\w+)"\} (\S+)', after[1])
    }
    assert closed.get("displaced", 0) + closed.get("header_timeout", 0) >= 300, closed


def test_connections_over_the_cap_are_answered_503_when_none_can_be_displaced():
    doc = {"server": {"max_connections": 3, "idle_timeout_s": "10m"}}

    async def main():
        server = _agent(None, doc)
        port = await server.start("127.0.0.1", 0)
        try:
            held = []
            for _ in range(3):  # each has sent a whole request: none is displaced
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
                await _read_http(reader)
                held.append(writer)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            over = await asyncio.wait_for(reader.read(), 120)
            for w in [*held, writer]:
                w.close()
            return over
        finally:
            await server.stop()

    over = asyncio.run(main())
    assert over.startswith(b"HTTP/1.1 503") and b"max_connections" in over


def test_otlp_receiver_closes_a_half_open_connection():
    """The OTLP receiver is served by the same HttpSite with the agent's `server.*` limits."""
    from kvscope.agent.traces.receiver import OtlpTraceReceiver, parse_otlp_config

    config = build_config({"server": {"header_timeout_s": "500ms"}}, environ={}, flags=[])
    config.extensions["otlp"] = parse_otlp_config({"listen": "127.0.0.1:0"})
    receiver = OtlpTraceReceiver(config)

    async def main():
        await receiver.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", receiver.port)
            writer.write(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")
            end = await asyncio.wait_for(reader.read(), 120)
            writer.close()
            return end, (await receiver.collect()).health[0].closed
        finally:
            await receiver.stop()

    end, closed = asyncio.run(main())
    assert end == b"" and closed["header_timeout"] == 1


def test_kvscope_serve_closes_a_half_open_connection(tmp_path):
    """The real `kvscope serve` process: a request head that never ends is closed (default
    header timeout, 10 s) while /-/healthy answers."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "kvscope", "serve", "--listen", "127.0.0.1:0", "--store", ":memory:",
         "--prometheus", "http://127.0.0.1:9"],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        port = None
        for line in proc.stderr:
            if m := re.search(r"listening on http://127.0.0.1:(\d+)", line):
                port = int(m.group(1))
                break
        assert port, "kvscope serve did not start"

        async def main():
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\n")
            async with aiohttp.ClientSession() as s:
                healthy = await _get(s, f"http://127.0.0.1:{port}/-/healthy")
            end = await asyncio.wait_for(reader.read(), 120)
            writer.close()
            return healthy, end

        healthy, end = asyncio.run(main())
    finally:
        proc.terminate()
        proc.wait(60)
        proc.stderr.close()
    assert healthy[0] == 200 and end == b""


def test_systemd_units_set_the_open_file_limit():
    from pathlib import Path

    import kvscope.agent

    root = Path(kvscope.agent.__file__).resolve().parents[1] / "deploy" / "systemd"  # the checkout under test
    for unit in ("kvscope-agent.service", "kvscope-serve.service"):
        m = re.search(r"(?m)^LimitNOFILE=(\d+)$", (root / unit).read_text())
        assert m and int(m.group(1)) >= 4096, unit


def test_a_low_soft_open_file_limit_is_raised_at_start():
    """What stands in for LimitNOFILE in a pod: a process started with a soft limit of 256 (the
    issue's case) raises it up to its hard limit."""
    import resource
    import subprocess
    import sys

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "from kvscope.agent.serve.limits import raise_open_files\n"
        "print(raise_open_files(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    want = 8192 if hard == resource.RLIM_INFINITY else min(8192, hard)
    assert out == [str(want), str(want)]


# ---------------------------------------------------------------- N5: KV-event messages bounded


def _kv_batch(seq_hashes, ts=1.0):
    import msgspec

    events = [{"type": "BlockStored", "block_hashes": list(h), "parent_block_hash": None, "token_ids": [], "block_size": 16, "medium": "GPU"} for h in seq_hashes]  # fmt: skip
    return msgspec.msgpack.encode([ts, events, 0])


def test_an_oversized_kv_event_message_is_refused_counted_and_the_subscriber_goes_on():
    """Over real TCP: a 1 MB batch against a 64 KiB cap is never applied, the drop is counted in
    health, and later batches are received again (libzmq drops the connection; we reconnect)."""
    import zmq
    import zmq.asyncio

    from kvscope.agent.kvevents.subscriber import KvEventsCollector, KvEventSource, KvEventSubscriber

    async def main():
        ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.PUB)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        source = KvEventSource(f"tcp://127.0.0.1:{port}", "e0:8000", "", max_message_bytes=64 << 10)
        sub = KvEventSubscriber(source, context=ctx)
        coll = KvEventsCollector(None)
        coll.subscribers = [sub]
        await sub.start()
        seq = 0
        huge = _kv_batch([range(i * 100, i * 100 + 100) for i in range(2000)])  # 200k blocks, about 1 MB

        async def until(cond, make):
            nonlocal seq
            for _ in range(3000):  # bounded: a hang turns into a failure
                seq += 1
                await pub.send_multipart([b"kv", seq.to_bytes(8, "big"), make()])
                await asyncio.sleep(0.02)
                if cond():
                    return True
            return False

        try:
            joined = await until(lambda: sub.stats["batches"] > 0, lambda: _kv_batch([[1]]))
            seq += 1
            await pub.send_multipart([b"kv", seq.to_bytes(8, "big"), huge])
            again = await until(
                lambda: sub.stats["batches"] > 1 and sub.errors["too_large"] > 0, lambda: _kv_batch([[2]])
            )
            health = (await coll.collect()).health[0]
        finally:
            await sub.stop()
            pub.close(linger=0)
            ctx.term()
        return joined, again, sub, health, len(huge)

    joined, again, sub, health, size = asyncio.run(main())
    assert joined and again and size > 10 * (64 << 10)
    assert sub.stats["events"] < 100  # the 2000 events of the huge batch never reached the tracker
    assert health.errors["too_large"] >= 1 and health.up  # issue 57 S9: counted as oversized


def test_a_big_kv_event_batch_is_applied_in_pieces_that_let_the_loop_run():
    """Under the cap, a 10k-event batch is applied APPLY_CHUNK events at a time; another task on
    the loop runs between the pieces."""
    from kvscope.agent.kvevents import subscriber as mod

    big = _kv_batch([[i] for i in range(10_000)])
    order: list[str] = []

    class OneMessage:
        sent = False

        async def recv_multipart(self):
            if self.sent:
                await asyncio.Event().wait()  # nothing more
            self.sent = True
            return [b"kv", (1).to_bytes(8, "big"), big]

    async def main():
        sub = mod.KvEventSubscriber(mod.KvEventSource("inproc://x", "e0", "", max_message_bytes=1 << 20))
        real = sub.tracker.apply
        sub.tracker.apply = lambda evs: (order.append(f"apply {len(evs)}"), real(evs))[1]
        sub._sock = OneMessage()

        async def other():
            for _ in range(10):
                order.append("other")
                await asyncio.sleep(0)

        task = asyncio.create_task(sub._loop())
        await other()
        task.cancel()
        return sub

    sub = asyncio.run(main())
    applies = [o for o in order if o.startswith("apply")]
    assert sub.stats["events"] == 10_000 and len(applies) == 10_000 // mod.APPLY_CHUNK
    first, last = order.index(applies[0]), len(order) - 1 - order[::-1].index(applies[-1])
    assert "other" in order[first:last]


def test_kv_event_message_cap_is_validated():
    from kvscope.agent.config import ConfigError
    from kvscope.agent.kvevents.subscriber import parse_kv_events_config

    src = parse_kv_events_config([{"endpoint": "tcp://127.0.0.1:5557", "instance": "e", "max_message_bytes": "4MiB"}])
    assert src[0].max_message_bytes == 4 << 20
    with pytest.raises(ConfigError, match=r"kv_events\[0\].max_message_bytes"):
        parse_kv_events_config([{"endpoint": "tcp://127.0.0.1:5557", "instance": "e", "max_message_bytes": "1e20GiB"}])


# ---------------------------------------------------------------- N13: skipped ticks counted


def test_a_cycle_that_overruns_the_interval_counts_the_skipped_ticks():
    """A collector that takes 0.35 s at a 100 ms interval: the runtime skips the ticks it missed,
    counts them, and /metrics and /api/v1/health show the count."""
    from kvscope.agent.collectors.base import Collection
    from kvscope.agent.serve.export import render_metrics
    from kvscope.core.signals import load_catalog

    class Slow:
        name = "slow"

        async def collect(self):
            await asyncio.sleep(0.35)
            return Collection()

        async def close(self):
            return None

    config = build_config({"scrape": {"interval_s": "100ms"}}, environ={}, flags=[])
    runtime = AgentRuntime(config, [Slow()], None)

    async def main():
        server = AgentServer(runtime)
        port = await server.start("127.0.0.1", 0)
        task = asyncio.create_task(runtime.run())
        while runtime.state.cycles < 2:
            await asyncio.sleep(0.05)
        runtime.stop()
        await task
        async with aiohttp.ClientSession() as s:
            health = await _get(s, f"http://127.0.0.1:{port}/api/v1/health")
        await server.stop()
        return json.loads(health[1])["data"]

    health = asyncio.run(main())
    skipped = runtime.state.cycles_skipped
    assert skipped >= 2 and health["cycles_skipped"] == skipped  # each 0.35 s cycle misses >= 2 ticks of 0.1 s
    assert f"kvscope_cycles_skipped_total {skipped}" in render_metrics(runtime.state, load_catalog())


# ---------------------------------------------------------------- N9: config values in a sane range


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("scrape: {interval_s: 1ms}\n", "scrape.interval_s"),
        ("scrape: {interval_s: 0.001}\n", "scrape.interval_s"),
        ("store: {retention_s: 1.0e+308}\n", "store.retention_s"),
        ("store: {retention_s: 1s}\n", "store.retention_s"),
        ("scrape: {max_body_bytes: 107374182400000000000000000000}\n", "scrape.max_body_bytes"),
        ("store: {max_bytes: 107374182400000000000000000000}\n", "store.max_bytes"),
        ('targets: ["http://127.0.0.1:8000/metrics\\r\\nX-Injected: 1"]\n', "targets[0].url"),
        ('targets: [{url: "http://127.0.0.1:8000/me\\ttrics"}]\n', "targets[0].url"),
        ('targets: ["http://127.0.0.1:8000/metrics\\u0000"]\n', "targets[0].url"),
        ("scrape:\n  interval_s: 5\n  interval_s: 50\n", "scrape.interval_s: duplicate key"),
        ("store: {path: a.db, path: b.db}\n", "store.path: duplicate key"),
        ("targets: []\ntargets: [http://x:1/metrics]\n", "targets: duplicate key"),
        ("server: {max_connections: 0}\n", "server.max_connections"),
    ],
)
def test_config_values_out_of_range_are_refused_naming_the_key(text, key):
    from kvscope.agent.config import ConfigError, parse_config_yaml

    with pytest.raises(ConfigError, match=re.escape(key)):
        build_config(parse_config_yaml(text.encode(), "--config x.yaml"), environ={}, flags=[])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # a bare ValueError that named no key, and a negative ttl that was accepted
        ("otlp: {settle_s: abc}\n", 'otlp.settle_s: must be a duration from 0s to 1h, got "abc"'),
        ("otlp: {ttl_s: -5}\n", "otlp.ttl_s: must be a duration from 100ms to 1d, got -5"),
        ("otlp: {max_traces: 0}\n", "otlp.max_traces: must be an integer from 1 to 1000000, got 0"),
        # was "invalid literal for int()"
        (
            "tap: {upstreams: http://e:8000, max_tenants: x}\n",
            'tap.max_tenants: must be an integer from 1 to 10000, got "x"',
        ),
        (
            "tap: {upstreams: http://e:8000, block_chars: 0}\n",
            "tap.block_chars: must be an integer from 1 to 1048576, got 0",
        ),
        ("otlp_push: {timeout_s: 1e9}\n", 'otlp_push.timeout_s: must be a duration > 0 and < 1d, got "1e9"'),
        # a port past 65535 was accepted for both listeners; an upstream without a host failed later
        ("otlp: {listen: 'h:99999'}\n", 'otlp.listen: must be host:port (e.g. 127.0.0.1:4318), got "h:99999"'),
        (
            "tap: {upstreams: http://e:8000, listen: 'h:99999'}\n",
            'tap.listen: must be host:port (e.g. 127.0.0.1:8001), got "h:99999"',
        ),
        ("tap: {upstreams: 'http://'}\n", "tap.upstreams: needs one or more http(s):// base URLs, got 'http://'"),
    ],
)
def test_extension_section_values_are_refused_naming_the_key(text, message):
    import kvscope.agent.otel.push
    import kvscope.agent.tap.collector
    import kvscope.agent.traces.receiver  # noqa: F401  (each registers its section)
    from kvscope.agent.config import ConfigError, parse_config_yaml

    with pytest.raises(ConfigError, match=re.escape(message)):
        build_config(parse_config_yaml(text.encode(), "--config x.yaml"), environ={}, flags=[])


def test_agent_refuses_a_1ms_interval_at_start():
    """The real command: exit 2 and one line naming the flag's key, before anything runs."""
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-m", "kvscope", "agent", "--scrape.interval", "1ms", "--store.path", ""],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "scrape.interval_s: must be a duration from 100ms to 1d" in res.stderr


# ---------------------------------------------------------------- N12: per-target series budgets


def test_one_churning_target_cannot_use_up_the_stores_series_cap(tmp_path):
    """A target that churns 2000 new label values per scrape against a 1000-series store: the
    other target's series are still stored, and the churning one's drops are counted per
    instance (health) and by reason."""
    from kvscope.agent.serve.export import render_metrics
    from kvscope.agent.store.sqlite import SqliteStore
    from kvscope.core.signals import load_catalog

    store = SqliteStore(tmp_path / "s.db", max_series=1000, background=False)
    try:
        for scrape in range(3):
            ts = 1000.0 + scrape
            churn = [Sample("engine_requests_running", (("instance", "bad"), ("req", f"{scrape}-{i}")), 1.0, ts) for i in range(2000)]  # fmt: skip
            good = [
                Sample("engine_requests_running", (("instance", "good"), ("n", str(i))), 2.0, ts) for i in range(50)
            ]
            store.write(churn + good)
            store.flush()
            store.flush()
        stored = store.query("engine_requests_running", 0, 2000)
        stats = store.stats()
    finally:
        store.close()
    by_target: dict[str, int] = {}
    for labels in stored:
        by_target[dict(labels)["instance"]] = by_target.get(dict(labels)["instance"], 0) + 1
    assert by_target["good"] == 50  # every series of the quiet target
    assert by_target["bad"] == 250  # its budget: a quarter of max_series
    assert stats.over_budget == {"bad": 3 * 2000 - 250} and stats.dropped["target_series_limit"] == 3 * 2000 - 250

    runtime = AgentRuntime(build_config({}, environ={}, flags=[]), [], None)
    runtime.state.store_stats = stats
    assert 'kvscope_store_target_series_dropped_total{instance="bad"} 5750' in render_metrics(
        runtime.state, load_catalog()
    )


# ---------------------------------------------------------------- N8: a store that cannot be opened says why


def _open_error(path) -> str:
    from kvscope.agent.store.sqlite import SqliteStore, StoreError

    with pytest.raises(StoreError) as info:
        SqliteStore(path, background=False)
    return str(info.value)


def test_a_dangling_store_symlink_says_so_and_never_advises_deleting(tmp_path):
    link = tmp_path / "kvscope.db"
    link.symlink_to(tmp_path / "unmounted" / "volume" / "kvscope.db")
    msg = _open_error(link)
    assert "symbolic link" in msg and "does not exist" in msg
    assert "delete" not in msg and "damaged" not in msg


def test_another_programs_sqlite_file_is_left_unchanged(tmp_path):
    import sqlite3

    path = tmp_path / "app.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE users (id INTEGER)")
        db.commit()
    before = path.read_bytes()
    msg = _open_error(path)
    assert "another program" in msg and "users" in msg and "delete" not in msg
    assert path.read_bytes() == before  # no kvscope table was added to it


def test_a_store_path_under_a_file_names_it(tmp_path):
    (tmp_path / "afile").write_text("x")
    msg = _open_error(tmp_path / "afile" / "kvscope.db")
    assert "is not a directory" in msg and "delete" not in msg


FULL_DISK = """
import os, sys
from kvscope.core.signals import Sample
from kvscope.agent.store.sqlite import SqliteStore, StoreError
d = sys.argv[1]
store = SqliteStore(os.path.join(d, "k.db"), background=False)
store.write([Sample("x", (("instance", "a"),), 1.0, 1e9)])
store.flush()
store.flush()
store.close()
fd = os.open(os.path.join(d, "fill"), os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, bytes(4096))
except OSError:
    pass
os.close(fd)
try:
    SqliteStore(os.path.join(d, "k.db"), background=False)
except StoreError as e:
    print(e)
"""


def test_a_store_on_a_full_disk_says_the_disk_is_full_not_damaged(tmp_path):
    """A real full file system (a 256 KiB tmpfs in a private mount namespace): restarting on it
    says the disk is full and that the store is to be kept."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = tmp_path / "full.py"
    script.write_text(FULL_DISK)
    cmd = f"mount -t tmpfs -o size=256k tmpfs {mnt} && {sys.executable} {script} {mnt}"
    res = subprocess.run(["unshare", "-rm", "sh", "-c", cmd], capture_output=True, text=True, timeout=120)
    if "mount" in res.stderr and res.returncode:
        pytest.skip(f"this box cannot mount a private tmpfs: {res.stderr.strip()[:200]}")
    assert "no space left on the device" in res.stdout, res.stdout + res.stderr
    assert "not damaged" in res.stdout and "delete" not in res.stdout
