"""ZMQ subscriber for engine KV events; a collector that reports residency and churn series.

Config: agent YAML section `kv_events`, one entry per engine publisher (docs/requests.md §4):
`endpoint` (vLLM binds ipc/`*` endpoints; we connect), `instance` (the engine's scrape instance,
for joins), optional `topic` (ZMQ topic prefix, "" = all). vLLM adds the DP rank to a tcp port per
rank: list one entry per rank. PUB/SUB drops what was published before the subscriber connected
(slow joiner), so start the agent before traffic, or accept early blocks as `removed_unknown`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from kvscope.agent.collectors.base import Collection, Health, register_collector
from kvscope.agent.config import ConfigError, register_section
from kvscope.agent.kvevents.events import KvEventError, parse_kv_batch, parse_seq
from kvscope.agent.kvevents.residency import ResidencyTracker
from kvscope.agent.ratelog import warn_every

log = logging.getLogger("kvscope.kvevents")


@dataclass(frozen=True)
class KvEventSource:
    endpoint: str
    instance: str
    topic: str = ""


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
        out.append(KvEventSource(str(item["endpoint"]), str(item["instance"]), str(item.get("topic", ""))))
    return out


register_section("kv_events", parse_kv_events_config)


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
        self._last_seq: int | None = None

    async def start(self) -> None:
        if self._task is not None:
            return
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        sock.connect(self.source.endpoint)
        self._sock = sock
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # a dead loop's error is in `dead`
                await self._task
            self._task = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    async def _loop(self) -> None:
        assert self._sock is not None
        while True:
            frames = await self._sock.recv_multipart()  # a socket error ends the loop: `dead` says why
            try:
                self.handle(frames)
            except Exception as e:  # noqa: BLE001 - a bug on one message must not lose the later ones
                self._bad(f"exception_{type(e).__name__}", e)

    @property
    def dead(self) -> str | None:
        """Why the receive loop ended (`loop_<exception>`), or None while it runs."""
        t = self._task
        if t is None or not t.done() or t.cancelled():
            return None
        return f"loop_{type(t.exception()).__name__}"

    def handle(self, frames: list[bytes]) -> None:
        """One multipart message: [topic, seq, payload] (or [seq, payload] without topic).
        A bad message or event is counted in `errors` by reason, never raised."""
        try:
            if len(frames) not in (2, 3):
                raise KvEventError(f"{len(frames)} frames, want [topic, seq, payload]", "bad_frames")
            seq = parse_seq(frames[-2])
        except KvEventError as e:
            self._bad(e.reason, e)
            return
        if self._last_seq is not None and seq > self._last_seq + 1:
            self.stats["missed_batches"] += seq - self._last_seq - 1
        self._last_seq = seq  # received, even if its payload turns out bad
        try:
            events = parse_kv_batch(frames[-1], self.errors)
        except KvEventError as e:
            self._bad(e.reason, e)
            return
        self.stats["batches"] += 1
        self.stats["events"] += len(events)
        self.tracker.apply(events)

    def _bad(self, reason: str, e: Exception) -> None:
        self.errors[reason] += 1
        warn_every(log, f"kvevents:{reason}", "bad KV event message from %s (%s): %s", self.source.endpoint, reason, e)


@register_collector("kv_events", default_enabled=True)
class KvEventsCollector:
    """Residency / churn series from every configured KV-event publisher (inert without config)."""

    name = "kv_events"

    def __init__(self, config: Any = None) -> None:
        section = getattr(config, "extensions", {}).get("kv_events") if config is not None else None
        sources = (
            section
            if section is None or isinstance(section, list) and all(isinstance(s, KvEventSource) for s in section)
            else parse_kv_events_config(section)
        )
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
