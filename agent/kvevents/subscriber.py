"""ZMQ subscriber for engine KV events; a collector that reports residency and churn series.

Config: agent YAML section `kv_events`, one entry per engine publisher (docs/requests.md §4):
`endpoint` (vLLM binds ipc/`*` endpoints; we connect), `instance` (the engine's scrape instance,
for joins), optional `topic` (ZMQ topic prefix, "" = all). vLLM adds the DP rank to a tcp port per
rank: list one entry per rank. PUB/SUB drops what was published before the subscriber connected
(slow joiner), so start the agent before traffic, or accept early blocks as `removed_unknown`.

Bounds: a message over `max_message_bytes` (default 1 MiB; a vLLM step's batch is far smaller) is
refused by ZMQ before it is buffered (ZMQ_MAXMSGSIZE: libzmq drops the connection, the subscriber
reconnects; counted as `too_large` when the connection is made again within REFUSED_S, else as
`disconnected`, the lost batches as `missed_batches`) or, where ZMQ cannot check (inproc), dropped
as `too_large`; at most `QUEUE_BYTES` wait in ZMQ's queue (its high-water
mark is set from the cap); a batch's events are applied `APPLY_CHUNK` at a time, yielding to the
agent loop between chunks.

Names: libzmq would look a `tcp://` host name up with a blocking getaddrinfo on its context's I/O
thread (shared by every subscriber), which a DNS server that never answers stalls. So the
subscriber looks the name up itself, on a daemon thread of its own (`core/resolve.py`),
waits at most `RESOLVE_TIMEOUT_S` for it, and connects ZMQ to the address (IPv4 first, IPv6 in
brackets). A lookup that fails or passes its deadline is counted (`resolve_failed`,
`resolve_timeout`) and tried again after a backoff (`RETRY_S` doubling up to `MAX_RETRY_S`); the name
is looked up again on each reconnect (a pod's address changes). A subscriber has at most one lookup
on a thread: a retry waits for the one still running. A `tcp://source;host:port` endpoint's source
must be `*`, an IP address or a network interface of this host: a name there is refused at start,
since ZMQ would look it up itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import zmq
import zmq.asyncio

from kvscope.agent.collectors.base import Collection, Health, register_collector
from kvscope.agent.config import ConfigError, key_value, register_section, size_key
from kvscope.agent.kvevents.events import KvEvent, KvEventError, parse_kv_batch, parse_seq
from kvscope.agent.kvevents.residency import ResidencyTracker
from kvscope.agent.ratelog import warn_every
from kvscope.core.resolve import daemon_call, lookup

log = logging.getLogger("kvscope.kvevents")

MAX_MESSAGE_BYTES = 1 << 20
QUEUE_BYTES = 128 << 20
"""Messages ZMQ may hold for one subscriber, in bytes at the cap (RCVHWM = QUEUE_BYTES / cap)."""
APPLY_CHUNK = 2000
"""Events applied to the residency tracker between two yields to the agent loop."""
RESOLVE_TIMEOUT_S = 10.0
"""How long one try waits for the lookup of a publisher's host name."""
REFUSED_S = 3.0
"""A connection lost and made again (its handshake done) within this is taken for one that libzmq
dropped itself, for a message over ZMQ_MAXMSGSIZE: its monitor reports that as a plain disconnect,
and a publisher that went away (an engine restart) is not back so soon. Counted `too_large`."""
RETRY_S, MAX_RETRY_S = 1.0, 30.0
"""Backoff between tries of a lookup that failed: RETRY_S, doubling up to MAX_RETRY_S."""


@dataclass(frozen=True)
class KvEventSource:
    endpoint: str
    instance: str
    topic: str = ""
    max_message_bytes: int = MAX_MESSAGE_BYTES


_MAX_MESSAGE = size_key("kv_events[].max_message_bytes", MAX_MESSAGE_BYTES, "1KiB", "1GiB")


def parse_kv_events_config(raw: Any) -> list[KvEventSource]:
    """Validate the `kv_events` section (a list of {endpoint, instance, topic})."""
    if not isinstance(raw, list):
        raise ConfigError(f"kv_events: must be a list of {{endpoint, instance}}, got {raw!r}")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not item.get("endpoint") or not item.get("instance"):
            raise ConfigError(f"kv_events[{i}]: needs endpoint and instance, got {item!r}")
        if not str(item["endpoint"]).startswith(("ipc://", "tcp://", "inproc://")):
            raise ConfigError(f"kv_events[{i}].endpoint: must be ipc://, tcp:// or inproc://")
        if (source := named_source(str(item["endpoint"]))) is not None:
            raise ConfigError(
                f"kv_events[{i}].endpoint: the source {source!r} before ';' must be an IP address or a "
                "network interface of this host (ZMQ would look a host name up with no deadline)"
            )
        cap = key_value(
            replace(_MAX_MESSAGE, path=f"kv_events[{i}].max_message_bytes"),
            item.get("max_message_bytes", MAX_MESSAGE_BYTES),
        )
        topic = str(item.get("topic", ""))
        out.append(KvEventSource(str(item["endpoint"]), str(item["instance"]), topic, cap))
    return out


register_section("kv_events", parse_kv_events_config)


def named_host(endpoint: str) -> tuple[str, str, int] | None:
    """For a `tcp://[source;]host:port` endpoint whose host is a name: (the endpoint up to the
    host, the host, the port). None for an IP literal, `*`, a port that is not a number, and
    ipc:// or inproc://: ZMQ connects to those as they are."""
    if not endpoint.startswith("tcp://"):
        return None
    head, _, dest = endpoint.rpartition(";")
    host, _, port = dest.removeprefix("tcp://").rpartition(":")
    if not host or host == "*" or host.startswith("[") or not port.isdigit():
        return None
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        return (f"{head};" if head else "tcp://"), host, int(port)


def named_source(endpoint: str) -> str | None:
    """The source of a `tcp://source;host:port` endpoint when it is a host name: neither `*`, an
    IP address nor one of this host's network interfaces (libzmq looks such a name up with a
    blocking getaddrinfo on its I/O thread, which nothing here can bound). None otherwise."""
    if not endpoint.startswith("tcp://") or ";" not in endpoint:
        return None
    source = endpoint.removeprefix("tcp://").partition(";")[0]
    host, colon, port = source.rpartition(":")
    if not colon or not port.isdigit() or host.endswith(":"):  # no ":port" (an IPv6 literal's colons are not one)
        host = source
    host = host.removeprefix("[").removesuffix("]")
    if host == "*" or host in {name for _, name in socket.if_nameindex()}:
        return None
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        return source


def _with_address(head: str, answers: list[Any], port: int) -> str:
    """The endpoint to an address of a lookup's `answers` (IPv4 first, IPv6 in brackets)."""
    answers = sorted(answers, key=lambda a: a["family"] != socket.AF_INET)
    if not answers:
        raise OSError("no IPv4 or IPv6 address")
    address = answers[0]["host"]
    return f"{head}[{address}]:{port}" if ":" in address else f"{head}{address}:{port}"


class KvEventSubscriber:
    """Subscribes to one publisher and feeds a ResidencyTracker. `start()` / `stop()`."""

    def __init__(self, source: KvEventSource, context: zmq.asyncio.Context | None = None) -> None:
        self.source = source
        self.tracker = ResidencyTracker(source.instance)
        self.stats: Counter[str] = Counter()  # batches, events, missed_batches
        self.errors: Counter[str] = Counter()  # bad messages and events by reason
        self._ctx = context or zmq.asyncio.Context.instance()
        self._sock: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._last_seq: int | None = None
        self._connected: str | None = None  # the endpoint ZMQ is connected to (a name's address)
        self._lookup: asyncio.Future[list[Any]] | None = None  # the host name's lookup, at most one

    async def start(self) -> None:
        """Open the socket and start receiving; the connection is made in a task of its own
        (`_connect`), so a host name that does not resolve never holds the caller."""
        if self._task is not None:
            return
        cap = self.source.max_message_bytes
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, max(16, min(100_000, QUEUE_BYTES // cap)))
        sock.setsockopt(zmq.MAXMSGSIZE, cap)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IPV6, 1)  # a name may resolve to an IPv6 address only
        sock.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self._sock = sock
        self._task = asyncio.create_task(self._loop())
        self._watch = asyncio.create_task(self._reconnect(monitor))

    async def stop(self) -> None:
        """Stop receiving and close the socket; a lookup still running is left to end by itself."""
        for task in (self._task, self._watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):  # a dead loop's error is in `dead`
                    await task
        self._task = self._watch = None
        self._connected = self._lookup = None
        if self._sock is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.disable_monitor()
            self._sock.close(linger=0)
            self._sock = None

    async def _loop(self) -> None:
        assert self._sock is not None
        while True:
            frames = await self._sock.recv_multipart()  # a socket error ends the loop: `dead` says why
            try:
                events = self.parse(frames)
                for i in range(0, len(events), APPLY_CHUNK):
                    if i:
                        await asyncio.sleep(0)  # a big batch never holds the loop in one piece
                    self.tracker.apply(events[i : i + APPLY_CHUNK])
            except Exception as e:  # noqa: BLE001 - a bug on one message must not lose the later ones
                self._bad(f"exception_{type(e).__name__}", e)

    async def _reconnect(self, monitor: zmq.asyncio.Socket) -> None:
        """Connect, then count each lost connection and connect again: libzmq ends (and does not
        retry) a connection whose peer sent a message over ZMQ_MAXMSGSIZE. A connection made again
        within REFUSED_S was dropped for such a message (`too_large`), else the publisher went away
        (`disconnected`)."""
        try:
            await self._connect()
            event = await _event(monitor)
            while True:
                if event != zmq.EVENT_DISCONNECTED:
                    event = await _event(monitor)
                    continue
                lost = time.monotonic()
                if self._sock is not None and self._connected is not None:
                    with contextlib.suppress(zmq.ZMQError):
                        self._sock.disconnect(self._connected)
                    self._connected = None
                await self._connect()
                back = await _handshake_or_loss(monitor, REFUSED_S - (time.monotonic() - lost))
                if back == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    cap = self.source.max_message_bytes
                    why = f"a message over max_message_bytes={cap} (ZMQ dropped the connection; it was made again)"
                    self._bad("too_large", KvEventError(why, "too_large"))
                else:
                    self._bad("disconnected", ConnectionError("publisher connection lost; reconnecting"))
                event = back if back == zmq.EVENT_DISCONNECTED else await _event(monitor)
        finally:
            monitor.close(linger=0)

    async def _connect(self) -> None:
        """Connect the socket to the publisher, a host name looked up first (`_address`): a lookup
        that fails is counted and tried again after a backoff, until one answers."""
        delay = RETRY_S
        while True:
            try:
                endpoint = await self._address()
                break
            except OSError as e:
                reason = "resolve_timeout" if isinstance(e, TimeoutError) else "resolve_failed"
                self._bad(reason, e)
            await asyncio.sleep(delay)
            delay = min(2 * delay, MAX_RETRY_S)
        if self._sock is not None:
            self._sock.connect(endpoint)
            self._connected = endpoint

    async def _address(self) -> str:
        """The endpoint with its host name (`named_host`) replaced by an address, looked up on a
        daemon thread for at most RESOLVE_TIMEOUT_S (a lookup still running from an earlier try is
        waited for, not started again). OSError if it does not resolve; TimeoutError past the
        deadline (the lookup is left to finish)."""
        named = named_host(self.source.endpoint)
        if named is None:
            return self.source.endpoint
        head, host, port = named
        if self._lookup is None or self._lookup.done():
            self._lookup = daemon_call(lookup, host, port, socket.AF_UNSPEC, name=f"resolve {host}")
        try:
            answers = await asyncio.wait_for(asyncio.shield(self._lookup), RESOLVE_TIMEOUT_S)
        except TimeoutError:
            raise TimeoutError(f"{host} did not resolve within {RESOLVE_TIMEOUT_S:g} s") from None
        except UnicodeError as e:  # a label idna refuses
            raise OSError(f"bad host name {host!r}: {e}") from None
        return _with_address(head, answers, port)

    @property
    def dead(self) -> str | None:
        """Why the receive loop ended (`loop_<exception>`) or the connecting task did
        (`connect_<exception>`, e.g. an endpoint ZMQ refuses), or None while both run."""
        for what, t in (("loop", self._task), ("connect", self._watch)):
            if t is not None and t.done() and not t.cancelled():
                return f"{what}_{type(t.exception()).__name__}"
        return None

    def parse(self, frames: list[bytes]) -> list[KvEvent]:
        """One multipart message: [topic, seq, payload] (or [seq, payload] without topic) -> its
        events. A bad message or event is counted in `errors` by reason, never raised."""
        try:
            if sum(map(len, frames)) > self.source.max_message_bytes:
                raise KvEventError(f"message over max_message_bytes={self.source.max_message_bytes}", "too_large")
            if len(frames) not in (2, 3):
                raise KvEventError(f"{len(frames)} frames, want [topic, seq, payload]", "bad_frames")
            seq = parse_seq(frames[-2])
        except KvEventError as e:
            self._bad(e.reason, e)
            return []
        if self._last_seq is not None and seq > self._last_seq + 1:
            self.stats["missed_batches"] += seq - self._last_seq - 1
        self._last_seq = seq  # received, even if its payload turns out bad
        try:
            events = parse_kv_batch(frames[-1], self.errors)
        except KvEventError as e:
            self._bad(e.reason, e)
            return []
        self.stats["batches"] += 1
        self.stats["events"] += len(events)
        return events

    def _bad(self, reason: str, e: Exception) -> None:
        self.errors[reason] += 1
        warn_every(log, f"kvevents:{reason}", "KV events from %s (%s): %s", self.source.endpoint, reason, e)


async def _event(monitor: zmq.asyncio.Socket) -> int:
    """The next event (zmq.EVENT_*) of a socket monitor."""
    frames = await monitor.recv_multipart()
    return int.from_bytes(frames[0][:2], "little")  # the event id, then the value (ZMTP monitor format)


async def _handshake_or_loss(monitor: zmq.asyncio.Socket, seconds: float) -> int | None:
    """The first finished handshake or lost connection (zmq.EVENT_*) the monitor reports within
    `seconds`, or None."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            event = await asyncio.wait_for(_event(monitor), left)
        except TimeoutError:
            return None
        if event in (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_DISCONNECTED):
            return event
    return None


@register_collector("kv_events", default_enabled=True)
class KvEventsCollector:
    """Residency / churn series from every configured KV-event publisher (inert without config)."""

    name = "kv_events"

    def __init__(self, config: Any = None) -> None:
        sources = config.extensions.get("kv_events") if config is not None else None  # parsed by build_config
        self.subscribers = [KvEventSubscriber(s) for s in sources or []]
        self._reported: dict[str, Counter[str]] = {}

    async def collect(self) -> Collection:
        coll = Collection()
        for sub in self.subscribers:
            await sub.start()
            health = Health(collector=self.name, target=sub.source.instance)
            if dead := sub.dead:
                health.up, health.reason = False, dead
            totals = sub.stats + sub.tracker.stats + sub.errors
            delta = totals - self._reported.get(sub.source.endpoint, Counter())
            self._reported[sub.source.endpoint] = Counter(totals)
            health.errors.update({k: v for k, v in delta.items() if k in sub.errors or k == "missed_batches"})
            health.dropped.update({k: v for k, v in delta.items() if k.endswith("_overflow")})
            samples = sub.tracker.render_samples(time.time())
            health.series = len(samples)
            coll.samples.extend(samples)
            coll.health.append(health)
        return coll

    async def close(self) -> None:
        for sub in self.subscribers:
            await sub.stop()
