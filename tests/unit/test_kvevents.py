"""KV events: decoding (map- and array-encoded), residency / churn / hot-eviction logic, ZMQ wiring."""

import asyncio
import socket
import threading
from types import SimpleNamespace

import msgspec
import pytest
import zmq
import zmq.asyncio

from kvscope.agent.kvevents import subscriber
from kvscope.agent.kvevents.events import KvEventError, parse_kv_batch, parse_seq
from kvscope.agent.kvevents.residency import ResidencyTracker
from kvscope.agent.kvevents.subscriber import (
    KvEventsCollector,
    KvEventSource,
    KvEventSubscriber,
    parse_kv_events_config,
)

ENC = msgspec.msgpack.Encoder()
H1, H2, H3 = 9639650443363922608, 10089782939432059628, 17415555505625026712


def stored(*hashes, session=None):
    ev = {
        "type": "BlockStored",
        "block_hashes": list(hashes),
        "parent_block_hash": None,
        "token_ids": list(range(32 * len(hashes))),
        "block_size": 32,
        "medium": "GPU",
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    if session:
        ev["session_id"] = session
    return ev


def removed(*hashes):
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU", "group_idx": 0}


def batch(ts, *events, dp=0):
    return ENC.encode([ts, list(events), dp])


def test_parse_map_encoded_batch_like_vllm_0_32():
    evs = parse_kv_batch(
        batch(1795324915.58, stored(H1, H2), removed(H3), {"type": "AllBlocksCleared"}, {"type": "SomethingNew"})
    )
    assert [e.kind for e in evs] == ["stored", "removed", "cleared"]
    assert evs[0].block_hashes == (H1, H2) and evs[0].medium == "GPU" and evs[0].dp_rank == 0
    assert not hasattr(evs[0], "token_ids")  # token ids are never kept


def test_parse_array_encoded_events_and_missing_dp_rank():
    payload = ENC.encode([5.0, [["BlockStored", [H1], None, [1, 2], 16, None, "GPU"], ["BlockRemoved", [H1]]]])
    evs = parse_kv_batch(payload)
    assert [(e.kind, e.block_hashes, e.dp_rank) for e in evs] == [("stored", (H1,), None), ("removed", (H1,), None)]


@pytest.mark.parametrize("payload", [b"\xc1", ENC.encode({"a": 1}), ENC.encode([1.0])])
def test_bad_batches_raise(payload):
    with pytest.raises(KvEventError):
        parse_kv_batch(payload)


def test_seq_frame():
    assert parse_seq((5).to_bytes(8, "big")) == 5 and parse_seq((-1).to_bytes(8, "big", signed=True)) == -1
    with pytest.raises(KvEventError):
        parse_seq(b"\x01")


def _values(tracker):
    return {(s.name, s.label("le")): s.value for s in tracker.render_samples() if s.label("le") in (None, "10.0")}


def test_residency_churn_and_hot_evictions():
    t = ResidencyTracker("e0:8000", churn_window_s=60, hot_min_uses=2)
    t.apply(parse_kv_batch(batch(100.0, stored(H1, H2))))
    t.apply(parse_kv_batch(batch(104.0, removed(H1))))  # resident 4 s
    t.apply(parse_kv_batch(batch(105.0, stored(H1, session="s1"))))  # recomputed (1 use)
    t.apply(parse_kv_batch(batch(106.0, removed(H1))))
    t.apply(parse_kv_batch(batch(107.0, stored(H1, session="s1"))))  # recomputed again (2 uses)
    t.apply(parse_kv_batch(batch(108.0, removed(H1))))  # a hot block evicted: LRU failure
    t.apply(parse_kv_batch(batch(500.0, stored(H1))))  # outside the churn window: not churn
    t.apply(parse_kv_batch(batch(501.0, removed(H3))))  # never seen stored: unknown
    v = _values(t)
    assert v[("kv_blocks_stored_total", None)] == 5
    assert v[("kv_blocks_removed_total", None)] == 4
    assert v[("kv_blocks_evicted_recomputed_total", None)] == 2
    assert v[("kv_hot_blocks_evicted_total", None)] == 1
    assert v[("kv_block_residency_seconds_count", None)] == 3
    assert v[("kv_block_residency_seconds_sum", None)] == pytest.approx(6.0)
    assert t.stats["removed_unknown"] == 1


def test_reuse_reports_make_a_block_hot():
    t = ResidencyTracker("e0", hot_min_uses=2)
    t.apply(parse_kv_batch(batch(1.0, stored(H1), stored(H1), stored(H1), removed(H1))))
    assert _values(t)[("kv_hot_blocks_evicted_total", None)] == 1


def test_tracker_is_bounded():
    t = ResidencyTracker("e0", max_blocks=2)
    t.apply(parse_kv_batch(batch(1.0, stored(H1, H2, H3))))
    assert t.stats["resident_overflow"] == 1


def test_config_validation():
    assert parse_kv_events_config([{"endpoint": "ipc:///tmp/x.sock", "instance": "a:1"}])[0].topic == ""
    for bad in ({"endpoint": "x"}, [{"endpoint": "http://x", "instance": "a"}], [{"endpoint": "ipc:///x"}]):
        with pytest.raises(ValueError):
            parse_kv_events_config(bad)


def test_subscriber_over_ipc_counts_events_gaps_and_bad_messages(tmp_path):
    endpoint = f"ipc://{tmp_path}/kv.sock"

    async def main():
        ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.PUB)
        pub.bind(endpoint)
        sub = KvEventSubscriber(KvEventSource(endpoint, "e0:8000", "kv"), context=ctx)
        await sub.start()
        try:
            for _ in range(500):  # slow joiner: wait until connected
                await pub.send_multipart([b"kv", (0).to_bytes(8, "big"), batch(1.0, stored(H1))])
                await asyncio.sleep(0.02)
                if sub.stats["batches"]:
                    break
            base = sub._last_seq
            await pub.send_multipart([b"kv", (base + 3).to_bytes(8, "big"), batch(2.0, removed(H1))])
            await pub.send_multipart([b"kv", (base + 4).to_bytes(8, "big"), b"\xc1garbage"])
            await pub.send_multipart([b"other", (0).to_bytes(8, "big"), batch(3.0, stored(H2))])  # other topic
            await pub.send_multipart([b"kv", (base + 5).to_bytes(8, "big"), batch(4.0)])  # end marker
            for _ in range(500):
                if sub._last_seq == base + 5:
                    break
                await asyncio.sleep(0.01)
        finally:
            await sub.stop()
            pub.close(linger=0)
            ctx.term()
        return sub

    sub = asyncio.run(main())
    assert sub.stats["missed_batches"] == 2 and sub.errors == {"not_msgpack": 1}
    assert _values(sub.tracker)[("kv_blocks_removed_total", None)] == 1


def _collector(sub):
    coll = KvEventsCollector(SimpleNamespace(extensions={"kv_events": [sub.source]}))
    coll.subscribers = [sub]
    return coll


def test_subscriber_survives_bad_batches_between_good_ones_and_counts_them(tmp_path):
    """Real msgpack over a real ZMQ PUB socket: 120 good blocks in 40 batches, with a bad batch
    after every good one (invalid UTF-8, a list-valued block hash, not msgpack, wrong frame count,
    a bad sequence frame). Every good block is counted; every bad item is counted by reason."""
    endpoint = f"ipc://{tmp_path}/kv.sock"
    bad_utf8 = batch(1.0, stored(H1)).replace(b"GPU", b"G\xffU")
    list_hash = batch(1.0, stored(H1), {**stored(H2), "block_hashes": [[1, 2], 3]})  # H1 kept, the other not
    bads = [
        [b"kv", None, bad_utf8],
        [b"kv", None, list_hash],
        [b"kv", None, b"\xc1junk"],
        [b"kv", b"x", b"y", b"z"],
        [b"kv", b"\x01", batch(1.0)],
    ]

    async def main():
        ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.PUB)
        pub.bind(endpoint)
        sub = KvEventSubscriber(KvEventSource(endpoint, "e0:8000", "kv"), context=ctx)
        await sub.start()
        seq = 0
        try:
            for _ in range(500):  # slow joiner: wait until connected
                await pub.send_multipart([b"kv", (seq := seq + 1).to_bytes(8, "big"), batch(0.0)])
                await asyncio.sleep(0.02)
                if sub.stats["batches"]:
                    break
            for i in range(40):
                hashes = [1000 + 3 * i + j for j in range(3)]
                await pub.send_multipart([b"kv", (seq := seq + 1).to_bytes(8, "big"), batch(10.0 + i, stored(*hashes))])
                frames = bads[i % len(bads)]
                if frames[1] is None:
                    frames = [frames[0], (seq := seq + 1).to_bytes(8, "big"), frames[2]]
                await pub.send_multipart(frames)
            await pub.send_multipart([b"kv", (seq := seq + 1).to_bytes(8, "big"), batch(99.0)])
            for _ in range(500):
                if sub._last_seq == seq:
                    break
                await asyncio.sleep(0.01)
            health = (await _collector(sub).collect()).health[0]
        finally:
            await sub.stop()
            pub.close(linger=0)
            ctx.term()
        return sub, health

    sub, health = asyncio.run(main())
    # 120 good blocks + the good H1 of each of the 8 list-hash batches
    assert _values(sub.tracker)[("kv_blocks_stored_total", None)] == 120 + 8
    assert sub.errors == {"not_msgpack": 8 + 8, "bad_event": 8, "bad_frames": 8, "bad_seq": 8}
    assert health.up and health.errors == sub.errors


def test_a_dead_subscriber_loop_shows_in_health(tmp_path):
    async def main():
        ctx = zmq.asyncio.Context()
        sub = KvEventSubscriber(KvEventSource(f"ipc://{tmp_path}/kv.sock", "e0:8000"), context=ctx)
        coll = _collector(sub)
        up = (await coll.collect()).health[0]
        sub._task.cancel()
        sub._sock.close(linger=0)  # the receive loop's socket fails:
        sub._task = asyncio.create_task(sub._loop())  # recv raises ZMQError, the loop ends
        for _ in range(1200):  # until it has ended: 60 s is a hang guard only (a loaded box is slow)
            if sub._task.done():
                break
            await asyncio.sleep(0.05)
        down = (await coll.collect()).health[0]
        await sub.stop()
        ctx.term()
        return up, down

    up, down = asyncio.run(main())
    assert up.up and up.reason == ""
    assert not down.up and down.reason.startswith("loop_")


def test_deeply_nested_msgpack_is_a_bad_batch():
    """Found by bench/fuzz_inputs.py: msgspec raised RecursionError, outside KvEventError."""
    with pytest.raises(KvEventError) as e:
        parse_kv_batch(b"\x93\xcb" + b"\x00" * 8 + b"\x91" * 100_000)
    assert e.value.reason == "bad_batch"


# ---------------------------------------------------------------- publishers named by host name
# libzmq would look a tcp:// name up with a blocking getaddrinfo on its context's I/O thread; the
# subscriber looks it up itself on a daemon thread with a deadline (issue 41) and connects ZMQ to
# the address.


@pytest.mark.parametrize(
    ("endpoint", "named"),
    [
        ("tcp://engine-0.vllm.svc:5557", ("tcp://", "engine-0.vllm.svc", 5557)),
        ("tcp://eth0;engine:5557", ("tcp://eth0;", "engine", 5557)),
        ("tcp://127.0.0.1:5557", None),
        ("tcp://[::1]:5557", None),
        ("tcp://::1:5557", None),
        ("tcp://*:5557", None),
        ("tcp://engine:*", None),
        ("ipc:///run/vllm/kv.sock", None),
        ("inproc://kv", None),
    ],
)
def test_which_endpoints_are_looked_up(endpoint, named):
    assert subscriber.named_host(endpoint) == named


@pytest.mark.parametrize(
    ("endpoint", "refused"),
    [
        ("tcp://gw.example;engine:5557", True),
        ("tcp://gw.example:7000;engine:5557", True),
        ("tcp://lo;engine:5557", False),
        ("tcp://lo:7000;engine:5557", False),
        ("tcp://10.0.0.1;engine:5557", False),
        ("tcp://[fd00::1]:7000;engine:5557", False),
        ("tcp://fd00::1;engine:5557", False),
        ("tcp://*:7000;engine:5557", False),
        ("tcp://engine:5557", False),
    ],
)
def test_a_source_host_name_is_refused_at_start(endpoint, refused):
    """libzmq looks a source name up itself, on its I/O thread with no deadline: refused with the
    key named; `*`, IP literals and this host's interfaces (`lo` is on every Linux host) pass."""
    config = [{"endpoint": endpoint, "instance": "e0:8000"}]
    if not refused:
        assert parse_kv_events_config(config)[0].endpoint == endpoint
        return
    with pytest.raises(ValueError, match=r"kv_events\[0\].endpoint: the source 'gw.example"):
        parse_kv_events_config(config)


def test_the_address_a_lookup_gives_ipv4_first_ipv6_in_brackets():
    v4 = {"host": "10.0.0.7", "family": socket.AF_INET}
    v6 = {"host": "fd00::7", "family": socket.AF_INET6}
    assert subscriber._with_address("tcp://", [v6, v4], 5557) == "tcp://10.0.0.7:5557"
    assert subscriber._with_address("tcp://", [v6], 5557) == "tcp://[fd00::7]:5557"


def test_a_publisher_name_that_never_resolves_holds_neither_start_nor_stop_nor_the_loop(monkeypatch):
    """A lookup that never answers: start() returns, each try that passes its deadline is counted
    (and shows in health), one lookup thread serves every try, another task on the loop keeps
    running, and stop() returns. Once the resolver answers with a failure, that is counted too."""
    release = threading.Event()
    lookups: list[str] = []

    def never(host, port, family):
        lookups.append(host)
        release.wait()  # a DNS server that never answers
        raise socket.gaierror(socket.EAI_AGAIN, "released by the test")

    monkeypatch.setattr(subscriber, "lookup", never)
    monkeypatch.setattr(subscriber, "RESOLVE_TIMEOUT_S", 0.2)
    monkeypatch.setattr(subscriber, "RETRY_S", 0.05)
    monkeypatch.setattr(subscriber, "MAX_RETRY_S", 0.1)

    async def until(cond):
        for _ in range(1200):  # 60 s: a hang guard only (a loaded box is slow)
            if cond():
                return True
            await asyncio.sleep(0.05)
        return False

    async def main():
        ctx = zmq.asyncio.Context()
        sub = KvEventSubscriber(KvEventSource("tcp://engine-0.stuck.test:5557", "e0:8000"), context=ctx)
        ticks = 0

        async def other_work():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        other = asyncio.create_task(other_work())
        try:
            await asyncio.wait_for(sub.start(), 60)
            timed_out = await until(lambda: sub.errors["resolve_timeout"] >= 3)
            threads = len(lookups)
            ticks_then = ticks
            await asyncio.sleep(0.2)
            health = (await _collector(sub).collect()).health[0]
            release.set()  # the resolver answers at last: with a failure
            failed = await until(lambda: sub.errors["resolve_failed"] >= 1)
            release.clear()  # the next try hangs again
            await asyncio.wait_for(sub.stop(), 60)
        finally:
            release.set()
            other.cancel()
            ctx.term()
        return sub, timed_out, failed, ticks > ticks_then > 0, health, threads

    sub, timed_out, failed, loop_ran, health, threads = asyncio.run(main())
    assert timed_out and failed and loop_ran
    assert lookups[0] == "engine-0.stuck.test"
    assert threads == 1  # a try past its deadline waits on the same lookup: one thread, not one per try
    assert health.errors["resolve_timeout"] >= 3 and health.up and sub._connected is None


def _until_batches(pub, sub, count, seq=0):
    async def go():
        nonlocal seq
        for _ in range(3000):  # 60 s: a hang guard only
            seq += 1
            await pub.send_multipart([b"kv", seq.to_bytes(8, "big"), batch(1.0, stored(H1))])
            await asyncio.sleep(0.02)
            if sub.stats["batches"] >= count:
                return seq
        return None

    return go()


def test_a_publisher_named_localhost_is_looked_up_and_its_events_received():
    async def main():
        ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.PUB)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        sub = KvEventSubscriber(KvEventSource(f"tcp://localhost:{port}", "e0:8000", "kv"), context=ctx)
        await sub.start()
        try:
            joined = await _until_batches(pub, sub, 1)
            connected = sub._connected
        finally:
            await sub.stop()
            pub.close(linger=0)
            ctx.term()
        return joined, connected, port, sub

    joined, connected, port, sub = asyncio.run(main())
    assert joined and connected == f"tcp://127.0.0.1:{port}", connected
    assert not any(k.startswith("resolve_") for k in sub.errors), sub.errors


def test_a_reconnect_looks_the_name_up_again(monkeypatch):
    """A pod's address changes: after a lost connection (here a message over the cap, which
    libzmq answers by dropping the connection) the name is looked up again, then events flow."""
    lookups: list[str] = []

    def answer(host, port, family):
        lookups.append(host)
        return [{"host": "127.0.0.1", "family": socket.AF_INET}]

    monkeypatch.setattr(subscriber, "lookup", answer)

    async def main():
        ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.PUB)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        source = KvEventSource(f"tcp://engine-0.vllm.test:{port}", "e0:8000", "kv", max_message_bytes=1024)
        sub = KvEventSubscriber(source, context=ctx)
        await sub.start()
        try:
            seq = await _until_batches(pub, sub, 1)
            if seq is not None:
                await pub.send_multipart([b"kv", (seq + 1).to_bytes(8, "big"), b"x" * 4096])
                seq = await _until_batches(pub, sub, 2, seq + 1)
                for _ in range(3000):  # the reconnect's handshake is counted by its own task
                    if sub.errors:
                        break
                    await asyncio.sleep(0.02)
        finally:
            await sub.stop()
            pub.close(linger=0)
            ctx.term()
        return seq, sub

    seq, sub = asyncio.run(main())
    # issue 57 S9: the oversized message is counted as such, not as the publisher going away
    assert seq is not None and sub.errors["too_large"] >= 1 and not sub.errors["disconnected"], sub.errors
    assert len(lookups) >= 2 and set(lookups) == {"engine-0.vllm.test"}, lookups


def test_a_publisher_that_goes_away_is_counted_disconnected_not_too_large():
    async def main():
        ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.PUB)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        sub = KvEventSubscriber(KvEventSource(f"tcp://127.0.0.1:{port}", "e0:8000", "kv"), context=ctx)
        await sub.start()
        try:
            seq = await _until_batches(pub, sub, 1)
            pub.close(linger=0)  # the engine is gone: nothing accepts the connection again
            for _ in range(3000):  # 60 s: a hang guard only
                if sub.errors:
                    break
                await asyncio.sleep(0.02)
        finally:
            await sub.stop()
            ctx.term()
        return seq, sub

    seq, sub = asyncio.run(main())
    assert seq is not None and sub.errors == {"disconnected": 1}, sub.errors
